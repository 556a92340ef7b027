"""The KV-cache calculator, the model registry and the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from minitransformer.kv_cache import MODEL_CONFIGS, format_bytes, kv_cache_bytes, main


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


@settings(max_examples=50, deadline=None)
@given(
    layers=st.integers(1, 100), kv_heads=st.integers(1, 64), head_dim=st.integers(1, 256),
    seq=st.integers(0, 10**5), batch=st.integers(1, 64), bpe=st.sampled_from([1, 2, 4]),
)
def test_formula_is_linear_in_every_factor(layers, kv_heads, head_dim, seq, batch, bpe):
    total = kv_cache_bytes(layers, kv_heads, head_dim, seq, batch, bpe)
    assert total == 2 * layers * kv_heads * head_dim * seq * batch * bpe
    assert kv_cache_bytes(layers, kv_heads, head_dim, seq + 1, batch, bpe) - total == (
        2 * layers * kv_heads * head_dim * batch * bpe
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_layers=0), "num_layers"),
        (dict(num_kv_heads=-1), "num_kv_heads"),
        (dict(head_dim=2.5), "head_dim"),
        (dict(seq_len=-1), "seq_len"),
        (dict(batch_size=0), "batch_size"),
        (dict(bytes_per_element=0), "bytes_per_element"),
    ],
)
def test_bad_sizes_raise(kwargs, match):
    args = dict(num_layers=2, num_kv_heads=2, head_dim=8, seq_len=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        kv_cache_bytes(**args)


def test_format_bytes():
    assert format_bytes(512) == "512 bytes"
    assert format_bytes(524_288) == "512 KiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(16 * 2**30) == "16.00 GiB"


def test_cli_table(capsys):
    assert main(["llama-2-7b", "--context", "4096", "--batch", "8", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "524,288 bytes (512 KiB)" in out  # per token
    assert "2,147,483,648 bytes (2.00 GiB)" in out  # per sequence
    assert "17,179,869,184 bytes (16.00 GiB)" in out  # per batch
    assert "GQA saving" in out


def test_cli_gqa_saving(capsys):
    main(["llama-2-70b", "--context", "4096", "--dtype", "fp16"])
    out = capsys.readouterr().out
    assert "8x" in out and "GQA" in out


def test_cli_unknown_model_lists_known_ones(capsys):
    with pytest.raises(SystemExit) as info:
        main(["gpt-5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model 'gpt-5'" in err
    for name in MODEL_CONFIGS:
        assert name in err


def test_cli_custom_model(capsys):
    main(["--layers", "4", "--kv-heads", "2", "--heads", "8", "--head-dim", "32",
          "--context", "100", "--dtype", "fp32"])
    out = capsys.readouterr().out
    assert f"{2 * 4 * 2 * 32 * 4:,} bytes" in out and "4x" in out


def test_cli_help_runs_as_module():
    result = subprocess.run(
        [sys.executable, "-m", "minitransformer.kv_cache", "--help"],
        capture_output=True, text=True, check=True,
    )
    assert "bytes per element" in result.stdout
    assert "llama-2-7b" in result.stdout
