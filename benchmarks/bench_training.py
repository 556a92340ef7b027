"""A training step of our Transformer against torch.nn.Transformer, and the encoder stack's forward
against torch.nn.TransformerEncoder.

Setting (chapter "Training a Transformer"): d_model 256, 4 + 4 post-LN layers, 8 heads, d_ff
1024, a shared vocabulary of 1000 with tied embeddings, dropout 0.1, float32, a batch of 16
sources and targets of 32 tokens whose sources are padded to lengths 16..32, one thread by
default.

* **Training step**: forward, cross-entropy loss, backward and an Adam step. Ours is
  ``minitransformer.model.Transformer``; the reference is ``torch.nn.Transformer`` built from
  the same post-LN layers (no final LayerNorms, as ours), wrapped with the same scaled
  embeddings, sinusoidal positions and tied output projection, so both have the same
  parameters and do the same arithmetic. Masks: source padding and causal on both sides.
* **Encoder forward**: our ``Encoder`` copied from a ``torch.nn.TransformerEncoder``
  (``Encoder.from_torch``), eval mode, no autograd, without and with source padding. torch
  takes its fused "fast path" there (and, with padding, packs the sequences into a nested
  tensor that skips the padded positions).

Both sides run in one process, in alternating order, for several rounds; the tables give the
median and spread of the per-round ratios ours / torch. Target: a training step <= 1.0x torch's
(exit status 1 if missed; ``--no-check`` only prints). The encoder ratios are reported.

Where the time goes (torch.profiler, one thread): in a training step both models spend it in
the same matrix products (addmm/mm forward and backward) and the fused attention kernel; ours
adds the packed Q/K/V split as views (free) and nothing else of note. In the encoder forward,
torch's fast path fuses each layer into one native call (``_transformer_encoder_layer_fwd``:
the packed projection, attention, residual and LayerNorm without Python in between), and with
padding it computes only the real positions; ours runs the same products through modules,
about 15 operations per layer.

Run: ``.venv/bin/python benchmarks/bench_training.py [--rounds 7] [--threads N] [--device cpu]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.benchmark import Timer

from minitransformer.attention import causal_mask, padding_mask
from minitransformer.model import Encoder, Transformer
from minitransformer.positional import sinusoidal_encoding

D_MODEL, LAYERS, HEADS, D_FF, VOCAB, DROPOUT = 256, 4, 8, 1024, 1000, 0.1
BATCH, LENGTH = 16, 32
TARGET = 1.0  # our training step / torch's, at most


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with the embeddings, positions and output projection of ours."""

    def __init__(self) -> None:
        super().__init__()
        layer = dict(
            d_model=D_MODEL, nhead=HEADS, dim_feedforward=D_FF, dropout=DROPOUT, batch_first=True
        )
        self.core = nn.Transformer(
            custom_encoder=nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), LAYERS),
            custom_decoder=nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer), LAYERS),
            d_model=D_MODEL,
            nhead=HEADS,
            batch_first=True,
        )
        self.embed = nn.Embedding(VOCAB, D_MODEL)  # source, target and output: one matrix
        nn.init.normal_(self.embed.weight, std=D_MODEL**-0.5)
        self.register_buffer("pe", sinusoidal_encoding(LENGTH, D_MODEL), persistent=False)
        self.dropout = nn.Dropout(DROPOUT)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * math.sqrt(D_MODEL) + self.pe[: ids.shape[1]])

    def forward(self, src, tgt, src_padding, causal):
        out = self.core(
            self._embed(src),
            self._embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )
        return F.linear(out, self.embed.weight)  # (B, T, V)


def timed(fn, number: int = 1) -> float:
    """Seconds per call (``torch.utils.benchmark.Timer``, which synchronises an accelerator)."""
    return Timer("fn()", globals={"fn": fn}).timeit(number).mean


def alternate(fns: dict, rounds: int, number: int = 1) -> dict[str, list[float]]:
    """Per-round times of each function, the order alternating from round to round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[name].append(timed(fns[name], number))
    return times


def ratios(times: dict[str, list[float]], a: str, b: str) -> str:
    rs = [x / y for x, y in zip(times[a], times[b], strict=True)]
    return f"median {statistics.median(rs):.2f}x (rounds {min(rs):.2f}-{max(rs):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1; 0 keeps torch's choice)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()
    # torch's fast path warns about nested tensors
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    gen = torch.Generator().manual_seed(0)
    src = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=gen).to(device)
    tgt = torch.randint(3, VOCAB, (BATCH, LENGTH + 1), generator=gen).to(device)
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (BATCH,), generator=gen).to(device)
    src_mask = padding_mask(lengths, LENGTH)  # (B, 1, 1, S), True = real token
    tgt_in, labels = tgt[:, :-1], tgt[:, 1:]

    torch.manual_seed(0)
    ours = (
        Transformer(
            VOCAB,
            VOCAB,
            d_model=D_MODEL,
            num_heads=HEADS,
            num_layers=LAYERS,
            d_ff=D_FF,
            dropout=DROPOUT,
            max_len=LENGTH,
        )
        .to(device)
        .train()
    )
    theirs = TorchTransformer().to(device).train()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    optimizers = {
        "ours": torch.optim.Adam(ours.parameters(), lr=1e-4),
        "torch": torch.optim.Adam(theirs.parameters(), lr=1e-4),
    }
    torch_padding, torch_causal = ~src_mask[:, 0, 0], ~causal_mask(LENGTH, device=device)
    forwards = {
        "ours": lambda: ours(src, tgt_in, src_mask=src_mask),
        "torch": lambda: theirs(src, tgt_in, torch_padding, torch_causal),
    }

    def train_step(name: str):
        def step() -> None:
            optimizers[name].zero_grad(set_to_none=True)
            logits = forwards[name]()
            F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)).backward()
            optimizers[name].step()

        return step

    steps = {name: train_step(name) for name in forwards}
    for step in steps.values():  # warm-up
        step()
        step()
    print(
        f"d_model={D_MODEL}, {LAYERS}+{LAYERS} layers, {HEADS} heads, d_ff={D_FF}, "
        f"vocab={VOCAB}, batch {BATCH} x {LENGTH} tokens; torch {torch.__version__}, {device}, "
        f"{torch.get_num_threads()} thread(s), {args.rounds} alternating rounds"
    )
    train = alternate(steps, args.rounds)
    print(
        f"training step: ours {1e3 * statistics.median(train['ours']):.0f} ms, torch "
        f"{1e3 * statistics.median(train['torch']):.0f} ms; ours / torch "
        f"{ratios(train, 'ours', 'torch')}"
    )

    reference = theirs.core.encoder.eval()
    encoder = Encoder.from_torch(reference).eval()
    x = torch.randn(BATCH, LENGTH, D_MODEL, generator=gen).to(device)
    with torch.inference_mode():
        variants = {
            "ours": lambda: encoder(x),
            "torch": lambda: reference(x),
            "ours, padded": lambda: encoder(x, src_mask),
            "torch, padded": lambda: reference(x, src_key_padding_mask=torch_padding),
        }
        for fn in variants.values():
            fn()
        enc = alternate(variants, args.rounds, number=3)
    for pad in ("", ", padded"):
        print(
            f"encoder forward{pad or ', no padding'}: ours "
            f"{1e3 * statistics.median(enc['ours' + pad]):.1f} ms, torch "
            f"{1e3 * statistics.median(enc['torch' + pad]):.1f} ms; ours / torch "
            f"{ratios(enc, 'ours' + pad, 'torch' + pad)}"
        )

    train_ratios = [x / y for x, y in zip(train["ours"], train["torch"], strict=True)]
    ok = statistics.median(train_ratios) <= TARGET
    print(f"training step target <= {TARGET}x {'met' if ok else 'MISSED'}")
    return 0 if ok or args.no_check else 1


if __name__ == "__main__":
    sys.exit(main())
