"""The KV-memory calculator: the formula, the registry of published models, Hugging Face
config.json files (Llama, Mistral, Qwen2, Gemma 2 and 3, DeepSeek-V3, Phi-3, GPT-2, T5), the
refusal of what it does not know, and the estimate/report behind the CLI."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.kv_memory import (
    DTYPE_BYTES,
    HF_CONFIGS,
    HF_MODEL_TYPES,
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
        "model_type": "gemma2",
        "head_dim": 128,
        "num_hidden_layers": 4,
        "sliding_window": 10,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 1
        + ["full_attention"],
    }
    cfg = ModelConfig.from_hf_config(fields)
    assert cfg.window_layers == 2  # layer_types, not Gemma 2's default alternation (also 2)
    assert cfg.cache_bytes(100) == (2 * 100 + 2 * 10) * per_token(1, 8, 128)
    three = ModelConfig.from_hf_config(
        fields | {"layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    )
    assert three.window_layers == 3


def test_mistral_ignores_layer_types_as_transformers_does():
    # MistralConfig warns that it does not use layer_types: every layer keeps the window
    cfg = ModelConfig.from_hf_config(MISTRAL_7B | {"layer_types": ["full_attention"] * 32})
    assert cfg.window_layers == 32


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
    # tiiuae/falcon-40b: new_decoder_architecture, 128 query heads, num_kv_heads 8
    falcon_40b = {
        "model_type": "falcon",
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "num_kv_heads": 8,
        "new_decoder_architecture": True,
    }
    assert ModelConfig.from_hf_config(falcon_40b).num_kv_heads == 8
    # tiiuae/falcon-7b: multi_query true (FalconConfig's default too), 71 heads of 64
    falcon_7b = {
        "model_type": "falcon",
        "hidden_size": 4544,
        "num_attention_heads": 71,
        "num_hidden_layers": 32,
        "multi_query": True,
    }
    cfg = ModelConfig.from_hf_config(falcon_7b)
    assert (cfg.num_kv_heads, cfg.head_dim) == (1, 64)
    assert ModelConfig.from_hf_config(falcon_7b | {"multi_query": False}).num_kv_heads == 71


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
            "model_type": "llama",
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
        (
            dict(model_type="gemma2", layer_types=["full_attention"]),
            "layer_types must list the 32 layers",
        ),
        (
            dict(model_type="gemma2", layer_types=["chunked_attention"] * 32),
            "layer_types holds 'chunked_attention'; the calculator knows only full_attention "
            "and sliding_attention layers and would need the cache shape of the others",
        ),
        (
            dict(model_type="llama4"),
            "model_type 'llama4', which the calculator does not know, so it cannot say what "
            "the model caches .* it reads the model types deepseek_v2, deepseek_v3, falcon, "
            r".* give its cache shape \(--layers, --kv-heads, --head-dim\)",
        ),
        (dict(model_type=None), "no model_type, which the calculator does not know"),
        (dict(model_type="gemma3"), "model_type 'gemma3' keeps its language model in text_config"),
        (
            dict(model_type="deepseek_v3", kv_lora_rank=0),
            "kv_lora_rank must be a positive integer, got 0",
        ),
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


# --------------------------------------------------------------------------------------------
# Eight current models: their published config.json values (the fields that shape the cache,
# written out here as released on the Hugging Face Hub) against bytes computed by hand. All at
# batch 1 and 2 bytes per element unless said; "layer-positions" = sum over layers of the
# positions that layer keeps.
# --------------------------------------------------------------------------------------------

# meta-llama/Meta-Llama-3-8B
LLAMA_3_8B = {
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}
# Qwen/Qwen2.5-7B: a window of 131072 declared and switched off (use_sliding_window false)
QWEN2_5_7B = {
    "hidden_size": 3584,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
# google/gemma-2-9b: head_dim 256 although 3584 / 16 = 224; local (window 4096) and global
# layers alternate, layer 0 local; published in float32
GEMMA_2_9B = {
    "cache_implementation": "hybrid",
    "head_dim": 256,
    "hidden_size": 3584,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "torch_dtype": "float32",
}
# google/gemma-3-27b-it: a multimodal config, the language model in text_config; five local
# layers (window 1024) to one global (sliding_window_pattern 6, Gemma3TextConfig's default)
GEMMA_3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"model_type": "siglip_vision_model"},
}
# deepseek-ai/DeepSeek-V3: multi-head latent attention
DEEPSEEK_V3 = {
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
}
# microsoft/Phi-3-mini-4k-instruct: MHA, 3072 / 32 = 96 per head, a window of 2047 everywhere
PHI_3_MINI = {
    "hidden_size": 3072,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "sliding_window": 2047,
    "torch_dtype": "bfloat16",
}

N = 32768  # positions per sequence for the comparisons below

PUBLISHED = {  # name -> (fields, bytes per token, bytes of one 32768-position sequence)
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 per token; no window
    "meta-llama/Meta-Llama-3-8B": (LLAMA_3_8B, 131_072, 32768 * 131_072),
    # the same shape; all 32 layers keep only the last 4096 positions
    "mistralai/Mistral-7B-v0.1": (MISTRAL_7B, 131_072, 4096 * 131_072),
    # 28 x 4 x 128 x 2 x 2 = 57,344; the switched-off window caps nothing
    "Qwen/Qwen2.5-7B": (QWEN2_5_7B, 57_344, 32768 * 57_344),
    # 42 x 8 x 256 x 2 x 2 = 344,064 per token, 8,192 per layer; 21 global layers keep 32768,
    # 21 local ones 4096: (21 x 32768 + 21 x 4096) x 8,192
    "google/gemma-2-9b": (GEMMA_2_9B, 344_064, (21 * 32768 + 21 * 4096) * 8_192),
    # 62 x 16 x 128 x 2 x 2 = 507,904, 8,192 per layer; layers 5, 11, ..., 59 global (10),
    # 52 local with 1024 positions: (10 x 32768 + 52 x 1024) x 8,192
    "google/gemma-3-27b-it": (GEMMA_3_27B, 507_904, (10 * 32768 + 52 * 1024) * 8_192),
    # MLA: 61 layers x (512 latent + 64 rotary key) x 2 bytes = 70,272; no factor 2
    "deepseek-ai/DeepSeek-V3": (DEEPSEEK_V3, 70_272, 32768 * 70_272),
    # 32 x 32 x 96 x 2 x 2 = 393,216; every layer keeps 2047 positions
    "microsoft/Phi-3-mini-4k-instruct": (PHI_3_MINI, 393_216, 2047 * 393_216),
    # 6 decoder layers x 8 x 64 x 2 x 2 = 12,288 (plus cross-attention, below)
    "google-t5/t5-small": (T5_SMALL, 12_288, 32768 * 12_288),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_against_hand_computed_bytes(name):
    fields, per_tok, per_seq = PUBLISHED[name]
    cfg = ModelConfig.from_hf_config(fields)
    assert cfg.bytes_per_token(2) == per_tok
    assert cfg.cache_bytes(N) == per_seq
    assert cfg.cache_bytes(N, batch_size=3, bytes_per_element=4) == 3 * 2 * per_seq
    assert estimate(cfg, N, dtype="bf16")["bytes_per_sequence"] == per_seq


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_package_holds_the_same_published_fields(name):
    fields = PUBLISHED[name][0]
    held = HF_CONFIGS[name]
    for key, value in held.items():  # the package keeps a subset, with the same values
        if key != "_name_or_path":
            want = fields[key]
            assert value == ({k: want[k] for k in value} if isinstance(value, dict) else want)
    assert ModelConfig.from_hf_config(held).cache_bytes(N) == PUBLISHED[name][2]


def test_gemma_3_12b_text_config_relies_on_the_class_defaults():
    # google/gemma-3-12b-it's text_config gives neither head_dim (Gemma3TextConfig: 256, not
    # 3840 / 16 = 240) nor sliding_window_pattern (6)
    fields = {
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 3840,
            "model_type": "gemma3_text",
            "num_attention_heads": 16,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
    }
    cfg = ModelConfig.from_hf_config(fields)
    # 48 layers: 8 global (5, 11, ..., 47), 40 local; 8 x 256 x 2 x 2 = 8,192 bytes per layer
    assert (cfg.head_dim, cfg.window_layers, cfg.dtype) == (256, 40, "bfloat16")
    assert cfg.cache_bytes(N) == (8 * 32768 + 40 * 1024) * 8_192


def test_deepseek_v3_is_not_counted_as_multi_head_attention():
    cfg = ModelConfig.from_hf_config(DEEPSEEK_V3)
    assert cfg.attention == "MLA" and cfg.elements_per_position == 512 + 64
    # what the old calculator printed: 7168 / 128 = 56 per head, 128 KV heads, K and V
    assert cfg.bytes_per_token(2) != 2 * 61 * 128 * 56 * 2
    # the decompressed per-head keys (128 + 64) and values (128) of all 128 heads
    assert cfg.mha_cache_bytes(1) == 61 * 128 * (192 + 128) * 2
    text = report(cfg, 4096)
    assert "61 x (512 latent + 64 rotary key)" in text and "MLA saving" in text
    assert "71.1x" in text  # 4,997,120 / 70,272


def test_t5_small_adds_the_cross_attention():
    cfg = ModelConfig.from_hf_config(T5_SMALL)
    est = estimate(cfg, 100, src_len=400, dtype="bf16")
    assert est["cross_attention_bytes_per_batch"] == 400 * 12_288  # 6 x 8 x 64 x 2 x 2
    assert est["total_bytes_per_batch"] == 500 * 12_288


def test_window_counts_agree_with_transformers():
    """transformers' own config classes, an independent reference, say which layers slide."""
    transformers = pytest.importorskip("transformers")

    def sliding(config):
        return config.layer_types.count("sliding_attention")

    gemma2 = transformers.AutoConfig.for_model(**GEMMA_2_9B)
    assert ModelConfig.from_hf_config(GEMMA_2_9B).window_layers == sliding(gemma2)
    gemma3 = transformers.AutoConfig.for_model(**GEMMA_3_27B).text_config
    cfg = ModelConfig.from_hf_config(GEMMA_3_27B)
    assert (cfg.window_layers, cfg.head_dim) == (sliding(gemma3), gemma3.head_dim)
    qwen_on = QWEN2_5_7B | {"use_sliding_window": True, "max_window_layers": 20}
    qwen = transformers.AutoConfig.for_model(**qwen_on)
    assert ModelConfig.from_hf_config(qwen_on).window_layers == sliding(qwen) == 8


def test_torch_dtype_auto_or_missing_takes_the_argument():
    cfg = ModelConfig.from_hf_config(LLAMA_3_8B | {"torch_dtype": "auto"})
    assert cfg.dtype is None
    assert estimate(cfg, 10)["dtype_source"] == "default"
    assert estimate(cfg, 10, dtype="fp32")["bytes_per_sequence"] == 10 * 2 * 131_072
    assert "the default: the model names no dtype, pass --dtype" in report(cfg, 10)
    gemma = ModelConfig.from_hf_config(GEMMA_2_9B)  # float32, as published
    assert estimate(gemma, 10)["bytes_per_element"] == 4
    assert estimate(gemma, 10)["dtype_source"] == "config"
    assert estimate(gemma, 10, dtype="bf16")["dtype_source"] == "argument"


def test_every_known_model_type_reads_a_minimal_config():
    for model_type in HF_MODEL_TYPES:
        fields = {
            "model_type": model_type,
            "num_hidden_layers": 2,
            "num_attention_heads": 32,  # the class defaults give up to 32 KV heads
            "hidden_size": 1024,
        }
        cfg = ModelConfig.from_hf_config(fields)
        assert cfg.num_layers == 2 and cfg.bytes_per_token(2) > 0


def test_mla_fields_go_together():
    args = dict(name="m", num_layers=2, num_heads=4, num_kv_heads=4, head_dim=8, d_model=32)
    with pytest.raises(ValueError, match="kv_lora_rank and qk_rope_head_dim go together"):
        ModelConfig(**args, max_len=None, source="t", kv_lora_rank=16)


def test_a_config_whose_shapes_disagree_names_its_file(tmp_path):
    # ModelConfig's own check (KV heads must divide the heads), with the file in front
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
            }
        )
    )
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: num_kv_heads=3 must divide"):
        ModelConfig.from_hf_config(tmp_path)
