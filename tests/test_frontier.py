"""The stability-frontier search, on planted thresholds."""

import math
from pathlib import Path

import pandas as pd
import pytest

from deepnorm_exp.sweeps.frontier import grid_runs, prior_brackets, search


def planted(thresholds):
    calls = []

    def probe(batch):
        calls.append(batch)
        return [lr <= thresholds[key] for key, lr in batch]

    return probe, calls


@pytest.mark.parametrize("threshold", [1.3e-4, 7e-4, 3.3e-3, 0.02, 0.09])
def test_bisection_brackets_a_planted_threshold_with_the_expected_probes(threshold):
    lo, hi, resolution = 1e-4, 1e-1, 2 ** 0.25
    probe, _ = planted({"cell": threshold})
    (cell,) = search(["cell"], lo, hi, resolution, probe)
    assert cell.stable <= threshold < cell.unstable
    assert cell.unstable / cell.stable <= resolution
    # hi and lo, then halvings of the log-range until within the resolution
    expected = 2 + math.ceil(math.log2(math.log(hi / lo) / math.log(resolution)))
    assert cell.result()["runs"] == expected == 8
    assert grid_runs(lo, hi, resolution) == 41  # what a grid of the same resolution costs


def test_cells_are_searched_together_and_edge_cases_settle_early():
    probe, calls = planted({"stable everywhere": 1.0, "unstable everywhere": 1e-9, "middle": 3e-3})
    cells = {c.key: c for c in search(["stable everywhere", "unstable everywhere", "middle"], 1e-4, 1e-1,
                                      2 ** 0.25, probe)}
    assert cells["stable everywhere"].result()["runs"] == 1 and cells["stable everywhere"].unstable is None
    assert cells["unstable everywhere"].result()["runs"] == 2 and cells["unstable everywhere"].stable is None
    assert len(calls[0]) == 3 and len(calls[1]) == 2 and all(len(batch) == 1 for batch in calls[2:])


def test_a_failed_probe_stops_its_cell_only_and_is_counted_and_listed_with_its_error():
    def probe(batch):
        return ["RuntimeError: boom" if key == "broken" else lr <= 1e-2 for key, lr in batch]

    cells = {c.key: c for c in search(["broken", "fine"], 1e-4, 1e-1, 2.0, probe)}
    broken = cells["broken"].result()
    assert broken["runs"] == 1 and broken["probes"] == [{"lr": 0.1, "stable": None, "error": "RuntimeError: boom"}]
    assert "RuntimeError: boom" in broken["error"]
    assert cells["fine"].stable <= 1e-2 < cells["fine"].unstable


def test_a_prior_bracket_starts_the_search_inside_it_and_costs_no_probe():
    """The board's grid (3e-4, 1e-3, 3e-3, 1e-2) already brackets each cell: the bisection starts there."""
    grid = (3e-4, 1e-3, 3e-3, 1e-2)
    thresholds = {"inside": 2e-3, "above": 0.02, "below": 1e-4, "too slow low": 5e-3}
    seen = {key: [(lr, lr <= t) for lr in grid] for key, t in thresholds.items()}
    seen["too slow low"][0] = (3e-4, False)  # trained too slowly at the lowest rate: no bound on the frontier
    prior = {key: prior_brackets(outcomes) for key, outcomes in seen.items()}
    assert prior["inside"] == [(1e-3, True), (3e-3, False)] and prior["above"] == [(1e-2, True)]
    assert prior["below"] == [(3e-4, False)] and prior["too slow low"] == [(3e-3, True), (1e-2, False)]
    probe, calls = planted(thresholds)
    cells = {c.key: c for c in search(list(thresholds), 1e-4, 3e-2, 2.05, probe, prior)}
    inside = cells["inside"].result()
    assert inside["runs"] == 1 and inside["probes"] == [{"lr": pytest.approx(math.sqrt(3e-6)), "stable": True}]
    assert inside["prior"] == [{"lr": 1e-3, "stable": True}, {"lr": 3e-3, "stable": False}]
    assert (cells["inside"].stable, cells["inside"].unstable) == (pytest.approx(math.sqrt(3e-6)), 3e-3)
    assert [p["lr"] for p in cells["above"].result()["probes"]][0] == 3e-2  # the open end first: the range's top
    assert [p["lr"] for p in cells["below"].result()["probes"]][0] == 1e-4  # and its bottom
    assert (cells["too slow low"].stable, cells["too slow low"].unstable) == (3e-3, pytest.approx(math.sqrt(3e-5)))
    assert sum(len(batch) for batch in calls) == sum(c.result()["runs"] for c in cells.values())
    settled = search(["top"], 1e-4, 1e-2, 2.05, planted({"top": 1.0})[0], {"top": [(1e-2, True)]})
    assert settled[0].result()["runs"] == 0  # stable at the range's top already: at or above it


def test_a_prior_outside_the_range_bounds_it_at_its_ends_or_not_at_all():
    """A reviewer's cases: a prior stable at 0.1 over a range ending at 3e-2 reported max_stable_lr 0.1 with no
    run; stable at 3e-2 and unstable at 0.1 probed 0.0548, outside the range."""
    def run(prior, lo=1e-3, hi=3e-2, threshold=1.0):
        (cell,) = search(["c"], lo, hi, 2.05, planted({"c": threshold})[0], {"c": prior})
        return cell
    above = run([(0.1, True)])
    assert (above.stable, above.result()["runs"]) == (3e-2, 0)
    assert above.result()["prior"] == [{"lr": 3e-2, "stable": True, "seen_at": 0.1}]
    edge = run([(3e-2, True), (0.1, False)])  # the unstable rate above the range bounds nothing: settled at hi
    assert (edge.stable, edge.unstable, edge.result()["runs"]) == (3e-2, None, 0)
    below = run([(3e-4, False)])
    assert (below.stable, below.unstable, below.result()["runs"]) == (None, 1e-3, 0)
    low_stable = run([(3e-4, True), (3e-3, False)], threshold=2e-3)  # stable below lo: no bound; lo probed
    assert [p["lr"] for p in low_stable.result()["probes"]][0] == 1e-3 and low_stable.stable >= 1e-3


def test_without_a_prior_the_search_probes_as_before():
    probe, calls = planted({"cell": 3e-3})
    (with_empty,) = search(["cell"], 1e-4, 1e-1, 2.0, probe, {"cell": []})
    (without,) = search(["cell"], 1e-4, 1e-1, 2.0, planted({"cell": 3e-3})[0])
    assert with_empty.result() == without.result() and "prior" not in without.result()


class FakeLauncher:
    """Records each launch; every probe below lr 1e-2 is stable, one cell's probes fail."""

    def __init__(self):
        self.launches = []

    def launch(self, jobs, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus

        self.launches.append([list(job) for job in jobs])
        results = []
        for job in jobs:
            overrides = dict(o.split("=", 1) for o in job)
            result = JobReturn()
            if overrides["norm"] == "broken":
                result.status, result._return_value = JobStatus.FAILED, RuntimeError("boom")
            elif overrides["norm"] == "elsewhere":
                result.status = JobStatus.COMPLETED
                result._return_value = {"status": "skipped", "reason": "running in another process",
                                        "run_dir": "runs/x/elsewhere"}
            elif overrides["norm"] == "preempted":
                result.status = JobStatus.COMPLETED
                result._return_value = {"status": "interrupted", "run_dir": "runs/x/preempted", "error": "SIGTERM"}
            else:
                result.status = JobStatus.COMPLETED
                result._return_value = {"status": "completed" if float(overrides["train.lr"]) <= 1e-2 else "diverged"}
            results.append(result)
        return results


def sweeper(tmp_path, **options):
    from omegaconf import OmegaConf

    from hydra_plugins.deepnorm_exp_frontier.frontier_sweeper import FrontierSweeper

    sweep = FrontierSweeper(params={}, key="train.lr", lr_min=1e-4, lr_max=1e-1, resolution=2.0,
                            stable_if="completed", **options)
    sweep.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "x": 1})
    sweep.launcher = FakeLauncher()
    sweep.hydra_context = type("Context", (), {"config_loader": None})()
    return sweep


def test_the_sweeper_counts_failed_probes_in_runs_and_runs_spent_alike(tmp_path):
    sweep = sweeper(tmp_path)
    report = sweep.sweep(["norm=post,pre,broken"])
    cells = {cell["norm"]: cell for cell in report["cells"]}
    assert report["runs_spent"] == sum(cell["runs"] for cell in report["cells"])
    assert cells["broken"]["probes"][0]["error"] == "RuntimeError: boom" and cells["broken"]["runs"] == 1


def test_an_interrupted_probe_stops_the_sweep_instead_of_settling_its_cell(tmp_path):
    """A preempted probe says nothing about stability: the sweep stops (re-running resumes it), writing no
    frontier.json that would report the cell as failed."""
    with pytest.raises(RuntimeError, match="runs/x/preempted was interrupted .SIGTERM.: .* re-run the same command"):
        sweeper(tmp_path).sweep(["norm=post,preempted"])
    assert not (tmp_path / "frontier.json").exists()


def test_a_probe_another_sweep_is_running_stops_this_sweep(tmp_path):
    """The same frontier launched twice: the second finds the first's probe locked. That says nothing about
    stability either (it used to settle the cell as failed in the second sweep's report)."""
    with pytest.raises(RuntimeError, match="runs/x/elsewhere is being run by another process .* one sweep"):
        sweeper(tmp_path).sweep(["norm=post,elsewhere"])
    assert not (tmp_path / "frontier.json").exists()


def test_max_batch_size_bounds_each_launch(tmp_path):
    sweep = sweeper(tmp_path, max_batch_size=2)
    report = sweep.sweep(["norm=post,pre,deepnorm"])
    launches = sweep.launcher.launches
    assert max(len(batch) for batch in launches) == 2 and [len(b) for b in launches[:2]] == [2, 1]  # round 1: 3
    assert report["runs_spent"] == sum(len(batch) for batch in launches)


def test_a_value_for_the_probed_key_is_refused(tmp_path):
    from deepnorm_exp.errors import ConfigError

    with pytest.raises(ConfigError, match="probes train.lr itself"):
        sweeper(tmp_path).sweep(["norm=post", "train.lr=1e-3"])


def test_the_command_line_refuses_a_probed_key_before_anything_runs(tmp_path, capsys):
    from deepnorm_exp.__main__ import main

    with pytest.raises(SystemExit) as exit:
        main(["-m", "hydra/sweeper=frontier", "norm=post,pre", "train.lr=1e-3", f"paths.runs={tmp_path / 'runs'}"])
    assert exit.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith("deepnorm_exp: error: train.lr=1e-3 is invalid: hydra/sweeper=frontier probes train.lr")
    assert not (tmp_path / "runs").exists()


def test_the_bisection_probes_exact_midpoints_and_the_runs_use_them(tmp_path):
    """Issue 39: the rates were rounded to 3 digits, so two brackets that exact bisection makes equal
    (0.001-0.00204 and 0.00416-0.00848: ratios 4.160 and 4.157) differed, and a claim read the difference."""
    lo, hi = 1e-3, 0.3
    probe, _ = planted({"post": 0.005, "deepnorm": 0.0015})
    cells = {c.key: c for c in search(["post", "deepnorm"], lo, hi, 2.05, probe)}
    for cell in cells.values():  # three halvings of log(300): 300^(1/8) = 2.04, within the resolution
        assert math.isclose(cell.unstable / cell.stable, (hi / lo) ** (1 / 8), rel_tol=1e-12)
    sweep = sweeper(tmp_path)
    report = sweep.sweep(["norm=post"])
    used = [float(dict(o.split("=", 1) for o in job)["train.lr"]) for batch in sweep.launcher.launches for job in batch]
    assert used[:3] == [1e-1, 1e-4, math.sqrt(1e-4 * 1e-1)]  # the ends, then the exact geometric midpoint
    assert used == [probe["lr"] for probe in report["cells"][0]["probes"]]  # what ran is what the report says


# -- hydra.sweeper.prior: which of an earlier study's runs bracket each cell ---------------------------------
def prior_runs(**battery):
    """A two-scheme grid at depths 6 and 24, seeds 0 and 1: post trains up to 1e-3, pre up to 1e-2."""
    top = {"post": 1e-3, "pre": 1e-2}
    return pd.DataFrame([{"norm": norm, "depth": depth, "seed": seed, "train.lr": lr, "status": "completed",
                          "trained": lr <= top[norm], "train.steps": 500, "experiment": "board", "paths.runs": "/else",
                          "threads": 2, **battery}
                         for norm in top for depth in (6, 24) for seed in (0, 1) for lr in (3e-4, 1e-3, 3e-3, 1e-2)])


def outcomes_of(monkeypatch, runs, cells, **config):
    from omegaconf import OmegaConf

    from deepnorm_exp.analysis import frontier_prior
    from deepnorm_exp.analysis.evidence import Evidence

    monkeypatch.setattr(Evidence, "runs", lambda self, study: runs)
    base = {"norm": {"name": "post"}, "depth": 6, "seed": 0, "train": {"steps": 500}, **config}
    return frontier_prior.prior_outcomes(Path("runs/board"), cells, "train.lr", "trained", OmegaConf.create(base))


def test_a_cell_reads_only_its_own_schemes_depths_and_seeds_runs_even_where_the_sweep_does_not_vary_them(monkeypatch):
    """A reviewer's case: `norm=post` alone (one value, so no axis) pooled every scheme's runs into each cell."""
    cells = [("experiment=board_frontier", "norm=post", "depth=24", f"seed={s}", "threads=1") for s in (0, 1)]
    read = outcomes_of(monkeypatch, prior_runs(), cells)
    for cell in cells:
        assert sorted(read[cell]) == [(3e-4, True), (1e-3, True), (3e-3, False), (1e-2, False)]
    no_norm = [("depth=6",)]  # the scheme and seed from the sweep's config: post, seed 0
    assert len(outcomes_of(monkeypatch, prior_runs(), no_norm)[no_norm[0]]) == 4


def test_a_prior_of_another_or_of_two_batteries_is_refused_unless_the_sweep_varies_that_setting(monkeypatch):
    from deepnorm_exp.errors import ConfigError

    cells = [("norm=post", "depth=6", "seed=0")]
    with pytest.raises(ConfigError, match=r"another battery \(train\.steps: 500 there, 200 here\)"):
        outcomes_of(monkeypatch, prior_runs(), cells, train={"steps": 200})
    with pytest.raises(ConfigError, match=r"another battery \(train\.grad_clip: 1\.0 there, None here\)"):
        outcomes_of(monkeypatch, prior_runs(**{"train.grad_clip": 1.0}), cells)
    two = pd.concat([prior_runs(), prior_runs(**{"train.steps": 2000})], ignore_index=True)
    with pytest.raises(ConfigError, match=r"train\.steps: 2000, 500 there, runs of more than one battery"):
        outcomes_of(monkeypatch, two, cells)
    swept = [("norm=post", "depth=6", "seed=0", f"train.steps={steps}") for steps in (500, 2000)]
    read = outcomes_of(monkeypatch, two, swept)  # the sweep varies it: each cell reads its own budget's runs
    assert [len(read[cell]) for cell in swept] == [4, 4]
