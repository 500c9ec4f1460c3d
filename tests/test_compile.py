"""train.compile=true: each residual block compiled (regional), the same training as eager, the
instruments' probe forwards run eagerly (their hooks fire, no recompilation on measured steps)."""

import json

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.lifecycle.run import run_experiment

from conftest import TINY

pytestmark = pytest.mark.slow


def compiled_run(root, *overrides):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={root}", "logger=none", "train.log_every=1", *overrides])
    summary = run_experiment(cfg, progress=False)
    assert summary["status"] == "completed"
    (run,) = root.glob("*/*/metrics.jsonl")
    return [json.loads(line) for line in run.read_text().splitlines()], counters["stats"]["unique_graphs"]


def test_compiled_blocks_train_as_eager_and_measured_steps_compile_nothing_more(tmp_path):
    eager, _ = compiled_run(tmp_path / "eager", "metrics.layer_every=1")
    compiled, graphs = compiled_run(tmp_path / "compiled", "metrics.layer_every=1", "train.compile=true")
    for a, b in zip(eager, compiled):
        for key in ("loss", "grad_norm", "update_norm", "model_update"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), key
    _, unmeasured_graphs = compiled_run(tmp_path / "bare", "train.compile=true", "metrics=off")
    # Probe forwards on every step (model update, activations) add no graph to the unmeasured run's:
    # one per block kind for training, the same again for evaluation (eval mode, no gradients).
    assert graphs == unmeasured_graphs <= 4
    from deepnorm_exp.sinks.layers import load_layers

    (run,) = (tmp_path / "compiled").glob("*/*/layers")
    layers = load_layers(run.parent)
    assert layers["out_norm"].notna().all()  # the activation hooks fired inside compiled blocks


def test_compiled_encoder_decoder_blocks_recompute_under_activation_checkpointing(tmp_path):
    """The translation task's batches vary in length: with recomputation the blocks are compiled for every
    shape at once, so a block's recomputation runs the graph its forward ran (with automatic dynamic shapes
    torch's checkpoint refused the second length it saw, pytorch#166926)."""
    overrides = ["model=encdec", "depth=2", "model.activation_checkpointing=true", "metrics=off", "train.steps=4"]
    eager, _ = compiled_run(tmp_path / "eager", *overrides)
    compiled, _ = compiled_run(tmp_path / "compiled", *overrides, "train.compile=true")
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
