"""Resume and idempotence: checkpoints, skipping finished runs, continuing killed ones bit for bit."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.rundir import RunDir
from deepnorm_exp.train.batches import RandomBatches
from deepnorm_exp import records

from conftest import TINY, TINY_MODEL, PausedRun, run_cli, write_text, CrashAt, only_run_dir, SimulatedCrash, config


def test_random_batches_resume_mid_epoch_with_the_same_batches():
    tensors = {"x": torch.arange(10)[:, None]}
    straight = RandomBatches(tensors, 3, seed=5)
    expected = [next(straight)["x"].flatten().tolist() for _ in range(8)]  # 3 per epoch: crosses epochs
    first = RandomBatches(tensors, 3, seed=5)
    got = [next(first)["x"].flatten().tolist() for _ in range(4)]
    resumed = RandomBatches(tensors, 3, seed=5)
    resumed.load_state_dict(first.state_dict())
    got += [next(resumed)["x"].flatten().tolist() for _ in range(4)]
    assert got == expected
    assert sorted(sum(expected[:3], [])) == sorted(set(sum(expected[:3], [])))  # no repeats in an epoch


def test_run_lock_is_exclusive_and_released(tmp_path):
    first, second = RunDir(tmp_path).lock(), RunDir(tmp_path).lock()
    assert first.acquire() and not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def losses(run_dir) -> list:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, lines) if "loss" in r]


def test_finished_runs_are_skipped_and_resume_false_starts_over(tmp_path):
    first = run_experiment(config(tmp_path), progress=False)
    assert first["status"] == "completed" and not (Path(first["run_dir"]) / "checkpoint.pt").exists()
    from deepnorm_exp.train.trainer import Callback

    class Steps(Callback):
        count = 0

        def on_step_end(self, trainer, out):
            Steps.count += 1

    again = run_experiment(config(tmp_path), progress=False, callbacks=[Steps()])
    assert again == first and Steps.count == 0  # skipped: not a single step trained
    fresh = run_experiment(config(tmp_path, "resume=false"), progress=False)
    assert fresh["wall_s"] != first["wall_s"] and losses(fresh["run_dir"]) == losses(first["run_dir"])


def test_resume_from_a_checkpoint_gives_the_uninterrupted_losses_and_records(tmp_path):
    """An in-process stand-in for a crash: stop after step 7 of 12 (checkpoint at 6), then re-run."""
    overrides = ["train.steps=12", "train.log_every=1", "train.ckpt_every=3", "metrics.layer_every=4",
                 "model.dropout=0.1", "train.eval_every=5"]
    straight = run_experiment(config(tmp_path / "a", *overrides), progress=False)

    from deepnorm_exp.train.trainer import Callback

    class Crash(Callback):
        def on_step_end(self, trainer, out):
            if out.step == 7:
                raise SimulatedCrash

    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path / "b", *overrides), progress=False, callbacks=[Crash()])
    run_dir = Path(straight["run_dir"].replace(str(tmp_path / "a"), str(tmp_path / "b")))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"] == 6
    resumed = run_experiment(config(tmp_path / "b", *overrides), progress=False)
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == 6
    assert losses(run_dir) == losses(straight["run_dir"])  # records after step 6 were cut, then rewritten
    assert resumed["eval_loss"] == straight["eval_loss"] and resumed["final_loss"] == straight["final_loss"]
    from deepnorm_exp.sinks.layers import load_layers

    a, b = load_layers(straight["run_dir"]), load_layers(run_dir)
    assert sorted(b.step.unique()) == [0, 4, 8, 12]
    assert a.equals(b)


def test_wall_time_counts_the_segments_before_a_resume(tmp_path):
    """summary.wall_s of a resumed run = the clock saved in the checkpoint + the resumed process's time (a
    day planted in the checkpoint must show up), and when it started and finished."""
    from deepnorm_exp.train.trainer import Callback

    class Crash(Callback):
        def on_step_end(self, trainer, out):
            if out.step == 5:
                raise SimulatedCrash

    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path, "train.ckpt_every=4"), progress=False, callbacks=[Crash()])
    (path,) = tmp_path.rglob("checkpoint.pt")
    state = torch.load(path, weights_only=True)
    assert 0 < state["callbacks"]["WallClock"]["elapsed_s"] < 600
    state["callbacks"]["WallClock"]["elapsed_s"] = 86400.0
    torch.save(state, path)
    resumed = run_experiment(config(tmp_path, "train.ckpt_every=4"), progress=False)
    assert resumed["resumed_from_step"] == 4 and 86400 < resumed["wall_s"] < 86400 + 600
    assert resumed["started_at"] <= resumed["finished_at"] and resumed["finished_at"].endswith("+00:00")


def test_a_checkpoint_of_another_config_is_not_resumed(tmp_path):
    from deepnorm_exp.train.trainer import Callback

    class Crash(Callback):
        def on_step_end(self, trainer, out):
            if out.step == 4:
                raise SimulatedCrash

    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path, "train.ckpt_every=2"), progress=False, callbacks=[Crash()])
    changed = config(tmp_path, "train.ckpt_every=2", "data.seed=9")  # not in the run name: same directory
    with pytest.raises(ConfigError, match="resume=false"):
        run_experiment(changed, progress=False)
    # How often to log, evaluate or checkpoint does not change what is trained: that resume goes ahead.
    relogged = config(tmp_path, "train.ckpt_every=3", "train.log_every=1", "train.eval_every=2")
    summary = run_experiment(relogged, progress=False)
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 2
    steps = [json.loads(line)["step"] for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
             .splitlines() if "loss" in json.loads(line)]
    assert steps == [2, 3, 4, 5, 6]  # every 2 before the checkpoint, every step after


@pytest.mark.slow
@pytest.mark.parametrize("how, data", [("SIGKILL", "synthetic"), ("SIGTERM", "synthetic"), ("SIGKILL", "text")])
def test_killed_run_rerun_matches_an_uninterrupted_run_step_by_step(tmp_path, how, data):
    """kill -9 between checkpoints (or SIGTERM: checkpoint at the step boundary, then exit), re-run the
    same command: the per-step losses equal an uninterrupted run's, bit for bit (same thread count); on
    the synthetic data and on a text file (memory-mapped cached blocks)."""
    data_args = TINY if data == "synthetic" else [
        *TINY_MODEL, "data=text", f"data.files={write_text(tmp_path / 'corpus.txt', lines=400)}"]
    args = [*data_args, "train.steps=160", "train.log_every=1", "train.ckpt_every=40", "train.eval_every=1000",
            "model.dropout=0.1", "threads=1", "logger=none", "metrics.layer_every=50"]
    straight = run_cli(*args, f"paths.runs={tmp_path / 'a'}")
    assert straight.returncode == 0, straight.stderr
    run = PausedRun([*args, f"paths.runs={tmp_path / 'b'}"], step=100, directory=tmp_path / "pause")
    run.wait_paused()
    run.proc.send_signal(getattr(signal, how))
    run.resume()
    run.finish(timeout=120)
    assert run.proc.returncode == -getattr(signal, how)
    (metrics,) = (tmp_path / "b").glob("*/*/metrics.jsonl")
    run_dir = metrics.parent
    stopped = json.loads((run_dir / "summary.json").read_text())["status"] if how == "SIGTERM" else None
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"]
    if how == "SIGTERM":  # checkpointed where it stopped, and said so
        assert stopped == "interrupted" and saved == 100
    else:
        assert saved == 80  # the last checkpoint before step 100
    rerun = run_cli(*args, f"paths.runs={tmp_path / 'b'}")
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == saved
    (straight,) = (tmp_path / "a").glob("default/*/metrics.jsonl")
    assert losses(run_dir) == losses(straight.parent) and len(losses(run_dir)) == 160


@pytest.mark.slow
def test_a_resumed_run_continues_its_wandb_run(tmp_path):
    from deepnorm_exp.train.trainer import Callback

    class Crash(Callback):
        def on_step_end(self, trainer, out):
            if out.step == 4:
                raise SimulatedCrash

    overrides = ["logger=wandb", "train.ckpt_every=2"]
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", *overrides])
    with pytest.raises(SimulatedCrash):
        run_experiment(cfg, progress=False, callbacks=[Crash()])
    summary = run_experiment(cfg, progress=False)
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 2  # step 4 crashed first
    segments = sorted((Path(summary["run_dir"]) / "wandb").glob("offline-run-*"))
    # the run id from each segment's run-<id>.wandb file, not from the directory's name: wandb appends "-1"
    # to a second segment started within the same second (CI saw offline-run-<time>-<id> and ...-<id>-1)
    run_ids = {f.name[len("run-"):-len(".wandb")] for s in segments for f in s.glob("run-*.wandb")}
    assert len(segments) == 2 and len(run_ids) == 1  # one run id


@pytest.mark.parametrize("damage", ["truncated", "deleted", "overwritten"])
def test_resume_rebuilds_a_metrics_file_that_no_longer_matches_the_checkpoint(tmp_path, damage):
    overrides = ["train.steps=12", "train.log_every=1", "train.ckpt_every=6", "train.eval_every=4"]
    straight = run_experiment(config(tmp_path / "a", *overrides), progress=False)
    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path / "b", *overrides), progress=False, callbacks=[CrashAt(9)])
    run_dir = only_run_dir(tmp_path / "b")
    metrics = run_dir / "metrics.jsonl"
    if damage == "truncated":
        metrics.write_bytes(metrics.read_bytes()[:40])
    elif damage == "deleted":
        metrics.unlink()
    else:
        metrics.write_text('{"step": 1, "loss": 99.0}\n' * 3)
    resumed = run_experiment(config(tmp_path / "b", *overrides), progress=False)
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == 6
    assert b"\x00" not in metrics.read_bytes()
    assert losses(run_dir) == losses(straight["run_dir"]) and len(losses(run_dir)) == 12


def test_a_metric_switched_on_for_a_resumed_run_measures_what_an_uninterrupted_run_does(tmp_path):
    overrides = ["train.steps=12", "train.log_every=1", "train.ckpt_every=6", "model.dropout=0.1"]
    straight = run_experiment(config(tmp_path / "a", *overrides), progress=False)
    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path / "b", *overrides, "metrics.model_update=false"), progress=False,
                       callbacks=[CrashAt(8)])
    resumed = run_experiment(config(tmp_path / "b", *overrides), progress=False)
    assert resumed["resumed_from_step"] == 6

    def model_update(run_dir):
        return {r["step"]: r["model_update"] for r in records.read_jsonl(Path(run_dir) / "metrics.jsonl")
                if "model_update" in r}

    after = model_update(resumed["run_dir"])
    assert sorted(after) == list(range(7, 13))  # measured from the resumption on
    expected = model_update(straight["run_dir"])
    assert all(after[step] == pytest.approx(expected[step], rel=1e-6) for step in after)


@pytest.mark.slow
def test_ctrl_c_checkpoints_records_interrupted_and_the_rerun_continues(tmp_path):
    """(That a resumed run equals an uninterrupted one, bit for bit, test_resume.py shows for SIGTERM and kill -9.)"""
    args = [*TINY, "train.steps=60", "train.log_every=1", "train.ckpt_every=50", "logger=none", f"paths.runs={tmp_path}"]
    run = PausedRun(args, step=23, directory=tmp_path / "pause")
    run.wait_paused()
    run.proc.send_signal(signal.SIGINT)
    run.resume()
    result = run.finish()
    assert result.returncode == 130 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == "deepnorm_exp: interrupted"
    run_dir = only_run_dir(tmp_path)
    summary = records.read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["steps_completed"] == 23
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["step"] == 23
    rerun = run_cli(*args)
    assert rerun.returncode == 0
    summary = records.read_json(run_dir / "summary.json")
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 23
    assert [row[0] for row in losses(run_dir)] == list(range(1, 61))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has stopped; only its parent's wait is missing


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_reaches_its_workers_which_checkpoint_and_stop(tmp_path):
    """`kill <sweep pid>` signals the launcher's process alone; joblib's workers, which train the runs, are
    its children and would train on to the end of their runs. The sweep hands the signal on to them."""
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY, "train.steps=100000",
            "train.ckpt_every=0", "logger=none", f"paths.runs={tmp_path}"]
    run = PausedRun(args, step=7, directory=tmp_path / "pause")
    worker = None
    try:
        worker = run.wait_paused()
        assert worker != run.proc.pid  # the run trains in a worker process
        run.proc.send_signal(signal.SIGTERM)
        run.proc.wait(timeout=60)  # the sweep's own process ends as SIGTERM's sender expects
        run.resume()
        deadline = time.monotonic() + 120
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker), "the worker trained on after the sweep was stopped"
        summary = records.read_json(only_run_dir(tmp_path) / "summary.json")
        assert summary["status"] == "interrupted" and summary["steps_completed"] == 7
    finally:
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)
        run.__exit__()
