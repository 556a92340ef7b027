"""The KV-memory calculator on the command line (chapter ``book/inference``, section "Memory").

    minitransformer-kv llama-2-7b --seq-len 4096 --batch-size 8 --dtype bf16
    minitransformer-kv path/to/config.json --json       # a Hugging Face config
    minitransformer-kv google/gemma-2-9b --seq-len 8192  # a published config it holds
    python -m minitransformer.kv_cli --help

It prints the table of :func:`minitransformer.kv_memory.report`, or with ``--json`` the dict of
:func:`~minitransformer.kv_memory.estimate`. Bad arguments are usage errors (exit code 2, a
message, no traceback). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minitransformer.kv_memory import (
    DTYPE_BYTES,
    HF_CONFIGS,
    MODEL_CONFIGS,
    ModelConfig,
    estimate,
    report,
)

__all__ = ["main"]

PROG = "minitransformer-kv"


def _positive(text: str) -> int:
    """argparse type: a positive integer, else a usage error that names the argument."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "KV-cache memory of a decoder: 2 (K and V) x batch x positions x layers x "
            "KV heads x head_dim x bytes per element, summed layer by layer (sliding windows "
            "cap the positions of their layers; multi-head latent attention caches a latent "
            "instead of K and V). Prints the bytes per token, per sequence and per batch, and "
            "what grouped-query or latent attention saves. A config.json is read by the rules "
            "of its model_type; an unknown one is refused."
        ),
        epilog=f"Known models: {', '.join(sorted(MODEL_CONFIGS))}; published configs: "
        f"{', '.join(HF_CONFIGS)}. Example: {PROG} llama-2-7b "
        "--seq-len 4096 --batch-size 8 --dtype bf16",
    )
    parser.add_argument(
        "model",
        nargs="?",
        help="a known model or published config (see below), or a Hugging Face config.json "
        "(or its folder); omit "
        "it and give --layers, --kv-heads and --head-dim for your own model",
    )
    parser.add_argument(
        "--seq-len",
        "--context",
        type=_positive,
        dest="seq_len",
        help="positions per sequence (default: the model's context length; 1024 where the "
        "model sets none)",
    )
    parser.add_argument(
        "--batch-size",
        "--batch",
        type=_positive,
        default=1,
        dest="batch_size",
        help="sequences (default: 1)",
    )
    parser.add_argument(
        "--src-len",
        type=_positive,
        help="encoder-decoder models: source positions for the cross-attention "
        "cache (default: --seq-len)",
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPE_BYTES),
        help="element type of the cache (default: the config's torch_dtype, else bf16; "
        "needed where the config says 'auto' or nothing)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--list", action="store_true", help="list the known models and exit")
    custom = parser.add_argument_group("a model of your own (instead of a name)")
    custom.add_argument("--layers", type=_positive, help="decoder layers")
    custom.add_argument("--heads", type=_positive, help="query heads (default: --kv-heads)")
    custom.add_argument("--kv-heads", type=_positive, help="key/value heads")
    custom.add_argument("--head-dim", type=_positive, help="size of one head")
    return parser


def _model_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ModelConfig:
    """The model named or described on the command line (parser.error on a bad one)."""
    custom = {"--layers": args.layers, "--kv-heads": args.kv_heads, "--head-dim": args.head_dim}
    if args.model is not None:
        if any(v is not None for v in (*custom.values(), args.heads)):
            parser.error("give a model or --layers/--heads/--kv-heads/--head-dim, not both")
        if args.model.lower() in MODEL_CONFIGS:
            return MODEL_CONFIGS[args.model.lower()]
        if args.model in HF_CONFIGS:
            return ModelConfig.from_hf_config(HF_CONFIGS[args.model], name=args.model)
        if Path(args.model).exists():
            try:
                return ModelConfig.from_hf_config(args.model)
            except (OSError, ValueError) as exc:
                parser.error(str(exc))
        parser.error(
            f"unknown model {args.model!r}: neither a known model "
            f"({', '.join(sorted(MODEL_CONFIGS))}), nor a published config "
            f"({', '.join(HF_CONFIGS)}), nor a config.json file"
        )
    missing = [flag for flag, value in custom.items() if value is None]
    if missing:
        parser.error(
            f"give a model name, or all of {', '.join(custom)} (missing: {', '.join(missing)})"
        )
    heads = args.heads if args.heads is not None else args.kv_heads
    if heads % args.kv_heads:
        parser.error(f"--kv-heads {args.kv_heads} must divide --heads {heads}")
    return ModelConfig(
        "custom",
        args.layers,
        heads,
        args.kv_heads,
        args.head_dim,
        heads * args.head_dim,
        None,
        "command line",
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; ``minitransformer-kv --help`` lists the options."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        known = sorted(MODEL_CONFIGS.items()) + [
            (name, ModelConfig.from_hf_config(fields, name=name))
            for name, fields in HF_CONFIGS.items()
        ]
        if args.json:
            print(json.dumps({name: cfg.to_dict() for name, cfg in known}, indent=2))
            return 0
        for name, cfg in known:
            print(
                f"{name:<33} {cfg.num_layers:>3} layers, {cfg.num_heads:>3} heads, "
                f"{cfg.num_kv_heads:>3} KV heads, head_dim {cfg.head_dim:>3}, {cfg.attention}"
                f"  ({cfg.source})"
            )
        return 0
    cfg = _model_config(parser, args)
    seq_len = args.seq_len if args.seq_len is not None else (cfg.max_len or 1024)
    try:  # dtype None: the config's, else bf16 (the table says which)
        if args.json:
            est = estimate(cfg, seq_len, args.batch_size, args.dtype, src_len=args.src_len)
            print(json.dumps(est, indent=2))
        else:
            print(report(cfg, seq_len, args.batch_size, args.dtype, src_len=args.src_len))
    except ValueError as exc:  # e.g. --src-len for a decoder-only model
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
