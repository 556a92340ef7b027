"""The translator of the chapter "A real translation" over several seeds.

The chapter trains one seed (about 40 s); the claims it makes must hold for any seed and on
any CPU, so this script trains ``--seeds`` (default 0 to 4) with the package's recipe
(:class:`minitransformer.translation.TranslatorRecipe`) and scores each on the same 600 test
pairs (200 of each kind): the last weights and the average of the last 5 checkpoints, greedy
and with beam search (beam 4) at several length penalties alpha. It writes
``minitransformer/studies/translation.json``, which the chapter loads (five runs take minutes,
more than a chapter may spend).

Run: ``.venv/bin/python scripts/translation_study.py [--seeds 0 1 2 3 4]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import torch

from minitransformer.translation import (
    STUDY_PATH,
    TranslatorRecipe,
    score_by_kind,
    train_translator,
    translation_pairs,
)

ALPHAS = (0.0, 0.3, 0.6, 1.0, 1.5)
TEST_PAIRS, TEST_SEED = 600, 0
OUT = pathlib.Path(__file__).resolve().parents[1] / "minitransformer" / STUDY_PATH


def run(seed: int) -> dict:
    recipe = TranslatorRecipe()
    start = time.process_time()
    translator = train_translator(recipe, seed=seed, progress=False)
    seconds = time.process_time() - start
    test = translation_pairs(TEST_PAIRS, split="test", seed=TEST_SEED, kinds=recipe.kinds)
    result: dict = {"seed": seed, "train_cpu_seconds": seconds}
    for weights in ("last", "averaged"):
        model = translator.model if weights == "last" else translator.averaged
        runs = {"greedy": score_by_kind(model, translator.tokenizer, test, recipe.kinds)}
        for alpha in ALPHAS:
            runs[f"beam alpha={alpha}"] = score_by_kind(
                model, translator.tokenizer, test, recipe.kinds, beam_size=4, length_penalty=alpha
            )
        result[weights] = {
            name: {
                kind: {"bleu": s.bleu, "chrf": s.chrf, "exact": s.exact}
                for kind, s in scores.items()
            }
            for name, scores in runs.items()
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = dataclasses.asdict(TranslatorRecipe())
    recipe["kinds"] = list(recipe["kinds"])
    runs = []
    for seed in args.seeds:
        runs.append(run(seed))
        r = runs[-1]
        print(
            f"seed {seed}: {r['train_cpu_seconds']:.0f} CPU-s; BLEU all, greedy last "
            f"{r['last']['greedy']['all']['bleu']:.1f}, averaged "
            f"{r['averaged']['greedy']['all']['bleu']:.1f}, averaged beam 0.6 "
            f"{r['averaged']['beam alpha=0.6']['all']['bleu']:.1f}",
            flush=True,
        )
    study = {
        "recipe": recipe,
        "test": {"pairs": TEST_PAIRS, "seed": TEST_SEED},
        "alphas": list(ALPHAS),
        "runs": runs,
    }
    OUT.write_text(json.dumps(study, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
