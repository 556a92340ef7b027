"""The checkers of the chapter "From the paper to a language model" accept right answers written
independently of the package, report an untouched stub, and reject each typical mistake with its
own hint, including a function that changes its input in place."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checker_helpers import rejects, rejects_in_place, stub, verdict

from minitransformer.exercises import check_bpe_merge, check_lm_loss, check_top_k_probs
from minitransformer.lm import lm_loss

# ---------------------------------------------------------------------------- one merge step


def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_with_a_string_replace(ids, pair, new_id):
    """Another right answer: tokens as one-character strings, str.replace scans left to right."""
    text = "".join(chr(0x100 + i) for i in ids)
    merged = text.replace(chr(0x100 + pair[0]) + chr(0x100 + pair[1]), chr(0x100 + new_id))
    return [ord(c) - 0x100 for c in merged]


def test_merge_accepts_right_answers(capsys):
    for fn in (merge, merge_with_a_string_replace):
        assert verdict(capsys, check_bpe_merge, fn) == "Correct: one BPE merge step.\n"
    assert verdict(capsys, check_bpe_merge, stub).startswith("Not attempted yet")


def merge_advancing_by_one(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)  # and forgets to skip ids[i + 1]
        else:
            out.append(ids[i])
    return out


def merge_right_to_left(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i >= 1 and (ids[i - 1], ids[i]) == tuple(pair):
            out.insert(0, new_id)
            i -= 2
        else:
            out.insert(0, ids[i])
            i -= 1
    return out


def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return ids[:i] + [new_id] + ids[i + 2 :]
    return ids[:]


def merge_unordered(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if sorted(ids[i : i + 2]) == sorted(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (merge_advancing_by_one, "moves on by one token"),
        (merge_right_to_left, "you merge from the right"),
        (merge_first_only, "only the first occurrence"),
        (merge_unordered, "in the other order"),
        (lambda ids, pair, new_id: list(ids), "nothing was merged for two occurrences"),
        (lambda ids, pair, new_id: torch.tensor(merge(ids, pair, new_id)), "got Tensor"),
        (
            lambda ids, pair, new_id: [new_id if t == pair[0] else t for t in ids if t != pair[1]],
            r"overlaps itself is \[\], expected \[9, 5\]",
        ),
    ],
)
def test_merge_rejects_mistakes(wrong, hint):
    rejects(check_bpe_merge, wrong, hint)


def test_merge_that_edits_the_list_in_place_is_rejected():
    def in_place(ids, pair, new_id):
        i = 0
        while i < len(ids) - 1:
            if (ids[i], ids[i + 1]) == tuple(pair):
                ids[i : i + 2] = [new_id]  # the caller's list shrinks
            i += 1
        return ids

    rejects_in_place(check_bpe_merge, in_place, "ids", right=True)


# ---------------------------------------------------------------------------- the shifted loss


def lm_loss_by_hand(model, tokens, pad_id):
    logits = model(tokens[:, :-1])  # (B, T, V)
    targets = tokens[:, 1:]
    log_p = torch.log_softmax(logits.double(), dim=-1)
    nll = -log_p.gather(-1, targets[..., None])[..., 0]  # (B, T)
    keep = targets != pad_id
    return nll[keep].sum() / keep.sum()


def lm_loss_from_the_whole_sequence(model, tokens, pad_id):
    """Also right: the causal model's logits at positions 0..T-1 do not see the last token."""
    logits = model(tokens)[:, :-1]
    return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], ignore_index=pad_id)


def test_lm_loss_accepts_right_answers(capsys):
    for fn in (lm_loss_by_hand, lm_loss_from_the_whole_sequence):
        assert verdict(capsys, check_lm_loss, fn) == (
            "Correct: the causal language-modelling loss.\n"
        )
    assert verdict(capsys, check_lm_loss, stub).startswith("Not attempted yet")


def _ce(logits, targets, **kwargs):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), **kwargs)


def _nll(model, tokens):
    logits = model(tokens[:, :-1])
    return -torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]  # (B, T)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (
            lambda m, t, p: _ce(m(t[:, :-1]), t[:, :-1], ignore_index=p),
            "the targets are not shifted",
        ),
        (lambda m, t, p: _ce(m(t), t, ignore_index=p), "the targets are not shifted"),
        (lambda m, t, p: _ce(m(t[:, 1:]), t[:, :-1], ignore_index=p), "shifted the wrong way"),
        (lambda m, t, p: _ce(m(t[:, :-1]), t[:, 1:]), "includes the padded targets"),
        (
            lambda m, t, p: (_nll(m, t) * (t[:, 1:] != p)).sum() / t[:, 1:].numel(),
            "still divide by all B x T",
        ),
        (lambda m, t, p: _nll(m, t)[t[:, :-1] != p].mean(), "whose input is padding"),
        (
            lambda m, t, p: torch.stack(
                [row[keep].mean() for row, keep in zip(_nll(m, t), t[:, 1:] != p, strict=True)]
            ).mean(),
            "you average each sequence, then the sequences",
        ),
        (lambda m, t, p: _nll(m, t)[t[:, 1:] != p].sum(), "the sum over the targets"),
        (lambda m, t, p: _nll(m, t) * (t[:, 1:] != p), r"has shape \(3, 8\)"),
        (
            lambda m, t, p: _nll(m, t)[t[:, 1:] != p].mean() / torch.log(torch.tensor(2.0)),
            "natural log",
        ),
    ],
)
def test_lm_loss_rejects_mistakes(wrong, hint):
    rejects(check_lm_loss, wrong, hint)


def test_lm_loss_that_overwrites_the_padding_in_place_is_rejected():
    def in_place(model, tokens, pad_id):
        tokens[tokens == pad_id] = -100  # the caller's tokens now hold an invalid id
        logits = model(tokens[:, :-1].clamp(min=0))
        return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], ignore_index=-100)

    rejects_in_place(check_lm_loss, in_place, "tokens", right=True)


# ---------------------------------------------------------------------------- temperature, top-k


def top_k_probs(logits, temperature, k):
    scaled = logits / temperature
    kept = torch.zeros_like(scaled, dtype=torch.bool)
    kept.scatter_(-1, scaled.topk(min(k, scaled.shape[-1]), dim=-1).indices, True)
    return torch.softmax(scaled.masked_fill(~kept, float("-inf")), dim=-1)


def top_k_probs_renormalised(logits, temperature, k):
    """Also right: the softmax first, then the k largest kept and renormalised."""
    p = torch.softmax(logits / temperature, dim=-1)
    kth = p.sort(dim=-1, descending=True).values[:, min(k, p.shape[-1]) - 1 :][:, :1]
    p = torch.where(p >= kth, p, torch.zeros_like(p))
    return p / p.sum(-1, keepdim=True)


def test_top_k_accepts_right_answers(capsys):
    for fn in (top_k_probs, top_k_probs_renormalised):
        assert verdict(capsys, check_top_k_probs, fn) == (
            "Correct: temperature and top-k sampling probabilities.\n"
        )
    assert verdict(capsys, check_top_k_probs, stub).startswith("Not attempted yet")


def _filtered(logits, k, fill=float("-inf"), strict=False):
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits <= kth if strict else logits < kth, fill)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda x, t, k: top_k_probs(x, t, k + 1), r"k \+ 1 tokens"),
        (lambda x, t, k: torch.softmax(_filtered(x / t, k, strict=True), -1), "k - 1 tokens"),
        (lambda x, t, k: top_k_probs(x, 1.0, k), "the temperature has no effect"),
        (lambda x, t, k: top_k_probs(torch.softmax(x, -1).log(), 1.0, k) / t, "after the softmax"),
        (lambda x, t, k: top_k_probs(x * t, 1.0, k), "you multiply the logits by the temperature"),
        (
            lambda x, t, k: torch.softmax(x / t, -1) * (_filtered(x, k) > float("-inf")),
            "your rows sum to less than 1",
        ),
        (
            lambda x, t, k: torch.softmax(_filtered(x / t, k, fill=0.0), -1),
            "not 0, before the softmax",
        ),
        (lambda x, t, k: _filtered(x / t, k), "those are the filtered logits"),
        (lambda x, t, k: torch.softmax(_filtered(x / t, k), 0), "sums to 1"),
    ],
)
def test_top_k_rejects_mistakes(wrong, hint):
    rejects(check_top_k_probs, wrong, hint)


def test_top_k_that_divides_the_logits_in_place_is_rejected():
    def in_place(logits, temperature, k):
        logits /= temperature  # the caller's logits are rescaled
        return top_k_probs(logits, 1.0, k)

    rejects_in_place(check_top_k_probs, in_place, "logits", right=True)


def test_lm_loss_with_a_hard_wired_pad_id_is_caught():
    rejects(
        check_lm_loss,
        lambda model, tokens, pad_id: lm_loss(model, tokens, pad_id=0),
        "hard-wire the pad id",
    )
