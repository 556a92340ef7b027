"""Tests of multi-head attention (chapter "Multi-head attention", ``book/multihead``).

The reference is ``torch.nn.MultiheadAttention``: after ``MultiHeadAttention.from_torch`` both
modules hold the same weights and must agree. PyTorch's boolean masks mean "blocked" (True =
may NOT attend), ours mean "may attend", so every torch mask below is the negation of ours.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from minitransformer.attention import (
    AttentionFlops,
    MultiHeadAttention,
    attention_flops,
    attention_parameter_count,
    causal_mask,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)
from minitransformer.positional import rotary_embedding

ATOL = 1e-5


def make_pair(d_model: int = 32, num_heads: int = 4, bias: bool = True, seed: int = 0):
    """A torch.nn.MultiheadAttention and our copy of it, both in eval mode."""
    torch.manual_seed(seed)
    reference = torch.nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True)
    with torch.no_grad():  # torch initialises the biases to 0; make them matter
        if bias:
            reference.in_proj_bias.normal_()
            reference.out_proj.bias.normal_()
    reference.eval()
    return reference, MultiHeadAttention.from_torch(reference).eval()


def inputs(B: int, T: int, S: int, d_model: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(B, T, d_model, generator=gen)
    memory = torch.randn(B, S, d_model, generator=gen)
    return query, memory


def compare_with_torch(ours, reference, query, key, value, mask=None, torch_kwargs=None):
    """Our (output, per-head weights) against torch's, both ways of calling ours."""
    torch_kwargs = torch_kwargs or {}
    with torch.no_grad():
        want_out, want_w = reference(query, key, value, average_attn_weights=False, **torch_kwargs)
        got_out, got_w = ours(query, key, value, mask=mask)
        fused_out, none = ours(query, key, value, mask=mask, need_weights=False)
    torch.testing.assert_close(got_out, want_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_w, want_w, atol=ATOL, rtol=0)
    torch.testing.assert_close(fused_out, want_out, atol=ATOL, rtol=0)
    assert none is None
    return got_w


# --- equivalence with torch.nn.MultiheadAttention ------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("num_heads", [1, 2, 4, 8])
def test_self_attention_matches_torch(num_heads, bias, device):
    reference, ours = make_pair(32, num_heads, bias)
    reference, ours = reference.to(device), ours.to(device)
    x, _ = inputs(3, 6, 6, 32)
    x = x.to(device)
    weights = compare_with_torch(ours, reference, x, x, x)
    assert weights.shape == (3, num_heads, 6, 6) and weights.device == x.device


def test_cross_attention_matches_torch_with_t_different_from_s(device):
    reference, ours = make_pair(32, 4)
    reference, ours = reference.to(device), ours.to(device)
    query, memory = (t.to(device) for t in inputs(2, 5, 9, 32))
    mask = padding_mask(torch.tensor([9, 4]), 9).to(device)
    weights = compare_with_torch(
        ours, reference, query, memory, memory, mask, {"key_padding_mask": ~mask[:, 0, 0]}
    )
    assert weights.shape == (2, 4, 5, 9)


def test_cross_attention_with_distinct_key_and_value_matches_torch():
    reference, ours = make_pair(32, 4)
    query, key = inputs(2, 5, 9, 32)
    _, value = inputs(2, 5, 9, 32, seed=7)
    compare_with_torch(ours, reference, query, key, value)


def test_causal_mask_matches_torch_with_inverted_mask():
    reference, ours = make_pair(32, 4)
    x, _ = inputs(2, 7, 7, 32)
    ours_mask = causal_mask(7)  # True = may attend
    torch_mask = ~ours_mask  # torch: True = blocked
    weights = compare_with_torch(ours, reference, x, x, x, ours_mask, {"attn_mask": torch_mask})
    assert torch.all(weights[..., ~ours_mask] == 0)  # nothing from the future


def test_key_padding_matches_torch_with_inverted_mask():
    reference, ours = make_pair(32, 4)
    query, memory = inputs(3, 5, 8, 32)
    lengths = torch.tensor([8, 3, 5])
    ours_mask = padding_mask(lengths, 8)  # (B, 1, 1, S), True = real token
    key_padding_mask = ~ours_mask[:, 0, 0, :]  # (B, S), torch: True = padding
    weights = compare_with_torch(
        ours, reference, query, memory, memory, ours_mask, {"key_padding_mask": key_padding_mask}
    )
    assert torch.all(weights[1, :, :, 3:] == 0) and torch.all(weights[2, :, :, 5:] == 0)


def test_causal_and_padding_masks_combined_match_torch():
    reference, ours = make_pair(32, 2)
    x, _ = inputs(2, 6, 6, 32)
    lengths = torch.tensor([6, 4])
    ours_mask = causal_mask(6) & padding_mask(lengths, 6)  # (B, 1, T, T)
    compare_with_torch(
        ours,
        reference,
        x,
        x,
        x,
        ours_mask,
        {"attn_mask": ~causal_mask(6), "key_padding_mask": ~padding_mask(lengths, 6)[:, 0, 0]},
    )


def test_from_torch_copies_every_parameter_and_the_dropout():
    reference = torch.nn.MultiheadAttention(16, 2, dropout=0.25, batch_first=True)
    ours = MultiHeadAttention.from_torch(reference)
    w_q, w_k, w_v = reference.in_proj_weight.chunk(3)
    assert torch.equal(ours.w_q.weight, w_q) and torch.equal(ours.w_k.weight, w_k)
    assert torch.equal(ours.w_v.weight, w_v)
    assert torch.equal(ours.w_o.weight, reference.out_proj.weight)
    assert ours.dropout.p == 0.25 and ours.training == reference.training
    assert attention_parameter_count(16, 2) == sum(p.numel() for p in ours.parameters())
    assert sum(p.numel() for p in reference.parameters()) == sum(
        p.numel() for p in ours.parameters()
    )


def test_from_torch_rejects_what_it_cannot_copy():
    with pytest.raises(TypeError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))


# --- the structure: one head, GQA, split and merge ----------------------------------------


def test_single_head_is_one_scaled_dot_product_attention_over_projected_inputs():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 1).eval()
    query, memory = inputs(2, 4, 6, 16)
    mask = padding_mask(torch.tensor([6, 2]), 6)[:, 0]  # (B, 1, S) for the 3-D call
    with torch.no_grad():
        out, weights = mha(query, memory, memory, mask=mask[:, None])
        head, want_w = scaled_dot_product_attention(
            mha.w_q(query), mha.w_k(memory), mha.w_v(memory), mask
        )
        want = mha.w_o(head)
    torch.testing.assert_close(out, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights[:, 0], want_w, atol=ATOL, rtol=0)


def test_heads_are_independent_attentions_on_column_blocks_of_the_projections():
    """Concat_i(attention(X W_i^Q, X W_i^K, X W_i^V)) W^O, with W_i the i-th block of d_k
    columns."""
    torch.manual_seed(0)
    d_model, h = 24, 3
    d_k = d_model // h
    mha = MultiHeadAttention(d_model, h, bias=False).eval()
    x, _ = inputs(2, 5, 5, d_model)
    heads = []
    with torch.no_grad():
        for i in range(h):
            rows = slice(i * d_k, (i + 1) * d_k)  # nn.Linear stores W^T: head i = rows i*d_k..
            q = x @ mha.w_q.weight[rows].T  # (B, T, d_k) = X W_i^Q
            k = x @ mha.w_k.weight[rows].T
            v = x @ mha.w_v.weight[rows].T
            heads.append(scaled_dot_product_attention(q, k, v)[0])
        want = torch.cat(heads, dim=-1) @ mha.w_o.weight.T
        got, _ = mha(x, x, x)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_gqa_with_as_many_kv_heads_as_query_heads_equals_mha():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).eval()
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 4, num_kv_heads=4).eval()
    x, _ = inputs(2, 5, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x, x, x)[0], mha(x, x, x)[0], atol=0, rtol=0)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_gqa_equals_mha_whose_kv_heads_are_copies(num_kv_heads):
    """Grouped-query attention = MHA whose key/value heads repeat in groups of h / h_kv."""
    torch.manual_seed(0)
    d_model, h = 32, 4
    d_k, group = d_model // h, h // num_kv_heads
    gqa = MultiHeadAttention(d_model, h, num_kv_heads=num_kv_heads).eval()
    mha = MultiHeadAttention(d_model, h).eval()
    with torch.no_grad():
        for name in ("w_q", "w_o"):  # w_q is a view of the packed in_proj_weight: copy into it
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
            getattr(mha, name).bias.copy_(getattr(gqa, name).bias)
        for name in ("w_k", "w_v"):
            w = getattr(gqa, name).weight.view(num_kv_heads, d_k, d_model)
            b = getattr(gqa, name).bias.view(num_kv_heads, d_k)
            getattr(mha, name).weight.copy_(
                w.repeat_interleave(group, dim=0).reshape(d_model, d_model)
            )
            getattr(mha, name).bias.copy_(b.repeat_interleave(group, dim=0).reshape(d_model))
    assert (
        sum(p.numel() for p in gqa.parameters())
        == attention_parameter_count(d_model, h, num_kv_heads=num_kv_heads)
        < sum(p.numel() for p in mha.parameters())
    )
    query, memory = inputs(2, 3, 6, d_model)
    with torch.no_grad():
        for need_weights in (True, False):
            got = gqa(query, memory, memory, causal_mask(6)[:3], need_weights=need_weights)[0]
            want = mha(query, memory, memory, causal_mask(6)[:3])[0]
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@settings(max_examples=30, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 6),
    h=st.sampled_from([1, 2, 3, 4]),
    d_k=st.integers(1, 5),
)
def test_merge_heads_inverts_split_heads(B, T, h, d_k):
    x = torch.randn(B, T, h * d_k)
    heads = split_heads(x, h)
    assert heads.shape == (B, h, T, d_k)
    assert torch.equal(heads[:, 1 % h], x[..., (1 % h) * d_k : (1 % h + 1) * d_k])
    assert torch.equal(merge_heads(heads), x)


@settings(max_examples=20, deadline=None)
@given(perm_seed=st.integers(0, 10_000), h=st.sampled_from([1, 2, 4]))
def test_self_attention_is_permutation_equivariant(perm_seed, h):
    """Without positions or masks, permuting the tokens permutes the outputs the same way."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, h).eval()
    x, _ = inputs(2, 7, 7, 16)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(perm_seed))
    with torch.no_grad():
        out, weights = mha(x, x, x)
        out_p, weights_p = mha(x[:, perm], x[:, perm], x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm], atol=ATOL, rtol=0)
    torch.testing.assert_close(weights_p, weights[:, :, perm][..., perm], atol=ATOL, rtol=0)


# --- the fused path and dropout -----------------------------------------------------------


@pytest.mark.parametrize("T,S", [(5, 5), (3, 8)])
def test_fused_path_equals_explicit_path(T, S):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).eval()
    query, memory = inputs(2, T, S, 32)
    masks = [None, padding_mask(torch.tensor([S, 2]), S), torch.rand(2, 4, T, S) > 0.3]
    for mask in masks:
        with torch.no_grad():
            explicit, _ = mha(query, memory, memory, mask)
            fused, weights = mha(query, memory, memory, mask, need_weights=False)
        assert weights is None
        torch.testing.assert_close(fused, explicit, atol=ATOL, rtol=0)


def test_fully_masked_query_row_gives_bias_only_output_in_both_paths():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).eval()
    x, _ = inputs(1, 3, 3, 16)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    with torch.no_grad():
        for need_weights in (True, False):
            out, _ = mha(x, x, x, mask, need_weights=need_weights)
            assert torch.isfinite(out).all()
            # zero heads: the output is W^O applied to 0, i.e. the output bias
            torch.testing.assert_close(out[0, 1], mha.w_o.bias, atol=ATOL, rtol=0)


def test_dropout_acts_in_training_only_and_the_weights_show_it():
    torch.manual_seed(0)
    p = 0.5
    mha = MultiHeadAttention(16, 2, dropout=p)
    x, _ = inputs(2, 6, 6, 16)
    mha.eval()
    with torch.no_grad():
        eval_out, eval_w = mha(x, x, x)
    mha.train()
    torch.manual_seed(1)
    train_out, train_w = mha(x, x, x)
    # Surviving weights are scaled by 1 / (1 - p), the others are exactly 0.
    kept = train_w != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(train_w[kept], eval_w[kept] / (1 - p), atol=ATOL, rtol=1e-5)
    # The output uses exactly the returned (dropped-out) weights.
    v = split_heads(mha.w_v(x), 2)
    torch.testing.assert_close(train_out, mha.w_o(merge_heads(train_w @ v)), atol=ATOL, rtol=0)
    assert not torch.allclose(train_out, eval_out, atol=1e-3)
    # The fused path also drops out in training, reproducibly under a seed, and not in eval.
    torch.manual_seed(2)
    fused_a, _ = mha(x, x, x, need_weights=False)
    torch.manual_seed(2)
    fused_b, _ = mha(x, x, x, need_weights=False)
    torch.testing.assert_close(fused_a, fused_b)
    assert not torch.allclose(fused_a, eval_out, atol=1e-3)
    mha.eval()
    with torch.no_grad():
        torch.testing.assert_close(mha(x, x, x, need_weights=False)[0], eval_out, atol=ATOL, rtol=0)


def test_gradients_flow_to_every_parameter_on_both_paths():
    torch.manual_seed(0)
    x, _ = inputs(2, 4, 4, 16)
    grads = []
    for need_weights in (True, False):
        torch.manual_seed(0)
        mha = MultiHeadAttention(16, 4)
        mha(x, x, x, causal_mask(4), need_weights=need_weights)[0].square().sum().backward()
        grads.append([p.grad for p in mha.parameters()])
        assert all(g is not None and torch.isfinite(g).all() for g in grads[-1])
    for g_explicit, g_fused in zip(*grads, strict=False):
        torch.testing.assert_close(g_explicit, g_fused, atol=1e-4, rtol=1e-4)


# --- bad input ----------------------------------------------------------------------------


def test_d_model_not_divisible_by_heads_raises_value_error_naming_both():
    with pytest.raises(ValueError, match=r"d_model=10.*num_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        MultiHeadAttention(12, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(8, 2, dropout=1.0)
    MultiHeadAttention(10, 4, head_dim=3)  # an explicit head size lifts the constraint


def test_bad_shapes_raise_value_error_naming_the_shapes():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"\(2, 5, 12\)"):
        mha(x, torch.randn(2, 5, 12), torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"\(5, 16\)"):
        mha(x[0], x[0], x[0])
    with pytest.raises(ValueError, match=r"\(2, 4, 16\)"):
        mha(x, x, torch.randn(2, 4, 16))
    for need_weights in (True, False):
        with pytest.raises(ValueError, match=r"\(5, 4\)"):
            mha(x, x, x, torch.ones(5, 4, dtype=torch.bool), need_weights=need_weights)
        with pytest.raises(TypeError, match="boolean"):
            mha(x, x, x, torch.ones(5, 5), need_weights=need_weights)
    with pytest.raises(ValueError, match=r"\(2, 5, 10\).*3"):
        split_heads(torch.randn(2, 5, 10), 3)
    with pytest.raises(ValueError, match=r"\(2, 5\)"):
        merge_heads(torch.randn(2, 5))


# --- cost -----------------------------------------------------------------------------------

D_MODEL = 512
DIVISORS = [h for h in range(1, D_MODEL + 1) if D_MODEL % h == 0]


@pytest.mark.parametrize("h", DIVISORS)
def test_parameter_count_is_the_same_for_every_head_count(h):
    assert attention_parameter_count(D_MODEL, h) == 4 * D_MODEL**2 + 4 * D_MODEL
    assert attention_parameter_count(D_MODEL, h, bias=False) == 4 * D_MODEL**2


@pytest.mark.parametrize("d_model,h", [(32, 1), (32, 4), (24, 3), (48, 16)])
def test_parameter_count_matches_the_modules(d_model, h):
    for bias in (True, False):
        ours = MultiHeadAttention(d_model, h, bias=bias)
        theirs = torch.nn.MultiheadAttention(d_model, h, bias=bias)
        count = attention_parameter_count(d_model, h, bias=bias)
        assert count == sum(p.numel() for p in ours.parameters())
        assert count == sum(p.numel() for p in theirs.parameters())
    wide = MultiHeadAttention(d_model, h, head_dim=d_model)
    assert attention_parameter_count(d_model, h, head_dim=d_model) == sum(
        p.numel() for p in wide.parameters()
    )


def test_projection_and_attention_flops_are_the_same_for_every_head_count():
    T, S = 100, 70
    costs = {attention_flops(T, S, D_MODEL, h) for h in DIVISORS}
    assert costs == {
        AttentionFlops(
            projections=2 * T * D_MODEL**2 + 2 * S * D_MODEL**2, attention=2 * T * S * D_MODEL
        )
    }


def test_full_width_heads_cost_h_times_as_much():
    for h in (1, 2, 4, 8, 16):
        wide = attention_flops(64, 64, D_MODEL, h, head_dim=D_MODEL)
        base = attention_flops(64, 64, D_MODEL, h)
        assert wide.projections == h * base.projections and wide.attention == h * base.attention
        params = attention_parameter_count(D_MODEL, h, bias=False, head_dim=D_MODEL)
        assert params == h * attention_parameter_count(D_MODEL, h, bias=False)


@pytest.mark.parametrize(
    "h,num_kv_heads,head_dim,T,S",
    [
        (4, None, None, 5, 7),
        (1, None, None, 3, 3),
        (4, 2, None, 6, 2),
        (2, None, 32, 4, 5),
    ],
)
def test_flop_count_matches_torch_flop_counter(h, num_kv_heads, head_dim, T, S):
    """torch's own FlopCounterMode counts 2 FLOPs per multiply-add of every matmul it runs."""
    mha = MultiHeadAttention(16, h, num_kv_heads=num_kv_heads, head_dim=head_dim)
    query, memory = inputs(3, T, S, 16)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        mha(query, memory, memory)
    want = attention_flops(T, S, 16, h, num_kv_heads=num_kv_heads, head_dim=head_dim).total
    assert counter.get_total_flops() == 2 * 3 * want


def test_cost_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match="d_model=10.*num_heads=4"):
        attention_parameter_count(10, 4)
    with pytest.raises(ValueError, match="d_model=10.*num_heads=4"):
        attention_flops(5, 5, 10, 4)
    with pytest.raises(ValueError, match="T must be >= 0, got -1"):
        attention_flops(-1, 5, 8, 2)
    assert math.isclose(
        attention_flops(8, 8, 8, 2).total,
        attention_flops(8, 8, 8, 2).projections + attention_flops(8, 8, 8, 2).attention,
    )


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 6),
    S=st.integers(1, 6),
    h=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 1000),
    with_padding=st.booleans(),
)
def test_random_shapes_and_padding_match_torch(B, T, S, h, seed, with_padding):
    """Any batch/length combination, with key padding (at least one real key per sequence)."""
    reference, ours = make_pair(16, h, seed=seed)
    query, memory = inputs(B, T, S, 16, seed=seed)
    if with_padding:
        lengths = torch.randint(1, S + 1, (B,), generator=torch.Generator().manual_seed(seed))
        mask = padding_mask(lengths, S)
        compare_with_torch(
            ours, reference, query, memory, memory, mask, {"key_padding_mask": ~mask[:, 0, 0]}
        )
    else:
        compare_with_torch(ours, reference, query, memory, memory)


# --------------------------------------------------------------------------------------
# rotary=True: RoPE inside MultiHeadAttention (chapter "Positional encoding")
# --------------------------------------------------------------------------------------


def rotary_pair(
    d_model: int = 16, num_heads: int = 2, num_kv_heads: int | None = None, seed: int = 0
):
    """A rotary MultiHeadAttention with random biases, in eval mode."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, rotary=True).eval()
    with torch.no_grad():
        for lin in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
            lin.bias.normal_()
    return mha


@pytest.mark.parametrize("start", [0, 5])
def test_rotary_equals_the_chapters_manual_construction(start):
    """Rotate split_heads(x W^Q) and split_heads(x W^K) by positions start.., then attend."""
    mha = rotary_pair(seed=start)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1))
    mask = causal_mask(6)
    positions = torch.arange(start, start + 6)
    q = rotary_embedding(split_heads(mha.w_q(x), 2), positions)  # (B, h, T, d_k)
    k = rotary_embedding(split_heads(mha.w_k(x), 2), positions)
    v = split_heads(mha.w_v(x), 2)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    want = mha.w_o(merge_heads(out))
    got, got_weights = mha(x, x, x, mask, start=start if start else None)  # default start 0
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_weights, weights, atol=ATOL, rtol=0)
    fused, none = mha(x, x, x, mask, need_weights=False, start=start)
    assert none is None
    torch.testing.assert_close(fused, want, atol=ATOL, rtol=0)


@settings(max_examples=20, deadline=None)
@given(shift=st.integers(1, 500), T=st.integers(1, 8), seed=st.integers(0, 1000))
def test_rotary_attention_depends_only_on_relative_positions(shift, T, seed):
    """Moving every position by the same amount changes no score, weight or output."""
    mha = rotary_pair(seed=seed).double()
    x = torch.randn(2, T, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out0, w0 = mha(x, x, x, causal_mask(T))
    out1, w1 = mha(x, x, x, causal_mask(T), start=shift)
    torch.testing.assert_close(w1, w0, atol=1e-9, rtol=0)
    torch.testing.assert_close(out1, out0, atol=1e-9, rtol=0)


def test_rotary_changes_attention_and_breaks_permutation_equivariance():
    """Without positions attention is permutation-equivariant; RoPE makes order matter."""
    mha = rotary_pair(seed=3)
    plain = MultiHeadAttention(16, 2).eval()
    plain.load_state_dict(mha.state_dict())  # same weights, no rotation
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(0))
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(
        plain(x[:, perm], x[:, perm], x[:, perm])[0], plain(x, x, x)[0][:, perm], atol=ATOL, rtol=0
    )
    assert not torch.allclose(
        mha(x[:, perm], x[:, perm], x[:, perm])[0], mha(x, x, x)[0][:, perm], atol=1e-3
    )


@pytest.mark.parametrize("num_kv_heads", [None, 1])
def test_rotary_with_a_cache_equals_the_full_sequence(num_kv_heads):
    """Feeding tokens one at a time (positions from the cache length) = one causal pass."""
    from minitransformer.kv_cache import AttentionCache

    mha = rotary_pair(d_model=16, num_heads=4, num_kv_heads=num_kv_heads, seed=7)
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2))
    full, _ = mha(x, x, x, causal_mask(7))
    cache = AttentionCache(max_len=4)  # outgrown on purpose: the buffers double
    steps = [mha(x[:, :3], x[:, :3], x[:, :3], causal_mask(3), cache=cache)[0]]  # a prefill of 3
    for t in range(3, 7):
        steps.append(mha(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_rotary_bad_arguments():
    with pytest.raises(ValueError, match="head_dim=3 must be even"):
        MultiHeadAttention(6, 2, rotary=True)
    x = torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="only applies with rotary=True"):
        MultiHeadAttention(8, 2)(x, x, x, start=3)
    with pytest.raises(ValueError, match="start must be >= 0"):
        MultiHeadAttention(8, 2, rotary=True)(x, x, x, start=-1)
    from minitransformer.kv_cache import AttentionCache

    with pytest.raises(ValueError, match="static"):
        MultiHeadAttention(8, 2, rotary=True)(x, x, x, cache=AttentionCache(static=True))


# --------------------------------------------------------------------------------------
# The packed projection [W^Q; W^K; W^V]
# --------------------------------------------------------------------------------------


def count_linear_calls(fn) -> int:
    """How many matrix products (torch.nn.functional.linear calls) ``fn`` makes."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.n += getattr(func, "__name__", "") == "linear"
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def test_one_matmul_projects_q_k_v_in_self_attention_and_k_v_in_cross_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x, memory = inputs(2, 3, 5, 16)
    _, other = inputs(2, 3, 5, 16, seed=2)
    with torch.no_grad():
        assert count_linear_calls(lambda: mha(x, x, x)) == 2  # [W^Q; W^K; W^V], then W^O
        assert count_linear_calls(lambda: mha(x, memory, memory)) == 3  # W^Q, [W^K; W^V], W^O
        assert count_linear_calls(lambda: mha(x, memory, other)) == 4  # key is not value


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_w_q_w_k_w_v_are_views_of_the_rows_of_in_proj_weight(num_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads)
    h_kv, d_k = mha.num_kv_heads, 4
    assert mha.in_proj_weight.shape == ((4 + 2 * h_kv) * d_k, 16)
    blocks = mha.in_proj_weight.split([4 * d_k, h_kv * d_k, h_kv * d_k])
    biases = mha.in_proj_bias.split([4 * d_k, h_kv * d_k, h_kv * d_k])
    for projection, weight, bias in zip((mha.w_q, mha.w_k, mha.w_v), blocks, biases, strict=False):
        assert torch.equal(projection.weight, weight) and torch.equal(projection.bias, bias)
        x = torch.randn(2, 3, 16)
        torch.testing.assert_close(projection(x), x @ weight.T + bias)
    with torch.no_grad():  # a write into a view changes the module
        mha.w_k.weight.zero_()
    assert (mha.in_proj_weight[4 * d_k : (4 + h_kv) * d_k] == 0).all()
    assert MultiHeadAttention(16, 4, bias=False).w_v.bias is None


def test_initialisation_is_that_of_three_linear_layers():
    """The packed matrix starts exactly as separate nn.Linear W^Q, W^K, W^V would (same RNG
    stream), so seeded experiments are unchanged by the packing."""
    torch.manual_seed(3)
    mha = MultiHeadAttention(16, 2, num_kv_heads=1)
    torch.manual_seed(3)
    linears = [torch.nn.Linear(16, n) for n in (16, 8, 8, 16)]  # W^Q, W^K, W^V, W^O
    for projection, linear in zip((mha.w_q, mha.w_k, mha.w_v, mha.w_o), linears, strict=False):
        assert torch.equal(projection.weight, linear.weight)
        assert torch.equal(projection.bias, linear.bias)


def test_from_torch_keeps_dtype_and_weights_exactly():
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    ours = MultiHeadAttention.from_torch(reference)
    assert ours.in_proj_weight.dtype == torch.float64
    assert torch.equal(ours.in_proj_weight, reference.in_proj_weight)
    assert torch.equal(ours.in_proj_bias, reference.in_proj_bias)
    assert torch.equal(ours.w_o.weight, reference.out_proj.weight)


def test_dropout_multiplies_weights_by_values_once():
    """In training with dropout the explicit path makes the products of attention_flops, no
    more (the weighted sum used to be computed twice)."""
    mha = MultiHeadAttention(16, 4, dropout=0.5).train()
    query, memory = inputs(3, 4, 5, 16)
    with FlopCounterMode(display=False) as counter:
        mha(query, memory, memory)
    assert counter.get_total_flops() == 2 * 3 * attention_flops(4, 5, 16, 4).total


# --------------------------------------------------------------------------------------
# Bad and empty input
# --------------------------------------------------------------------------------------


def test_masks_of_undocumented_shapes_are_refused():
    """A (B, 1, S) padding mask broadcasts over the heads axis when B == h: refused."""
    mha = MultiHeadAttention(16, 2).eval()
    query, memory = inputs(2, 3, 5, 16)
    three_d = padding_mask(torch.tensor([5, 2]), 5)[:, 0]  # (B, 1, S) with B == h == 2
    for need_weights in (True, False):
        with pytest.raises(ValueError, match=r"mask must have shape .*\(2, 1, 5\)"):
            mha(query, memory, memory, three_d, need_weights=need_weights)
        with pytest.raises(ValueError, match=r"mask must have shape .*\(2, 3, 3, 5\)"):
            mha(query, memory, memory, torch.ones(2, 3, 3, 5, dtype=torch.bool))  # 3 heads
        with pytest.raises(ValueError, match=r"mask must have shape .*\(3, 4\)"):
            mha(query, memory, memory, torch.ones(3, 4, dtype=torch.bool))  # S = 4
    for good in (
        torch.ones(3, 5),
        torch.ones(1, 5),
        torch.ones(2, 1, 1, 5),
        torch.ones(1, 2, 3, 5),
    ):
        mha(query, memory, memory, good.bool())


def test_wrong_dtypes_devices_and_arguments_raise_naming_them():
    mha = MultiHeadAttention(16, 4, rotary=True)
    x = torch.randn(2, 3, 16)
    with pytest.raises(TypeError, match="query must be a floating-point tensor"):
        mha(x.long(), x, x)
    with pytest.raises(TypeError, match="key has dtype torch.float64, the module torch.float32"):
        mha(x, x.double(), x.double())
    with pytest.raises(TypeError, match="value must be a torch.Tensor"):
        mha(x, x, x.tolist())
    with pytest.raises(TypeError, match="start must be an int"):
        mha(x, x, x, start=1.5)
    with pytest.raises(ValueError, match="d_model must be positive"):
        MultiHeadAttention(0, 1)
    with pytest.raises(TypeError, match="num_heads must be an int"):
        MultiHeadAttention(16, 2.0)
    with pytest.raises(ValueError, match="dropout must be finite"):
        MultiHeadAttention(16, 2, dropout=float("nan"))
    with pytest.raises(TypeError, match="positional"):
        MultiHeadAttention(16, 2, 0.1)  # options are keyword-only


@pytest.mark.parametrize("need_weights", [True, False])
def test_empty_inputs(need_weights):
    """B = 0 and T = 0 give empty outputs; S = 0 (nothing to attend to) gives the output bias,
    as a fully masked row does."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    with torch.no_grad():
        out, _ = mha(
            torch.randn(2, 3, 8),
            torch.randn(2, 0, 8),
            torch.randn(2, 0, 8),
            need_weights=need_weights,
        )
        torch.testing.assert_close(out, mha.w_o.bias.expand(2, 3, 8))
        x = torch.randn(0, 3, 8)
        assert mha(x, x, x, need_weights=need_weights)[0].shape == (0, 3, 8)
        out, _ = mha(
            torch.randn(2, 0, 8),
            torch.randn(2, 3, 8),
            torch.randn(2, 3, 8),
            need_weights=need_weights,
        )
        assert out.shape == (2, 0, 8)


def test_split_and_merge_heads_check_their_arguments():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        split_heads([[1.0]], 2)
    with pytest.raises(TypeError, match="num_heads must be an int"):
        split_heads(torch.randn(1, 2, 4), 2.0)
    with pytest.raises(ValueError, match="num_heads must be positive"):
        split_heads(torch.randn(1, 2, 4), 0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        merge_heads(None)
