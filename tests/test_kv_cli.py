"""The KV-memory command line: the table, --json, Hugging Face configs, usage errors, the
console script, and a start-up that imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from minitransformer.kv_cli import main
from minitransformer.kv_memory import HF_CONFIGS, MODEL_CONFIGS


def run_main(capsys, *argv):
    """main(argv) -> (exit code, stdout, stderr); usage errors exit through SystemExit."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table(capsys):
    assert main(["llama-2-7b", "--context", "4096", "--batch", "8", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "524,288 bytes (512 KiB)" in out  # per token
    assert "2,147,483,648 bytes (2.00 GiB)" in out  # per sequence
    assert "17,179,869,184 bytes (16.00 GiB)" in out  # per batch
    assert "GQA saving" in out


def test_seq_len_and_batch_size_are_the_names_context_and_batch_aliases(capsys):
    _, new, _ = run_main(capsys, "llama-2-7b", "--seq-len", "4096", "--batch-size", "8")
    _, old, _ = run_main(capsys, "llama-2-7b", "--context", "4096", "--batch", "8")
    assert new == old and "17,179,869,184 bytes" in new


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
    main(
        [
            "--layers",
            "4",
            "--kv-heads",
            "2",
            "--heads",
            "8",
            "--head-dim",
            "32",
            "--context",
            "100",
            "--dtype",
            "fp32",
        ]
    )
    out = capsys.readouterr().out
    assert f"{2 * 4 * 2 * 32 * 4:,} bytes" in out and "4x" in out


def test_cli_json(capsys):
    code, out, _ = run_main(
        capsys, "mistral-7b", "--seq-len", "32768", "--batch-size", "2", "--json"
    )
    assert code == 0
    est = json.loads(out)
    assert est["bytes_per_token"] == 131_072
    assert est["bytes_per_sequence"] == 4096 * 131_072  # the sliding window caps it
    assert est["bytes_per_batch"] == 2 * 4096 * 131_072
    assert est["model"]["sliding_window"] == 4096 and est["dtype"] == "bf16"


def test_cli_list(capsys):
    code, out, _ = run_main(capsys, "--list")
    assert code == 0 and all(name in out for name in MODEL_CONFIGS)
    assert all(name in out for name in HF_CONFIGS) and "MLA" in out
    code, out, _ = run_main(capsys, "--list", "--json")
    listed = json.loads(out)
    assert set(listed) == set(MODEL_CONFIGS) | set(HF_CONFIGS)
    assert listed["deepseek-ai/DeepSeek-V3"]["kv_lora_rank"] == 512
    assert listed["llama-2-70b"]["num_kv_heads"] == 8


def test_cli_reads_a_hugging_face_config(tmp_path, capsys):
    path = tmp_path / "Qwen2-0.5B" / "config.json"
    path.parent.mkdir()
    path.write_text(
        json.dumps(
            {  # Qwen2-0.5B's attention fields
                "model_type": "qwen2",
                "hidden_size": 896,
                "num_attention_heads": 14,
                "num_hidden_layers": 24,
                "num_key_value_heads": 2,
                "max_position_embeddings": 32768,
                "sliding_window": 32768,
                "use_sliding_window": False,
                "torch_dtype": "bfloat16",
            }
        )
    )
    for model in (path, path.parent):  # the file or its folder
        code, out, _ = run_main(capsys, str(model), "--json")
        assert code == 0
        est = json.loads(out)
        assert est["bytes_per_token"] == 2 * 24 * 2 * 64 * 2
        assert est["seq_len"] == 32768  # default: the config's max_position_embeddings
        assert est["dtype"] == "bfloat16"  # default: the config's torch_dtype
    code, out, _ = run_main(capsys, str(path), "--dtype", "fp32", "--seq-len", "10")
    assert code == 0 and f"{10 * 2 * 24 * 2 * 64 * 4:,} bytes" in out


def test_cli_encoder_decoder_counts_the_source(capsys):
    code, out, _ = run_main(
        capsys, "transformer-base", "--seq-len", "40", "--src-len", "30", "--json"
    )
    est = json.loads(out)
    assert code == 0 and est["src_len"] == 30
    assert est["cross_attention_bytes_per_batch"] == 30 * 12_288
    assert est["total_bytes_per_batch"] == (40 + 30) * 12_288


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--layers", "4", "--kv-heads", "0", "--head-dim", "8"],
            "argument --kv-heads: must be a positive integer, got 0",
        ),
        (["llama-2-7b", "--batch", "-1"], "argument --batch-size/--batch: must be a positive"),
        (["llama-2-7b", "--context", "4k"], "must be a positive integer, got '4k'"),
        (["llama-2-7b", "--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64'"),
        (
            ["--layers", "4", "--heads", "8", "--kv-heads", "3", "--head-dim", "8"],
            "--kv-heads 3 must divide --heads 8",
        ),
        (["--layers", "4", "--head-dim", "8"], "missing: --kv-heads"),
        ([], "give a model name, or all of --layers, --kv-heads, --head-dim"),
        (["llama-2-7b", "--layers", "4"], "give a model or --layers"),
        (["llama-2-7b", "--src-len", "10"], "src_len is for encoder-decoder models"),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, argv, message):
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err and "usage:" in err and "Traceback" not in err


def test_kv_heads_0_in_a_real_run_exits_2_without_a_traceback():
    # it used to die with a ZeroDivisionError traceback
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minitransformer.kv_cli",
            "--layers",
            "4",
            "--kv-heads",
            "0",
            "--head-dim",
            "8",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "argument --kv-heads: must be a positive integer, got 0" in result.stderr


def test_a_broken_config_file_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, _, err = run_main(capsys, str(path))
    assert code == 2 and f"{path}: no number of layers" in err


def _imported_modules(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime -m minitransformer.kv_cli ARGV``: the result and the names of
    every module the interpreter imported (importtime writes one line per module to stderr)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "minitransformer.kv_cli", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return result, {line.rsplit("|", 1)[1].strip() for line in lines[1:]}  # [0]: the header


@pytest.mark.parametrize(
    "argv, printed",
    [
        (["--help"], "usage: minitransformer-kv"),
        (["llama-2-70b", "--json"], '"bytes_per_token": 327680'),
    ],
)
def test_cli_imports_no_torch(argv, printed):
    result, modules = _imported_modules(*argv)
    assert printed in result.stdout
    assert "minitransformer.kv_memory" in modules  # the parse found the package's modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "numpy", "matplotlib")}


def test_cli_help_runs_as_module():
    result = subprocess.run(
        [sys.executable, "-m", "minitransformer.kv_cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "bytes per element" in result.stdout
    assert "llama-2-7b" in result.stdout


def test_console_script():
    (script,) = entry_points(group="console_scripts", name="minitransformer-kv")
    assert script.load() is main
    exe = Path(sys.executable).with_name("minitransformer-kv")  # installed beside python
    result = subprocess.run(
        [str(exe), "gpt2-small", "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout)["bytes_per_token"] == 36_864


def test_cli_published_configs_by_hub_name(capsys):
    code, out, _ = run_main(capsys, "google/gemma-2-9b", "--seq-len", "8192", "--json")
    est = json.loads(out)
    # 21 global layers x 8192 + 21 local x 4096, 8 KV heads x 256 x 2 (K, V), float32 as
    # published
    assert code == 0 and est["dtype"] == "float32" and est["dtype_source"] == "config"
    assert est["bytes_per_sequence"] == (21 * 8192 + 21 * 4096) * 8 * 256 * 2 * 4
    code, out, _ = run_main(capsys, "deepseek-ai/DeepSeek-V3", "--seq-len", "1000")
    assert code == 0 and f"{1000 * 61 * 576 * 2:,} bytes" in out and "MLA saving" in out


def test_cli_refuses_an_unknown_model_type(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama4_text",
                "num_hidden_layers": 48,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "attention_chunk_size": 8192,
            }
        )
    )
    code, out, err = run_main(capsys, str(path), "--seq-len", "100")
    assert code == 2 and out == ""
    assert "model_type 'llama4_text', which the calculator does not know" in err
    assert "--layers, --kv-heads, --head-dim" in err


def test_cli_dtype_auto_takes_the_override(tmp_path, capsys):
    fields = dict(HF_CONFIGS["meta-llama/Meta-Llama-3-8B"], torch_dtype="auto")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    code, out, _ = run_main(capsys, str(path), "--seq-len", "10")
    assert code == 0 and "pass --dtype" in out
    code, out, _ = run_main(capsys, str(path), "--seq-len", "10", "--dtype", "fp8", "--json")
    est = json.loads(out)
    assert est["bytes_per_sequence"] == 10 * 2 * 32 * 8 * 128 * 1
    assert est["dtype_source"] == "argument"
