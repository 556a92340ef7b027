"""minitransformer: the Transformer of "Attention Is All You Need", built and tested.

The companion package of the course in ``book/``. One module per concept, each explained by a
chapter (the chapter "Where next" has the full map):

* :mod:`minitransformer.attention`: scaled dot-product (and additive) attention, masks,
  multi-head attention, its parameter and FLOP counts;
* :mod:`minitransformer.positional`: sinusoidal, learned and rotary positions;
* :mod:`minitransformer.model`: the encoder-decoder ``Transformer``, its layers and its
  parameter breakdown;
* :mod:`minitransformer.data`, :mod:`minitransformer.training`, :mod:`minitransformer.decoding`:
  toy tasks, the paper's training recipe, greedy and beam decoding, sampling;
  :mod:`minitransformer.translation`: English to German number, date and amount expressions;
* :mod:`minitransformer.ablation` and :mod:`minitransformer.stats`: the paper's Table 3 at toy
  scale (the recipe as data, one training run, the stored seed study), and Welch's and the
  paired t-test;
* :mod:`minitransformer.kv_cache`, :mod:`minitransformer.kv_memory`,
  :mod:`minitransformer.kv_cli`, :mod:`minitransformer.flash`, :mod:`minitransformer.paged`,
  :mod:`minitransformer.quantize`: inference (the KV cache and its memory calculator with its
  command line, tiled attention, paged and int8 caches);
* :mod:`minitransformer.tokenizer`, :mod:`minitransformer.lm` and :mod:`minitransformer.gpt2`:
  byte-pair encoding, a decoder-only language model, and GPT-2's weights and files in it;
* :mod:`minitransformer.report`, :mod:`minitransformer.plotting` and
  :mod:`minitransformer.exercises`: numbers printed to the digits another CPU reproduces, the
  book's figures and the exercise checkers.
"""

__version__ = "0.1.0"
