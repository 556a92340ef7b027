"""The beam search of minitransformer before its rewrite on a fixed (B, beam_size) layout, frozen.

``tests/test_decoding.py`` checks that the package's :func:`~minitransformer.decoding.beam_search`
returns the same tokens and scores as this version on seeded random models, and
``benchmarks/bench_decoding.py`` times the two side by side. Kept verbatim except: masks are
passed to ``model.decode`` by keyword, the argument checks are left out, and the length penalty
is written inline, so that later changes to the package cannot change what this computes.
Not part of the package: do not use it elsewhere.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minitransformer.data import PAD_ID, src_padding_mask
from minitransformer.kv_cache import KVCache


def _lp(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def frozen_beam_search(
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
    """The old beam search: per-example Python loops over a narrowing beam of
    N <= B * beam_size rows."""
    if src_mask is None:
        src_mask = src_padding_mask(src, pad_id)  # (B, 1, 1, S)
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
            logits = model.decode(alive, memory[example], src_mask=src_mask[example])[
                :, -1
            ]  # (N, V)
        else:  # only the newest token of each live row; the cache holds the rest
            logits = model.decode(
                alive[:, -1:], memory[example], src_mask=src_mask[example], cache=cache
            )[:, -1]  # (N, V)
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
            for logp, index in zip(top_logp, top_index.tolist(), strict=True):
                row, token = int(rows[index // V]), index % V
                if eos_id is not None and token == eos_id:  # finished: keeps its slot
                    seq = torch.cat([alive[row], alive.new_tensor([token])])
                    finished[b].append((float(logp) / _lp(step, length_penalty), seq))
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
            score = float(alive_logp[row]) / _lp(alive.shape[1] - 1, length_penalty)
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
