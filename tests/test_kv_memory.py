"""The KV-memory calculator: the formula, the registry of published models, Hugging Face
config.json files (Llama, Mistral, Qwen2, GPT-2, T5) and the estimate/report behind the CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.kv_memory import (
    DTYPE_BYTES,
    MODEL_CONFIGS,
    ModelConfig,
    estimate,
    format_bytes,
    kv_cache_bytes,
    report,
)

# Bytes per token at 2 bytes per element, from ../shared/PAPER_FACTS.md (computed from each
# model's published config.json): 2 x layers x KV heads x head_dim x 2.
PER_TOKEN_BF16 = {
    "gpt2-small": 36_864,
    "llama-2-7b": 524_288,
    "llama-2-70b": 327_680,
    "llama-3-8b": 131_072,
    "mistral-7b": 131_072,
    "transformer-base": 12_288,
    "transformer-big": 24_576,
}


def per_token(layers: int, kv_heads: int, head_dim: int, bpe: int = 2) -> int:
    """The formula written out, independent of the package: K and V, every layer and KV head."""
    return 2 * layers * kv_heads * head_dim * bpe


@pytest.mark.parametrize("name, per_token", sorted(PER_TOKEN_BF16.items()))
def test_per_token_bytes_of_known_models(name, per_token):
    cfg = MODEL_CONFIGS[name]
    assert cfg.bytes_per_token(2) == per_token
    assert kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1) == per_token
    assert cfg.bytes_per_token(4) == 2 * per_token


def test_llama_2_7b_numbers():
    assert kv_cache_bytes(32, 32, 128, seq_len=1, bytes_per_element=2) == 524_288
    # 4096 tokens, batch 8, bf16: 16 GiB
    assert kv_cache_bytes(32, 32, 128, 4096, batch_size=8, bytes_per_element=2) == 16 * 2**30


def test_gqa_saving_of_llama_2_70b_is_8x():
    cfg = MODEL_CONFIGS["llama-2-70b"]
    assert cfg.attention == "GQA" and cfg.num_heads == 64 and cfg.num_kv_heads == 8
    assert cfg.mha_cache_bytes(4096) == 8 * cfg.cache_bytes(4096)
    assert cfg.mha_cache_bytes(1) == int(2.5 * 2**20)  # 2.5 MiB per token without GQA


def test_sliding_window_caps_mistral():
    cfg = MODEL_CONFIGS["mistral-7b"]
    assert cfg.cache_bytes(32768) == cfg.cache_bytes(4096) == 4096 * 131_072
    assert cfg.cache_bytes(1000) == 1000 * 131_072


def test_configs_are_consistent():
    for name, cfg in MODEL_CONFIGS.items():
        assert cfg.name == name
        assert cfg.num_heads % cfg.num_kv_heads == 0
        assert cfg.num_heads * cfg.head_dim == cfg.d_model
        assert cfg.source


def test_the_papers_models_are_encoder_decoders_with_cross_attention():
    base = MODEL_CONFIGS["transformer-base"]
    assert base.encoder_decoder and not MODEL_CONFIGS["llama-2-7b"].encoder_decoder
    # 6 decoder layers x 8 heads x 64 over 30 source positions, K and V, 2 bytes
    assert base.cross_cache_bytes(30) == 30 * per_token(6, 8, 64)
    assert MODEL_CONFIGS["llama-2-7b"].cross_cache_bytes(30) == 0


@settings(max_examples=50, deadline=None)
@given(
    layers=st.integers(1, 100),
    kv_heads=st.integers(1, 64),
    head_dim=st.integers(1, 256),
    seq=st.integers(0, 10**5),
    batch=st.integers(1, 64),
    bpe=st.sampled_from([1, 2, 4]),
)
def test_formula_is_linear_in_every_factor(layers, kv_heads, head_dim, seq, batch, bpe):
    total = kv_cache_bytes(layers, kv_heads, head_dim, seq, batch, bpe)
    assert total == 2 * layers * kv_heads * head_dim * seq * batch * bpe
    assert kv_cache_bytes(layers, kv_heads, head_dim, seq + 1, batch, bpe) - total == (
        2 * layers * kv_heads * head_dim * batch * bpe
    )


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 12),
    windowed=st.integers(1, 12),
    window=st.integers(1, 64),
    seq=st.integers(0, 200),
)
def test_sliding_window_caps_only_its_layers(layers, windowed, window, seq):
    windowed = min(windowed, layers)
    cfg = ModelConfig(
        "m", layers, 4, 2, 8, 32, None, "test", sliding_window=window, num_sliding_layers=windowed
    )
    assert cfg.window_layers == windowed
    layer_positions = (layers - windowed) * seq + windowed * min(seq, window)
    assert cfg.cache_bytes(seq) == layer_positions * per_token(1, 2, 8)
    assert cfg.mha_cache_bytes(seq) == 2 * cfg.cache_bytes(seq)  # 4 query heads, 2 KV heads


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_layers=0), ValueError, "num_layers must be positive, got 0"),
        (dict(num_kv_heads=-1), ValueError, "num_kv_heads"),
        # the wrong kind (a float) is a TypeError, as everywhere in the package (CONTRIBUTING)
        (dict(head_dim=2.5), TypeError, "head_dim must be an int, got float 2.5"),
        (dict(seq_len=-1), ValueError, "seq_len must be >= 0"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(bytes_per_element=0), ValueError, "bytes_per_element"),
        (dict(num_layers=True), TypeError, "num_layers must be an int, got bool"),
    ],
)
def test_bad_sizes_raise(kwargs, error, match):
    args = dict(num_layers=2, num_kv_heads=2, head_dim=8, seq_len=4)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        kv_cache_bytes(**args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_kv_heads=3), "num_kv_heads=3 must divide num_heads=8"),
        (dict(num_layers=0), "num_layers must be positive"),
        (dict(max_len=0), "max_len must be positive"),
        (dict(dtype="fp7"), "dtype must be one of .*got 'fp7'"),
        (dict(num_sliding_layers=2), "num_sliding_layers needs a sliding_window"),
        (dict(sliding_window=16, num_sliding_layers=5), "at most num_layers=4, got 5"),
    ],
)
def test_bad_model_configs_raise(kwargs, match):
    args = dict(
        name="m",
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        head_dim=8,
        d_model=64,
        max_len=None,
        source="test",
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ModelConfig(**args)


def test_format_bytes():
    assert format_bytes(512) == "512 bytes"
    assert format_bytes(524_288) == "512 KiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(1010 * 2**20) == "1010 MiB"  # not "1.01e+03 MiB"
    assert format_bytes(16 * 2**30) == "16.00 GiB"


# --------------------------------------------------------------------------------------------
# Hugging Face config.json files, one per family, with the field names each one publishes
# --------------------------------------------------------------------------------------------

# meta-llama/Llama-2-70b-hf (the attention fields and a few others as released)
LLAMA_2_70B = {
    "_name_or_path": "meta-llama/Llama-2-70b-hf",
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}
# mistralai/Mistral-7B-v0.1
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
# Qwen2-7B: a sliding window is declared but switched off by use_sliding_window
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}
# openai-community/gpt2: no torch_dtype, no num_key_value_heads
GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}
# google-t5/t5-small: an encoder-decoder; head size d_kv; n_positions 512, the length it was
# trained with (flan-t5's configs have no n_positions)
T5_SMALL = {
    "architectures": ["T5WithLMHeadModel"],
    "d_ff": 2048,
    "d_kv": 64,
    "d_model": 512,
    "is_encoder_decoder": True,
    "model_type": "t5",
    "n_positions": 512,
    "num_heads": 8,
    "num_layers": 6,
    "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}


def write_config(tmp_path, fields, folder="model"):
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields))
    return path


def test_llama_config(tmp_path):
    cfg = ModelConfig.from_hf_config(write_config(tmp_path, LLAMA_2_70B))
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (80, 64, 8, 128)
    assert cfg.bytes_per_token(2) == PER_TOKEN_BF16["llama-2-70b"]
    assert cfg.max_len == 4096 and cfg.dtype == "float16" and cfg.sliding_window is None
    assert cfg.name == "meta-llama/Llama-2-70b-hf"
    assert cfg.source.endswith("config.json")
    known = MODEL_CONFIGS["llama-2-70b"]  # the registry agrees with the file
    assert cfg.cache_bytes(4096, 8) == known.cache_bytes(4096, 8)
    assert cfg.mha_cache_bytes(4096) == known.mha_cache_bytes(4096)


def test_mistral_config_keeps_its_sliding_window(tmp_path):
    cfg = ModelConfig.from_hf_config(write_config(tmp_path, MISTRAL_7B))
    assert cfg.sliding_window == 4096 and cfg.window_layers == 32
    assert cfg.bytes_per_token(2) == PER_TOKEN_BF16["mistral-7b"]
    assert cfg.cache_bytes(32768) == 4096 * PER_TOKEN_BF16["mistral-7b"]
    assert cfg.dtype == "bfloat16" and cfg.max_len == 32768


def test_qwen2_config_ignores_a_switched_off_window(tmp_path):
    cfg = ModelConfig.from_hf_config(write_config(tmp_path, QWEN2_7B))
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (28, 28, 4, 128)
    assert cfg.sliding_window is None
    assert cfg.cache_bytes(131072) == 131072 * per_token(28, 4, 128)


def test_qwen2_config_with_the_window_on_caps_the_layers_after_max_window_layers():
    # Qwen2 uses the window in layers max_window_layers..num_hidden_layers-1 (8 of 28 here)
    cfg = ModelConfig.from_hf_config(
        QWEN2_7B | {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    )
    assert cfg.sliding_window == 4096 and cfg.window_layers == 8
    assert cfg.cache_bytes(10_000) == (20 * 10_000 + 8 * 4096) * per_token(1, 4, 128)
    text = report(cfg, 10_000)
    assert "only the last 4,096 positions are cached in 8 of the 28 layers" in text


def test_layer_types_say_which_layers_use_the_window():
    fields = MISTRAL_7B | {
        "num_hidden_layers": 4,
        "sliding_window": 10,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    cfg = ModelConfig.from_hf_config(fields)
    assert cfg.window_layers == 2
    assert cfg.cache_bytes(100) == (2 * 100 + 2 * 10) * per_token(1, 8, 128)


def test_gpt2_config(tmp_path):
    cfg = ModelConfig.from_hf_config(write_config(tmp_path, GPT2).parent)  # the folder works too
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (12, 12, 12, 64)
    assert cfg.bytes_per_token(2) == PER_TOKEN_BF16["gpt2-small"]
    assert cfg.max_len == 1024 and cfg.dtype is None and cfg.attention == "MHA"
    assert cfg.name == "gpt2"  # no _name_or_path: the model_type


def test_t5_config_counts_decoder_self_attention_and_cross_attention(tmp_path):
    cfg = ModelConfig.from_hf_config(write_config(tmp_path, T5_SMALL))
    assert cfg.encoder_decoder and cfg.max_len == 512 and cfg.dtype is None
    assert (cfg.num_layers, cfg.num_heads, cfg.head_dim, cfg.d_model) == (6, 8, 64, 512)
    assert cfg.cache_bytes(20, bytes_per_element=4) == 20 * per_token(6, 8, 64, 4)
    assert cfg.cross_cache_bytes(50, bytes_per_element=4) == 50 * per_token(6, 8, 64, 4)
    est = estimate(cfg, 20, 3, "fp32", src_len=50)
    assert est["total_bytes_per_batch"] == 3 * (20 + 50) * per_token(6, 8, 64, 4)


def test_t5_uses_num_decoder_layers_and_d_kv():
    # T5 1.1 / flan-t5 name the decoder's depth; t5-11b has d_kv 128 with d_model 1024 and
    # 128 heads, so the head size is not d_model / heads
    cfg = ModelConfig.from_hf_config(
        T5_SMALL
        | {
            "num_layers": 24,
            "num_decoder_layers": 6,
            "d_model": 1024,
            "d_kv": 128,
            "num_heads": 128,
            "n_positions": None,
        }
    )
    assert (cfg.num_layers, cfg.head_dim, cfg.d_model) == (6, 128, 1024)
    assert cfg.max_len is None
    assert cfg.bytes_per_token(2) == per_token(6, 128, 128)


def test_multi_query_configs_have_one_kv_head():
    # GPT-BigCode and Falcon say "multi_query" instead of num_key_value_heads
    cfg = ModelConfig.from_hf_config(GPT2 | {"multi_query": True, "model_type": "gpt_bigcode"})
    assert cfg.num_kv_heads == 1 and cfg.attention == "MQA"
    assert cfg.bytes_per_token(2) == per_token(12, 1, 64)
    falcon_40b_like = MISTRAL_7B | {
        "num_key_value_heads": None,
        "num_kv_heads": 8,
        "multi_query": True,
    }
    assert ModelConfig.from_hf_config(falcon_40b_like).num_kv_heads == 8


def test_hf_head_dim_field_wins_over_hidden_size():
    cfg = ModelConfig.from_hf_config(MISTRAL_7B | {"hidden_size": 5120, "head_dim": 128})
    assert cfg.head_dim == 128 and cfg.d_model == 5120  # Mistral-Nemo style: 32 x 128 != 5120


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(1, 96),
    kv_heads=st.integers(1, 16),
    group=st.integers(1, 8),
    head_dim=st.sampled_from([32, 64, 80, 128]),
    dtype=st.sampled_from(["float16", "float32"]),
)
def test_any_llama_style_config_gives_the_formula(layers, kv_heads, group, head_dim, dtype):
    heads = kv_heads * group
    cfg = ModelConfig.from_hf_config(
        {
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "hidden_size": heads * head_dim,
            "torch_dtype": dtype,
        }
    )
    bpe = DTYPE_BYTES[dtype]
    assert cfg.head_dim == head_dim and cfg.dtype == dtype
    assert cfg.bytes_per_token(bpe) == per_token(layers, kv_heads, head_dim, bpe)
    assert cfg.mha_cache_bytes(7) == group * cfg.cache_bytes(7)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            dict(num_hidden_layers=None),
            r"no number of layers: expected one of the fields "
            r"num_decoder_layers, num_hidden_layers, n_layer",
        ),
        (dict(num_attention_heads=None), "no number of attention heads: .*num_attention_heads"),
        (dict(hidden_size=None), "no head dimension or hidden size: .*head_dim, d_kv, hidden_size"),
        (dict(hidden_size=4001), "hidden size 4001 is not divisible by the 32 attention heads"),
        (dict(num_hidden_layers="32"), "num_hidden_layers must be a positive integer, got '32'"),
        (dict(num_key_value_heads=0), "num_key_value_heads must be a positive integer, got 0"),
        (dict(sliding_window=4.5), "sliding_window must be a positive integer, got 4.5"),
        (dict(torch_dtype="complex64"), "torch_dtype must be one of .*got 'complex64'"),
        (dict(use_sliding_window=True), "no first sliding-window layer: .*max_window_layers"),
        (dict(layer_types=["full_attention"]), "layer_types must list the 32 layers"),
    ],
)
def test_bad_hf_configs_name_the_field_and_the_file(tmp_path, change, match):
    fields = {k: v for k, v in (MISTRAL_7B | change).items() if v is not None}
    path = write_config(tmp_path, fields)
    with pytest.raises(ValueError, match=match) as info:
        ModelConfig.from_hf_config(path)
    assert str(path) in str(info.value)


def test_hf_config_that_is_not_a_json_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        ModelConfig.from_hf_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        ModelConfig.from_hf_config(str(path))


# --------------------------------------------------------------------------------------------
# estimate (the --json output) and report (the table)
# --------------------------------------------------------------------------------------------


def test_estimate_is_json_and_matches_the_methods():
    cfg = MODEL_CONFIGS["llama-2-70b"]
    est = json.loads(json.dumps(estimate(cfg, 4096, 8, "fp16")))
    assert est["bytes_per_token"] == PER_TOKEN_BF16["llama-2-70b"]
    assert est["bytes_per_sequence"] == cfg.cache_bytes(4096)
    assert est["bytes_per_batch"] == est["total_bytes_per_batch"] == 8 * cfg.cache_bytes(4096)
    assert est["mha_bytes_per_batch"] == 8 * est["bytes_per_batch"]
    assert est["model"]["attention"] == "GQA" and est["model"]["num_kv_heads"] == 8
    assert est["src_len"] is None and est["cross_attention_bytes_per_batch"] == 0
    assert est["exceeds_max_len"] is False
    assert estimate(cfg, 8192)["exceeds_max_len"] is True


def test_estimate_errors():
    with pytest.raises(ValueError, match="dtype must be one of"):
        estimate(MODEL_CONFIGS["gpt2-small"], 10, dtype="fp64")
    with pytest.raises(ValueError, match="seq_len must be positive, got 0"):
        estimate(MODEL_CONFIGS["gpt2-small"], 0)
    with pytest.raises(ValueError, match="src_len is for encoder-decoder models"):
        estimate(MODEL_CONFIGS["gpt2-small"], 10, src_len=5)


def test_report_of_an_encoder_decoder_shows_cross_attention_and_the_total():
    text = report(MODEL_CONFIGS["transformer-base"], 100, 2, "fp32", src_len=50)
    cross = 2 * 50 * per_token(6, 8, 64, 4)
    assert f"cross-attention (50 source tokens)  {cross:,} bytes" in text
    assert f"{2 * 100 * per_token(6, 8, 64, 4) + cross:,} bytes" in text  # the total
    assert "exceeds" not in text  # sinusoidal positions: no context limit
