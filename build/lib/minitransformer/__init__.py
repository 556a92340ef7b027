"""minitransformer: the Transformer of "Attention Is All You Need", built and tested.

The companion package of the course in ``book/``. One module per concept, each explained by a
chapter (the chapter "Where next" has the full map):

* :mod:`minitransformer.attention`: scaled dot-product and multi-head attention, masks, cost;
* :mod:`minitransformer.positional`: sinusoidal, learned and rotary positions;
* :mod:`minitransformer.model`: the encoder-decoder ``Transformer`` and its layers;
* :mod:`minitransformer.data`, :mod:`minitransformer.training`, :mod:`minitransformer.decoding`:
  toy tasks, the paper's training recipe, greedy and beam decoding;
* :mod:`minitransformer.kv_cache`, :mod:`minitransformer.flash`, :mod:`minitransformer.paged`,
  :mod:`minitransformer.quantize`: inference (KV cache, tiled attention, paged and int8 caches);
* :mod:`minitransformer.plotting` and :mod:`minitransformer.exercises`: the book's figures and
  exercise checkers.
"""

__version__ = "0.1.0"
