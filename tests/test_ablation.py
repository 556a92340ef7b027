"""The toy Table 3 study (minitransformer.ablation, chapter "The paper's Table 3 at toy scale"):
narrowed attention against torch's attention and against the package's own smaller heads, the
parameter counts against a count by hand, the recipe against the training chapter's, and the
study file against the code that reruns it."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_table3 import by_hand

from minitransformer import ablation
from minitransformer.attention import MultiHeadAttention
from minitransformer.decoding import greedy_decode
from minitransformer.model import Transformer

ROOT = Path(__file__).resolve().parents[1]


def reference_attention(mha, x, key_dim, value_dim):
    """Multi-head self-attention with d_k = key_dim and d_v = value_dim, written with
    torch.nn.functional from the first features of each head of ``mha``'s own weights."""
    B, T, _ = x.shape
    h, d = mha.num_heads, mha.d_k
    original = mha.parametrizations.in_proj_weight.original
    bias = mha.parametrizations.in_proj_bias.original
    w_q, w_k, w_v = original.view(3, h, d, -1)  # (h, d, d_model) each
    b_q, b_k, b_v = bias.view(3, h, d)

    def heads(w, b, n):  # (B, h, T, n): the first n features of every head
        return torch.einsum("btm,hfm->bhtf", x, w[:, :n]) + b[:, None, :n]

    q, k, v = heads(w_q, b_q, key_dim), heads(w_k, b_k, key_dim), heads(w_v, b_v, value_dim)
    out = F.scaled_dot_product_attention(q, k, v)  # scale 1 / sqrt(key_dim)
    w_o = mha.w_o.weight.view(-1, h, d)[:, :, :value_dim]  # (d_model, h, d_v)
    return torch.einsum("bhtf,mhf->btm", out, w_o) + mha.w_o.bias


@pytest.mark.parametrize("key_dim, value_dim", [(2, 8), (8, 3), (5, 5), (8, 8), (1, 1)])
def test_narrowed_attention_is_attention_with_those_sizes(key_dim, value_dim) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, head_dim=8).double()
    ablation.narrow_attention(mha, key_dim=key_dim, value_dim=value_dim)
    x = torch.randn(3, 6, 32, dtype=torch.float64)
    got, _ = mha(x, x, x)
    want = reference_attention(mha, x, key_dim, value_dim)
    # float64: a few roundings of numbers of size ~1 differ by far less than 1e-12
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_narrowed_heads_equal_the_package_s_smaller_heads_and_learn_alike() -> None:
    """head_dim 8 narrowed to 3 and 3 against a native head_dim 3 layer whose weights are the
    kept ones: the same outputs and the same weights after Adam steps (the query rows'
    factor sqrt(8 / 3) is exactly the change of scale from 1 / sqrt(8) to 1 / sqrt(3))."""
    torch.manual_seed(1)
    wide = MultiHeadAttention(16, 2, head_dim=8).double()
    native = MultiHeadAttention(16, 2, head_dim=3).double()
    with torch.no_grad():  # copy the first 3 features of each head into the native layer
        rows = wide.in_proj_weight.view(3, 2, 8, 16)[:, :, :3].reshape(-1, 16)
        native.in_proj_weight.copy_(rows)
        native.in_proj_bias.copy_(wide.in_proj_bias.view(3, 2, 8)[:, :, :3].reshape(-1))
        native.w_o.weight.copy_(wide.w_o.weight.view(16, 2, 8)[:, :, :3].reshape(16, -1))
        native.w_o.bias.copy_(wide.w_o.bias)
    ablation.narrow_attention(wide, key_dim=3, value_dim=3)
    opt_wide = torch.optim.Adam(wide.parameters(), lr=1e-2)
    opt_native = torch.optim.Adam(native.parameters(), lr=1e-2)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for _ in range(3):
        outs = []
        for mha, opt in ((wide, opt_wide), (native, opt_native)):
            opt.zero_grad()
            out, _ = mha(x, x, x)
            out.square().sum().backward()
            opt.step()
            outs.append(out.detach())
        torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=0)
    raw = wide.parametrizations.in_proj_weight.original  # what Adam updates
    kept = raw.view(3, 2, 8, 16)[:, :, :3].reshape(-1, 16)
    torch.testing.assert_close(kept, native.in_proj_weight.detach(), atol=1e-12, rtol=0)
    dropped = wide.parametrizations.in_proj_weight.original.grad.view(3, 2, 8, 16)[:, :, 3:]
    assert dropped.abs().max() == 0, "the dropped features must get no gradient"


def test_a_narrowed_model_decodes_the_same_with_and_without_its_cache() -> None:
    torch.manual_seed(0)
    model = Transformer(13, 13, d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0)
    ablation.narrow_attention(model, key_dim=3, value_dim=5).eval()
    src = torch.randint(3, 13, (4, 7))
    fast = greedy_decode(model, src, 9, 1, 2)
    slow = greedy_decode(model, src, 9, 1, 2, use_cache=False)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"key_dim": 17}, ValueError, "at most the layer's head_dim=16"),
        ({"value_dim": 0}, ValueError, "value_dim must be positive"),
        ({"key_dim": 2.0}, TypeError, "key_dim must be an int"),
    ],
)
def test_narrow_attention_refuses_bad_sizes(kwargs, error, message) -> None:
    mha = MultiHeadAttention(64, 4)
    before = copy.deepcopy(mha.state_dict())
    with pytest.raises(error, match=message):
        ablation.narrow_attention(mha, **kwargs)
    assert mha.state_dict().keys() == before.keys(), "a failed call leaves the layer unchanged"


def test_narrow_attention_changes_nothing_when_one_layer_refuses() -> None:
    model = torch.nn.Sequential(MultiHeadAttention(64, 4), MultiHeadAttention(64, 16))
    with pytest.raises(ValueError, match="at most the layer's head_dim=4"):
        ablation.narrow_attention(model, key_dim=8)  # fits the first layer, not the second
    assert not any(torch.nn.utils.parametrize.is_parametrized(m) for m in model)
    with pytest.raises(TypeError, match="model must be"):
        ablation.narrow_attention("a model", key_dim=2)


def test_narrow_attention_refuses_twice_and_models_without_attention() -> None:
    mha = ablation.narrow_attention(MultiHeadAttention(64, 4), key_dim=4)
    with pytest.raises(ValueError, match="narrowed already"):
        ablation.narrow_attention(mha, key_dim=2)
    with pytest.raises(ValueError, match="no MultiHeadAttention"):
        ablation.narrow_attention(torch.nn.Linear(3, 3), key_dim=2)


@pytest.mark.parametrize("row, label, changes", ablation.SETTINGS)
def test_parameters_match_a_count_by_hand(row, label, changes) -> None:
    config = {**ablation.BASE, **changes}
    d_model, h = config["d_model"], config["num_heads"]
    head_dim = config.get("head_dim", d_model // h)
    want = by_hand(
        config["num_layers"],
        d_model,
        config["d_ff"],
        h,
        config.get("key_dim", head_dim),
        d_v=config.get("value_dim", head_dim),
        vocab=ablation.TASK["vocab_size"],
    )
    assert ablation.parameters(changes) == want


def _training_chapter_constants() -> dict[str, object]:
    """The literal constants the training chapter assigns (``A, B = (1, 2)`` included)."""
    notebook = json.loads((ROOT / "book" / "training.ipynb").read_text())
    found: dict[str, object] = {}
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        try:
            tree = ast.parse(source)
        except SyntaxError:  # IPython magics
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0]
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            values = value if isinstance(target, ast.Tuple) else [value]
            for name, v in zip(names, values, strict=True):
                if isinstance(name, ast.Name):
                    found.setdefault(name.id, v)
    return found


def test_the_study_uses_the_training_chapter_s_recipe_and_model() -> None:
    """The study claims to use the training chapter's recipe, shortened: the scale, warm-up,
    decay and clipping the chapter trains with, and its model."""
    found = _training_chapter_constants()
    recipe = ablation.TRAINING_RECIPE
    names = {
        "STEPS": recipe.steps,
        "BATCH": recipe.batch_size,
        "WARMUP": recipe.warmup_steps,
        "SCALE": recipe.scale,
        "DECAY": recipe.decay_steps,
        "D_MODEL": ablation.BASE["d_model"],
        "HEADS": ablation.BASE["num_heads"],
        "LAYERS": ablation.BASE["num_layers"],
        "D_FF": ablation.BASE["d_ff"],
        "DROPOUT": ablation.BASE["dropout"],
        "MIN_LEN": ablation.TASK["min_len"],
        "MAX_LEN": ablation.TASK["max_len"],
        "VOCAB": ablation.TASK["vocab_size"],
    }
    assert {n: found.get(n) for n in names} == names
    source = (ROOT / "book" / "training.ipynb").read_text()
    assert source.count("clip_grad_norm=1.0") >= 1 and "clip_grad_norm=0" not in source
    assert recipe.clip_grad_norm == 1.0
    assert "LabelSmoothingLoss(0.1, ignore_index=PAD_ID)" in source
    assert ablation.BASE["smoothing"] == 0.1


def test_study_recipe_is_the_training_recipe_shortened() -> None:
    short, full = ablation.STUDY_RECIPE, ablation.TRAINING_RECIPE
    assert (short.steps, short.batch_size) == (200, 64)
    assert (short.warmup_steps, short.scale, short.clip_grad_norm) == (
        full.warmup_steps,
        full.scale,
        full.clip_grad_norm,
    )
    assert short.decay_steps == short.steps - short.warmup_steps == 160
    assert full.decay_steps == 360
    assert short.as_dict()["decay_steps"] == 160


def test_the_shipped_study_matches_the_code_that_reruns_it() -> None:
    study = ablation.load_study()  # raises if recipe, task, base or settings differ
    assert [(s["row"], s["label"]) for s in study["settings"]] == [
        (r, label) for r, label, _ in ablation.SETTINGS
    ]
    for s in study["settings"]:
        assert len(s["loss"]) == len(s["acc"]) == len(study["seeds"]) >= 5
        assert s["params"] == ablation.parameters(s["changes"])
        assert all(0 <= a <= 1 for a in s["acc"]) and all(x > 0 for x in s["loss"])


@pytest.mark.parametrize(
    "key, value",
    [
        ("recipe", {**ablation.STUDY_RECIPE.as_dict(), "scale": 0.5}),
        ("base", {**ablation.BASE, "d_ff": 256}),
        ("task", {**ablation.TASK, "held_out_seed": 1}),
        ("fixed", {"size": 100, "steps": 1200}),
    ],
)
def test_load_study_refuses_a_file_of_another_recipe(tmp_path, key, value) -> None:
    study = ablation.load_study()
    study[key] = value
    path = tmp_path / "study.json"
    path.write_text(json.dumps(study))
    with pytest.raises(ValueError, match=f"study file's {key} is"):
        ablation.load_study(path)
    study = ablation.load_study()
    study["settings"] = study["settings"][:-1]
    path.write_text(json.dumps(study))
    with pytest.raises(ValueError, match="settings differ"):
        ablation.load_study(path)


def test_train_setting_is_deterministic_and_reports_the_fixed_set() -> None:
    recipe = ablation.Recipe(steps=3, batch_size=8, warmup_steps=2, scale=0.4, clip_grad_norm=1.0)
    torch.set_num_threads(1)
    a = ablation.train_setting({"key_dim": 4}, 7, recipe=recipe)
    b = ablation.train_setting({"key_dim": 4}, 7, recipe=recipe)
    assert {k: v for k, v in a.items() if k != "cpu_seconds"} == {
        k: v for k, v in b.items() if k != "cpu_seconds"
    }
    assert set(a) == {"loss", "acc", "cpu_seconds"}
    assert 0 <= a["acc"] <= 1 and a["loss"] > 0


@pytest.mark.parametrize(
    "changes, seed, error, message",
    [
        ({"heads": 2}, 0, ValueError, r"unknown options \['heads'\]"),
        ([("num_heads", 2)], 0, TypeError, "changes must be a dict"),
        ({}, 1.5, TypeError, "seed must be an int"),
    ],
)
def test_train_setting_refuses_bad_arguments(changes, seed, error, message) -> None:
    with pytest.raises(error, match=message):
        ablation.train_setting(changes, seed)


def test_the_two_layer_norm_schedules_differ_only_in_the_warm_up() -> None:
    w, steps, peak = (ablation.LN_WARMUP[k] for k in ("warmup_steps", "steps", "peak_lr"))
    with_warmup = [ablation.layer_norm_warmup_lr(k, warmup=True) for k in range(1, steps + 1)]
    without = [ablation.layer_norm_warmup_lr(k, warmup=False) for k in range(1, steps + 1)]
    assert with_warmup[:w] == pytest.approx([peak * k / w for k in range(1, w + 1)])
    assert without[:w] == [peak] * w
    assert with_warmup[w:] == without[w:]
    assert max(with_warmup) == max(without) == peak
    assert without[w] == pytest.approx(peak)  # the decay starts at the peak
    assert without[-1] == pytest.approx(peak / (steps - w))  # and ends one step above zero


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"norm_first": 1, "warmup": True, "seed": 0}, TypeError, "must be bools"),
        ({"norm_first": False, "warmup": "yes", "seed": 0}, TypeError, "must be bools"),
        ({"norm_first": False, "warmup": True, "seed": 0.5}, TypeError, "seed"),
    ],
)
def test_train_layer_norm_setting_refuses_bad_arguments(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        ablation.train_layer_norm_setting(**kwargs)


def test_layer_norm_warmup_lr_refuses_a_step_before_the_first() -> None:
    with pytest.raises(ValueError, match="step"):
        ablation.layer_norm_warmup_lr(0, warmup=True)
