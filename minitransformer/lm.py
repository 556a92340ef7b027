"""A decoder-only language model from the package's decoder layers: loss, training, sampling.

Explained in the chapter "From the paper to a language model" (``book/lm``). Today's language
models (GPT and its successors) keep only the paper's decoder, without cross-attention: token
ids ``(B, T)`` in, logits ``(B, T, V)`` out, where the logits at position ``t`` predict token
``t + 1`` from tokens ``0 .. t``. Read top to bottom:

* :class:`DecoderOnlyTransformer`: embedding, positions, ``Decoder(cross_attention=False)``,
  the output projection;
* :func:`lm_loss` and :func:`evaluate_lm`: the shifted next-token cross-entropy;
* :func:`train_lm`: AdamW on random windows of a token stream, through the course's one
  training loop (:func:`~minitransformer.training.train`);
* :func:`next_token_probs` and :func:`generate`: greedy decoding and seeded sampling with a
  temperature, top-k and top-p, with or without the KV cache (same tokens); defined in
  :mod:`minitransformer.decoding`, with the other decoders;
* :func:`bigram_log_probs` and :func:`bigram_loss`: the baseline a model must beat;
* :func:`pydoc_split` and :func:`encode_corpus`: the corpus that ships with Python.

Shape letters: ``B`` batch, ``T`` positions, ``V`` vocabulary, ``N`` tokens of a stream.
Perplexity is ``exp`` of the mean cross-entropy in nats: the number of tokens the model is,
on average, as unsure between as a uniform choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer._checks import finite_float, ids, module, positive_int, probability, tensor
from minitransformer.attention import causal_mask
from minitransformer.decoding import generate, next_token_probs
from minitransformer.kv_cache import KVCache
from minitransformer.model import Decoder, _output_projection
from minitransformer.positional import LearnedPositionalEmbedding, PositionalEncoding
from minitransformer.tokenizer import BPETokenizer
from minitransformer.training import TrainHistory, train

__all__ = [
    "DecoderOnlyTransformer",
    "lm_loss",
    "evaluate_lm",
    "train_lm",
    "next_token_probs",
    "generate",
    "bigram_log_probs",
    "bigram_loss",
    "pydoc_split",
    "encode_corpus",
]


class DecoderOnlyTransformer(nn.Module):
    """A GPT-style language model: ``(B, T)`` ids -> ``(B, T, V)`` next-token logits.

    Token embedding times ``sqrt(d_model)`` plus the sinusoidal
    :class:`~minitransformer.positional.PositionalEncoding`, a
    :class:`~minitransformer.model.Decoder` stack without cross-attention (pre-LN by default,
    as GPT-2; ``norm_first=False`` is the paper's post-LN), and an output projection, tied to
    the embedding by default (the paper, section 3.4; GPT-2 too). The causal mask is always
    applied. Initialisation as :class:`~minitransformer.model.Transformer`. Section "A
    decoder-only model".

    What GPT-2 changed, as options (section "Your model is GPT-2";
    :func:`~minitransformer.gpt2.from_hf_gpt2` sets them): ``positions="learned"``, a trained
    :class:`~minitransformer.positional.LearnedPositionalEmbedding` table (initialised from
    ``N(0, 0.02^2)``, as GPT-2) instead of the sinusoids; ``scale_embedding=False``, the
    token embedding added unscaled; ``activation="gelu_tanh"`` in the feed-forward layers
    (one of :data:`~minitransformer.model.ACTIVATIONS`). Pre-LN with a final LayerNorm, tied
    embeddings and biases in every projection but the output are already the defaults.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int,
        max_len: int,
        dropout: float = 0.1,
        tie_embeddings: bool = True,
        norm_first: bool = True,
        positions: str = "sinusoidal",
        scale_embedding: bool = True,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.vocab_size = positive_int("vocab_size", vocab_size)
        self.d_model = positive_int("d_model", d_model)
        self.num_heads = positive_int("num_heads", num_heads)
        self.max_len = positive_int("max_len", max_len)
        self.tie_embeddings = bool(tie_embeddings)
        if not isinstance(scale_embedding, bool):
            raise TypeError(f"scale_embedding must be a bool, got {scale_embedding!r}")
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positional: PositionalEncoding | LearnedPositionalEmbedding
        dropout = probability("dropout", dropout)
        if positions == "sinusoidal":
            self.positional = PositionalEncoding(d_model, max_len, dropout=dropout)
        elif positions == "learned":
            self.positional = LearnedPositionalEmbedding(
                d_model, max_len, dropout=dropout, init_std=0.02
            )
        else:
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {positions!r}")
        self.decoder = Decoder(
            num_layers=positive_int("num_layers", num_layers),
            d_model=d_model,
            num_heads=num_heads,
            d_ff=positive_int("d_ff", d_ff),
            dropout=dropout,
            norm_first=norm_first,
            cross_attention=False,
            activation=activation,
        )
        self.output = nn.Linear(d_model, vocab_size, bias=False)  # pre-softmax projection
        for p in self.decoder.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for weight in (self.embed.weight, self.output.weight):
            nn.init.normal_(weight, mean=0.0, std=d_model**-0.5)
        if tie_embeddings:
            self.output.weight = self.embed.weight  # one (V, d_model) matrix, two uses

    def forward(self, tokens: Tensor, *, cache: KVCache | None = None) -> Tensor:
        """``tokens`` ``(B, T)`` -> logits ``(B, T, V)``.

        With a :class:`~minitransformer.kv_cache.KVCache` (chapter "Inference"), ``tokens``
        are the ``T`` *new* tokens, at positions ``cache.length .. cache.length + T - 1``;
        their keys and values are appended to the cache. Feeding a sequence in pieces gives
        the logits of feeding it whole. An empty batch or ``T = 0`` gives empty logits, as
        :class:`~minitransformer.model.Transformer` does.
        """
        tokens = ids("tokens", tokens, ndim=2, what="(B, T)", high=self.vocab_size)
        T = tokens.shape[1]
        start = 0 if cache is None else cache.length  # positions already cached
        if start + T > self.max_len:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} must hold at most max_len={self.max_len} "
                f"positions (with {start} cached before them)"
            )
        # New position start + t may attend to positions 0 .. start + t; a single new
        # position may attend to everything, so it needs no mask.
        mask = None if T == 1 else causal_mask(start + T, device=tokens.device)[start:]
        # mask: (T, start + T), broadcast over B and h
        x = self.embed(tokens)  # (B, T, d_model)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        x = self.positional(x, start)  # (B, T, d_model)
        x = self.decoder(x, None, tgt_mask=mask, cache=cache)  # (B, T, d_model)
        return _output_projection(self.output, x, self.decoder, cache)  # (B, T, V)


# -- the loss -----------------------------------------------------------------------------


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision logits, else their own dtype (a float64 model stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def lm_loss(model: nn.Module, tokens: Tensor, *, pad_id: int | None = None) -> Tensor:
    """The causal language-modelling loss of ``tokens`` ``(B, T + 1)``: the model reads
    ``tokens[:, :-1]`` and each position must predict the next token, ``tokens[:, 1:]``.

    Returns the mean cross-entropy in nats (a 0-d tensor, differentiable), over the targets
    that are not ``pad_id`` (None: all of them); NaN if there are none (an empty batch, or
    only padding), as for ``torch.nn.functional.cross_entropy`` and
    :class:`~minitransformer.training.LabelSmoothingLoss`. Section "The language-modelling
    loss".
    """
    module("model", model)
    tokens = ids("tokens", tokens, ndim=2, what="(B, T + 1)", low=None)  # any id dtype -> int64
    if tokens.shape[1] < 2:
        raise ValueError(f"tokens must be (B, T + 1) with T + 1 >= 2, got {tuple(tokens.shape)}")
    logits = model(tokens[:, :-1])  # (B, T, V); the model checks the inputs' ids
    targets = tokens[:, 1:]  # (B, T): shifted left by one
    # the last column is only a target: check it too (pad_id may lie outside the vocabulary)
    ids("tokens", targets if pad_id is None else targets[targets != pad_id], high=logits.shape[-1])
    ignore = -100 if pad_id is None else pad_id  # no id is -100: nothing is ignored
    logits = logits.flatten(0, 1).to(_at_least_float32(logits.dtype))  # (B T, V)
    return F.cross_entropy(logits, targets.flatten(), ignore_index=ignore)


def _check_stream(
    name: str, tokens: Tensor, min_len: int, high: int | None = None, within: str = "the vocabulary"
) -> Tensor:
    """A stream of ids ``(N,)`` of any id dtype, as int64 (``_checks.ids``: uint8 arithmetic
    would overflow), each in ``[0, high)``, at least ``min_len`` of them."""
    tokens = ids(name, tokens, ndim=1, what="(N,)", high=high, within=within)
    if tokens.shape[0] < min_len:
        raise ValueError(f"{name} must hold at least {min_len} tokens, got {tokens.shape[0]}")
    return tokens


@torch.no_grad()
def evaluate_lm(model: nn.Module, tokens: Tensor, *, seq_len: int, batch_size: int = 32) -> float:
    """The model's mean cross-entropy (nats per token) on a stream ``tokens`` ``(N,)``.

    Every token but the first is predicted once: the stream is cut into windows of
    ``seq_len + 1`` tokens that overlap by one (the last may be shorter), so the targets are
    exactly those of :func:`bigram_loss`; each sees at most ``seq_len`` tokens of context.
    Runs in eval mode (no dropout) and leaves the model's mode as it was. ``exp`` of the
    result is the perplexity.
    """
    module("model", model)
    seq_len = positive_int("seq_len", seq_len)
    batch_size = positive_int("batch_size", batch_size)
    tokens = _check_stream("tokens", tokens, 2)
    starts = list(range(0, tokens.shape[0] - 1, seq_len))
    full = [s for s in starts if s + seq_len + 1 <= tokens.shape[0]]
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        batches = [
            torch.stack([tokens[s : s + seq_len + 1] for s in full[i : i + batch_size]])
            for i in range(0, len(full), batch_size)
        ]
        if len(full) < len(starts):  # the shorter last window, alone
            batches.append(tokens[starts[-1] :][None])
        for batch in batches:  # (b, seq_len + 1)
            total += float(lm_loss(model, batch)) * batch[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / (tokens.shape[0] - 1)


# -- training -----------------------------------------------------------------------------


def train_lm(
    model: nn.Module,
    tokens: Tensor,
    *,
    steps: int,
    seq_len: int,
    batch_size: int,
    lr: float = 1e-3,
    warmup_steps: int = 100,
    weight_decay: float = 0.01,
    clip_grad_norm: float = 1.0,
    generator: torch.Generator | None = None,
    eval_fn: Callable[[nn.Module], float] | None = None,
    eval_every: int = 50,
    progress: bool = True,
) -> TrainHistory:
    """Train ``model`` as a causal LM on a token stream ``tokens`` ``(N,)``. Section "Training
    the model".

    The course's one loop, :func:`~minitransformer.training.train`, with :func:`lm_loss` as
    its loss: each step takes ``batch_size`` windows of ``seq_len + 1`` tokens at random
    offsets (drawn with ``generator``), clips the gradient norm and takes one AdamW step. The
    learning rate rises linearly to ``lr`` over ``warmup_steps`` steps, then decays along a
    cosine to ``lr / 10`` at the last step. ``eval_fn(model)`` (e.g. a held-out
    :func:`evaluate_lm`) runs every ``eval_every`` steps and after the last. Dropout draws
    from torch's global generator: seed it (``torch.manual_seed``) for a reproducible run.
    Returns the :class:`~minitransformer.training.TrainHistory` (``loss`` per step,
    ``eval_metric``); leaves the model in train mode.
    """
    module("model", model)
    steps = positive_int("steps", steps)
    seq_len = positive_int("seq_len", seq_len)
    batch_size = positive_int("batch_size", batch_size)
    warmup_steps = positive_int("warmup_steps", warmup_steps)
    lr = finite_float("lr", lr, low=0.0, low_open=True)
    clip_grad_norm = finite_float("clip_grad_norm", clip_grad_norm, low=0.0, low_open=True)
    tokens = _check_stream("tokens", tokens, seq_len + 1)
    windows = tokens.unfold(0, seq_len + 1, 1)  # (N - seq_len, seq_len + 1), a view

    def next_batch() -> Tensor:  # (batch_size, seq_len + 1)
        offsets = torch.randint(0, windows.shape[0], (batch_size,), generator=generator)
        return windows[offsets.to(tokens.device)]

    def schedule(step: int) -> float:  # factor on lr before update step + 1
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=lr,
        betas=(0.9, 0.98),
        weight_decay=finite_float("weight_decay", weight_decay, low=0.0),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    history = train(
        model,
        next_batch,
        optimizer,
        scheduler,
        loss=lm_loss,
        num_steps=steps,
        clip_grad_norm=clip_grad_norm,
        eval_fn=eval_fn,
        eval_every=eval_every,
        progress=progress,
        desc="language model",
    )
    model.train()
    return history


# -- generation ---------------------------------------------------------------------------


# :func:`next_token_probs` and :func:`generate` live in :mod:`minitransformer.decoding`, with
# the other decoders (imported above); this module re-exports them.


# -- the bigram baseline ------------------------------------------------------------------


def bigram_log_probs(tokens: Tensor, vocab_size: int, *, alpha: float = 1.0) -> Tensor:
    """A bigram model fitted on a stream ``tokens`` ``(N,)``: ``(V, V)`` log-probabilities,
    row ``a`` = ``log P(next | a)``.

    Add-``alpha`` smoothing: ``P(b | a) = (count(a, b) + alpha) / (count(a) + alpha V)``
    (``alpha = 1``: Laplace's add-one), so that no pair has probability zero. Section "A
    baseline to beat".
    """
    vocab_size = positive_int("vocab_size", vocab_size)
    alpha = finite_float("alpha", alpha, low=0.0, low_open=True)
    tokens = _check_stream("tokens", tokens, 2, high=vocab_size)
    pairs = tokens[:-1] * vocab_size + tokens[1:]  # (N - 1,) one index per (a, b)
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size)
    counts = counts.reshape(vocab_size, vocab_size).double()  # (V, V): count(a, b)
    return torch.log((counts + alpha) / (counts.sum(1, keepdim=True) + alpha * vocab_size))


def bigram_loss(log_probs: Tensor, tokens: Tensor) -> float:
    """The mean cross-entropy (nats per token) of a bigram model ``(V, V)`` on ``tokens``
    ``(N,)``: ``-mean log P(tokens[i + 1] | tokens[i])``, the targets of :func:`evaluate_lm`."""
    tensor("log_probs", log_probs, kind="float", ndim=2, what="(V, V)")
    if log_probs.shape[0] != log_probs.shape[1]:
        raise ValueError(f"log_probs must be a square (V, V) table, got {tuple(log_probs.shape)}")
    tokens = _check_stream(
        "tokens", tokens, 2, high=log_probs.shape[0], within="the vocabulary of log_probs"
    )
    return float(-log_probs[tokens[:-1], tokens[1:]].mean())


# -- the corpus ---------------------------------------------------------------------------


#: Two help topics that share a run of this many words (split at whitespace) share a passage.
PASSAGE_WORDS = 12


def _word_runs(text: str, n: int) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def pydoc_split() -> tuple[list[str], list[str]]:
    """Python's own documentation as ``(training, held_out)`` lists of documents, split by
    content.

    ``pydoc_data.topics`` ships with Python (79 topics, about 465,000 characters with Python
    3.11; the text changes with the Python version). Its topics copy one another: ``async``
    is most of a section of ``compound``, ``sequence-types`` one of ``specialnames``. So a
    topic that shares a passage (a run of ``PASSAGE_WORDS`` words) with any other topic
    stays in training, and of the topics that share none, sorted by name, every fifth from
    the second (``i % 5 == 1``) is held out: with Python 3.11, 9 topics, about 11 % of the
    characters, and no run of 12 words of the held-out text occurs in the training text.
    """
    from pydoc_data.topics import topics

    names = sorted(topics)
    first_owner: dict[tuple[str, ...], str] = {}
    shares: set[str] = set()  # the topics that share a passage with another topic
    for name in names:
        for run in _word_runs(topics[name], PASSAGE_WORDS):
            owner = first_owner.setdefault(run, name)
            if owner != name:
                shares.update((owner, name))
    standalone = [name for name in names if name not in shares]
    held_names = set(standalone[1::5])
    train = [topics[name] for name in names if name not in held_names]
    held_out = [topics[name] for name in names if name in held_names]
    return train, held_out


def encode_corpus(tokenizer: BPETokenizer, texts: Iterable[str]) -> Tensor:
    """One ``(N,)`` long tensor of token ids: each document's ids followed by the tokenizer's
    ``eos_id`` (``<|endoftext|>``), as GPT-2's training data separates documents."""
    if not (callable(getattr(tokenizer, "encode", None)) and hasattr(tokenizer, "eos_id")):
        raise TypeError(
            f"tokenizer must have encode() and eos_id (a BPETokenizer), got "
            f"{type(tokenizer).__name__}"
        )
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text)
        ids.append(tokenizer.eos_id)
    return torch.tensor(ids, dtype=torch.long)
