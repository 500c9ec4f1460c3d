"""Fidelity to the paper's training setups: fairseq's three dropout sites, fp16 with dynamic loss scaling.
(T-Fixup's init against its official code: tests/test_zoo.py.)"""

from pathlib import Path

import pytest
import torch

import deepnorm_exp
from deepnorm_exp import records
from deepnorm_exp.lifecycle.run import run_experiment

from conftest import TINY, CrashAt, SimulatedCrash

KNOBS = ("model.dropout", "model.attention_dropout", "model.activation_dropout")


def build(*overrides, model="decoder"):
    torch.manual_seed(0)
    cfg = deepnorm_exp.compose([f"model={model}", "model.d_model=32", "model.n_heads=4", "model.d_ff=64", "depth=2",
                                *overrides])
    return deepnorm_exp.build_model(cfg)


def random_in_training(module, *inputs) -> bool:
    """Whether two training-mode forwards under different seeds differ (some dropout site is active)."""
    module.train()
    outputs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        with torch.no_grad():
            outputs.append(module(*inputs))
    return not torch.equal(*outputs)


def sites(model, model_kind: str) -> dict[str, bool]:
    """Which parts draw dropout in training mode: embeddings, attention, cross-attention, FFN."""
    x = torch.randn(2, 5, 32)
    tokens = torch.randint(3, 200, (2, 5))
    layer = model.blocks[0] if model_kind == "decoder" else model.decoder[0]
    found = {"embeddings": random_in_training(model.embed, tokens),
             "attention": random_in_training(layer.attn.sublayer, x),
             "ffn": random_in_training(layer.ffn.sublayer, x)}
    if model_kind == "encdec":
        found["cross"] = random_in_training(layer.cross.sublayer, x, torch.randn(2, 7, 32), None)
    return found


@pytest.mark.parametrize("model_kind", ["decoder", "encdec"])
@pytest.mark.parametrize("knob", KNOBS)
def test_each_dropout_knob_acts_at_its_own_sites_only(knob, model_kind):
    model = build(f"{knob}=0.3", model=model_kind)
    expected = {"model.dropout": {"embeddings", "attention", "ffn", "cross"},
                "model.attention_dropout": {"attention", "cross"},
                "model.activation_dropout": {"ffn"}}[knob]
    found = sites(model, model_kind)
    assert found == {site: site in expected for site in found}


def test_residual_dropout_is_the_last_thing_a_sublayer_does():
    """fairseq's `dropout` zeroes whole entries of G(x) (what the residual then adds); the other two knobs act
    inside G, so the output keeps no exact zeros."""
    x = torch.randn(4, 16, 32)
    for knob, zeroed in (("model.dropout", True), ("model.attention_dropout", False),
                         ("model.activation_dropout", False)):
        layer = build(f"{knob}=0.5").blocks[0]
        for sublayer in (layer.attn.sublayer, layer.ffn.sublayer):
            if knob == "model.attention_dropout" and sublayer is layer.ffn.sublayer:
                continue
            if knob == "model.activation_dropout" and sublayer is layer.attn.sublayer:
                continue
            sublayer.train()
            torch.manual_seed(3)
            share = float((sublayer(x) == 0).float().mean())
            assert (0.4 < share < 0.6) if zeroed else share == 0.0, (knob, type(sublayer).__name__, share)


@pytest.mark.parametrize("norm", ["post", "pre", "deepnorm", "admin", "skipinit", "tfixup", "subln", "periln",
                                  "lnscale", "mixln", "dsinit", "sigma_reparam", "depth_mup", "completep", "deepscalelm",
                                  "dyt", "derf", "olmo2", "hybridnorm", "ngpt"])
def test_every_scheme_combines_the_dropped_out_branch(norm):
    """The block in training mode equals the scheme's combine applied to G(x) with the same dropout mask.
    (ReZero's branch scalar is 0 at init, so its combine ignores G; SkipInit's is set to 0.5 here.)"""
    model = build("model.dropout=0.5", f"norm={norm}", *(["norm.branch_init=0.5"] if norm == "skipinit" else []))
    block = model.blocks[0].ffn
    x = torch.randn(2, 5, 32)
    block.train()
    torch.manual_seed(7)
    with torch.no_grad():
        trained = block(x)
    # The same mask through the branch alone, then the combine with dropout off (eval) and G(x) replaced
    # by that dropped-out branch: equal only if the dropout sits on G(x) before the combine.
    torch.manual_seed(7)
    branch_input = x
    inner = block.sublayer
    captured = {}

    def capture(module, args, output):
        captured["g"] = output

    handle = inner.register_forward_hook(capture)
    with torch.no_grad():
        block(x)
    handle.remove()
    dropped = captured["g"]
    block.eval()

    def replay(module, args, output):
        return dropped

    handle = inner.register_forward_hook(replay)
    with torch.no_grad():
        replayed = block(branch_input)
    handle.remove()
    # (sigma-Reparam's replay recomputes sigma from the same stored vector: at most a last-digit difference,
    # not a misplaced mask)
    torch.testing.assert_close(trained, replayed, rtol=1e-4, atol=1e-5)
    assert (dropped == 0).float().mean() > 0.3  # the captured branch is the dropped-out one


def test_eval_mode_is_deterministic_with_every_knob_on():
    model = build(*(f"{knob}=0.3" for knob in KNOBS))
    model.eval()
    tokens = torch.randint(3, 200, (2, 9))
    with torch.no_grad():
        first = model.features({"tokens": tokens})
        torch.manual_seed(123)
        second = model.features({"tokens": tokens})
    assert torch.equal(first, second)


# -- fp16 with dynamic loss scaling (torch.amp.GradScaler; here on the CPU's fp16 autocast) ------------------
def config(root, *overrides):
    return deepnorm_exp.compose([*TINY, f"paths.runs={root}", "logger=none", "train.precision=fp16",
                                 "train.log_every=1", *overrides])


def test_fp16_trains_with_loss_scaling_and_records_the_scale():
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        summary = run_experiment(config(root), progress=False)
        assert summary["status"] == "completed" and summary["loss_scale"] == 128.0 and summary["skipped_steps"] == 0
        rows = records.read_jsonl(Path(summary["run_dir"]) / "metrics.jsonl")
        assert all(r["loss_scale"] == 128.0 and r["skipped_steps"] == 0 for r in rows if "loss" in r)


def test_overflowing_steps_are_skipped_and_counted_not_divergence(tmp_path):
    # A first scale of 1e12 overflows fp16's gradients: the scaler skips those steps and halves the scale.
    summary = run_experiment(config(tmp_path, "train.loss_scale_init=1e12", "train.steps=40"), progress=False)
    assert summary["status"] == "completed" and summary["steps_completed"] == 40
    rows = [r for r in records.read_jsonl(Path(summary["run_dir"]) / "metrics.jsonl") if "loss" in r]
    skipped = [r["skipped_steps"] for r in rows]
    assert skipped == sorted(skipped) and 0 < skipped[-1] == summary["skipped_steps"] < 40
    scales = [r["loss_scale"] for r in rows]
    assert scales[0] == 1e12 and summary["loss_scale"] < 1e12
    # Each skipped step halved the scale: the scale before step n is 1e12 / 2^(steps skipped before it).
    for before, row in zip([0] + skipped, rows):
        assert row["loss_scale"] == pytest.approx(1e12 / 2 ** before)
    # The loss mean leaves overflowing steps out (fairseq's way): a logged step that overflowed has no loss.
    overflowed = [now > before for before, now in zip([0] + skipped, skipped)]
    assert [r["loss"] != r["loss"] for r in rows] == overflowed
    assert not (Path(summary["run_dir"]) / "events.jsonl").exists()


def test_a_loss_scale_that_collapses_is_a_divergence(tmp_path):
    summary = run_experiment(config(tmp_path, "train.loss_scale_init=1e12", "train.min_loss_scale=1e11"),
                             progress=False)
    assert summary["status"] == "diverged" and summary["divergence_reason"].startswith("loss scale collapsed below")
    assert summary["diverged_at_step"] == 4 and summary["skipped_steps"] == 4  # 1e12 / 2^4 < 1e11
    assert "overflowed were not applied" in summary["eval_weights"]


def test_the_loss_scaler_is_checkpointed_and_resumes_where_it_was(tmp_path):
    overrides = ["train.loss_scale_init=1e12", "train.steps=30", "train.ckpt_every=6", "model.dropout=0.1"]
    straight = run_experiment(config(tmp_path / "a", *overrides), progress=False)
    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path / "b", *overrides), progress=False, callbacks=[CrashAt(9)])
    resumed = run_experiment(config(tmp_path / "b", *overrides), progress=False)
    assert resumed["resumed_from_step"] == 6

    def scale_and_loss(summary):
        return [(r["step"], r["loss_scale"], r["skipped_steps"], r["loss"])
                for r in records.read_jsonl(Path(summary["run_dir"]) / "metrics.jsonl") if "loss" in r]

    assert scale_and_loss(resumed) == scale_and_loss(straight)
    assert resumed["loss_scale"] == straight["loss_scale"] and resumed["skipped_steps"] == straight["skipped_steps"]
