"""Sinks: the offline W&B run holds what was logged, local files are always there, and W&B failing in
any way never stops training."""

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

import deepnorm_exp
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.sinks import Guarded, Sink
from deepnorm_exp import records

from conftest import TINY, PausedRun, only_run_dir
from wandb_records import read_run


def config(tmp_path, *overrides):
    return deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "train.steps=6", "metrics.layer_every=3",
                                 *overrides])


@pytest.mark.slow
def test_offline_wandb_run_holds_the_logged_keys_grouping_and_config(tmp_path):
    summary = run_experiment(config(tmp_path, "logger=wandb", "norm=post", "depth=2",
                                    "experiment_name=sweep_a"), progress=False)
    (offline,) = (Path(summary["run_dir"]) / "wandb").glob("offline-run-*")
    (wandb_file,) = offline.glob("*.wandb")
    run = read_run(wandb_file)
    assert run["run"].run_group == "sweep_a" and run["run"].job_type == "post"
    assert set(run["run"].tags) == {"norm:post", "depth:2", "model:decoder"}
    assert run["run"].display_name == summary["run_name"]
    assert {item.key for item in run["run"].config.update} >= {"norm", "model", "train", "metrics", "depth"}
    scalars = {"loss", "eval_loss", "lr", "grad_norm", "update_norm", "update_ratio", "tokens_per_s",
               "model_update", "model_update_step", "step"}
    assert scalars <= run["history_keys"]
    for metric in ("grad_norm", "update_ratio", "ln_input_norm", "out_norm", "attn_entropy"):
        for stat in ("min", "median", "max", "first", "last"):
            assert f"layers/{metric}/decoder/{stat}" in run["history_keys"]
        assert f"layers/{metric}/decoder/heatmap/path" in run["history_keys"]
    # Per-layer vectors stay summaries: no key per layer.
    assert not any(key.split("/")[-1].isdigit() for key in run["history_keys"])
    assert {"status", "eval_loss", "depth", "diagnosis_kind", "diagnosis_step", "diagnosis_evidence"} <= run["summary_keys"]
    assert list(offline.glob("files/media/images/layers/grad_norm/decoder/heatmap_*.png"))


def test_logger_none_writes_no_wandb_files_but_every_local_record(tmp_path):
    summary = run_experiment(config(tmp_path, "logger=none"), progress=False)
    run_dir = Path(summary["run_dir"])
    assert not (run_dir / "wandb").exists()
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "metrics.jsonl", "summary.json", "layers"}


def failing(*args, **kwargs):
    raise RuntimeError("wandb-core exited\nsecond line")


@pytest.mark.parametrize("breaks", ["init", "log", "missing"])
def test_wandb_failures_warn_once_and_the_run_completes(tmp_path, monkeypatch, caplog, breaks):
    import wandb
    from wandb.sdk import wandb_run

    if breaks == "init":
        monkeypatch.setattr(wandb, "init", failing)
    elif breaks == "log":
        monkeypatch.setattr(wandb_run.Run, "log", failing)
    else:
        monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with caplog.at_level(logging.WARNING, logger="deepnorm_exp"):
        summary = run_experiment(config(tmp_path, "logger=wandb"), progress=False)
    assert summary["status"] == "completed"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "W&B" in warnings[0] and "local records" in warnings[0]
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines if "loss" in json.loads(line)] == [2, 4, 6]


def test_guarded_sink_drops_a_failing_sink_and_closes_it():
    calls = []

    class Flaky(Sink):
        def log(self, record):
            calls.append("log")
            raise OSError("disk")

        def close(self):
            calls.append("close")

    guarded = Guarded("flaky", Flaky)
    guarded.log({"step": 1})
    guarded.log({"step": 2})
    guarded.finish({})
    assert calls == ["log", "close"]


def wandb_service_pids(parent: int) -> list[int]:
    """Processes started below `parent` whose command line names W&B's service."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ancestor = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "wandb" in command and ancestor == parent:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_wandb_service_dying_mid_run_is_one_warning_and_the_run_completes(tmp_path):
    args = [*TINY, "train.steps=30", "logger=wandb", f"paths.runs={tmp_path}"]
    with PausedRun(args, step=10, directory=tmp_path / "pause") as run:
        pid = run.wait_paused()
        services = wandb_service_pids(pid)
        assert services, "no W&B service process found"
        for service in services:
            os.kill(service, signal.SIGKILL)
        run.resume()
        result = run.finish()
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert sum("W&B" in line and "continuing with the local records only" in line for line in output.splitlines()) == 1
    summary = records.read_json(only_run_dir(tmp_path) / "summary.json")
    assert summary["status"] == "completed" and summary["steps_completed"] == 30
