"""Training loop pieces: schedules, divergence detection, and a NaN injected into a real run."""

import json
import math
import os

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.config import TrainConfig
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.train.callbacks import DivergenceDetector
from deepnorm_exp.train.optim import build_scheduler
from deepnorm_exp.rundir import RunDir
from deepnorm_exp.train.trainer import Callback, StepOutput

from conftest import TINY


def lrs(schedule, steps=100, warmup=10):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = build_scheduler(opt, TrainConfig(schedule=schedule, steps=steps, warmup_steps=warmup))
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_inverse_sqrt_warms_up_then_decays():
    lr = lrs("inverse_sqrt")
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert lr[39] == pytest.approx(math.sqrt(10 / 40))
    assert all(a < b for a, b in zip(lr[:9], lr[1:10]))


def test_cosine_and_constant():
    cos = lrs("cosine")
    assert cos[9] == pytest.approx(1.0) and cos[-1] < 0.01
    const = lrs("constant")
    assert const[0] == pytest.approx(0.1) and set(const[10:]) == {1.0}


def step(n, loss, grad=1.0):
    return StepOutput(step=n, loss=loss, grad_norm=grad, lr=1e-3, tokens=1)


class FakeTrainer:
    def __init__(self):
        self.stop_reason, self.record, self.events = None, {}, []

    def request_stop(self, reason):
        self.stop_reason = reason


@pytest.mark.parametrize("loss,grad,reason", [(float("nan"), 1.0, "non-finite loss"),
                                              (float("inf"), 1.0, "non-finite loss"),
                                              (2.0, float("nan"), "non-finite gradient norm")])
def test_non_finite_values_diverge_at_once(loss, grad, reason):
    det, trainer = DivergenceDetector(3.0, 5), FakeTrainer()
    det.after_backward(trainer, step(1, 2.5))
    det.after_backward(trainer, step(2, loss, grad))
    assert trainer.stop_reason == reason
    assert det.event["step"] == 2 and det.event["last_healthy"]["step"] == 1


def test_loss_spike_needs_patience_consecutive_steps():
    det, trainer = DivergenceDetector(2.0, 3), FakeTrainer()
    for n, loss in enumerate([4.0, 1.0, 2.5, 2.5, 1.5, 2.5, 2.5], start=1):  # never 3 in a row above 2.0
        det.after_backward(trainer, step(n, loss))
    assert trainer.stop_reason is None
    det.after_backward(trainer, step(8, 2.5))
    assert trainer.stop_reason is not None and det.event["step"] == 8


def test_injected_nan_makes_a_run_diverged_not_failed(tmp_path, monkeypatch):
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "train.steps=20"])
    from deepnorm_exp.models.decoder import DecoderLM

    original = DecoderLM.forward
    calls = {"n": 0}

    def forward_with_nan(self, tokens):
        calls["n"] += self.training
        out = original(self, tokens)
        if self.training and calls["n"] >= 5:
            out = out * float("nan")
        return out

    monkeypatch.setattr(DecoderLM, "forward", forward_with_nan)
    summary = run_experiment(cfg, progress=False)
    assert summary["status"] == "diverged"
    assert summary["diverged_at_step"] == 5 and summary["steps_completed"] == 4
    assert summary["divergence_reason"] == "non-finite loss"
    assert summary["divergence"]["last_healthy"]["step"] == 4
    assert summary["eval_loss"] is not None and math.isfinite(summary["eval_loss"])  # last healthy weights
    from pathlib import Path

    (event,) = [json.loads(line) for line in (Path(summary["run_dir"]) / "events.jsonl").read_text().splitlines()]
    assert event["event"] == "divergence" and event["step"] == 5 and event["loss"] == "nan"
    assert event["last_healthy"]["step"] == 4 and event["last_logged"]["step"] == 4  # TINY logs every 2
    assert "model_update" in event["last_logged"]


def test_bf16_autocast_runs_on_cpu(tmp_path):
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "train.precision=bf16"])
    summary = run_experiment(cfg, progress=False)
    assert summary["status"] == "completed" and math.isfinite(summary["eval_loss"])


def test_same_seed_same_losses(tmp_path):
    """Bitwise-reproducible on CPU: the seed fixes init and batch order."""
    losses = []
    for root in ("a", "b"):
        cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path / root}", f"paths.cache={tmp_path}/cache",
                                    "logger=none", "train.log_every=1"])
        summary = run_experiment(cfg, progress=False)
        assert summary["status"] == "completed"
        (metrics,) = (tmp_path / root).glob("*/*/metrics.jsonl")
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        losses.append([{k: v for k, v in r.items() if k not in ("tokens_per_s", "flops_per_s")} for r in records])
    assert len(losses[0]) == 6 and losses[0] == losses[1]


def test_checkpoint_random_states_come_back_on_the_cpu(tmp_path):
    """A GPU run resumed only if its checkpoint's random-number states came back as CPU ByteTensors
    (torch.set_rng_state and Generator.set_state take nothing else): `checkpoint.load` reads on the CPU
    whatever the run's device. Here every RNG state in a real run's checkpoint is checked, and restored."""
    from deepnorm_exp.train import checkpoint

    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "train.ckpt_every=3",
                                "train.keep_checkpoint=true"])
    run_experiment(cfg, progress=False)
    (path,) = tmp_path.glob(f"*/*/{RunDir.CHECKPOINT}")
    state = checkpoint.load(path)
    tensors = [state["rng"]["torch"], *state["rng"]["cuda"], state["batches"]["epoch_start_state"]]
    assert all(t.device.type == "cpu" and t.dtype == torch.uint8 for t in tensors)
    checkpoint.set_rng_state(state["rng"])
    torch.Generator().set_state(state["batches"]["epoch_start_state"])


def test_the_model_updates_reference_comes_back_beside_the_model(tmp_path):
    """The checkpoint is read onto the CPU; the model update's F(x, theta_0) goes back to the device of the
    outputs it is compared with (on a GPU it stayed on the CPU and the resumed run failed at its first logged
    step; the meta device stands in for the GPU here)."""
    from deepnorm_exp.metrics.model_update import ModelUpdate
    from deepnorm_exp.metrics.probe import Probe
    from deepnorm_exp.train import checkpoint

    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "train.ckpt_every=3",
                                "train.keep_checkpoint=true"])
    run_experiment(cfg, progress=False)
    (path,) = tmp_path.glob(f"*/*/{RunDir.CHECKPOINT}")
    saved = checkpoint.load(path)["callbacks"][ModelUpdate.__name__]
    assert saved["initial"].device.type == "cpu"

    class OnMeta(Probe):  # a probe whose model lives on another device than the checkpoint's tensors
        def __init__(self):
            pass

        def features(self, model):
            return torch.empty(2, 3, device="meta")

    restored = ModelUpdate(OnMeta(), every=1, model=None)
    restored.load_state_dict(saved)
    assert restored.initial.device.type == "meta" and restored.initial.shape == saved["initial"].shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_run_killed_and_resumed_gives_the_straight_runs_losses(tmp_path):
    from conftest import PausedRun, run_cli

    args = [*TINY, "device=cuda", "train.steps=12", "train.ckpt_every=4", "train.log_every=1", "logger=none"]
    straight = run_cli(*args, f"paths.runs={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    paused = PausedRun([*args, f"paths.runs={tmp_path / 'killed'}"], step=6, directory=tmp_path / "pause")
    import os
    import signal

    os.kill(paused.wait_paused(), signal.SIGKILL)
    paused.finish()
    resumed = run_cli(*args, f"paths.runs={tmp_path / 'killed'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    losses = [[json.loads(line)["loss"] for line in next(root.glob("*/*/metrics.jsonl")).read_text().splitlines()]
              for root in (tmp_path / "straight", tmp_path / "killed")]
    assert losses[0] == losses[1]


def test_deterministic_kernels_hold_for_the_run_and_leave_the_callers_setting(monkeypatch):
    from deepnorm_exp.train.numerics import DETERMINISTIC_CUBLAS, deterministic_kernels

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(True, warn_only=True)  # the caller's own setting
    try:
        with deterministic_kernels(True):
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == DETERMINISTIC_CUBLAS
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    with deterministic_kernels(False):
        assert not torch.are_deterministic_algorithms_enabled()


class SubnormalProbe(Callback):
    """What the training steps compute with 1e-40, a subnormal float32 (the smallest normal is 1.2e-38)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer, out):
        self.seen.append(float(torch.tensor(1e-40) * torch.tensor(1.0)))


@pytest.mark.parametrize("flush", [True, False])
def test_training_flushes_subnormal_floats_to_zero_on_the_cpu_unless_told_not_to(tmp_path, flush):
    """Deep Post-LN's backward is full of subnormals, which x86 computes tens of times slower than normal
    floats (train.flush_denormal); the process gets IEEE arithmetic back once the run ends."""
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "train.steps=2",
                                f"train.flush_denormal={str(flush).lower()}"])
    probe = SubnormalProbe()
    assert run_experiment(cfg, progress=False, callbacks=[probe])["status"] == "completed"
    assert probe.seen == ([0.0, 0.0] if flush else [pytest.approx(1e-40, rel=1e-3)] * 2)
    assert float(torch.tensor(1e-40) * torch.tensor(1.0)) > 0  # restored after the run


def test_a_run_stored_before_flush_denormal_existed_is_not_taken_as_one_trained_with_it(tmp_path):
    """The stored config lacks the key: those runs computed with subnormals (the field's `absent`: config.ABSENT_MEANS), so a
    finished one is another config's run, not this one's result."""
    from omegaconf import OmegaConf

    from deepnorm_exp.errors import ConfigError
    from deepnorm_exp.lifecycle.claim import check_same_training

    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}"])
    stored = OmegaConf.to_container(cfg, resolve=True)
    del stored["train"]["flush_denormal"]
    with pytest.raises(ConfigError) as err:
        check_same_training(stored, cfg, tmp_path)
    assert err.value.key == "train.flush_denormal"
    check_same_training(stored, deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "train.flush_denormal=false"]),
                        tmp_path)


@pytest.mark.parametrize("norm, key, absent_means, current", [
    ("deepscalelm", "embedding_norm", None, True),  # its absence is the default: taken as current
    ("tfixup", "init", None, True),
    ("hybridnorm", "init", None, True),  # the zoo's rows were stored before it: their re-launch was refused
    ("sigma_reparam", "qkv", None, True),
    ("rezero", "alpha_per", "alpha_per=sublayer", False),  # trained one alpha per sublayer: not today's default
    ("admin", "omega_param", None, False),  # no value of the key trains what the earlier profile did
    ("dsinit", "rule", None, False)])
def test_a_run_stored_before_its_schemes_key_existed_compares_as_what_it_trained(tmp_path, norm, key, absent_means,
                                                                                 current):
    """A scheme's Config says what a key's absence means where that is a value of the key (its field's `absent`); a key
    whose introduction changed training has none, and the stored run is another config's."""
    from omegaconf import OmegaConf

    from deepnorm_exp.errors import ConfigError
    from deepnorm_exp.lifecycle.claim import check_same_training

    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", f"norm={norm}"])
    stored = OmegaConf.to_container(cfg, resolve=True)
    del stored["norm"][key]
    if current:
        check_same_training(stored, cfg, tmp_path)
    else:
        with pytest.raises(ConfigError) as err:
            check_same_training(stored, cfg, tmp_path)
        assert err.value.key == f"norm.{key}"
    if absent_means:
        check_same_training(stored, deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", f"norm={norm}",
                                                          f"norm.{absent_means}"]), tmp_path)


# -- hostile input (issue 23): ddp or fsdp asked for on one process ------------------------------------------
def test_ddp_or_fsdp_on_one_process_says_so_in_one_line(tmp_path, caplog):
    import logging

    from deepnorm_exp.lifecycle.run import run_experiment

    from conftest import config

    with caplog.at_level(logging.WARNING, logger="deepnorm_exp"):
        summary = run_experiment(config(tmp_path, "train.parallel=fsdp", "train.steps=2"), progress=False)
    notes = [r.getMessage() for r in caplog.records if "train.parallel=fsdp" in r.getMessage()]
    assert len(notes) == 1 and "one process" in notes[0] and "torchrun" in notes[0] and "\n" not in notes[0]
    assert (summary["status"], summary["parallel"]) == ("completed", "none")


def test_callbacks_with_one_name_are_refused():
    from deepnorm_exp.train.trainer import Trainer

    with pytest.raises(ValueError, match="distinct names"):
        Trainer(model=None, optimizer=None, scheduler=None, batches=None, steps=1, device=None,
                callbacks=[Callback(), Callback()])
