"""Autoregressive decoding: greedy search and beam search, plus the score beam search maximises;
and sampling from a decoder-only language model (temperature, top-k, top-p).

Chapters "The encoder–decoder picture" (section "Teacher forcing in training, one token at a
time at inference"), "Training a Transformer" (section "Decoding the trained model") and
"Inference: the KV cache and the cost of attention" (section "How the cache works").

Output of both decoders: ``(B, L)`` ``long`` ids, ``L <= max_len`` (``max_len`` counts the
BOS); every row starts with ``bos_id``, and a row that produced ``eos_id`` is ``pad_id`` after
it. Decoding stops once every row has ended; an empty batch gives ``(0, 1)`` (``(0, max_len)``
with ``eos_id=None``). The paper's limit, input length + 50 (section 6.1), is
``max_len=src.shape[1] + 51`` for the longest source of a batch (the model needs that many
positions).

``src_mask`` ``(B, 1, 1, S)`` or ``(1, 1, 1, S)``, True = may attend; None builds it once from
``src != pad_id``, and passes no mask at all when the source has no padding. Call
``model.eval()`` first: the decoders do not change the model's mode.

Beam search maximises the length-normalised log-probability of Wu et al. (2016), with
``alpha = 0.6`` in the paper (section 6.1), over the ``n`` generated tokens (EOS included)::

    score(y) = sum_t log p(y_t | y_<t, x) / lp(n)
    lp(n)    = ((5 + n) / 6) ** alpha

Sampling (:func:`next_token_probs`, :func:`generate`; chapter "From the paper to a language
model", section "Sampling") draws each token from ``softmax(logits / temperature)``, optionally
restricted to the ``top_k`` largest logits and to the nucleus of ``top_p`` (Holtzman et al.,
2020). A temperature below ``MIN_TEMPERATURE`` (0 included) and ``top_k=1`` are greedy
decoding: the argmax, the first of tied maxima, with no random number drawn.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
from torch import Tensor, nn

from minitransformer._checks import finite_float, ids, module, positive_int, tensor
from minitransformer.data import PAD_ID, src_padding_mask
from minitransformer.kv_cache import AttentionCache, KVCache

__all__ = [
    "greedy_decode",
    "beam_search",
    "beam_search_with_scores",
    "sequence_score",
    "length_penalty_factor",
    "MIN_TEMPERATURE",
    "next_token_probs",
    "generate",
]


def length_penalty_factor(length: int | Tensor, alpha: float) -> float | Tensor:
    """``lp(n) = ((5 + n) / 6) ** alpha`` of ``n = length`` generated tokens (Wu et al., 2016);
    ``length`` an int, or an integer tensor (then a float32 tensor comes back)."""
    alpha = finite_float("alpha", alpha, low=0.0)
    if isinstance(length, Tensor):
        return ((5 + tensor("length", length, kind="int").float()) / 6) ** alpha
    return ((5 + positive_int("length", length, allow_zero=True)) / 6) ** alpha


def _check_ids(model: nn.Module, **ids: object) -> None:
    """Token ids are ints in the model's target vocabulary (``eos_id`` may be None)."""
    vocab = getattr(model, "tgt_vocab_size", None)
    for name, value in ids.items():
        if value is None and name == "eos_id":
            continue
        i = positive_int(name, value, allow_zero=True)
        if vocab is not None and i >= vocab:
            raise ValueError(f"{name} must be < the model's tgt_vocab_size={vocab}, got {i}")


def _check_source(
    src: Tensor, src_mask: Tensor | None, pad_id: int
) -> tuple[Tensor, Tensor | None]:
    """Check ``src`` and ``src_mask``; return ``src`` as int64 (any integer dtype of
    ``_checks.ids``; the model checks its range) and the mask every step uses (None: no
    padding)."""
    src = ids("src", src, ndim=2, what="(B, S) of token ids", low=None)
    B, S = src.shape
    if S == 0:
        raise ValueError(f"src must have at least one position, got shape {tuple(src.shape)}")
    if src_mask is None:
        mask = src_padding_mask(src, pad_id)  # (B, 1, 1, S)
        return src, None if bool(mask.all()) else mask  # no padding: nothing to hide
    tensor("src_mask", src_mask, kind="bool", ndim=4, what="(B, 1, 1, S)")
    if src_mask.shape[0] not in (1, B):
        raise ValueError(
            f"src_mask of shape {tuple(src_mask.shape)} does not match the batch "
            f"of src {tuple(src.shape)}"
        )
    if src_mask.shape[1:] != (1, 1, S):
        raise ValueError(
            f"src_mask must have shape (B, 1, 1, S) = {(B, 1, 1, S)} for src "
            f"{tuple(src.shape)}, got {tuple(src_mask.shape)}"
        )
    return src, src_mask


class _EncoderDecoder(Protocol):
    """What the decoders call: the ``encode`` and ``decode`` of a Transformer."""

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor: ...

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor: ...


def _check_model(model: object) -> _EncoderDecoder:
    """Decoders take a :class:`~minitransformer.model.Transformer`, or anything with the same
    ``encode`` and ``decode``; returns ``model``, typed as having them."""
    if not (callable(getattr(model, "encode", None)) and callable(getattr(model, "decode", None))):
        raise TypeError(
            f"model must have encode() and decode() (a Transformer), got {type(model).__name__}"
        )
    return cast(_EncoderDecoder, model)  # checked just above


def _check_decode_args(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None,
    bos_id: int,
    eos_id: int | None,
    pad_id: int,
    cache_cls: type[AttentionCache] | None,
) -> tuple[_EncoderDecoder, Tensor, Tensor | None]:
    """The checks both decoders share; returns ``model`` (see _check_model), ``src`` as int64
    and the ``src_mask`` to use (see _check_source)."""
    seq2seq = _check_model(model)
    _check_ids(model, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    if cache_cls is not None and not (
        isinstance(cache_cls, type) and issubclass(cache_cls, AttentionCache)
    ):
        raise TypeError(f"cache_cls must be a subclass of AttentionCache, got {cache_cls!r}")
    return seq2seq, *_check_source(src, src_mask, pad_id)


def _ids(src: Tensor, shape: tuple[int, ...], fill: int) -> Tensor:
    """A ``long`` tensor of ``shape`` filled with ``fill``, on ``src``'s device."""
    return torch.full(shape, fill, dtype=torch.long, device=src.device)


def greedy_decode(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int | None = None,
    *,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
    use_cache: bool = True,
    cache_cls: type[AttentionCache] | None = None,
) -> Tensor:
    """The most likely next token at every step: ``src`` ``(B, S)`` -> ids ``(B, L)`` (section
    "Teacher forcing in training, one token at a time at inference").

    ``model`` has ``encode(src, src_mask)`` and ``decode(tgt, memory, src_mask=, cache=)``.
    ``eos_id=None`` decodes exactly ``max_len`` ids per row. ``use_cache`` feeds only the newest
    token and keeps the earlier keys/values in a :class:`~minitransformer.kv_cache.KVCache` of
    ``cache_cls`` attention caches (e.g. :class:`~minitransformer.quantize.Int8AttentionCache`);
    False recomputes the whole prefix. Same tokens either way.
    """
    max_len = positive_int("max_len", max_len)
    seq2seq, src, src_mask = _check_decode_args(
        model, src, src_mask, bos_id, eos_id, pad_id, cache_cls
    )
    B = src.shape[0]
    if B == 0:
        return _ids(src, (0, 1 if eos_id is not None else max_len), pad_id)
    # inference_mode rather than no_grad: it also skips the version-counter and view
    # bookkeeping of every tensor, a noticeable part of a cached step (many small operations).
    with torch.inference_mode():
        memory = seq2seq.encode(src, src_mask)  # (B, S, d_model), computed once
        ys = _ids(src, (B, max_len), pad_id)  # preallocated output
        ys[:, 0] = bos_id
        cache = KVCache.for_model(model, max_len, cache_cls) if use_cache else None
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)
        length = 1  # ids written so far
        for t in range(1, max_len):
            if cache is None:  # the whole prefix
                logits = seq2seq.decode(ys[:, :t], memory, src_mask=src_mask)[:, -1]  # (B, V)
            else:  # only the newest token; the cache holds the keys/values of the others
                logits = seq2seq.decode(ys[:, t - 1 : t], memory, src_mask=src_mask, cache=cache)[
                    :, -1
                ]  # (B, V)
            next_token = logits.argmax(dim=-1)  # (B,)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, pad_id)  # ended rows only pad
                finished = finished | (next_token == eos_id)
            ys[:, t] = next_token
            length = t + 1
            if eos_id is not None and bool(finished.all()):
                break
    # Cloned outside inference mode: an ordinary tensor the caller may modify or train on.
    return ys[:, :length].clone()  # (B, length)


def beam_search(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int | None = None,
    *,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
    use_cache: bool = True,
    cache_cls: type[AttentionCache] | None = None,
) -> Tensor:
    """Beam search (section "Decoding the trained model"): the ``(B, L)`` ids of
    :func:`beam_search_with_scores`, which takes the same arguments."""
    return beam_search_with_scores(
        model,
        src,
        max_len,
        bos_id,
        eos_id,
        beam_size=beam_size,
        length_penalty=length_penalty,
        src_mask=src_mask,
        pad_id=pad_id,
        use_cache=use_cache,
        cache_cls=cache_cls,
    )[0]


def _keep_best(
    best: tuple[Tensor, Tensor, Tensor], score: Tensor, seqs: Tensor, length: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Per example, the first highest ``score`` ``(B, k)`` replaces ``best`` if strictly higher
    (so of equal scores the one that finished first wins); ``seqs`` ``(B, k, max_len)``."""
    best_score, best_seq, best_len = best  # (B,), (B, max_len), (B,)
    i = score.argmax(dim=1, keepdim=True)  # (B, 1): the first maximum
    new = score.gather(1, i)[:, 0]  # (B,)
    better = new > best_score
    seq = seqs.gather(1, i[..., None].expand(-1, -1, seqs.shape[-1]))[:, 0]  # (B, max_len)
    return (
        torch.where(better, new, best_score),
        torch.where(better[:, None], seq, best_seq),
        best_len.masked_fill(better, length),
    )


def beam_search_with_scores(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int | None = None,
    *,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
    use_cache: bool = True,
    cache_cls: type[AttentionCache] | None = None,
) -> tuple[Tensor, Tensor]:
    """Keep the ``beam_size`` best partial outputs per example (section "Decoding the trained
    model").

    Every step extends each live hypothesis by every token and fills the example's free slots
    with the best extensions by summed log-probability (one ``topk`` over ``(B, k * V)``). An
    extension ending in ``eos_id`` is finished and keeps its slot, so the beam narrows; at
    ``max_len`` the live ones finish too. The answer is the finished hypothesis with the best
    score (module docstring; ``length_penalty`` is ``alpha``). Beam 1 is greedy decoding.
    Other arguments as in :func:`greedy_decode`; the cache follows the surviving hypotheses.

    Returns:
        ``(B, L)`` ids (layout of :func:`greedy_decode`) and their ``(B,)`` float32 scores.
    """
    max_len, k = positive_int("max_len", max_len), positive_int("beam_size", beam_size)
    alpha = finite_float("length_penalty", length_penalty, low=0.0)
    seq2seq, src, src_mask = _check_decode_args(
        model, src, src_mask, bos_id, eos_id, pad_id, cache_cls
    )
    B, device = src.shape[0], src.device
    if B == 0:
        out = _ids(src, (0, 1 if eos_id is not None else max_len), pad_id)
        return out, torch.zeros(0, device=device)
    with torch.inference_mode():
        # Model rows are (example, slot) pairs, B * k of them: example b owns rows b*k .. b*k+k-1.
        memory = seq2seq.encode(src, src_mask).repeat_interleave(k, dim=0)  # (B * k, S, d_model)
        if src_mask is not None and src_mask.shape[0] == B:
            src_mask = src_mask.repeat_interleave(k, dim=0)  # (B * k, 1, 1, S)
        cache = KVCache.for_model(model, max_len, cache_cls) if use_cache else None
        seqs = _ids(src, (B, k, max_len), pad_id)  # each slot's hypothesis, PAD after it
        seqs[:, :, 0] = bos_id
        # (B, k) summed log-probs of each slot's hypothesis; -inf: empty slot
        logp = torch.full((B, k), float("-inf"), device=device)
        logp[:, 0] = 0.0  # one live hypothesis to start with: BOS
        n_live = torch.ones(B, dtype=torch.long, device=device)  # live hypotheses per example
        n_done = torch.zeros(B, dtype=torch.long, device=device)  # finished ones (slots taken)
        best = (
            torch.full((B,), float("-inf"), dtype=torch.float64, device=device),
            seqs[:, 0].clone(),
            torch.ones(B, dtype=torch.long, device=device),
        )
        slot = torch.arange(k, device=device)  # (k,)
        first_row = torch.arange(B, device=device)[:, None] * k  # (B, 1): example b's first row
        for t in range(1, max_len):  # t tokens generated after this step
            rows = seqs.view(B * k, max_len)
            if cache is None:  # the whole prefix
                logits = seq2seq.decode(rows[:, :t], memory, src_mask=src_mask)[:, -1]
            else:  # only the newest token; the cache holds the rest
                logits = seq2seq.decode(rows[:, t - 1 : t], memory, src_mask=src_mask, cache=cache)[
                    :, -1
                ]  # (B * k, V)
            log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B * k, V)
            V = log_probs.shape[-1]
            candidates = logp[:, :, None] + log_probs.view(B, k, V)  # (B, k, V) every extension
            top_logp, top_index = candidates.view(B, k * V).topk(k, dim=1)  # (B, k) best first
            parent, token = top_index // V, top_index % V  # (B, k) slot extended, token added
            # An example fills only its free slots, from its live candidates.
            chosen = slot < torch.minimum(k - n_done, n_live * V)[:, None]  # (B, k)
            ended = chosen & (token == eos_id) if eos_id is not None else torch.zeros_like(chosen)
            live = chosen & ~ended
            grown = seqs.gather(1, parent[..., None].expand(-1, -1, max_len))  # (B, k, max_len)
            grown[:, :, t] = token
            if bool(ended.any()):  # finished hypotheses leave the beam, scored
                score = (top_logp.double() / length_penalty_factor(t, alpha)).masked_fill(
                    ~ended, float("-inf")
                )
                best = _keep_best(best, score, grown, t + 1)
            # The live extensions move to the first slots, best first (a stable sort on ~live).
            order = (~live).to(torch.uint8).argsort(dim=1, stable=True)  # (B, k)
            live, parent = live.gather(1, order), parent.gather(1, order)
            logp = top_logp.gather(1, order).masked_fill(~live, float("-inf"))
            seqs = grown.gather(1, order[..., None].expand(-1, -1, max_len))
            n_done, n_live = n_done + ended.sum(1), live.sum(1)
            if not bool(live.any()):
                break
            if cache is not None:  # each slot keeps the keys/values of its parent
                # Each survivor extends a beam of its own example, whose cross-attention
                # keys and values are those of the same source: only the self-attention moves.
                cache.reorder((first_row + parent).view(-1), cross_attention=False)
        else:  # max_len reached: the live hypotheses end here without EOS
            score = (logp.double() / length_penalty_factor(max_len - 1, alpha)).masked_fill(
                slot >= n_live[:, None], float("-inf")
            )
            best = _keep_best(best, score, seqs, max_len)
        best_score, best_seq, best_len = best
        out = best_seq[:, : int(best_len.max())]
    return out.clone(), best_score.float()  # (B, L), (B,)


def sequence_score(
    model: nn.Module,
    src: Tensor,
    seqs: Tensor,
    eos_id: int | None,
    *,
    length_penalty: float = 0.6,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
) -> Tensor:
    """The beam-search score (module docstring) of outputs ``seqs`` ``(B, L)``: ``(B,)`` float32.

    One teacher-forced pass; the ``n`` generated tokens of a row are those after the BOS up to
    and including the first ``eos_id`` (to its end if it has none). Compares greedy and beam
    outputs (chapter "Training a Transformer", section "Decoding the trained model").
    """
    seq2seq = _check_model(model)
    vocab = getattr(model, "tgt_vocab_size", None)
    within = "the model's target vocabulary" if vocab is not None else "the valid ids"
    seqs = ids("seqs", seqs, ndim=2, what="(B, L) of token ids", high=vocab, within=within)
    alpha = finite_float("length_penalty", length_penalty, low=0.0)
    _check_ids(model, eos_id=eos_id, pad_id=pad_id)
    src, src_mask = _check_source(src, src_mask, pad_id)
    if seqs.shape[0] != src.shape[0]:
        raise ValueError(
            f"seqs (B, L) = {tuple(seqs.shape)} must have the batch size of src {tuple(src.shape)}"
        )
    B, L = seqs.shape
    if L < 2 or B == 0:
        return torch.zeros(B, device=seqs.device)
    with torch.inference_mode():
        memory = seq2seq.encode(src, src_mask)  # (B, S, d_model)
        logits = seq2seq.decode(seqs[:, :-1], memory, src_mask=src_mask)  # (B, L - 1, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        targets = seqs[:, 1:]  # (B, L - 1): the generated tokens
        token_logp = log_probs.gather(-1, targets[..., None])[..., 0]  # (B, L - 1)
        n = torch.full((B,), L - 1, device=seqs.device)  # (B,) without EOS: the whole row
        if eos_id is not None:
            is_eos = targets == eos_id  # (B, L - 1)
            n = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, n)  # up to the first EOS
        keep = torch.arange(L - 1, device=seqs.device) < n[:, None]  # (B, L - 1)
        score = (token_logp * keep).sum(-1) / length_penalty_factor(n, alpha)  # (B,)
    return score.clone()


# -- sampling from a decoder-only language model -------------------------------------------

#: Temperatures below this are greedy decoding. ``logits / temperature`` then could overflow
#: float32 (logits of 1e3 at a temperature of 1e-36 are inf, and the softmax NaN), and a
#: sampled token would differ from the argmax only between logits closer than
#: ``MIN_TEMPERATURE * 30`` (``exp(-30) < 1e-13``): tied ones, whose order a sample ignores.
MIN_TEMPERATURE = 1e-6


def _nucleus(probs: Tensor, top_p: float) -> Tensor:
    """``(B, V)`` True at the tokens of the smallest set whose probability reaches ``top_p``:
    tokens in decreasing probability while the mass before them is below ``top_p``; a token
    tied with the last one kept is kept too, so the set does not depend on how ``sort``
    orders equal values (nor on the CPU)."""
    sorted_probs = probs.sort(dim=-1, descending=True).values  # (B, V)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V) the mass ahead of each
    # (the exact prefix sum minus the token itself: within a few ulps of the exclusive sum,
    # as close to top_p as the cumulative sum itself is)
    inside = before < top_p  # (B, V); the first token always (0 < top_p)
    smallest = sorted_probs.masked_fill(~inside, float("inf")).amin(dim=-1, keepdim=True)
    return probs >= smallest  # (B, V)


def _check_top_p(top_p: object) -> float | None:
    if top_p is None:
        return None
    return finite_float("top_p", top_p, low=0.0, high=1.0, low_open=True)


def next_token_probs(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Tensor:
    """The sampling distribution ``(B, V)`` for next-token logits ``(B, V)``.

    ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits (ties with
    the k-th are kept) and then to the nucleus of ``top_p`` (the most probable tokens whose
    probability reaches ``top_p``; ties with the last are kept), renormalised; None keeps
    all, and so does ``top_p=1``. A temperature below 1 sharpens the distribution, above 1
    flattens it; below ``MIN_TEMPERATURE`` it is its limit, uniform over the largest
    logits (never a NaN). Section "Sampling".
    """
    tensor("logits", logits, kind="float", ndim=2, what="(B, V)")
    temperature = finite_float("temperature", temperature, low=0.0, low_open=True)
    top_p = _check_top_p(top_p)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half -> float32
    if temperature < MIN_TEMPERATURE:  # the limit: only the maxima (uniform among ties)
        top = logits.amax(dim=-1, keepdim=True)
        logits = torch.zeros_like(logits).masked_fill(logits < top, float("-inf"))
    else:
        logits = logits / temperature
    if top_k is not None and positive_int("top_k", top_k) < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if top_p is None or top_p == 1.0:
        return probs
    return torch.softmax(logits.masked_fill(~_nucleus(probs, top_p), float("-inf")), dim=-1)


def generate(
    model: nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    pad_id: int = PAD_ID,
    use_cache: bool = True,
    cache: KVCache | None = None,
) -> Tensor:
    """Continue ``prompt`` ``(B, T0)`` by ``max_new_tokens`` tokens: ``(B, T0 + n)`` ids.

    ``model``: a decoder-only language model (a
    :class:`~minitransformer.lm.DecoderOnlyTransformer`): ``model(ids, cache=)`` gives
    ``(B, T, V)`` logits, ``model.max_len`` its positions. Each step draws the next token
    from :func:`next_token_probs` (``temperature``, ``top_k``, ``top_p``) with ``generator``
    (seeded: the same tokens every run), or takes the most likely one (greedy, the first of
    tied maxima, no random number drawn) when ``temperature`` is below
    ``MIN_TEMPERATURE`` (``temperature=0``) or ``top_k=1``. A row that produces
    ``eos_id`` is filled with ``pad_id`` after it, and generation stops early once every
    row has. The whole output must fit ``model.max_len`` positions.

    ``use_cache=True`` feeds the prompt once and then one token per step, keeping the keys and
    values of earlier positions in a :class:`~minitransformer.kv_cache.KVCache` (``cache``: an
    empty one to use, to inspect it afterwards); ``False`` re-reads the whole sequence every
    step. Both give the same tokens. Does not change the model's mode: call ``model.eval()``
    first. Section "Sampling" of the chapter "From the paper to a language model".
    """
    module("model", model)
    vocab = getattr(model, "vocab_size", None)
    prompt = ids(
        "prompt", prompt, ndim=2, what="(B, T0)", high=vocab if isinstance(vocab, int) else None
    )
    max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
    temperature = finite_float("temperature", temperature, low=0.0)
    top_p = _check_top_p(top_p)
    if top_k is not None:
        top_k = positive_int("top_k", top_k)
    greedy = temperature < MIN_TEMPERATURE or top_k == 1
    B, T0 = prompt.shape
    max_len = int(model.max_len)  # type: ignore[arg-type]  # a DecoderOnlyTransformer's
    if T0 == 0 or T0 + max_new_tokens > max_len:
        raise ValueError(
            f"prompt {tuple(prompt.shape)} plus max_new_tokens={max_new_tokens} "
            f"must fit 1 to max_len={max_len} positions"
        )
    if cache is not None and (not use_cache or cache.length):
        raise ValueError(
            f"cache must be an empty KVCache and use_cache True, got a cache of "
            f"length {cache.length} and use_cache={use_cache}"
        )
    if use_cache and cache is None:
        cache = KVCache.for_model(model, T0 + max_new_tokens)
    out = torch.full((B, T0 + max_new_tokens), pad_id, dtype=torch.long, device=prompt.device)
    out[:, :T0] = prompt
    finished = torch.zeros(B, dtype=torch.bool, device=prompt.device)
    length = T0
    with torch.inference_mode():  # no autograd bookkeeping: many small steps
        while length < T0 + max_new_tokens:
            if cache is None:
                logits = model(out[:, :length])[:, -1]  # (B, V): the whole sequence again
            else:  # the prompt at the first step, then only the newest token
                logits = model(out[:, cache.length : length], cache=cache)[:, -1]  # (B, V)
            if greedy:
                next_token = logits.argmax(dim=-1)  # (B,)
            else:
                probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
                next_token = torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, pad_id)  # ended rows only pad
                finished |= next_token == eos_id
            out[:, length] = next_token
            length += 1
            if eos_id is not None and bool(finished.all()):
                break
    return out[:, :length]  # (B, T0 + n)
