"""The parameter column of the paper's Table 3, counted (chapter "The paper's Table 3 at toy
scale"): the package's counts for every row of :func:`table3_configs`, pinned, checked against a
count by hand and set beside the paper's numbers."""

from __future__ import annotations

import pytest
import torch

from minitransformer.model import Transformer, parameter_breakdown, table3_configs

VOCAB = 37000  # the shared EN-DE byte-pair vocabulary of about 37,000 tokens (paper, 5.1)

# The package's counts with one shared, tied 37,000 x d_model embedding.
PINNED = {
    "base": 63_082_496,
    "(A) h=1": 63_082_496,
    "(A) h=4": 63_082_496,
    "(A) h=16": 63_082_496,
    "(A) h=32": 63_082_496,
    "(B) d_k=16": 48_905_984,
    "(B) d_k=32": 53_631_488,
    "(C) N=2": 33_656_832,
    "(C) N=4": 48_369_664,
    "(C) N=8": 77_795_328,
    "(C) d_model=256": 26_834_944,
    "(C) d_model=1024": 163_889_152,
    "(C) d_ff=1024": 50_487_296,
    "(C) d_ff=4096": 88_272_896,
    "big": 214_245_376,
}

# Vaswani et al. (2017), Table 3, "params x 10^6" (rows (A) list none: they equal the base).
PAPER_MILLIONS = {
    "base": 65,
    "(B) d_k=16": 58,
    "(B) d_k=32": 60,
    "(C) N=2": 36,
    "(C) N=4": 50,
    "(C) N=8": 80,
    "(C) d_model=256": 28,
    "(C) d_model=1024": 168,
    "(C) d_ff=1024": 53,
    "(C) d_ff=4096": 90,
    "big": 213,
}


def by_hand(num_layers, d_model, d_ff, num_heads, head_dim=None, *, d_v=None, vocab=VOCAB):
    """The count written out: one V x d_model embedding; per attention W^Q, W^K (h d_k columns)
    and W^V, W^O (h d_v), with biases; the FFN's two linear maps; 2 d_model per LayerNorm; an
    encoder layer has 1 attention and 2 norms, a decoder layer 2 attentions and 3 norms."""
    d_k = head_dim or d_model // num_heads
    d_v = d_v or d_k
    attention = 2 * (d_model * num_heads * d_k + num_heads * d_k)  # W^Q, W^K and biases
    attention += d_model * num_heads * d_v + num_heads * d_v  # W^V and bias
    attention += num_heads * d_v * d_model + d_model  # W^O and bias
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    encoder_layer = attention + ffn + 2 * 2 * d_model
    decoder_layer = 2 * attention + ffn + 3 * 2 * d_model
    return vocab * d_model + num_layers * (encoder_layer + decoder_layer)


def count(config: dict) -> dict[str, int]:
    with torch.device("meta"):  # no memory is allocated
        return parameter_breakdown(Transformer(VOCAB, VOCAB, **config))


def test_table3_configs_name_every_row_with_a_size() -> None:
    rows = table3_configs()
    assert list(rows) == list(PINNED)
    assert rows["base"] == {"num_layers": 6, "d_model": 512, "d_ff": 2048, "num_heads": 8}
    assert rows["big"] == {"num_layers": 6, "d_model": 1024, "d_ff": 4096, "num_heads": 16}
    rows["base"]["num_layers"] = 1  # a new dict each call: nothing global to spoil
    assert table3_configs()["base"]["num_layers"] == 6


@pytest.mark.parametrize("row", list(PINNED))
def test_table3_counts_are_pinned_and_match_a_count_by_hand(row) -> None:
    config = table3_configs()[row]
    counts = count(config)
    assert counts["total"] == PINNED[row]
    assert counts["total"] == by_hand(**config)
    assert counts["embeddings"] == VOCAB * config["d_model"]  # one matrix, tied three ways


def test_heads_at_constant_width_do_not_change_the_count() -> None:
    """Row (A) varies h at d_k = d_model / h: the same parameters, as the paper intends."""
    assert {PINNED[row] for row in PINNED if row.startswith("(A)")} == {PINNED["base"]}


@pytest.mark.parametrize("row", list(PAPER_MILLIONS))
def test_table3_counts_beside_the_paper(row) -> None:
    """With V = 37,000, every row lies 1 to 4.2M below the paper's column, except big, 1.25M
    above. Rows (B) are compared in the paper's configuration, d_v = 64 (the package's
    head_dim sets d_v = d_k, which removes a further h (64 - d_k)(2 d_model + 1) per attention
    layer)."""
    config = table3_configs()[row]
    ours = by_hand(**config, d_v=64) if row.startswith("(B)") else PINNED[row]
    difference = ours - PAPER_MILLIONS[row] * 1e6
    if row == "big":
        assert 1.2e6 < difference < 1.3e6
    else:
        assert -4.2e6 < difference < -1.0e6
    if row.startswith("(B)"):
        d_k, h = config["head_dim"], config["num_heads"]
        assert ours - PINNED[row] == 18 * h * (64 - d_k) * (2 * 512 + 1)  # 3 N = 18 attentions
