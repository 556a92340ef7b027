"""GPT-2 in the course's layers (minitransformer.gpt2) against Hugging Face ``transformers``'
own GPT-2, the independent reference: the same logits and the same greedy tokens, from random
weights (nothing is downloaded). Every weight is drawn at random, LayerNorms and biases
included, so that a weight copied to the wrong place, or not at all, changes the logits."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from minitransformer._layout import step_weight
from minitransformer.gpt2 import from_hf_gpt2, gpt2_weight_map, load_safetensors
from minitransformer.kv_cache import KVCache
from minitransformer.lm import DecoderOnlyTransformer, generate
from minitransformer.model import FeedForward

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 101, "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64}
CONFIGS = {
    "tiny": TINY,
    # exact GELU, a feed-forward width that is not 4 d_model, untied output, another epsilon
    "untied-gelu": {
        **TINY,
        "n_inner": 48,
        "activation_function": "gelu",
        "tie_word_embeddings": False,
        "layer_norm_epsilon": 1e-6,
    },
    "relu-3-layers": {**TINY, "n_head": 2, "n_layer": 3, "activation_function": "relu"},
}


def hf_gpt2(seed: int = 0, **config: object) -> torch.nn.Module:
    """A random ``GPT2LMHeadModel`` in eval mode; every parameter redrawn (HF starts biases at
    zero and LayerNorms at one, which would hide a bias or a LayerNorm left behind)."""
    torch.manual_seed(seed)
    settings = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, **config}
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith(".weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_hugging_face(name: str) -> None:
    hf = hf_gpt2(**CONFIGS[name])
    ours = from_hf_gpt2(hf)
    assert not ours.training
    tokens = torch.randint(0, 101, (3, 40), generator=torch.Generator().manual_seed(1))
    theirs = logits(hf, tokens)
    assert theirs.std() > 0.5  # logits that differ between tokens: the check has teeth
    torch.testing.assert_close(logits(ours, tokens), theirs, rtol=0, atol=1e-5)
    hf64 = hf.double()
    torch.testing.assert_close(
        logits(from_hf_gpt2(hf64), tokens), logits(hf64, tokens), rtol=0, atol=1e-12
    )


def test_options_match_the_config() -> None:
    ours = from_hf_gpt2(hf_gpt2(**CONFIGS["untied-gelu"]))
    assert ours.output.weight is not ours.embed.weight
    assert ours.decoder.layers[0].feed_forward.activation == "gelu"
    assert ours.decoder.layers[0].feed_forward.linear1.out_features == 48
    assert ours.decoder.norm.eps == 1e-6 and ours.decoder.layers[1].norm3.eps == 1e-6
    tied = from_hf_gpt2(hf_gpt2(**TINY))
    assert tied.output.weight is tied.embed.weight and tied.embed_scale == 1.0
    assert tied.decoder.layers[0].feed_forward.activation == "gelu_tanh"


def test_gpt2_small_shape() -> None:
    """GPT-2 small's real shape (124M parameters), HF's own initialisation."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = from_hf_gpt2(hf)
    assert sum(p.numel() for p in ours.parameters()) == 124_439_808
    assert sum(p.numel() for p in hf.parameters()) == 124_439_808
    tokens = torch.randint(0, 50257, (1, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(logits(ours, tokens), logits(hf, tokens), rtol=0, atol=1e-5)
    # The cached step's copies laid out (in, out): c_attn, c_fc and the output projection, as
    # minitransformer._layout says (88,142,592 numbers, 352 MB in float32, beside 498 MB)
    cache = KVCache.for_model(ours, 4)
    generate(ours, tokens[:, :2], 2, temperature=0, cache=cache)
    plan = cache.step_plan.layers
    copies = [step.self_attn.w_in for step in plan] + [step.ffn[0] for step in plan]
    copies.append(step_weight(ours.output.weight))
    parameters = {p.data_ptr() for p in ours.parameters()}
    assert not any(copy.data_ptr() in parameters for copy in copies)
    assert sum(copy.numel() for copy in copies) == 88_142_592
    assert plan[0].self_attn.w_o is ours.decoder.layers[0].self_attn.w_o.weight  # 768 x 768


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("name", ["tiny", "untied-gelu"])
def test_greedy_generation_equals_hugging_face_generate(name: str, use_cache: bool) -> None:
    hf = hf_gpt2(**CONFIGS[name])
    ours = from_hf_gpt2(hf)
    prompt = torch.randint(1, 101, (4, 6), generator=torch.Generator().manual_seed(3))
    theirs = hf.generate(
        prompt, max_new_tokens=30, do_sample=False, use_cache=use_cache, eos_token_id=None
    )
    mine = generate(ours, prompt, 30, temperature=0, use_cache=use_cache)
    assert torch.equal(mine, theirs)
    assert len(set(theirs[:, 6:].flatten().tolist())) > 2  # not one token throughout


def test_reads_a_saved_folder(tmp_path) -> None:
    hf = hf_gpt2(**CONFIGS["untied-gelu"])
    hf.save_pretrained(tmp_path)
    ours = from_hf_gpt2(tmp_path)
    tokens = torch.randint(0, 101, (2, 9))
    torch.testing.assert_close(logits(ours, tokens), logits(hf, tokens), rtol=0, atol=1e-5)
    assert from_hf_gpt2(str(tmp_path)).decoder.norm.eps == 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_load_safetensors_agrees_with_the_safetensors_package(tmp_path, dtype) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tensors = {
        "a": torch.randn(3, 5).to(dtype),
        "b.c": torch.arange(7, dtype=torch.int64),
        "empty": torch.zeros(0, 4, dtype=dtype),
        "scalar": torch.tensor(2.5, dtype=dtype),
    }
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    read, reference = load_safetensors(path), safetensors_torch.load_file(str(path))
    assert read.keys() == reference.keys()
    for key, value in reference.items():
        assert read[key].dtype == value.dtype and torch.equal(read[key], value), key


def test_load_safetensors_refuses_broken_files(tmp_path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_safetensors(short)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
    wrong = tmp_path / "wrong.safetensors"
    wrong.write_bytes(len(header).to_bytes(8, "little") + header + bytes(12))
    with pytest.raises(ValueError, match=r"'w' has 12 bytes, its shape \(4,\) needs 16"):
        load_safetensors(wrong)


def test_weight_map_covers_every_parameter() -> None:
    """Every parameter of the model is the target of exactly one GPT-2 weight."""
    for tie in (True, False):
        model = DecoderOnlyTransformer(
            101, d_model=32, num_heads=4, num_layers=3, d_ff=64, max_len=16,
            positions="learned", scale_embedding=False, tie_embeddings=tie,
        )  # fmt: skip
        targets = list(gpt2_weight_map(3, tie_embeddings=tie).values())
        assert sorted(targets) == sorted(dict(model.named_parameters()))


def test_refuses_what_it_cannot_express() -> None:
    hf = hf_gpt2(**TINY)
    state, config = hf.state_dict(), hf.config.to_dict()
    for key, value, words in [
        ("model_type", "llama", "model_type must be 'gpt2'"),
        ("scale_attn_by_inverse_layer_idx", True, "divided by the layer's index"),
        ("scale_attn_weights", False, r"not divided by sqrt\(d_k\)"),
        ("add_cross_attention", True, "cross-attention"),
        ("activation_function", "swish", "activation_function 'swish'"),
        ("n_head", None, "n_head must be a positive integer"),
        ("n_layer", True, "n_layer must be a positive integer, got True"),
        ("n_positions", 0, "n_positions must be a positive integer"),
        ("n_inner", 2.5, "n_inner must be a positive integer"),
        ("n_head", 5, "n_head=5 must divide n_embd=32"),
        ("layer_norm_epsilon", -1.0, r"layer_norm_epsilon must be in \(0, 1\)"),
    ]:
        with pytest.raises(ValueError, match=words):
            from_hf_gpt2(state, config={**config, key: value})
    with pytest.raises(ValueError, match=r"missing \['h.1.ln_2.bias'\]"):
        from_hf_gpt2(
            {k: v for k, v in state.items() if k != "transformer.h.1.ln_2.bias"}, config=config
        )
    with pytest.raises(ValueError, match=r"unexpected \['h.2.ln_1.weight'\]"):
        from_hf_gpt2({**state, "transformer.h.2.ln_1.weight": torch.ones(32)}, config=config)
    bad = {**state, "transformer.h.0.mlp.c_fc.weight": torch.zeros(128, 32)}
    with pytest.raises(
        ValueError, match=r"h.0.mlp.c_fc.weight has shape \(128, 32\), the config needs \(32, 128\)"
    ):
        from_hf_gpt2(bad, config=config)
    ints = {**state, "transformer.h.0.ln_1.weight": torch.ones(32, dtype=torch.long)}
    with pytest.raises(TypeError, match="h.0.ln_1.weight must be a floating-point tensor"):
        from_hf_gpt2(ints, config=config)
    with pytest.raises(TypeError, match="config is required"):
        from_hf_gpt2(state)
    with pytest.raises(TypeError, match="source must be"):
        from_hf_gpt2(42)  # type: ignore[arg-type]


def test_refuses_a_folder_without_its_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        from_hf_gpt2(tmp_path)
    hf_gpt2(**TINY).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="config comes from"):
        from_hf_gpt2(tmp_path, config={})


def test_a_failed_load_changes_nothing() -> None:
    """A refused state_dict leaves the caller's tensors as they were."""
    hf = hf_gpt2(**TINY)
    state = hf.state_dict()
    before = {k: v.clone() for k, v in state.items()}
    with pytest.raises(ValueError):
        from_hf_gpt2({**state, "transformer.wpe.weight": torch.zeros(3, 32)}, config=hf.config)
    assert all(torch.equal(state[k], before[k]) for k in state)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_activations_against_torch(activation: str) -> None:
    ffn = FeedForward(8, 16, dropout=0.0, activation=activation).eval()
    x = torch.randn(2, 3, 8)
    act = {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
    }[activation]
    expected = ffn.linear2(act(ffn.linear1(x)))
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=0)


def test_new_options_refuse_bad_values() -> None:
    sizes = {"d_model": 8, "num_heads": 2, "num_layers": 1, "d_ff": 16, "max_len": 8}
    with pytest.raises(ValueError, match="positions must be 'sinusoidal' or 'learned'"):
        DecoderOnlyTransformer(10, positions="rotary", **sizes)
    with pytest.raises(ValueError, match="activation must be one of relu, gelu, gelu_tanh"):
        DecoderOnlyTransformer(10, activation="swish", **sizes)
    with pytest.raises(TypeError, match="scale_embedding must be a bool"):
        DecoderOnlyTransformer(10, scale_embedding=1, **sizes)  # type: ignore[arg-type]


def test_cached_fast_step_with_gelu_equals_the_module_path() -> None:
    """The cached one-token step has its own copy of the feed-forward (model._ffn_step): with
    GELU it must give the logits of the module path, bit for bit over the parameters, and to
    float32 rounding over the copies laid out for one-row products (pack_weights)."""
    model = from_hf_gpt2(hf_gpt2(**TINY))
    prompt, new = torch.randint(1, 101, (2, 5)), torch.randint(1, 101, (2, 1))
    steps = []
    for fast, pack in ((True, False), (False, False), (True, True)):
        model.decoder.fast_step, model.decoder.pack_weights = fast, pack
        cache = KVCache.for_model(model, 6)
        with torch.no_grad():
            model(prompt, cache=cache)
            steps.append(model(new, cache=cache))
        assert (cache.step_plan is not None) == fast
    assert torch.equal(steps[0], steps[1])
    torch.testing.assert_close(steps[2], steps[1], atol=1e-5, rtol=1e-5)
