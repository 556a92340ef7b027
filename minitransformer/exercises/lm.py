"""Checkers for the chapter "From the paper to a language model" (``book/lm``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer.exercises._core import Case, checker, hard_wired, like, seeded, when
from minitransformer.lm import DecoderOnlyTransformer, lm_loss, next_token_probs
from minitransformer.tokenizer import merge_pair

__all__ = ["check_bpe_merge", "check_lm_loss", "check_top_k_probs"]


# -- one BPE merge step ---------------------------------------------------------------------


def _merge_advancing_by_one(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out = []
    for i, token in enumerate(ids):  # the right token of a merged pair is looked at again
        out.append(new_id if tuple(ids[i : i + 2]) == tuple(pair) else token)
    return out


def _merge_first_only(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return [*ids[:i], new_id, *ids[i + 2 :]]
    return list(ids)


def _merge_either_order(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(ids):
        if tuple(ids[i : i + 2]) in (tuple(pair), tuple(pair)[::-1]):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


_MERGE_MISTAKES = [
    when(
        lambda got: not isinstance(got, list),
        "return a new list of ints (the merged ids), got {got_type}",
    ),
    like(
        _merge_advancing_by_one,
        "after a merge your scan moves on by one token, so the pair's right token is kept or "
        "merged a second time with the next one (in [5, 5, 5] the pair (5, 5) overlaps itself). "
        "Skip both tokens of a merged pair: advance by two after a merge, by one otherwise",
    ),
    like(
        lambda ids, pair, new_id: merge_pair(ids[::-1], pair[::-1], new_id)[::-1],
        "you merge from the right: of two overlapping occurrences ([5, 5, 5] with the pair "
        "(5, 5)) the left one must merge, [9, 5], as the tokenizer's encoder and the training "
        "loop both scan left to right",
    ),
    like(
        _merge_first_only,
        "you merge only the first occurrence; a merge step replaces every occurrence of the pair",
    ),
    like(
        _merge_either_order,
        "you also merge the pair in the other order (right, left); a pair is ordered: only "
        "left followed by right merges",
    ),
    when(lambda got, ids: got == list(ids), "nothing was merged {where}"),
]


@checker(
    "one BPE merge step",
    reference=merge_pair,
    mistakes=_MERGE_MISTAKES,
    returns="merge({ids}, {pair}, {new_id})",
    otherwise="Scan left to right; where ids[i], ids[i + 1] equal the pair, write new_id "
    "and skip both, else copy ids[i]",
)
def check_bpe_merge() -> list[Case]:
    """Check ``fn(ids, pair, new_id) -> list[int]``, every ``pair`` replaced by ``new_id`` left to
    right, against :func:`~minitransformer.tokenizer.merge_pair`."""
    return [
        Case("for two occurrences", ids=[3, 4, 5, 3, 4], pair=(3, 4), new_id=9),
        Case("for a pair that overlaps itself", ids=[5, 5, 5], pair=(5, 5), new_id=9),
        Case("for the pair in both orders", ids=[6, 7, 6, 7, 6], pair=(7, 6), new_id=8),
        Case("for four equal tokens", ids=[5, 5, 5, 5, 2], pair=(5, 5), new_id=9),
        Case("for a pair that does not occur", ids=[1, 2, 3], pair=(3, 1), new_id=4),
    ]


# -- the shifted language-modelling loss ----------------------------------------------------


def _ce(logits: Tensor, targets: Tensor, **kwargs: Any) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), **kwargs)


def _per_target(model: nn.Module, tokens: Tensor) -> Tensor:  # (B, T) nats of each target
    logits = model(tokens[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")


def _masked_mean_by_inputs(model: nn.Module, tokens: Tensor, pad_id: int) -> Tensor:
    keep = tokens[:, :-1] != pad_id  # the inputs, not the targets
    return _per_target(model, tokens)[keep].mean()


def _mean_of_row_means(model: nn.Module, tokens: Tensor, pad_id: int) -> Tensor:
    keep = (tokens[:, 1:] != pad_id).double()
    return ((_per_target(model, tokens) * keep).sum(1) / keep.sum(1)).mean()


_LOSS_MISTAKES = [
    when(
        lambda got: isinstance(got, Tensor) and got.dim() > 0,
        "your loss has shape {got.shape}; return one number, the mean over every target that "
        "is not pad_id (a 0-d tensor)",
    ),
    like(
        [
            lambda model, tokens, pad_id: _ce(
                model(tokens[:, :-1]), tokens[:, :-1], ignore_index=pad_id
            ),
            lambda model, tokens, pad_id: _ce(model(tokens), tokens, ignore_index=pad_id),
        ],
        "the targets are not shifted: you score each position on the token it reads. The "
        "logits at position t predict the next token, so compare model(tokens[:, :-1]) with "
        "tokens[:, 1:]",
    ),
    like(
        lambda model, tokens, pad_id: _ce(
            model(tokens[:, 1:]), tokens[:, :-1], ignore_index=pad_id
        ),
        "you shifted the wrong way, asking each token to predict the one before it: the "
        "model reads tokens[:, :-1] and its targets are tokens[:, 1:]",
    ),
    like(
        lambda model, tokens, pad_id: _ce(model(tokens[:, :-1]), tokens[:, 1:]),
        "your mean includes the padded targets: the model is scored on predicting padding. "
        "Leave out every target equal to pad_id (ignore_index=pad_id)",
    ),
    like(
        lambda model, tokens, pad_id: (
            _per_target(model, tokens) * (tokens[:, 1:] != pad_id)
        ).mean(),
        "you zero the loss of the padded targets but still divide by all B x T of them: "
        "divide by the number of targets that are not pad_id",
    ),
    like(
        _masked_mean_by_inputs,
        "you leave out the positions whose input is padding; leave out those whose target, "
        "tokens[:, 1:], is pad_id (the last real token's target is padding too)",
    ),
    like(
        _mean_of_row_means,
        "you average each sequence, then the sequences, so that a short sequence weighs as "
        "much as a long one: take one mean over all the targets that are not pad_id",
    ),
    like(
        lambda model, tokens, pad_id: _ce(
            model(tokens[:, :-1]), tokens[:, 1:], ignore_index=pad_id, reduction="sum"
        ),
        "you return the sum over the targets; the loss is their mean",
    ),
]


@checker(
    "the causal language-modelling loss",
    reference=lambda model, tokens, pad_id: lm_loss(model, tokens, pad_id=pad_id),
    mistakes=_LOSS_MISTAKES,
    returns="the loss",
    otherwise="It should be the mean cross-entropy (natural log) of model(tokens[:, :-1]) "
    "against tokens[:, 1:], over the targets that are not pad_id",
)
def check_lm_loss(gen: torch.Generator) -> list[Case]:
    """Check ``fn(model, tokens, pad_id)``, the mean next-token loss of ``tokens`` ``(B, T + 1)``
    (right-padded with ``pad_id``), against :func:`~minitransformer.lm.lm_loss`."""
    model = seeded(
        0,
        lambda: DecoderOnlyTransformer(
            12, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=16, dropout=0.0
        ).eval(),
    )
    padded = torch.randint(1, 12, (3, 9), generator=gen)  # ids 1..11: 0 is the padding
    padded[1, 6:] = 0
    padded[2, 3:] = 0
    return [
        Case(
            "for 3 sequences of 9 tokens, two of them padded with pad_id = 0",
            model=model,
            tokens=padded,
            pad_id=0,
        ),
        Case(
            "for 2 sequences without padding",
            model=model,
            tokens=torch.randint(1, 12, (2, 7), generator=gen),
            pad_id=0,
        ),
        Case(
            "for 3 sequences padded with pad_id = 11",
            model=model,
            tokens=torch.where(padded == 0, 11, padded % 11),  # ids 0..10, then 11 as padding
            pad_id=11,
            hint=hard_wired("the pad id 0"),
        ),
    ]


# -- temperature and top-k ------------------------------------------------------------------


def _probs(logits: Tensor, temperature: float, k: int) -> Tensor:
    return next_token_probs(logits, temperature=temperature, top_k=k)


def _kth(logits: Tensor, k: int) -> Tensor:  # (B, 1): the k-th largest logit of each row
    return logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]


_TOP_K_MISTAKES = [
    when(
        lambda got, want: (
            isinstance(got, Tensor) and got.shape == want.shape and bool(torch.isinf(got).any())
        ),
        "your answer holds -inf: those are the filtered logits. Return probabilities, the "
        "softmax of the filtered logits",
    ),
    like(
        lambda logits, temperature, k: _probs(logits, temperature, k + 1),
        "you keep k + 1 tokens per row; keep the k largest",
    ),
    like(
        lambda logits, temperature, k: torch.softmax(
            (logits / temperature).masked_fill(logits <= _kth(logits, k), float("-inf")), -1
        ),
        "you keep k - 1 tokens per row: the k-th largest logit must stay (filter the logits "
        "strictly below it)",
    ),
    like(
        lambda logits, temperature, k: _probs(logits, 1.0, k),
        "the temperature has no effect in your answer: divide the logits by it before the softmax "
        "(dividing or rescaling the probabilities afterwards is undone by renormalising)",
    ),
    like(
        lambda logits, temperature, k: _probs(logits, 1.0, k) / temperature,
        "you divide the probabilities by the temperature, after the softmax; divide the "
        "logits, before it",
    ),
    like(
        lambda logits, temperature, k: _probs(logits * temperature**2, temperature, k),
        "you multiply the logits by the temperature; divide by it, so that a temperature "
        "below 1 sharpens the distribution and one above 1 flattens it",
    ),
    like(
        lambda logits, temperature, k: torch.softmax(logits / temperature, -1).masked_fill(
            logits < _kth(logits, k), 0.0
        ),
        "your rows sum to less than 1: after dropping the tokens outside the top k, renormalise "
        "the k kept probabilities (or fill the dropped logits with -inf before the softmax)",
    ),
    like(
        lambda logits, temperature, k: torch.softmax(
            (logits / temperature).masked_fill(logits < _kth(logits, k), 0.0), -1
        ),
        "the tokens outside the top k still get some probability: fill their logits with -inf, "
        "not 0, before the softmax",
    ),
    when(
        lambda got: not torch.allclose(got.double().sum(-1), torch.ones((), dtype=torch.float64)),
        "each row must be a probability distribution that sums to 1",
    ),
]


@checker(
    "temperature and top-k sampling probabilities",
    reference=_probs,
    mistakes=_TOP_K_MISTAKES,
    returns="the probabilities",
    otherwise="They should be softmax(logits / temperature) over the k largest logits of "
    "each row, 0 elsewhere",
)
def check_top_k_probs(gen: torch.Generator) -> list[Case]:
    """Check ``fn(logits, temperature, k) -> probs``, both ``(B, V)``, against
    :func:`~minitransformer.lm.next_token_probs`."""
    logits = torch.randn(2, 8, generator=gen) * 2  # no ties: the top k is unique
    return [
        Case("for temperature 0.5 and k = 3", logits=logits, temperature=0.5, k=3),
        Case("for temperature 2.0 and k = 5", logits=logits, temperature=2.0, k=5),
        Case(
            "for temperature 1.0 and k = 8 (the whole vocabulary)",
            logits=logits,
            temperature=1.0,
            k=8,
        ),
    ]
