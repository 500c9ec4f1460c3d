"""Sweeps through Hydra's launchers (joblib, submitit's local executor), idempotent re-runs, two sweeps
at once, and the stability-frontier sweeper, end to end through the real CLI on tiny models."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, PausedRun, run_cli

pytestmark = pytest.mark.slow


def lr_of(run_dir: Path) -> float:
    from omegaconf import OmegaConf

    return OmegaConf.load(run_dir / "config.yaml").train.lr


def summaries(root: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in root.glob("*/summary.json")}


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_launcher_sweep_records_every_job_and_a_failing_job_does_not_stop_the_rest(tiny, runs_root, launcher):
    # batch 64 > the 32 training sequences: passes the pre-flight, fails when the job loads its data
    tiny = [o for o in tiny if not o.startswith(("train.batch_size=", "data.train_sequences="))]
    result = run_cli("-m", f"hydra/launcher={launcher}", "norm=post,deepnorm", "train.batch_size=4,64",
                     *tiny, "data.train_sequences=32", timeout=600)
    # Every job ran; the command then says which failed and exits non-zero (a diverged run would be a result).
    assert result.returncode == 1, result.stderr[-3000:]
    assert "2 of 4 runs failed" in result.stderr.splitlines()[-1] and "Traceback" not in result.stderr
    runs = summaries(runs_root / "default")
    assert len(runs) == 4
    statuses = {name: s["status"] for name, s in runs.items()}
    assert sorted(statuses.values()) == ["completed", "completed", "failed", "failed"], statuses
    assert all(s["status"] == "failed" for n, s in runs.items() if "batch_size=64" in n)
    assert "train.batch_size" in next(s["error"] for s in runs.values() if s["status"] == "failed")
    table = result.stdout[result.stdout.index("status"):]  # the one-screen table ends the sweep
    assert table.count("completed") == 2 and table.count("failed") == 2
    if launcher == "joblib":  # each of the 2 workers gets the machine's cores / 2 torch threads
        import os

        expected = max(1, (os.cpu_count() or 1) // 2)
        assert {json.loads((runs_root / "default" / n / "config.yaml").read_text().split("threads: ")[1]
                           .split("\n")[0]) for n in runs} == {expected}


def test_rerunning_a_finished_sweep_launches_nothing(tiny, runs_root):
    first = run_cli("-m", "norm=post,pre", *tiny)
    assert first.returncode == 0, first.stderr
    before = {n: s["wall_s"] for n, s in summaries(runs_root / "default").items()}
    again = run_cli("-m", "norm=post,pre", *tiny)
    assert again.returncode == 0 and "already finished" in again.stdout  # nothing launched, nothing trained
    assert {n: s["wall_s"] for n, s in summaries(runs_root / "default").items()} == before
    # Adding a grid point runs only the new job.
    grown = run_cli("-m", "norm=post,pre,deepnorm", *tiny)
    after = summaries(runs_root / "default")
    assert grown.returncode == 0 and len(after) == 3
    assert {n: after[n]["wall_s"] for n in before} == before
    # Each invocation that launched something is logged (the results page measures presets' times from it).
    log = [json.loads(line) for line in (runs_root / "default" / "sweeps.jsonl").read_text().splitlines()]
    assert [line["event"] for line in log] == ["start", "end"] * 2
    assert log[-2]["overrides"][0] == "norm=post,pre,deepnorm" and log[-2]["sweeper"] == "CheckedSweeper"
    assert log[0]["at"] <= log[1]["at"] <= log[2]["at"] <= log[3]["at"]
    # ... with the code that ran it: this checkout's HEAD (the results page names it)
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert log[0]["commit"] == head and isinstance(log[0]["modified"], bool)


def test_two_sweeps_at_once_never_share_a_run_or_corrupt_a_record(tiny, runs_root):
    args = [sys.executable, "-m", "deepnorm_exp", "-m", "norm=post,pre,deepnorm", *tiny, "train.steps=30"]
    procs = [subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in procs:
        proc.communicate(timeout=600)
        assert proc.returncode == 0
    runs = summaries(runs_root / "default")
    assert len(runs) == 3 and all(s["status"] == "completed" for s in runs.values())
    for name in runs:
        records = [json.loads(line) for line in (runs_root / "default" / name / "metrics.jsonl").read_text()
                   .splitlines()]
        steps = [r["step"] for r in records if "loss" in r]
        assert steps == list(range(2, 31, 2)), (name, steps)  # written once, by one process


def test_frontier_sweeper_probes_learning_rates_as_ordinary_runs(tiny, runs_root):
    result = run_cli("-m", "hydra/sweeper=frontier", "norm=post,deepnorm", "depth=2,3", *tiny,
                     "train.steps=20", "train.warmup_steps=0", "train.schedule=constant",
                     "train.divergence.spike_patience=3", "train.divergence.spike_factor=1.5",
                     "hydra.sweeper.lr_min=1e-3", "hydra.sweeper.lr_max=30", "hydra.sweeper.resolution=4",
                     timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((runs_root / "default" / "frontier.json").read_text())
    assert [(cell["norm"], cell["depth"]) for cell in report["cells"]] == [
        ("post", "2"), ("post", "3"), ("deepnorm", "2"), ("deepnorm", "3")]
    runs = summaries(runs_root / "default")
    assert report["runs_spent"] == sum(cell["runs"] for cell in report["cells"]) == len(runs)
    assert report["grid_runs"] == 4 * 9 and report["runs_spent"] < report["grid_runs"]
    for cell in report["cells"]:
        lrs = [p["lr"] for p in cell["probes"]]
        assert lrs[0] == 30  # the optimistic end first
        if cell["max_stable_lr"] and cell["min_unstable_lr"]:
            assert cell["max_stable_lr"] < cell["min_unstable_lr"] <= 4 * cell["max_stable_lr"]
        for probe in cell["probes"]:  # each probe is a run with its own record
            (summary,) = [s for n, s in runs.items()
                          if s["norm"] == cell["norm"] and s["depth"] == int(cell["depth"])
                          and lr_of(runs_root / "default" / n) == probe["lr"]]
            assert (summary["status"] == "completed") == probe["stable"]
    assert "stability frontier" in result.stdout
    # The frontier law from these runs: in the analysis package and in report.html
    from deepnorm_exp.analysis import load_frontier
    from deepnorm_exp.analysis.frontier_law import fit_frontier_law
    from deepnorm_exp.analysis.report import build_report

    law = fit_frontier_law(load_frontier(runs_root / "default")).set_index("norm")
    closed = {c["norm"] for c in report["cells"] if c["max_stable_lr"] and c["min_unstable_lr"]}
    for norm in ("post", "deepnorm"):
        bracketed = sum(1 for c in report["cells"] if c["norm"] == norm and c["max_stable_lr"] and c["min_unstable_lr"])
        assert law.loc[norm, "cells"] == bracketed and law.loc[norm, "censored"] == 2 - bracketed
    assert closed  # at least one scheme has a bracketed frontier at some depth
    page = build_report(runs_root / "default")
    assert 'id="frontier-law"' in page and "Stability frontier across depth" in page
    # ... and on the results page, as the frontier_depth study: the law, its figure, every cell
    import shutil

    from deepnorm_exp.analysis.results import build_results

    shutil.copytree(runs_root / "default", runs_root.parent / "studies" / "frontier_depth")
    results = build_results(runs_root.parent / "studies", runs_root.parent / "docs").read_text()
    section = results[results.index("## Stability frontier across depth"):].split("\n## ")[0]
    assert "(results/frontier_law.png)" in section and (runs_root.parent / "docs/results/frontier_law.png").is_file()
    assert f"({report['runs_spent']} probe runs; a grid at the same resolution would have taken 36)" in section
    law_table = section[section.index("| norm | slope | slope_low | slope_high |"):].split("\n\n")[0]
    assert [line.split(" | ")[0] for line in law_table.splitlines()[2:]] == ["| deepnorm", "| post"]
    # each cell's bracket, from frontier.json as read here (one seed: one bracket a cell)
    brackets = section[section.index("| norm | 2 | 3 |"):].split("\n\n")[0]
    rows = {line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in brackets.splitlines()[2:]}
    for cell in report["cells"]:
        lo, hi = cell["max_stable_lr"], cell["min_unstable_lr"]
        text = "error" if lo is None and hi is None else f"< {hi:.3g}" if lo is None else (
            f"> {lo:.3g}" if hi is None else f"{lo:.3g}-{hi:.3g}")
        assert rows[cell["norm"]][int(cell["depth"]) - 2] == text
    # ... and the README's frontier block, from the same records
    from deepnorm_exp.analysis.blocks import generated_blocks
    from deepnorm_exp.analysis.evidence import Evidence

    block = generated_blocks(Evidence(runs_root.parent / "studies"))["frontier"]
    assert brackets in block and re.search(r"- (deepnorm|post): (slope -?\d|no slope)", block)


def test_submitit_preemption_signal_checkpoints_requeues_and_the_run_completes_unchanged(tiny, runs_root):
    """The signal SLURM sends before a time limit (submitit's SIGUSR2), sent to the running job: it
    checkpoints, submitit requeues it, the new job resumes, and the losses equal an uninterrupted run's."""
    import os
    import signal

    args = [*tiny, "train.steps=400", "train.log_every=1", "train.ckpt_every=150", "threads=1",
            "metrics.layer_every=0", "model.dropout=0.1"]
    straight = run_cli(*args, f"paths.runs={runs_root / 'straight'}")
    assert straight.returncode == 0, straight.stderr
    submitit = runs_root.parent / "submitit"
    run = PausedRun(["-m", "hydra/launcher=submitit_local", *args, f"paths.submitit={submitit}"], step=200,
                    directory=runs_root.parent / "pause")
    task = run.wait_paused()  # submitit's job process, paused at step 200
    os.kill(task, signal.SIGUSR2)
    run.resume()
    result = run.finish(timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = [m.parent for m in (runs_root / "default").glob("*/metrics.jsonl")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 200
    log = "".join(p.read_text() for p in (submitit / "default").glob("*/*_log.out"))
    assert not list(runs_root.rglob("*.pkl"))  # no pickle in the run tree (submitit unpickles its own)
    assert "Requeued job" in log
    lines = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
    (straight_dir,) = [m.parent for m in (runs_root / "straight" / "default").glob("*/metrics.jsonl")]
    assert lines(run_dir) == lines(straight_dir) and len(lines(run_dir)) == 400


def test_hydra_s_sweep_grammar_and_multirun_mode_run_as_hydra_runs_them(tiny, runs_root):
    """glob() and range() (Hydra's override grammar), and hydra.mode=MULTIRUN in place of -m."""
    result = run_cli("hydra.mode=MULTIRUN", "norm=glob(p*)", "depth=range(1,2)", *tiny)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = summaries(runs_root / "default")
    # post_init at depth 1: the memory estimate's shape probes have more layers than the stack (k_l at least 1)
    assert sorted((s["norm"], s["depth"]) for s in runs.values()) == [("periln", 1), ("post", 1), ("post_init", 1),
                                                                      ("pre", 1)]
