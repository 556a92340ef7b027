"""Tests for minitransformer.model: equality with torch.nn.Transformer* layers and stacks, the
paper's parameter counts, tied embeddings, decoder causality, masks and input errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from minitransformer.attention import MultiHeadAttention, causal_mask, padding_mask
from minitransformer.model import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    Transformer,
    parameter_breakdown,
)

D_MODEL, HEADS, D_FF = 16, 4, 32
ATOL = 1e-5


def small_model(**kwargs) -> Transformer:
    config = dict(
        d_model=D_MODEL, num_heads=HEADS, num_layers=2, d_ff=D_FF, dropout=0.0, max_len=32
    )
    config.update(kwargs)
    return Transformer(11, 11, **config).eval()


def lengths_mask(lengths: list[int], S: int) -> torch.Tensor:
    """(B, S) boolean, True at real tokens: the opposite of torch's key_padding_mask."""
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


# --------------------------------------------------------------------------------------------
# Equality with torch layers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_encoder_layer_matches_torch(norm_first: bool, with_mask: bool, device) -> None:
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(
        D_MODEL, HEADS, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, device=device
    ).eval()
    ours = EncoderLayer.from_torch(ref).eval()
    assert ours.norm_first is norm_first
    x = torch.randn(3, 7, D_MODEL, device=device)
    if with_mask:
        keep = lengths_mask([7, 4, 1], 7).to(device)  # (B, S), True = real token
        want = ref(x, src_key_padding_mask=~keep)  # torch: True = blocked
        got = ours(x, keep[:, None, None, :])
        # torch's fast path may write anything at padded *query* rows; compare real rows only.
        torch.testing.assert_close(got[keep], want[keep], atol=ATOL, rtol=0)
    else:
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_decoder_layer_matches_torch(norm_first: bool, with_mask: bool, device) -> None:
    torch.manual_seed(1)
    ref = nn.TransformerDecoderLayer(
        D_MODEL, HEADS, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, device=device
    ).eval()
    ours = DecoderLayer.from_torch(ref).eval()
    assert ours.norm_first is norm_first
    x, memory = torch.randn(3, 5, D_MODEL, device=device), torch.randn(3, 6, D_MODEL, device=device)
    if with_mask:
        causal = torch.ones(5, 5, dtype=torch.bool, device=device).tril()  # True = may attend
        src_keep = lengths_mask([6, 2, 4], 6).to(device)
        want = ref(x, memory, tgt_mask=~causal, memory_key_padding_mask=~src_keep)
        got = ours(x, memory, tgt_mask=causal, src_mask=src_keep[:, None, None, :])
    else:
        want, got = ref(x, memory), ours(x, memory)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_from_torch_copies_sizes_and_rejects_unsupported_layers() -> None:
    ref = nn.TransformerEncoderLayer(
        D_MODEL, HEADS, D_FF, dropout=0.3, batch_first=True, layer_norm_eps=1e-6
    )
    ours = EncoderLayer.from_torch(ref)
    assert ours.self_attn.num_heads == HEADS
    assert ours.feed_forward.linear1.out_features == D_FF
    assert ours.dropout1.p == 0.3 and ours.norm1.eps == 1e-6
    with pytest.raises(ValueError, match="batch_first"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF))
    with pytest.raises(ValueError, match="relu"):
        EncoderLayer.from_torch(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, batch_first=True, activation="gelu")
        )
    with pytest.raises(ValueError, match="batch_first"):
        DecoderLayer.from_torch(nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF))


# --------------------------------------------------------------------------------------------
# Equality with torch stacks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_torch(norm_first: bool) -> None:
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(
        D_MODEL, HEADS, D_FF, batch_first=True, norm_first=norm_first
    )
    final = nn.LayerNorm(D_MODEL) if norm_first else None  # pre-LN stacks need a final norm
    ref = nn.TransformerEncoder(layer, num_layers=3, norm=final, enable_nested_tensor=False).eval()
    with torch.no_grad():  # make the final norm non-trivial, so copying it is tested
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ours = Encoder.from_torch(ref).eval()
    assert len(ours.layers) == 3 and (ours.norm is not None) == norm_first
    x = torch.randn(2, 6, D_MODEL)
    keep = lengths_mask([6, 3], 6)
    torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
    got = ours(x, keep[:, None, None, :])
    want = ref(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(got[keep], want[keep], atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_matches_torch(norm_first: bool) -> None:
    torch.manual_seed(3)
    layer = nn.TransformerDecoderLayer(
        D_MODEL, HEADS, D_FF, batch_first=True, norm_first=norm_first
    )
    final = nn.LayerNorm(D_MODEL) if norm_first else None
    ref = nn.TransformerDecoder(layer, num_layers=3, norm=final).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ours = Decoder.from_torch(ref).eval()
    x, memory = torch.randn(2, 5, D_MODEL), torch.randn(2, 4, D_MODEL)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    keep = lengths_mask([4, 2], 4)
    want = ref(x, memory, tgt_mask=~causal, memory_key_padding_mask=~keep)
    got = ours(x, memory, tgt_mask=causal, src_mask=keep[:, None, None, :])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_default_stacks_have_final_norm_only_for_pre_ln() -> None:
    assert Encoder(2, D_MODEL, HEADS, D_FF, norm_first=False).norm is None
    assert isinstance(Encoder(2, D_MODEL, HEADS, D_FF, norm_first=True).norm, nn.LayerNorm)
    assert Decoder(2, D_MODEL, HEADS, D_FF, norm_first=False).norm is None
    assert isinstance(Decoder(2, D_MODEL, HEADS, D_FF, norm_first=True).norm, nn.LayerNorm)


def test_feed_forward_is_relu_mlp_applied_per_position() -> None:
    torch.manual_seed(4)
    ffn = FeedForward(D_MODEL, D_FF, dropout=0.0)
    x = torch.randn(2, 3, D_MODEL)
    want = (
        torch.relu(x @ ffn.linear1.weight.T + ffn.linear1.bias) @ ffn.linear2.weight.T
        + ffn.linear2.bias
    )
    torch.testing.assert_close(ffn(x), want)
    # position-wise: each position alone gives the same result
    torch.testing.assert_close(ffn(x[:, 1:2]), ffn(x)[:, 1:2])


# --------------------------------------------------------------------------------------------
# The whole model
# --------------------------------------------------------------------------------------------


def test_transformer_shapes_and_forward_equals_encode_then_decode() -> None:
    torch.manual_seed(5)
    model = small_model()
    src, tgt = torch.randint(0, 11, (3, 7)), torch.randint(0, 11, (3, 5))
    src_mask = padding_mask(torch.tensor([7, 3, 5]), 7)  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)
    assert memory.shape == (3, 7, D_MODEL)
    logits = model.decode(tgt, memory, src_mask=src_mask)
    assert logits.shape == (3, 5, 11)
    torch.testing.assert_close(model(src, tgt, src_mask=src_mask), logits)


def test_embeddings_are_scaled_by_sqrt_d_model() -> None:
    model = small_model()
    tokens = torch.tensor([[3, 4]])
    want = model.src_embed.weight[tokens] * D_MODEL**0.5 + model.positional.pe[:2]
    torch.testing.assert_close(model.embed(tokens, model.src_embed), want)


def test_source_padding_is_ignored() -> None:
    """Changing the tokens at masked source positions changes nothing in the output."""
    torch.manual_seed(6)
    model = small_model()
    src = torch.randint(3, 11, (2, 6))
    src_mask = padding_mask(torch.tensor([4, 6]), 6)
    other = src.clone()
    other[0, 4:] = torch.tensor([7, 9])  # row 0's padded positions
    tgt = torch.randint(3, 11, (2, 4))
    torch.testing.assert_close(
        model(src, tgt, src_mask=src_mask), model(other, tgt, src_mask=src_mask)
    )


CAUSAL_MODEL = {}


@settings(max_examples=12, deadline=None)
@given(
    T=st.integers(2, 8), t=st.integers(0, 7), seed=st.integers(0, 2**16), norm_first=st.booleans()
)
def test_decoder_is_causal(T: int, t: int, seed: int, norm_first: bool) -> None:
    """The logits at position t do not depend on target tokens after t."""
    t = t % T
    gen = torch.Generator().manual_seed(seed)
    if norm_first not in CAUSAL_MODEL:  # build each model once: hypothesis calls this often
        torch.manual_seed(10)
        CAUSAL_MODEL[norm_first] = small_model(norm_first=norm_first)
    model = CAUSAL_MODEL[norm_first]
    src = torch.randint(3, 11, (2, 5), generator=gen)
    tgt = torch.randint(3, 11, (2, T), generator=gen)
    changed = tgt.clone()
    changed[:, t + 1 :] = torch.randint(3, 11, (2, T - t - 1), generator=gen)
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=0)


def test_target_mask_is_combined_with_causal_mask() -> None:
    torch.manual_seed(7)
    model = small_model()
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, 11, (2, 4))
    memory = model.encode(src)
    all_true = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    torch.testing.assert_close(
        model.decode(tgt, memory, tgt_mask=all_true), model.decode(tgt, memory)
    )
    pad = padding_mask(torch.tensor([4, 2]), 4)  # row 1: positions 2, 3 are padding
    w = model.attention_weights(src, tgt, tgt_mask=pad)["decoder_self"][0]  # (B, h, T, T)
    assert torch.all(w.triu(1) == 0)  # causal
    assert torch.all(w[1, :, :, 2:] == 0)  # padding keys hidden


def test_attention_weights_are_kept_for_plotting() -> None:
    model = small_model(num_layers=3)
    src, tgt = torch.randint(3, 11, (2, 6)), torch.randint(3, 11, (2, 4))
    maps = model.attention_weights(src, tgt)
    assert [w.shape for w in maps["encoder"]] == [(2, HEADS, 6, 6)] * 3
    assert [w.shape for w in maps["decoder_self"]] == [(2, HEADS, 4, 4)] * 3
    assert [w.shape for w in maps["cross"]] == [(2, HEADS, 4, 6)] * 3
    for w in maps["cross"]:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, HEADS, 4))
        assert not w.requires_grad


# --------------------------------------------------------------------------------------------
# Tied embeddings and parameter counts
# --------------------------------------------------------------------------------------------


def test_tied_embeddings_share_one_matrix_when_vocabularies_match() -> None:
    model = Transformer(20, 20, d_model=8, num_heads=2, num_layers=1, d_ff=16)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output.weight
    untied = Transformer(
        20, 20, d_model=8, num_heads=2, num_layers=1, d_ff=16, tie_embeddings=False
    )
    ids = {id(untied.src_embed.weight), id(untied.tgt_embed.weight), id(untied.output.weight)}
    assert len(ids) == 3
    assert parameter_breakdown(untied)["embeddings"] == 3 * 20 * 8
    assert parameter_breakdown(model)["embeddings"] == 20 * 8


def test_tied_embeddings_with_different_vocabularies_tie_target_and_output() -> None:
    model = Transformer(30, 20, d_model=8, num_heads=2, num_layers=1, d_ff=16)
    assert model.tgt_embed.weight is model.output.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert parameter_breakdown(model)["embeddings"] == (30 + 20) * 8


def test_tied_weight_gets_gradient_from_all_uses() -> None:
    torch.manual_seed(9)
    model = small_model()
    logits = model(torch.randint(3, 11, (2, 4)), torch.randint(3, 11, (2, 3)))
    logits.sum().backward()
    assert model.output.weight.grad is not None
    assert model.output.weight.grad is model.src_embed.weight.grad


def layer_count(d_model: int, d_ff: int, cross: bool) -> int:
    """Parameters of one layer counted by hand: 4 projections (with biases) per attention,
    two linear maps of the FFN, 2 (gamma, beta) per LayerNorm."""
    attention = 4 * (d_model * d_model + d_model)
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norms = (3 if cross else 2) * 2 * d_model
    return (2 if cross else 1) * attention + ffn + norms


@pytest.mark.parametrize(
    "d_model, num_heads, d_ff, paper_millions",
    [(512, 8, 2048, 65), (1024, 16, 4096, 213)],
    ids=["base", "big"],
)
def test_parameter_counts_match_the_paper(d_model, num_heads, d_ff, paper_millions) -> None:
    with torch.device("meta"):  # no memory is allocated
        model = Transformer(
            37000, 37000, d_model=d_model, num_heads=num_heads, num_layers=6, d_ff=d_ff
        )
    counts = parameter_breakdown(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["embeddings"] == 37000 * d_model  # one shared matrix
    assert counts["encoder"] == 6 * layer_count(d_model, d_ff, cross=False)
    assert counts["decoder"] == 6 * layer_count(d_model, d_ff, cross=True)
    assert counts["total"] == counts["embeddings"] + counts["encoder"] + counts["decoder"]
    assert abs(counts["total"] / (paper_millions * 1e6) - 1) < 0.05


def test_pre_ln_adds_the_two_final_norms() -> None:
    post = parameter_breakdown(Transformer(50, 50, d_model=8, num_heads=2, num_layers=2, d_ff=16))
    pre = parameter_breakdown(
        Transformer(50, 50, d_model=8, num_heads=2, num_layers=2, d_ff=16, norm_first=True)
    )
    assert pre["encoder"] - post["encoder"] == 2 * 8
    assert pre["decoder"] - post["decoder"] == 2 * 8


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_float_token_ids_raise_type_error_naming_the_dtype() -> None:
    model = small_model()
    with pytest.raises(TypeError, match="torch.float32"):
        model(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.float64"):
        model.decode(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 4, D_MODEL))


def test_mismatched_batch_sizes_raise() -> None:
    model = small_model()
    with pytest.raises(ValueError, match=r"batch sizes differ.*\(2, 3\).*\(3, 4\)"):
        model(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="batch sizes differ"):
        model.decode(torch.ones(3, 4, dtype=torch.long), torch.zeros(2, 5, D_MODEL))


def test_sequences_longer_than_max_len_raise() -> None:
    model = small_model(max_len=8)
    with pytest.raises(ValueError, match="length 9 > max_len=8"):
        model.encode(torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.ones(1, 4, dtype=torch.long), torch.ones(1, 9, dtype=torch.long))


def test_other_bad_inputs_raise() -> None:
    model = small_model()
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 11\)"):
        model.encode(torch.tensor([[3, 11]]))
    with pytest.raises(ValueError, match=r"\(B, length\)"):
        model.encode(torch.ones(4, dtype=torch.long))
    with pytest.raises(TypeError, match="boolean"):
        model.encode(torch.ones(1, 4, dtype=torch.long), torch.ones(1, 1, 1, 4))
    with pytest.raises(ValueError, match="d_model"):
        model.decode(torch.ones(1, 4, dtype=torch.long), torch.zeros(1, 5, D_MODEL + 1))
    with pytest.raises(ValueError, match="divisible"):
        Transformer(10, 10, d_model=10, num_heads=4)


def test_layers_use_the_package_attention() -> None:
    model = small_model()
    assert isinstance(model.encoder.layers[0].self_attn, MultiHeadAttention)
    assert isinstance(model.decoder.layers[0].cross_attn, MultiHeadAttention)


def test_decoder_only_layer_has_no_cross_attention_and_stays_causal():
    """cross_attention=False: the layer of a decoder-only model (masked self-attention + FFN)."""
    torch.manual_seed(0)
    layer = DecoderLayer(16, 2, 32, dropout=0.0, cross_attention=False).eval()
    assert layer.cross_attn is None and layer.norm2 is None
    n_params = sum(p.numel() for p in layer.parameters())
    full = sum(p.numel() for p in DecoderLayer(16, 2, 32, cross_attention=True).parameters())
    assert full - n_params == 4 * 16 * 16 + 4 * 16 + 2 * 16  # one attention and one LayerNorm
    x = torch.randn(2, 5, 16)
    out = layer(x, None, tgt_mask=causal_mask(5))
    x2 = x.clone()
    x2[:, 3:] = torch.randn(2, 2, 16)  # later positions must not change earlier outputs
    assert torch.allclose(layer(x2, None, tgt_mask=causal_mask(5))[:, :3], out[:, :3], atol=1e-6)
    with pytest.raises(ValueError, match="memory"):
        layer(x, torch.randn(2, 3, 16), tgt_mask=causal_mask(5))
    stack = Decoder(2, 16, 2, 32, dropout=0.0, cross_attention=False)
    assert stack(x, None, tgt_mask=causal_mask(5)).shape == (2, 5, 16)


# --------------------------------------------------------------------------------------------
# Masks of the documented shapes only
# --------------------------------------------------------------------------------------------


def test_src_masks_that_would_be_read_along_the_wrong_axis_are_refused() -> None:
    """(B, S) with B == T, or (B, 1, S) with B == h, broadcast silently along the wrong axis
    (the logits used to differ by up to 0.95); only (B, 1, 1, S) and (1, 1, 1, S) are taken."""
    model = small_model()
    B, S, T = HEADS, 6, HEADS  # B equals both h and T
    src, tgt = torch.randint(3, 11, (B, S)), torch.randint(3, 11, (B, T))
    keep = lengths_mask([6, 3, 5, 1], S)  # (B, S)
    memory = model.encode(src, keep[:, None, None, :])
    for bad in (keep, keep[:, None, :]):
        with pytest.raises(
            ValueError, match=r"src_mask must have shape \(B, 1, 1, S\) = \(4, 1, 1, 6\)"
        ):
            model(src, tgt, src_mask=bad)
        with pytest.raises(ValueError, match="src_mask"):
            model.decode(tgt, memory, src_mask=bad)
        with pytest.raises(ValueError, match="src_mask"):
            model.encoder.layers[0](memory, bad)
        with pytest.raises(ValueError, match="src_mask"):
            model.decoder.layers[0](memory[:, :T], memory, src_mask=bad)
    shared = torch.ones(1, 1, 1, S, dtype=torch.bool)
    torch.testing.assert_close(model(src, tgt, src_mask=shared), model(src, tgt))


def test_tgt_mask_takes_the_documented_shapes() -> None:
    model = small_model()
    B, T = 2, 5
    src, tgt = torch.randint(3, 11, (B, 4)), torch.randint(3, 11, (B, T))
    memory = model.encode(src)
    want = model.decode(tgt, memory)
    for shape in [(T, T), (B, 1, T, T), (B, 1, 1, T), (B, HEADS, T, T), (1, 1, T, T)]:
        torch.testing.assert_close(
            model.decode(tgt, memory, tgt_mask=torch.ones(shape, dtype=torch.bool)), want
        )
    for shape in [(B, T, T), (T, T + 1), (B, 3, T, T), (T,)]:
        with pytest.raises(ValueError, match="tgt_mask must have shape"):
            model.decode(tgt, memory, tgt_mask=torch.ones(shape, dtype=torch.bool))
    with pytest.raises(TypeError, match="tgt_mask must be a boolean tensor"):
        model.decode(tgt, memory, tgt_mask=torch.ones(T, T))


# --------------------------------------------------------------------------------------------
# from_torch: the right type, exactly the weights
# --------------------------------------------------------------------------------------------


def test_from_torch_keeps_float64_weights_exactly() -> None:
    """The copies used to be made in float32 and converted: 1.4e-8 off per weight."""
    torch.manual_seed(11)
    enc = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, batch_first=True, dtype=torch.float64)
    dec = nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF, batch_first=True, dtype=torch.float64)
    stack = nn.TransformerEncoder(
        enc, 2, norm=nn.LayerNorm(D_MODEL, dtype=torch.float64), enable_nested_tensor=False
    )
    for ref, ours in [
        (enc, EncoderLayer.from_torch(enc)),
        (dec, DecoderLayer.from_torch(dec)),
        (stack, Encoder.from_torch(stack)),
    ]:
        theirs = dict(ref.named_parameters())
        mine = [p for p in ours.parameters()]
        assert all(p.dtype == torch.float64 for p in mine)
        assert sum(p.numel() for p in mine) == sum(p.numel() for p in theirs.values())
        # torch names: ...self_attn.in_proj_weight, ...; ours has the same tensors, same order
        for p, q in zip(mine, theirs.values(), strict=False):
            assert torch.equal(p, q)
        assert ours.training == ref.training


def test_from_torch_refuses_the_wrong_kind_of_layer() -> None:
    enc = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, batch_first=True)
    dec = nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF, batch_first=True)
    with pytest.raises(TypeError, match="TransformerEncoderLayer, got TransformerDecoderLayer"):
        EncoderLayer.from_torch(dec)  # used to drop the cross-attention silently
    with pytest.raises(TypeError, match="TransformerDecoderLayer, got TransformerEncoderLayer"):
        DecoderLayer.from_torch(enc)
    with pytest.raises(TypeError, match="TransformerEncoder, got TransformerDecoder"):
        Encoder.from_torch(nn.TransformerDecoder(dec, 1))
    with pytest.raises(TypeError, match="TransformerDecoder, got TransformerEncoderLayer"):
        Decoder.from_torch(enc)


# --------------------------------------------------------------------------------------------
# Attention weights only when asked; other arguments
# --------------------------------------------------------------------------------------------


def test_a_forward_pass_keeps_no_weights_and_attention_weights_computes_them() -> None:
    torch.manual_seed(12)
    model = small_model()
    src, tgt = torch.randint(3, 11, (2, 6)), torch.randint(3, 11, (2, 4))
    src_mask = padding_mask(torch.tensor([6, 3]), 6)
    logits = model(src, tgt, src_mask=src_mask)
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert all(layer.self_attn_weights is None for layer in layers)
    maps = model.attention_weights(src, tgt, src_mask=src_mask)
    assert not any(layer.store_weights for layer in layers)  # the switch is reset
    assert all(layer.self_attn_weights is None for layer in layers)  # and nothing kept
    # The weights are those of an explicit call on the same inputs.
    with torch.no_grad():
        x = model.embed(src, model.src_embed)
        _, want = model.encoder.layers[0].self_attn(x, x, x, src_mask)
    torch.testing.assert_close(maps["encoder"][0], want)
    assert torch.all(maps["cross"][1][1, :, :, 3:] == 0)  # row 1's padding is hidden
    torch.testing.assert_close(model(src, tgt, src_mask=src_mask), logits)  # unchanged outputs
    layer = model.encoder.layers[0]  # the switch on one layer
    layer.store_weights = True
    layer(x)
    assert layer.self_attn_weights.shape == (2, HEADS, 6, 6)
    layer.store_weights = False
    layer(x)
    assert layer.self_attn_weights is None


def test_empty_batches_and_sequences() -> None:
    model = small_model()
    ids = lambda B, L: torch.randint(3, 11, (B, L))  # noqa: E731
    assert model(ids(0, 4), ids(0, 3)).shape == (0, 3, 11)
    assert model(ids(2, 4), ids(2, 0)).shape == (2, 0, 11)
    logits = model(ids(2, 0), ids(2, 3))  # no source: cross-attention adds only its bias
    assert logits.shape == (2, 3, 11) and torch.isfinite(logits).all()


def test_keyword_only_options_and_argument_checks() -> None:
    with pytest.raises(TypeError, match="positional"):
        Transformer(11, 11, 16)
    with pytest.raises(TypeError, match="positional"):
        EncoderLayer(16, 4, 32, 0.1)
    with pytest.raises(ValueError, match="d_ff must be positive"):
        Transformer(11, 11, d_model=16, num_heads=4, d_ff=0)
    with pytest.raises(ValueError, match="dropout"):
        Transformer(11, 11, d_model=16, num_heads=4, dropout=1.0)
    with pytest.raises(ValueError, match="num_layers must be positive"):
        Encoder(0, 16, 4, 32)
    model = small_model()
    memory = model.encode(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="memory must be a floating-point tensor"):
        model.decode(torch.ones(2, 1, dtype=torch.long), memory.long())
    with pytest.raises(ValueError, match=r"memory must have shape \(B, S, d_model\)"):
        model.decode(torch.ones(2, 1, dtype=torch.long), memory[0])
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        model.encoder.layers[0](torch.ones(2, 3, D_MODEL, dtype=torch.long))


def test_public_helpers_check_their_arguments() -> None:
    model = small_model()
    with pytest.raises(TypeError, match="tokens must be an integer tensor of ids"):
        model.embed(torch.zeros(1, 3), model.src_embed)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.embed(torch.tensor([[11]]), model.tgt_embed)
    with pytest.raises(TypeError, match="start must be an int"):
        model.embed(torch.ones(1, 3, dtype=torch.long), model.tgt_embed, start=0.5)
    with pytest.raises(TypeError, match="embedding must be an nn.Embedding"):
        model.embed(torch.ones(1, 3, dtype=torch.long), model.output)
    with pytest.raises(TypeError, match="model must be a Transformer"):
        parameter_breakdown(model.encoder)
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, d_model\) with d_model=16"):
        model.encoder.layers[0].feed_forward(torch.randn(2, 3, 8))
    with pytest.raises(TypeError, match="cache must be an AttentionCache"):
        model.decoder.layers[0].self_attn(
            torch.randn(1, 2, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16), cache=object()
        )


def test_head_dim_decouples_d_k_from_d_model_over_h():
    """Table 3 (B) of the paper varies d_k at fixed h and d_model: each attention then has
    4 d_model h d_k weights plus 3 h d_k + d_model biases."""
    from minitransformer.attention import attention_parameter_count

    model = Transformer(11, 11, d_model=32, num_heads=4, num_layers=1, d_ff=64, head_dim=4)
    attn = model.encoder.layers[0].self_attn
    assert attn.d_k == 4 and attn.in_proj_weight.shape == (3 * 4 * 4, 32)
    expected = attention_parameter_count(32, 4, head_dim=4)
    assert sum(p.numel() for p in attn.parameters()) == expected == 4 * 32 * 16 + 3 * 16 + 32
    assert model.decoder.layers[0].cross_attn.d_k == 4
    src = torch.randint(3, 11, (2, 5))
    assert model(src, src).shape == (2, 5, 11)
