"""The real cache (KVCache) with the package's Transformer, greedy decoding and beam search;
GQA/MQA. The memory calculator and its command line: test_kv_memory.py, test_kv_cli.py."""

from __future__ import annotations

import pytest
import torch

from minitransformer.attention import MultiHeadAttention, causal_mask
from minitransformer.data import BOS_ID, EOS_ID, PAD_ID
from minitransformer.decoding import beam_search_with_scores, greedy_decode
from minitransformer.kv_cache import AttentionCache, KVCache
from minitransformer.kv_memory import kv_cache_bytes
from minitransformer.model import Transformer

# --------------------------------------------------------------------------------------------
# The real cache: KVCache with the package's Transformer, greedy decoding and beam search.
# --------------------------------------------------------------------------------------------

VOCAB = 13


def _model(seed: int, norm_first: bool = False, layers: int = 2) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(
        VOCAB,
        VOCAB,
        d_model=32,
        num_heads=4,
        num_layers=layers,
        d_ff=64,
        dropout=0.1,
        norm_first=norm_first,
    ).eval()


def _padded_sources(seed: int, lengths: list[int]) -> torch.Tensor:
    """A (B, max(lengths)) batch of random content tokens, padded with PAD_ID."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (len(lengths), max(lengths)), generator=gen)
    for b, n in enumerate(lengths):
        src[b, n:] = PAD_ID
    return src


@pytest.mark.parametrize("seed, norm_first", [(0, False), (1, False), (2, False), (3, True)])
def test_cached_greedy_equals_uncached(seed, norm_first, device):
    model = _model(seed, norm_first).to(device)
    src = _padded_sources(seed, [7, 3, 5, 1]).to(device)  # batch 4, different lengths, padding
    for eos in (EOS_ID, None):
        cached = greedy_decode(model, src, max_len=12, bos_id=BOS_ID, eos_id=eos)
        uncached = greedy_decode(model, src, max_len=12, bos_id=BOS_ID, eos_id=eos, use_cache=False)
        assert torch.equal(cached, uncached)
    assert cached.shape == (4, 12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_step_logits_equal_full_decode(seed):
    # Feeding the greedy output one token at a time through the cache gives, step by step,
    # the logits of one uncached pass over the whole sequence.
    model = _model(seed)
    src = _padded_sources(seed + 10, [6, 2, 4])
    src_mask = (src != PAD_ID)[:, None, None, :]
    ys = greedy_decode(model, src, max_len=10, bos_id=BOS_ID, eos_id=None)  # (3, 10)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(ys, memory, src_mask=src_mask)  # (3, 10, V)
        cache = KVCache.for_model(model, max_len=10)
        steps = [
            model.decode(ys[:, t : t + 1], memory, src_mask=src_mask, cache=cache)
            for t in range(ys.shape[1])
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 10


def test_chunked_prefill_equals_whole():
    # Feeding 4 tokens, then 1, then 3 through the cache equals one pass over all 8.
    model = _model(3)
    src = _padded_sources(3, [5, 5])
    gen = torch.Generator().manual_seed(0)
    tgt = torch.randint(3, VOCAB, (2, 8), generator=gen)
    with torch.no_grad():
        memory = model.encode(src)
        full = model.decode(tgt, memory)
        cache = KVCache.for_model(model, max_len=3)  # too small on purpose: it must grow
        parts = [
            model.decode(tgt[:, a:b], memory, cache=cache) for a, b in ((0, 4), (4, 5), (5, 8))
        ]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cached_decoding_skips_the_weights_and_a_full_pass_brings_them_back():
    # Decoding uses the fused kernel and keeps no weights (no layer does unless asked);
    # attention_weights runs a full pass that computes them.
    model = _model(4)
    src = _padded_sources(4, [5, 3])
    ys = greedy_decode(model, src, max_len=6, bos_id=BOS_ID, eos_id=None)
    assert all(
        layer.self_attn_weights is None and layer.cross_attn_weights is None
        for layer in model.decoder.layers
    )
    assert all(layer.self_attn_weights is None for layer in model.encoder.layers)
    ys[0, 0] = BOS_ID  # an ordinary tensor, not an inference-mode one: in-place writes work
    maps = model.attention_weights(src, ys, src_mask=(src != PAD_ID)[:, None, None, :])
    assert maps["cross"][0].shape == (2, model.num_heads, 6, 5)
    assert maps["encoder"][0].shape == (2, model.num_heads, 5, 5)


@pytest.mark.parametrize("seed, beam_size", [(0, 1), (0, 3), (1, 4)])
def test_cached_beam_search_equals_uncached(seed, beam_size):
    model = _model(seed)
    src = _padded_sources(seed, [6, 2, 4])
    cached, s_cached = beam_search_with_scores(
        model, src, max_len=9, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=beam_size
    )
    uncached, s_uncached = beam_search_with_scores(
        model, src, max_len=9, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=beam_size, use_cache=False
    )
    assert torch.equal(cached, uncached)
    torch.testing.assert_close(s_cached, s_uncached, atol=1e-5, rtol=1e-5)


def test_cache_memory_equals_kv_cache_bytes():
    layers, B, n, S = 3, 2, 7, 5
    model = _model(0, layers=layers)
    src = _padded_sources(0, [S, S])
    ys = greedy_decode(model, src, max_len=n + 1, bos_id=BOS_ID, eos_id=None)
    cache = KVCache.for_model(model, max_len=n)
    with torch.no_grad():
        memory = model.encode(src)
        for t in range(n):  # n steps
            model.decode(ys[:, t : t + 1], memory, cache=cache)
    h, d_k = 4, 8
    assert cache.length == n
    for layer in cache.layers:  # only the filled positions, stored per KV head
        assert layer.self_attn.keys.shape == (B, h, n, d_k)
    assert cache.self_attn_nbytes == kv_cache_bytes(layers, h, d_k, n, B, bytes_per_element=4)
    assert cache.cross_attn_nbytes == kv_cache_bytes(layers, h, d_k, S, B, bytes_per_element=4)
    assert cache.nbytes == cache.self_attn_nbytes + cache.cross_attn_nbytes


def test_append_writes_in_place_into_preallocated_buffers():
    cache = AttentionCache(max_len=6)
    gen = torch.Generator().manual_seed(0)
    keys, values = [], []
    pointers = set()
    for _ in range(6):
        k, v = torch.randn(2, 3, 1, 4, generator=gen), torch.randn(2, 3, 1, 5, generator=gen)
        all_k, all_v = cache.update(k, v)
        keys.append(k)
        values.append(v)
        pointers.add(cache.keys.data_ptr())
        assert torch.equal(all_k, torch.cat(keys, dim=2))
        assert torch.equal(all_v, torch.cat(values, dim=2))
    assert len(pointers) == 1  # never reallocated: no torch.cat of a growing tensor
    cache.update(*(torch.randn(2, 3, 1, d, generator=gen) for d in (4, 5)))  # outgrows: doubles
    assert cache.keys.shape[2] == 12 and cache.length == 7
    assert torch.equal(cache.get()[0][:, :, :6], torch.cat(keys, dim=2))


def test_static_cache_is_filled_once_and_reused():
    cache = AttentionCache(static=True)
    memory = torch.randn(1, 5, 8)  # the encoder output the keys and values come from
    assert not cache.holds(memory)
    k = torch.randn(1, 2, 5, 4)
    cache.update(k, k, source=memory)
    assert cache.holds(memory) and cache.length == 5
    assert torch.equal(cache.get()[0], k)
    with pytest.raises(ValueError, match="filled once"):
        cache.update(k, k)


def test_reorder_follows_beam_indices():
    cache = KVCache(num_layers=1, max_len=4)
    rows = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 1, 4)  # row b is filled with b
    cache.layers[0].self_attn.update(rows, rows)
    cache.layers[0].cross_attn.update(rows, rows)
    cache.reorder(torch.tensor([2, 2, 0, 1]))  # the batch may grow or shrink
    k, _ = cache.layers[0].self_attn.get()
    assert k.shape == (4, 2, 1, 4)
    assert k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0, 1.0]
    assert cache.layers[0].cross_attn.get()[0][:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0, 1.0]


def test_reorder_at_a_fixed_batch_copies_in_place_and_can_leave_cross_attention():
    """Beam search's fixed (B, k) layout: same batch size, so the filled positions are copied in
    place (the buffers stay, with their free capacity); its cross-attention rows are equal within
    an example, so they need not move."""
    cache = KVCache(num_layers=1, max_len=8)
    rows = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 2, 3, 4)  # row b is filled with b
    cache.layers[0].self_attn.update(rows, rows + 10)
    cache.layers[0].cross_attn.update(rows, rows)
    buffer = cache.layers[0].self_attn.keys
    cache.reorder(torch.tensor([1, 1, 3, 2]), cross_attention=False)
    k, v = cache.layers[0].self_attn.get()
    assert cache.layers[0].self_attn.keys is buffer and buffer.shape[2] == 8  # in place
    assert k[:, 0, :, 0].tolist() == [[1.0] * 3, [1.0] * 3, [3.0] * 3, [2.0] * 3]
    assert v[:, 1, 2, 3].tolist() == [11.0, 11.0, 13.0, 12.0]
    assert cache.layers[0].cross_attn.get()[0][:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    cache.layers[0].self_attn.update(rows[:, :, :1], rows[:, :, :1])  # appending still works
    assert cache.layers[0].self_attn.get()[0][:, 0, 3, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_cache_shape_errors():
    cache = AttentionCache(max_len=4)
    cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"do not match the cache \(B=1, h_kv=2"):
        cache.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="same B, h_kv and n"):
        cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="empty"):
        AttentionCache().get()
    model = _model(0, layers=2)
    with pytest.raises(ValueError, match="the cache has 3 layers, the decoder 2"), torch.no_grad():
        memory = model.encode(torch.full((1, 3), 4))
        model.decode(torch.full((1, 1), BOS_ID), memory, cache=KVCache(3))


# --------------------------------------------------------------------------------------------
# GQA / MQA in MultiHeadAttention, and what the cache stores
# --------------------------------------------------------------------------------------------
def test_gqa_with_all_kv_heads_equals_plain_mha():
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 8).eval()
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 8, num_kv_heads=8).eval()
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    for a, b in zip(plain(x, mem, mem), gqa(x, mem, mem), strict=False):
        assert torch.equal(a, b)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_gqa_equals_mha_with_shared_key_value_heads(num_kv_heads):
    # Independent reference: GQA is plain MHA whose K/V projections repeat each KV head's
    # weights for every query head of its group.
    h, d_model = 8, 32
    d_k = d_model // h
    torch.manual_seed(1)
    gqa = MultiHeadAttention(d_model, h, num_kv_heads=num_kv_heads).eval()
    mha = MultiHeadAttention(d_model, h).eval()
    group = h // num_kv_heads
    with torch.no_grad():
        for ours, theirs in ((mha.w_q, gqa.w_q), (mha.w_o, gqa.w_o)):  # w_q: a packed view
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        for ours, theirs in ((mha.w_k, gqa.w_k), (mha.w_v, gqa.w_v)):
            w = theirs.weight.view(num_kv_heads, d_k, d_model).repeat_interleave(group, 0)
            ours.weight.copy_(w.reshape(d_model, d_model))
            ours.bias.copy_(
                theirs.bias.view(num_kv_heads, d_k).repeat_interleave(group, 0).reshape(-1)
            )
    x = torch.randn(2, 6, d_model)
    mask = causal_mask(6)
    out_gqa, w_gqa = gqa(x, x, x, mask)
    out_mha, w_mha = mha(x, x, x, mask)
    torch.testing.assert_close(out_gqa, out_mha, atol=1e-6, rtol=1e-5)
    assert w_gqa.shape == (2, h, 6, 6)
    assert gqa.w_k.weight.shape == (num_kv_heads * d_k, d_model)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 8])  # MQA, GQA, MHA
def test_incremental_attention_with_kv_heads_cache(num_kv_heads):
    # Self-attention one position at a time through an AttentionCache equals causal attention
    # over the whole sequence, and the cache holds only the KV heads.
    h, d_model, B, n = 8, 64, 3, 9
    d_k = d_model // h
    torch.manual_seed(2)
    attn = MultiHeadAttention(d_model, h, num_kv_heads=num_kv_heads).eval()
    x = torch.randn(B, n, d_model)
    full, _ = attn(x, x, x, causal_mask(n))
    cache = AttentionCache(max_len=n)
    steps = []
    for t in range(n):
        out, weights = attn(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=cache)
        assert weights.shape == (B, h, 1, t + 1)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.keys.shape == (B, num_kv_heads, n, d_k)
    assert cache.nbytes == kv_cache_bytes(1, num_kv_heads, d_k, n, B, bytes_per_element=4)
    assert kv_cache_bytes(1, h, d_k, n, B, 4) == (h // num_kv_heads) * cache.nbytes  # MHA's


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=8"):
        MultiHeadAttention(32, 8, num_kv_heads=3)


# --------------------------------------------------------------------------------------------
# Stale state, decoder-only caches, argument checks
# --------------------------------------------------------------------------------------------


def test_a_cache_refuses_another_encoder_output():
    """A KVCache reused with another memory kept the old cross-attention K/V (logits off by
    2.1, even with another S). The same tensor, or an equal one, is fine; another raises."""
    model = _model(5)
    src = _padded_sources(5, [6, 6])
    token = torch.full((2, 1), BOS_ID)
    with torch.no_grad():
        memory = model.encode(src)
        cache = KVCache.for_model(model, max_len=4)
        first = model.decode(token, memory, cache=cache)
        model.decode(token, memory.clone(), cache=cache)  # equal values: accepted
        for other in (model.encode(_padded_sources(6, [6, 6])), model.encode(src[:, :4])):
            with pytest.raises(ValueError, match="another encoder output"):
                model.decode(token, other, cache=cache)
        with pytest.raises(ValueError, match="do not match the cache"):  # another batch
            model.decode(token[:1], memory[:1], cache=cache)
        fresh = KVCache.for_model(model, max_len=4)
        torch.testing.assert_close(model.decode(token, memory, cache=fresh), first)


def test_the_first_step_checks_memory_and_masks_and_later_steps_what_changed():
    model = _model(6)
    src = _padded_sources(6, [5, 3])
    src_mask = (src != PAD_ID)[:, None, None, :]
    token = torch.full((2, 1), BOS_ID)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = KVCache.for_model(model, max_len=4)
        model.decode(token, memory, src_mask=src_mask, cache=cache)
        assert cache.checked[0] is memory and cache.checked[1] is src_mask
        with pytest.raises(ValueError, match="src_mask must have shape"):  # a new mask: checked
            model.decode(token, memory, src_mask=src_mask[:, 0], cache=cache)
        with pytest.raises(ValueError, match=r"tgt_mask must have shape .*\(2, 4, 1, 2\)"):
            model.decode(
                token,
                memory,
                src_mask=src_mask,
                tgt_mask=torch.ones(1, 1, dtype=torch.bool),
                cache=cache,
            )  # with a cache, tgt_mask spans cache length + T
        good = torch.ones(2, 1, 1, 2, dtype=torch.bool)
        assert model.decode(token, memory, src_mask=src_mask, tgt_mask=good, cache=cache).shape == (
            2,
            1,
            VOCAB,
        )


def test_decoder_only_layers_cache_self_attention_only():
    torch.manual_seed(7)
    from minitransformer.model import Decoder

    stack = Decoder(2, 32, 4, 64, dropout=0.0, cross_attention=False).eval()

    class LM(torch.nn.Module):  # anything with decoder.layers
        decoder = stack

    cache = KVCache.for_model(LM(), max_len=3)
    assert all(layer.cross_attn is None for layer in cache.layers) and cache.cross_attn_nbytes == 0
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        full = stack(x, None, tgt_mask=causal_mask(6))
        steps = [stack(x[:, t : t + 1], None, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 6


def test_cache_argument_checks():
    with pytest.raises(ValueError, match="max_len must be positive"):
        KVCache(2, max_len=0)
    with pytest.raises(TypeError, match="cache_cls must be AttentionCache"):
        KVCache(2, cache_cls=dict)
    with pytest.raises(TypeError, match="model must have decoder.layers"):
        KVCache.for_model(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="positional"):
        AttentionCache(4, True)  # static is keyword-only
    cache = AttentionCache(max_len=4)
    with pytest.raises(TypeError, match="key must be a floating-point tensor"):
        cache.update(torch.zeros(1, 2, 1, 4, dtype=torch.long), torch.zeros(1, 2, 1, 4))
    cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="dtype=torch.float32"):  # would be cast silently
        cache.update(
            torch.zeros(1, 2, 1, 4, dtype=torch.float64),
            torch.zeros(1, 2, 1, 4, dtype=torch.float64),
        )
    with pytest.raises(TypeError, match="index must be an integer tensor"):
        cache.reorder(torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"index \[0, 1\] must lie in \[0, B=1\)"):
        cache.reorder(torch.tensor([0, 1]))
    model = _model(0)
    with pytest.raises(TypeError, match="cache must be a KVCache"), torch.no_grad():
        model.decode(torch.ones(1, 1, dtype=torch.long), torch.zeros(1, 3, 32), cache=cache)
    static = AttentionCache(static=True)
    empty = torch.zeros(1, 2, 0, 4)  # a source of length 0 fills the cache with nothing
    static.update(empty, empty, source=torch.zeros(1, 0, 8))
    with pytest.raises(ValueError, match="filled once"):
        static.update(empty, empty)


# --------------------------------------------------------------------------------------------
# The fast cached step (Decoder._step_plan, model._layer_step): the same numbers as the
# module path (bit for bit over the parameters, to rounding over the copies laid out for
# one-row products), and the module path wherever it does not apply.
# --------------------------------------------------------------------------------------------


def _count_fast_steps(monkeypatch) -> list[int]:
    """Count the calls of model._layer_step (one per layer and fast step)."""
    from minitransformer import model

    calls = [0]
    original = model._layer_step

    def counted(*args):
        calls[0] += 1
        return original(*args)

    monkeypatch.setattr(model, "_layer_step", counted)
    return calls


def _stepwise(
    model: Transformer, ys, memory, src_mask, cache_cls=None, *, fast: bool = True, pack=True
):
    """Logits of feeding ``ys`` one token at a time through a cache of 4 preallocated
    positions (so the buffers grow on the way)."""
    model.decoder.fast_step, model.decoder.pack_weights = fast, pack
    cache = KVCache.for_model(model, max_len=4, cache_cls=cache_cls)
    steps = [
        model.decode(ys[:, t : t + 1], memory, src_mask=src_mask, cache=cache)
        for t in range(ys.shape[1])
    ]
    model.decoder.fast_step = model.decoder.pack_weights = True
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("int8", [False, True])
def test_fast_step_gives_the_module_paths_logits_exactly(norm_first, padded, int8, monkeypatch):
    from minitransformer.quantize import Int8AttentionCache

    model = _model(11, norm_first)
    src = _padded_sources(11, [6, 2, 4] if padded else [6, 6, 6])
    src_mask = (src != PAD_ID)[:, None, None, :]
    ys = torch.randint(3, VOCAB, (3, 9), generator=torch.Generator().manual_seed(3))
    calls = _count_fast_steps(monkeypatch)
    cache_cls = Int8AttentionCache if int8 else None
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        module = _stepwise(model, ys, memory, src_mask, cache_cls, fast=False)
        assert calls[0] == 0
        fast = _stepwise(model, ys, memory, src_mask, cache_cls, pack=False)
        packed = _stepwise(model, ys, memory, src_mask, cache_cls)
        full = model.decode(ys, memory, src_mask=src_mask)
    assert calls[0] == 2 * 8 * 2  # every step after the first, in both layers, twice
    assert torch.equal(fast, module)  # the same products and kernels: bit for bit
    # The copies laid out (in, out): the same products summed in another order, so float32
    # rounding apart, as the whole-sequence pass (other kernels again) is below.
    torch.testing.assert_close(packed, module, atol=1e-5, rtol=1e-5)
    if not int8:
        torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)


def test_the_fast_step_reads_copies_laid_out_for_one_row_products_only_without_autograd():
    from minitransformer._layout import step_weight

    model = _model(16, norm_first=True)
    src = _padded_sources(16, [5, 5])
    token = torch.full((2, 1), BOS_ID)

    def steps(grad: bool):
        cache = KVCache.for_model(model, max_len=4)
        with torch.no_grad():
            memory = model.encode(src)
            model.decode(token, memory, cache=cache)  # the first step: the module path
        with torch.set_grad_enabled(grad):
            return model.decode(token, memory, cache=cache), cache.step_plan

    layer = model.decoder.layers[0]
    attn, ffn = layer.self_attn, layer.feed_forward
    logits, plan = steps(grad=False)
    step = plan.layers[0]
    # the weights with more outputs than inputs: copies stored (in, out); the others as they are
    assert step.self_attn.w_in.stride() == (1, 96) and step.self_attn.w_in.shape == (96, 32)
    assert step.self_attn.w_in is step_weight(attn.in_proj_weight)  # made once, then reused
    assert torch.equal(step.self_attn.w_in, attn.in_proj_weight)
    assert step.ffn[0].stride() == (1, 64) and torch.equal(step.ffn[0], ffn.linear1.weight)
    assert step.ffn[2] is ffn.linear2.weight and step.self_attn.w_o is attn.w_o.weight
    cross_q, _ = plan.layers[0].cross
    # cross-attention reads W^Q alone, (32, 32): square, so the parameter's own rows
    assert cross_q.w_in.data_ptr() == layer.cross_attn.in_proj_weight.data_ptr()
    assert cross_q.w_in.shape == (32, 32) and cross_q.w_in.is_contiguous()
    # with autograd on, the step reads the parameters themselves, and gradients reach them
    model.zero_grad()
    logits_grad, plan = steps(grad=True)
    assert plan.layers[0].self_attn.w_in is attn.in_proj_weight and not plan.packed
    logits_grad.square().sum().backward()
    assert attn.in_proj_weight.grad is not None and attn.in_proj_weight.grad.abs().sum() > 0
    torch.testing.assert_close(logits_grad.detach(), logits, atol=1e-5, rtol=1e-5)


def test_a_copy_follows_its_parameter():
    from minitransformer import _layout

    weight = torch.nn.Parameter(torch.randn(12, 4, dtype=torch.float64))
    copy = _layout.step_weight(weight)
    assert copy.stride() == (1, 12) and torch.equal(copy, weight) and not copy.requires_grad
    assert _layout.step_weight(weight) is copy  # reused while the parameter is unchanged
    with torch.no_grad():
        weight.mul_(2)  # an optimiser step or copy_: a new version
    assert torch.equal(_layout.step_weight(weight), weight)
    weight.data = weight.data.float()  # .to(): another tensor behind the parameter
    assert _layout.step_weight(weight).dtype == torch.float32
    assert torch.equal(_layout.step_weight(weight), weight)
    square, narrow = torch.randn(4, 4), torch.randn(4, 12)
    assert _layout.step_weight(square) is square and _layout.step_weight(narrow) is narrow
    stored_transposed = torch.randn(4, 12).t()  # (12, 4), stored (in, out) already
    assert _layout.step_weight(stored_transposed) is stored_transposed
    key = id(weight)
    del weight, copy
    assert key not in _layout._COPIES  # the copy goes with its parameter


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_fast_step_of_a_decoder_only_stack_with_gqa(num_kv_heads, monkeypatch):
    from minitransformer.model import Decoder

    torch.manual_seed(12)
    stack = Decoder(2, 32, 4, 64, dropout=0.0, cross_attention=False, norm_first=True).eval()
    for layer in stack.layers:
        layer.self_attn = MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads).eval()
    calls = _count_fast_steps(monkeypatch)
    x = torch.randn(2, 6, 32)

    class LM(torch.nn.Module):  # anything with decoder.layers
        decoder = stack

    def stepwise(fast: bool, pack: bool = True):
        stack.fast_step, stack.pack_weights = fast, pack
        cache = KVCache.for_model(LM(), max_len=2)
        return torch.cat([stack(x[:, t : t + 1], None, cache=cache) for t in range(6)], dim=1)

    with torch.no_grad():
        module, fast, packed = stepwise(False), stepwise(True, pack=False), stepwise(True)
        full = stack(x, None, tgt_mask=causal_mask(6))
    assert calls[0] == 2 * 5 * 2
    assert torch.equal(fast, module)
    for result in (fast, packed):
        torch.testing.assert_close(result, full, atol=1e-5, rtol=1e-5)


def test_the_module_path_runs_where_the_fast_step_does_not_apply(monkeypatch):
    model = _model(13)
    src = _padded_sources(13, [5, 5])
    token = torch.full((2, 1), BOS_ID)
    calls = _count_fast_steps(monkeypatch)
    with torch.no_grad():
        memory = model.encode(src)
        cache = KVCache.for_model(model, max_len=8)
        model.decode(token, memory, cache=cache)  # the first step fills the cross-attention
        assert calls[0] == 0
        model.decode(token.repeat(1, 2), memory, cache=cache)  # two new tokens
        model.decode(token, memory, tgt_mask=torch.ones(1, 1, 1, 4, dtype=torch.bool), cache=cache)
        model.decoder.layers[1].store_weights = True  # the weights are wanted: module path
        model.decode(token, memory, cache=cache)
        assert model.decoder.layers[1].self_attn_weights.shape == (2, 4, 1, 5)
        model.decoder.layers[1].store_weights = False
        model.train()
        model.decode(token, memory, cache=cache)
        model.eval()
        assert calls[0] == 0
        model.decode(token, memory, cache=cache)
        assert calls[0] == 2 and cache.length == 7


@pytest.mark.parametrize("fast", [True, False])
def test_fast_step_keeps_the_module_paths_errors(fast):
    model = _model(14)
    model.decoder.fast_step = fast
    src = _padded_sources(14, [6, 6])
    token = torch.full((2, 1), BOS_ID)
    with torch.no_grad():
        memory = model.encode(src)
        cache = KVCache.for_model(model, max_len=4)
        model.decode(token, memory, cache=cache)
        model.decode(token, memory, cache=cache)  # a fast step
        with pytest.raises(ValueError, match="do not match the cache"):  # another batch
            model.decode(token[:1], memory[:1], cache=cache)
        with pytest.raises(ValueError, match="another encoder output"):
            model.decode(token, model.encode(_padded_sources(15, [6, 6])), cache=cache)
        with pytest.raises(TypeError, match="dtype"):  # x in another dtype than the weights
            model.decoder(torch.randn(2, 1, 32, dtype=torch.float64), memory, cache=cache)
