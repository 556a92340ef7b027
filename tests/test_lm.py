"""The decoder-only language model (minitransformer.lm) against torch.nn.TransformerEncoder with
a causal mask; its loss, cached and uncached generation, sampling, the bigram baseline."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from minitransformer.kv_cache import KVCache
from minitransformer.lm import (
    DecoderOnlyTransformer,
    bigram_log_probs,
    bigram_loss,
    encode_corpus,
    evaluate_lm,
    generate,
    lm_loss,
    next_token_probs,
    pydoc_split,
    train_lm,
)
from minitransformer.model import EncoderLayer
from minitransformer.tokenizer import BPETokenizer

V, D, H, N_LAYERS, D_FF, MAX_LEN = 50, 16, 2, 2, 32, 40


def small_model(seed: int = 0, **kwargs) -> DecoderOnlyTransformer:
    torch.manual_seed(seed)
    options = dict(
        d_model=D, num_heads=H, num_layers=N_LAYERS, d_ff=D_FF, max_len=MAX_LEN, dropout=0.0
    )
    return DecoderOnlyTransformer(V, **{**options, **kwargs}).eval()


def random_tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# -- the model against torch's layers -------------------------------------------------------


@pytest.mark.parametrize("norm_first", [True, False])
def test_logits_match_a_torch_encoder_stack_with_a_causal_mask(norm_first):
    """A decoder layer without cross-attention is an encoder layer with a causal mask, so our
    model must equal: embedding * sqrt(d) + sinusoids -> nn.TransformerEncoder -> E^T."""
    torch.manual_seed(1)
    reference = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(
            D, H, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first
        ),
        N_LAYERS,
        norm=nn.LayerNorm(D) if norm_first else None,
        enable_nested_tensor=False,
    ).eval()
    model = small_model(norm_first=norm_first)
    for ours, theirs in zip(model.decoder.layers, reference.layers, strict=True):
        copy = EncoderLayer.from_torch(theirs)  # the package's own torch import, tested there
        ours.self_attn.load_state_dict(copy.self_attn.state_dict())
        ours.feed_forward.load_state_dict(copy.feed_forward.state_dict())
        ours.norm1.load_state_dict(copy.norm1.state_dict())
        ours.norm3.load_state_dict(copy.norm2.state_dict())  # no cross-attention: no norm2
    if norm_first:
        model.decoder.norm.load_state_dict(reference.norm.state_dict())

    tokens = random_tokens(3, 11)
    T = tokens.shape[1]
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    pe = torch.stack([torch.sin(pos * freq), torch.cos(pos * freq)], dim=-1).reshape(T, D)
    x = model.embed.weight[tokens] * math.sqrt(D) + pe.float()
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # torch: True = may NOT attend
    with torch.no_grad():
        expected = reference(x, mask=blocked) @ model.embed.weight.T  # tied output
        assert torch.allclose(model(tokens), expected, atol=1e-5)


def test_tied_and_untied_embeddings():
    tied, untied = small_model(), small_model(tie_embeddings=False)
    assert tied.output.weight is tied.embed.weight
    assert untied.output.weight is not untied.embed.weight
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(tied) == V * D
    decoder = sum(p.numel() for p in tied.decoder.parameters())
    assert count(tied) == V * D + decoder  # sinusoids are a buffer, not parameters


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 12), st.integers(0, 11), st.integers(0, 10**6))
def test_the_future_does_not_change_the_past(T, t, seed):
    t = min(t, T - 1)
    model = small_model()
    tokens = random_tokens(2, T, seed)
    changed = tokens.clone()
    changed[:, t:] = (changed[:, t:] + 1) % V
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-6)


def test_feeding_in_pieces_with_a_cache_gives_the_whole_logits():
    model = small_model()
    tokens = random_tokens(2, 13)
    cache = KVCache.for_model(model, 13)
    with torch.no_grad():
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in [(0, 5), (5, 6), (6, 13)]]
        assert torch.allclose(torch.cat(pieces, dim=1), model(tokens), atol=1e-5)
    assert cache.length == 13


# -- the loss -------------------------------------------------------------------------------


def test_lm_loss_is_the_shifted_cross_entropy():
    model = small_model()
    tokens = random_tokens(4, 9)
    with torch.no_grad():
        logits = model(tokens[:, :-1])  # (4, 8, V)
        manual = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        assert torch.allclose(lm_loss(model, tokens), manual)
        padded = tokens.clone()
        padded[:, 6:] = 0
        kept = F.cross_entropy(
            model(padded[:, :-1])[:, :5].reshape(-1, V), padded[:, 1:6].reshape(-1)
        )
        assert torch.allclose(lm_loss(model, padded, pad_id=0), kept)


@pytest.mark.parametrize("seq_len", [1, 4, 7, 30])
def test_evaluate_lm_predicts_every_token_but_the_first_once(seq_len):
    model = small_model()
    stream = random_tokens(1, 23)[0]
    expected, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, 22, seq_len):  # windows of seq_len + 1 tokens overlapping by one
            window = stream[s : s + seq_len + 1]
            nll = F.cross_entropy(model(window[None, :-1])[0], window[1:], reduction="sum")
            expected += float(nll)
            count += len(window) - 1
    assert count == 22
    assert evaluate_lm(model, stream, seq_len=seq_len, batch_size=2) == pytest.approx(
        expected / count, rel=1e-5
    )


# -- training -------------------------------------------------------------------------------


def test_train_lm_learns_a_periodic_stream_reproducibly():
    stream = torch.arange(600) % 7  # period 7: every token determines the next

    def run(steps, **kwargs):
        model = small_model(seed=3, dropout=0.1)
        torch.manual_seed(3)  # dropout
        history = train_lm(
            model,
            stream,
            steps=steps,
            seq_len=12,
            batch_size=8,
            lr=1e-2,
            warmup_steps=5,
            generator=torch.Generator().manual_seed(0),
            progress=False,
            **kwargs,
        )
        return model, history.loss

    assert run(8)[1] == run(8)[1]  # same seeds, same losses
    model, losses = run(60)
    assert len(losses) == 60 and losses[0] > 3.0 and losses[-1] < 0.5
    assert model.training
    assert evaluate_lm(model, stream[:100], seq_len=12) < 0.5


def test_train_lm_is_the_course_loop_with_the_lm_loss_and_its_evaluations():
    """train_lm is training.train with lm_loss: the same losses, and eval_fn every eval_every
    steps and after the last, in eval mode."""
    stream = torch.arange(300) % 7
    modes = []

    def held_out(model):
        modes.append(model.training)
        return evaluate_lm(model, stream[:50], seq_len=12)

    model = small_model(seed=3)
    history = train_lm(
        model,
        stream,
        steps=25,
        seq_len=12,
        batch_size=4,
        warmup_steps=5,
        generator=torch.Generator().manual_seed(0),
        eval_fn=held_out,
        eval_every=10,
        progress=False,
    )
    assert history.eval_steps == [10, 20, 25] and modes == [False] * 3
    assert history.eval_metric[-1] == evaluate_lm(model, stream[:50], seq_len=12)
    assert len(history.loss) == len(history.lr) == 25
    assert history.lr[0] == pytest.approx(1e-3 / 5)  # the first warm-up step
    assert max(history.lr) == pytest.approx(1e-3) and history.lr[-1] > 1e-4  # cosine to lr / 10


def test_a_float64_model_keeps_float64_through_the_loss_and_sampling():
    """The loss and the sampling distribution follow the model's dtype (float32 for half
    precision): a float64 model is not rounded to float32 on the way."""
    model = small_model().double()
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        logits = model(tokens[:, :-1])
        manual = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        loss = lm_loss(model, tokens)
    assert loss.dtype == torch.float64 and torch.equal(loss, manual)
    assert next_token_probs(logits[:, -1], top_k=5).dtype == torch.float64
    assert next_token_probs(logits[:, -1].half()).dtype == torch.float32


# -- sampling -------------------------------------------------------------------------------


def test_next_token_probs_temperature_and_top_k():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 3.0, 1.0]])
    assert torch.allclose(next_token_probs(logits), torch.softmax(logits, -1))
    assert torch.allclose(next_token_probs(logits, temperature=0.5), torch.softmax(2 * logits, -1))
    top2 = next_token_probs(logits, top_k=2)
    assert torch.allclose(top2[0], torch.softmax(torch.tensor([2.0, 1.0, -1e9, -1e9]), -1))
    assert torch.allclose(top2[1], torch.tensor([0.0, 0.5, 0.5, 0.0]))
    assert torch.equal(next_token_probs(logits, top_k=1)[0], torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(next_token_probs(logits, top_k=10), torch.softmax(logits, -1))
    cold = next_token_probs(logits, temperature=0.01)
    assert cold[0, 0] > 0.999  # temperature -> 0: the argmax


@pytest.mark.parametrize(
    "options",
    [
        dict(temperature=0.0),
        dict(temperature=1.0),
        dict(temperature=0.7, top_k=5),
        dict(temperature=1.5, top_k=20, eos_id=3),
    ],
)
def test_cached_and_uncached_generation_give_identical_tokens(options):
    model = small_model()
    prompt = random_tokens(3, 4)
    outputs = [
        generate(
            model,
            prompt,
            30,
            use_cache=use_cache,
            generator=torch.Generator().manual_seed(7),
            **options,
        )
        for use_cache in (True, False)
    ]
    assert torch.equal(outputs[0], outputs[1])
    assert torch.equal(outputs[0][:, :4], prompt)
    assert outputs[0].dtype == torch.long and not outputs[0].is_inference()


def test_greedy_is_the_argmax_of_the_logits():
    model = small_model()
    prompt = random_tokens(2, 3)
    out = generate(model, prompt, 6, temperature=0.0)
    with torch.no_grad():
        for t in range(3, 9):
            assert torch.equal(out[:, t], model(out[:, :t])[:, -1].argmax(-1))
    top1 = generate(
        model, prompt, 6, temperature=1.3, top_k=1, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(top1, out)  # top-1 sampling is greedy


def test_sampling_is_seeded():
    model = small_model()
    prompt = random_tokens(2, 2)

    def sample(seed):
        return generate(model, prompt, 25, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_rows_that_end_are_padded_and_generation_stops():
    model = small_model()
    prompt = random_tokens(4, 2)
    greedy = generate(model, prompt, 20, temperature=0.0)
    eos = int(greedy[0, 2])  # the first token row 0 produces: make it the end
    out = generate(model, prompt, 20, temperature=0.0, eos_id=eos, pad_id=0)
    assert out[0, 2] == eos and (out[0, 3:] == 0).all()
    for row in out.tolist():
        if eos in row[2:]:
            end = row.index(eos, 2)
            assert all(t == 0 for t in row[end + 1 :])
    assert out.shape[1] <= greedy.shape[1]


def test_kv_cache_bytes_after_generation_follow_the_formula():
    model = small_model()
    cache = KVCache.for_model(model, 30)
    out = generate(model, random_tokens(2, 5), 25, cache=cache, temperature=0.0)
    assert out.shape == (2, 30)
    assert cache.length == 29  # the last token is never fed back
    head_dim = D // H
    per_token = 2 * N_LAYERS * H * head_dim * 4  # K and V, layers, heads, head_dim, fp32
    assert cache.nbytes == 2 * 30 * per_token  # batch 2, 30 positions allocated
    assert cache.cross_attn_nbytes == 0


def test_generation_on_the_test_device(device):
    model = small_model().to(device)
    prompt = random_tokens(2, 3).to(device)
    outputs = [
        generate(
            model, prompt, 8, use_cache=use_cache, generator=torch.Generator(device).manual_seed(0)
        )
        for use_cache in (True, False)
    ]
    assert outputs[0].device.type == device.type
    assert torch.equal(outputs[0], outputs[1])


# -- the bigram baseline --------------------------------------------------------------------


def test_bigram_counts_and_smoothing():
    stream = torch.tensor([0, 1, 1, 2, 0, 1, 2, 2, 0])
    table = bigram_log_probs(stream, 3, alpha=0.5)
    pairs = Counter(zip(stream.tolist(), stream[1:].tolist(), strict=False))
    for a in range(3):
        row = sum(n for (x, _), n in pairs.items() if x == a)
        for b in range(3):
            assert math.exp(table[a, b]) == pytest.approx((pairs[(a, b)] + 0.5) / (row + 1.5))
    assert torch.allclose(table.exp().sum(1), torch.ones(3, dtype=torch.float64))
    expected = (
        -sum(table[a, b] for a, b in zip(stream[:-1].tolist(), stream[1:].tolist(), strict=True))
        / 8
    )
    assert bigram_loss(table, stream) == pytest.approx(float(expected))


def test_bigram_beats_uniform_on_its_training_text_and_unseen_rows_are_uniform():
    stream = torch.arange(300) % 5
    table = bigram_log_probs(stream, 8, alpha=1.0)
    assert bigram_loss(table, stream) < math.log(8) / 4
    assert torch.allclose(table[6], torch.full((8,), -math.log(8), dtype=torch.float64))


# -- the corpus -----------------------------------------------------------------------------


def word_runs(texts, n):
    """Every run of n whitespace-separated words in texts (across their boundaries too)."""
    words = "\n".join(texts).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_pydoc_split_is_fixed_and_disjoint():
    from pydoc_data.topics import topics

    train, held_out = pydoc_split()
    assert len(train) + len(held_out) == len(topics) and 5 <= len(held_out) <= 15
    assert not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(topics.values())
    assert pydoc_split() == (train, held_out)
    share = sum(map(len, held_out)) / sum(map(len, topics.values()))
    assert 0.05 < share < 0.15


def test_pydoc_split_holds_out_no_copy_of_the_training_text():
    # The held-out text must be text the model never saw: no run of 12 words of it occurs
    # in the training text (the chapter's perplexity is measured on it).
    train, held_out = pydoc_split()
    shared = word_runs(held_out, 12) & word_runs(train, 12)
    assert not shared, sorted(shared)[:3]
    # The check has teeth: the earlier rule (every eighth topic by name) held out `async`,
    # `sequence-types` and `typesseq-mutable`, near-copies of `compound`, `specialnames` and
    # `typesseq`: most of their 12-word runs are in the other topics.
    from pydoc_data.topics import topics

    names = sorted(topics)
    old_held = [topics[n] for i, n in enumerate(names) if i % 8 == 2]
    old_train = [topics[n] for i, n in enumerate(names) if i % 8 != 2]
    old_runs = word_runs(old_held, 12)
    assert len(old_runs & word_runs(old_train, 12)) > 0.2 * len(old_runs)


def test_encode_corpus_ends_every_document():
    tok = BPETokenizer()
    ids = encode_corpus(tok, ["ab", "", "c"])
    eos = tok.eos_id
    assert ids.tolist() == tok.encode("ab") + [eos, eos] + tok.encode("c") + [eos]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(vocab_size=0), ValueError, "vocab_size must be positive"),
        (dict(d_model=0), ValueError, "d_model must be positive"),
        (dict(num_layers=2.5), TypeError, "num_layers must be an int"),
        (dict(dropout=1.0), ValueError, r"dropout must be in \[0, 1\)"),
        (dict(max_len=-1), ValueError, "max_len must be positive"),
        (dict(d_model=15), ValueError, "d_model"),
    ],
)
def test_bad_model_arguments(kwargs, error, match):
    options = dict(vocab_size=V, d_model=D, num_heads=H, num_layers=1, d_ff=D_FF, max_len=8)
    options.update(kwargs)
    with pytest.raises(error, match=match):
        DecoderOnlyTransformer(options.pop("vocab_size"), **options)


def test_bad_tokens():
    model = small_model()
    with pytest.raises(TypeError, match=r"tokens must be an integer tensor of ids .* torch.float"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"tokens holds ids in \[-1, 0\], outside"):
        model(torch.tensor([[0, -1]], dtype=torch.int8))
    with pytest.raises(ValueError, match=r"tokens must have 2 dimensions \(B, T\), got \S+ \(3,\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids in \[0, 50\], outside the vocabulary \[0, 50\)"):
        model(torch.tensor([[0, 50]]))
    with pytest.raises(ValueError, match="max_len=40"):
        model(torch.zeros(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match=r"T \+ 1 >= 2"):
        lm_loss(model, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens must hold at least 2 tokens"):
        evaluate_lm(model, torch.zeros(1, dtype=torch.long), seq_len=4)


def test_bad_generation_arguments():
    model = small_model()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, prompt, 5, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be positive"):
        generate(model, prompt, 5, top_k=0)
    with pytest.raises(ValueError, match="max_len=40"):
        generate(model, prompt, 38)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        generate(model, prompt, 0)
    with pytest.raises(TypeError, match="prompt must be an integer tensor"):
        generate(model, prompt.float(), 5)
    cache = KVCache.for_model(model, 10)
    generate(model, prompt, 2, cache=cache)
    with pytest.raises(ValueError, match="cache must be an empty KVCache"):
        generate(model, prompt, 2, cache=cache)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        next_token_probs(torch.zeros(1, 4), temperature=0.0)


def test_bad_training_and_baseline_arguments():
    model = small_model()
    stream = torch.arange(20) % V
    with pytest.raises(ValueError, match="tokens must hold at least 17 tokens"):
        train_lm(model, stream[:10], steps=1, seq_len=16, batch_size=2)
    with pytest.raises(ValueError, match="steps must be positive"):
        train_lm(model, stream, steps=0, seq_len=4, batch_size=2)
    with pytest.raises(ValueError, match="lr must be > 0"):
        train_lm(model, stream, steps=1, seq_len=4, batch_size=2, lr=0.0)
    with pytest.raises(ValueError, match="clip_grad_norm must be finite"):
        train_lm(model, stream, steps=1, seq_len=4, batch_size=2, clip_grad_norm=float("inf"))
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 5\)"):
        bigram_log_probs(stream, 5)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        bigram_log_probs(stream, V, alpha=0.0)
    with pytest.raises(TypeError, match="log_probs must be a floating-point tensor"):
        bigram_loss(torch.zeros(V, V, dtype=torch.long), stream)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_every_id_dtype_gives_the_int64_logits_and_loss(dtype):
    model = small_model().eval()
    tokens = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    if dtype == torch.int8:
        tokens = tokens.clamp(max=49)  # int8 holds up to 127: all 50 ids fit
    assert torch.equal(model(tokens.to(dtype)), model(tokens))
    assert torch.equal(lm_loss(model, tokens.to(dtype)), lm_loss(model, tokens))


def test_a_target_outside_the_vocabulary_is_named():
    # the last column is never an input: the loss checks it as a target
    with pytest.raises(ValueError, match=r"tokens holds ids in \[2, 50\], outside the vocab"):
        lm_loss(small_model(), torch.tensor([[1, 2, 50]]))
    # a pad_id outside the vocabulary is fine where it is ignored
    lm_loss(small_model(), torch.tensor([[1, 2, -1]]), pad_id=-1)


def test_empty_batches_and_no_positions():
    """As the encoder-decoder Transformer and torch: an empty batch, or no positions, gives
    empty logits; the loss over no targets is NaN, as for F.cross_entropy; generating from an
    empty batch gives an empty batch of the full length."""
    model = small_model().eval()
    assert model(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, 50)
    assert model(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 50)
    assert lm_loss(model, torch.zeros(0, 5, dtype=torch.long)).isnan()
    assert lm_loss(model, torch.zeros(2, 5, dtype=torch.long), pad_id=0).isnan()
    assert generate(model, torch.zeros(0, 3, dtype=torch.long), 4).shape == (0, 7)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_bigram_counts_of_every_id_dtype_equal_int64s(dtype):
    # uint8 ids with V = 256: a * V + b overflowed in uint8, and 1,280 of the 65,536 entries
    # differed; the ids are converted to int64 before any arithmetic
    tokens = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0))
    want = bigram_log_probs(tokens, 256)
    assert torch.equal(bigram_log_probs(tokens.to(dtype), 256), want)
    assert bigram_loss(want, tokens.to(dtype)) == bigram_loss(want, tokens)


def test_bigram_loss_refuses_a_negative_id():
    # it was read as row V - 1
    table = bigram_log_probs(torch.tensor([1, 2, 3, 1]), 4)
    with pytest.raises(ValueError, match=r"tokens holds ids in \[-1, 2\], outside the vocab"):
        bigram_loss(table, torch.tensor([1, -1, 2]))
