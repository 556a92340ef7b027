"""Autoregressive decoding: greedy search and beam search, plus the score beam search maximises.

Explained in the chapters "The encoder–decoder picture" (section "Teacher forcing and
autoregressive decoding") and "Training a Transformer" (section "Decoding the trained model").

At inference the target is unknown, so the decoder produces it one token at a time: start from
``[BOS]``, run the decoder on everything generated so far, pick the next token from the logits
at the last position, append it, repeat until ``EOS`` or until ``max_len`` ids.

Output layout of both decoders: a ``(B, L)`` ``long`` tensor with ``L <= max_len``; every row
starts with ``bos_id``; a row that produced ``eos_id`` keeps it and is filled with ``pad_id``
after it. ``max_len`` counts the BOS, so at most ``max_len - 1`` tokens are generated.

Source padding: when ``src_mask`` is None it is built from ``src != pad_id`` (the same mask
training uses), so padded positions of the source are never attended to. Pass an explicit
all-True mask to attend everywhere.

Neither function changes the model's mode: call ``model.eval()`` first (dropout off).

KV cache (chapter "Inference: the KV cache and the cost of attention"): with ``use_cache=True``
(the default) each step feeds only the newest token and a
:class:`~minitransformer.kv_cache.KVCache` keeps the keys and values of the earlier positions
(the encoder output's cross-attention keys and values are projected once); beam search reorders
the cache by the beam each surviving hypothesis came from. ``use_cache=False`` recomputes the
whole prefix at every step. Both give the same tokens.

The beam-search score of a hypothesis ``y_1 .. y_n`` (``y_n = EOS`` unless it stopped at
``max_len``) is the length-normalised log-probability of Wu et al. (2016), used with
``alpha = 0.6`` by the paper (section 6.1)::

    score(y) = sum_t log p(y_t | y_<t, x) / lp(n),    lp(n) = ((5 + n) / 6) ** alpha

``alpha = 0`` gives the plain sum of log-probabilities; larger ``alpha`` favours longer outputs.
:func:`sequence_score` computes it for any given sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minitransformer.data import PAD_ID, src_padding_mask
from minitransformer.kv_cache import AttentionCache, KVCache

__all__ = ["greedy_decode", "beam_search", "sequence_score", "length_penalty_factor"]


def length_penalty_factor(length: int | Tensor, alpha: float) -> float | Tensor:
    """``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al., 2016); 1 for ``n = 1`` or ``alpha = 0``.

    ``length`` is an int or a tensor of ints (the number of generated tokens, EOS included).
    """
    if isinstance(length, Tensor):
        length = length.float()
    return ((5 + length) / 6) ** alpha


def _check_decode_args(src: Tensor, max_len: int, src_mask: Tensor | None, pad_id: int) -> Tensor:
    if not isinstance(src, Tensor) or src.dim() != 2:
        shape = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
        raise ValueError(f"src must be a (B, S) tensor of token ids, got {shape}")
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len (longest output, BOS included) must be an int >= 1, got {max_len}")
    if src_mask is None:
        return src_padding_mask(src, pad_id)  # (B, 1, 1, S)
    if src_mask.shape[0] not in (1, src.shape[0]):
        raise ValueError(
            f"src_mask of shape {tuple(src_mask.shape)} does not match the batch of src "
            f"{tuple(src.shape)}"
        )
    return src_mask


def greedy_decode(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int | None = None,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
    use_cache: bool = True,
    cache_cls: type[AttentionCache] | None = None,
) -> Tensor:
    """Pick the most likely next token at every step (module docstring: output layout).

    Args:
        model: a :class:`~minitransformer.model.Transformer` (anything with ``encode`` and
            ``decode`` of the same signatures).
        src: source ids ``(B, S)``.
        max_len: the longest output, BOS included.
        bos_id: the first token of every output row.
        eos_id: a row stops when it produces this id (then ``pad_id`` follows); None decodes
            exactly ``max_len`` ids per row.
        src_mask: ``(B, 1, 1, S)`` boolean, True = may attend; None builds it from ``pad_id``.
        pad_id: filler after EOS, and the source padding id when ``src_mask`` is None.
        use_cache: keep the keys and values of earlier positions in a
            :class:`~minitransformer.kv_cache.KVCache` and feed only the newest token (the
            model's ``decode`` must accept ``cache=``); False recomputes the whole prefix
            every step. Same tokens either way.
        cache_cls: with ``use_cache``, how each attention stores its keys and values: the
            default :class:`~minitransformer.kv_cache.AttentionCache`, or e.g.
            :class:`~minitransformer.quantize.Int8AttentionCache` (int8, chapter "Where next").

    Returns:
        ``(B, L)`` ids, ``L <= max_len``; decoding stops as soon as every row has ended.
    """
    src_mask = _check_decode_args(src, max_len, src_mask, pad_id)
    # inference_mode rather than no_grad: besides switching autograd off, it skips the
    # version-counter and view bookkeeping of every tensor, which is a noticeable part of a
    # cached step's cost (a step is many small operations on a single token).
    with torch.inference_mode():
        memory = model.encode(src, src_mask)  # (B, S, d_model), computed once
        B = src.shape[0]
        ys = torch.full((B, max_len), pad_id, dtype=torch.long, device=src.device)  # preallocated
        ys[:, 0] = bos_id
        cache = KVCache.for_model(model, max_len, cache_cls) if use_cache else None
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)
        length = 1  # ids written so far
        for t in range(1, max_len):
            if cache is None:
                logits = model.decode(ys[:, :t], memory, src_mask=src_mask)[:, -1]  # (B, V): whole prefix
            else:  # only the newest token; the cache holds the keys/values of the others
                logits = model.decode(ys[:, t - 1 : t], memory, src_mask=src_mask, cache=cache)[:, -1]
            next_token = logits.argmax(dim=-1)  # (B,)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, pad_id)  # ended rows only pad
                finished = finished | (next_token == eos_id)
            ys[:, t] = next_token
            length = t + 1
            if eos_id is not None and bool(finished.all()):
                break
    # Cloned outside inference mode, the result is an ordinary tensor: the caller may modify
    # it in place or feed it to a model being trained.
    return ys[:, :length].clone()  # (B, length)


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int | None,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
    return_scores: bool = False,
    use_cache: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Beam search: keep the ``beam_size`` best partial outputs instead of one.

    For each example, the search holds ``beam_size`` slots. At every step each live hypothesis
    is extended by every token; the best extensions by summed log-probability fill the free
    slots. An extension ending in ``eos_id`` is finished and keeps its slot for good, so the
    beam narrows as hypotheses finish; the search for that example stops when no live
    hypothesis is left or at ``max_len`` (live hypotheses then count as finished). The answer
    is the finished hypothesis with the best length-normalised score (module docstring;
    ``length_penalty`` is ``alpha``). With ``beam_size=1`` this is exactly greedy decoding.

    Beam search is a heuristic: it usually, but not provably always, finds a higher-scoring
    output than greedy decoding (the greedy path can fall out of the beam).

    Args:
        model, src, max_len, bos_id, eos_id, src_mask, pad_id: as in :func:`greedy_decode`.
        beam_size: number of hypotheses kept per example (``>= 1``).
        length_penalty: ``alpha`` of ``lp(n) = ((5 + n) / 6) ** alpha``; the paper uses 0.6.
        return_scores: also return the ``(B,)`` scores of the chosen outputs.
        use_cache: as in :func:`greedy_decode`; the cache rows are reordered after every step
            to follow the hypotheses that survive.

    Returns:
        ``(B, L)`` ids in the layout of :func:`greedy_decode` (and the scores if asked).
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1, got {beam_size}")
    src_mask = _check_decode_args(src, max_len, src_mask, pad_id)
    memory = model.encode(src, src_mask)  # (B, S, d_model)
    B, device = src.shape[0], src.device
    if src_mask.shape[0] != B:
        src_mask = src_mask.expand(B, *src_mask.shape[1:])
    # The live hypotheses of all examples side by side, N rows in all (N <= B * beam_size):
    alive = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (N, t) prefixes
    alive_logp = torch.zeros(B, device=device)  # (N,) summed log-probabilities
    example = torch.arange(B, device=device)  # (N,) which example each row belongs to
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(B)]  # (score, ids)
    cache = KVCache.for_model(model, max_len) if use_cache else None
    for step in range(1, max_len):  # `step` tokens generated after this iteration
        if cache is None:
            logits = model.decode(alive, memory[example], src_mask=src_mask[example])[:, -1]  # (N, V)
        else:  # only the newest token of each live row; the cache holds the rest
            logits = model.decode(alive[:, -1:], memory[example], src_mask=src_mask[example],
                                  cache=cache)[:, -1]  # (N, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        V = log_probs.shape[-1]
        candidates = alive_logp[:, None] + log_probs  # (N, V): every one-token extension
        parents: list[int] = []  # row of `alive` each new live hypothesis extends
        tokens: list[int] = []
        new_logp: list[Tensor] = []
        for b in range(B):
            rows = (example == b).nonzero()[:, 0]  # (k_b,) this example's live rows
            if rows.numel() == 0:
                continue
            free = min(beam_size - len(finished[b]), rows.numel() * V)
            top_logp, top_index = candidates[rows].reshape(-1).topk(free)  # best first
            for logp, index in zip(top_logp, top_index.tolist()):
                row, token = int(rows[index // V]), index % V
                if eos_id is not None and token == eos_id:  # finished: keeps its slot
                    seq = torch.cat([alive[row], alive.new_tensor([token])])
                    finished[b].append((float(logp) / length_penalty_factor(step, length_penalty), seq))
                else:
                    parents.append(row)
                    tokens.append(token)
                    new_logp.append(logp)
        if not parents:
            break
        parent = torch.tensor(parents, device=device)  # (N',)
        alive = torch.cat([alive[parent], torch.tensor(tokens, device=device)[:, None]], dim=1)
        alive_logp = torch.stack(new_logp)  # (N',)
        example = example[parent]
        if cache is not None:
            cache.reorder(parent)  # each survivor keeps the keys/values of its parent row
    else:  # max_len reached: the live hypotheses end here without EOS
        for row in range(alive.shape[0]):
            score = float(alive_logp[row]) / length_penalty_factor(alive.shape[1] - 1, length_penalty)
            finished[int(example[row])].append((score, alive[row]))
    results, scores = [], []
    for b in range(B):
        if finished[b]:
            score, seq = max(finished[b], key=lambda f: f[0])
        else:  # max_len == 1: only BOS
            score, seq = 0.0, alive[0, :1]
        results.append(seq)
        scores.append(score)
    width = max(len(r) for r in results)
    out = torch.full((B, width), pad_id, dtype=torch.long, device=device)
    for b, r in enumerate(results):
        out[b, : len(r)] = r
    if return_scores:
        return out, torch.tensor(scores, dtype=torch.float32)
    return out


@torch.no_grad()
def sequence_score(
    model: nn.Module,
    src: Tensor,
    seqs: Tensor,
    eos_id: int | None,
    length_penalty: float = 0.6,
    src_mask: Tensor | None = None,
    pad_id: int = PAD_ID,
) -> Tensor:
    """The beam-search score of given outputs ``seqs`` ``(B, L)`` (layout of the decoders).

    Runs the model once with teacher forcing and returns ``(B,)`` scores
    ``sum_t log p(y_t | y_<t, x) / lp(n)`` over the ``n`` generated tokens of each row: those
    after the BOS, up to and including the first ``eos_id`` (a row without EOS counts to
    its end, as the decoders only leave such rows when they ran to ``max_len``). Use it to
    compare greedy and beam outputs. ``pad_id`` only serves to build ``src_mask`` if None.
    """
    if seqs.dim() != 2 or seqs.shape[0] != src.shape[0]:
        raise ValueError(
            f"seqs (B, L) = {tuple(seqs.shape)} must be 2-D with the batch size of src "
            f"{tuple(src.shape)}"
        )
    B, L = seqs.shape
    if L < 2:
        return torch.zeros(B)
    src_mask = _check_decode_args(src, L, src_mask, pad_id)
    logits = model(src, seqs[:, :-1], src_mask=src_mask)  # (B, L - 1, V)
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    targets = seqs[:, 1:]  # (B, L - 1): the generated tokens
    token_logp = log_probs.gather(-1, targets[..., None])[..., 0]  # (B, L - 1)
    lengths = []
    for row in targets.tolist():
        if eos_id is not None and eos_id in row:
            lengths.append(row.index(eos_id) + 1)
        else:  # no EOS: the decoders filled the whole row
            lengths.append(len(row))
    n = torch.tensor(lengths, device=seqs.device)  # (B,)
    keep = torch.arange(L - 1, device=seqs.device)[None, :] < n[:, None]  # (B, L - 1)
    total = (token_logp * keep).sum(-1)  # (B,)
    return (total / length_penalty_factor(n, length_penalty)).cpu()

