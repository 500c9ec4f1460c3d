"""The study-level W&B dashboards (deepnorm_exp/analysis/dashboard.py): written from a study's committed records,
read back from the offline file, their numbers against an independent reading of the same records; hostile
records written as text, not refused; a study whose runs stop once trained shows no final losses."""

import json
import math
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from deepnorm_exp.analysis.dashboard import every_study_tables, log_study, wandb_frame
from wandb_records import read_run


def logged(tmp_path: Path, study: str) -> tuple[dict, Path]:
    """The study's published records copied under tmp_path/runs, its dashboard written and read back."""
    shutil.copytree(REPO / "runs" / study / "published", tmp_path / "runs" / study / "published")
    directory = log_study(tmp_path / "runs" / study)
    (wandb_file,) = directory.glob("*.wandb")
    return read_run(wandb_file), directory


def table(directory: Path, key: str) -> pd.DataFrame:
    (path,) = directory.glob(f"files/media/table/{key}_*.table.json")
    data = json.loads(path.read_text())
    return pd.DataFrame(data["data"], columns=data["columns"])


def published_runs(study: str) -> list[dict]:
    from deepnorm_exp.analysis.evidence import Evidence

    return Evidence(REPO / "runs").runs(study).to_dict("records")


@pytest.mark.slow
def test_steps_to_train_dashboard_holds_each_schemes_median_at_its_best_rate(tmp_path):
    run, directory = logged(tmp_path, "steps_to_train")
    assert (run["run"].run_group, run["run"].job_type, set(run["run"].tags)) == \
        ("steps_to_train", "study", {"study", "study:steps_to_train"})
    assert {"runs/path", "diagnoses/path", "steps/cells/path", "steps_vs_depth/chart_table/path"} <= run["history_keys"]
    assert not any(key.startswith(("loss_vs_lr", "comparison")) for key in run["history_keys"])  # stopped once trained
    # independently: per cell the ceil(n/2)-th smallest step at which a seed trained, the best the smallest
    cells = defaultdict(list)
    for r in published_runs("steps_to_train"):
        if r["status"] in ("completed", "diverged"):
            cells[r["norm"], int(r["depth"]), float(r["train.lr"])].append(r.get("trained_at_step"))
    best = defaultdict(lambda: math.inf)
    for (norm, depth, _), steps in cells.items():
        trained = sorted(s for s in steps if s is not None and not math.isnan(s))
        need = math.ceil(len(steps) / 2)
        if len(trained) >= need:
            best[norm, depth] = min(best[norm, depth], trained[need - 1])
    chart = table(directory, "steps_vs_depth")
    got = {(n, int(d)): m for n, d, m in chart.itertuples(index=False)}
    assert got == {key: value for key, value in best.items() if math.isfinite(value)} and got
    assert len(table(directory, "runs")) == len(published_runs("steps_to_train"))


@pytest.mark.slow
def test_frontier_dashboard_holds_the_geometric_mean_of_the_seeds_largest_stable_rate(tmp_path):
    run, directory = logged(tmp_path, "frontier_depth")
    assert {"frontier/cells/path", "frontier/law/path", "frontier_vs_depth/chart_table/path"} <= run["history_keys"]
    (frontier_file,) = (REPO / "runs" / "frontier_depth" / "published").rglob("frontier.json")
    found = defaultdict(list)
    for cell in json.loads(frontier_file.read_text())["cells"]:
        if cell.get("max_stable_lr"):
            found[cell["norm"], int(cell["depth"])].append(math.log(cell["max_stable_lr"]))
    chart = table(directory, "frontier_vs_depth")
    got = {(n, int(d)): lr for n, d, lr in chart.itertuples(index=False)}
    assert got.keys() == found.keys()
    for key, logs in found.items():
        assert got[key] == pytest.approx(math.exp(sum(logs) / len(logs)), rel=1e-9)


def hand_runs(**extra) -> pd.DataFrame:
    rows = [{"run_name": f"{norm}-L{depth}-s{seed}", "norm": norm, "depth": depth, "seed": seed, "train.lr": 1e-3,
             "status": "completed", "eval_loss": loss, "initial_eval_loss": 5.0, "trained": True, **extra}
            for norm, depth, seed, loss in [("pre", 6, 0, 3.0), ("pre", 6, 1, 3.2), ("pre", 24, 0, 2.9), ("post", 6, 0, 3.1),
                                            ("post", 24, 0, 4.5)]]
    return pd.DataFrame(rows)


def test_one_rate_study_gets_its_comparison_and_the_loss_against_depth():
    tables = every_study_tables(hand_runs())
    assert {"runs", "comparison", "loss_vs_depth"} <= tables.keys() and not any(k.startswith("loss_vs_lr") for k in tables)
    chart = tables["loss_vs_depth"]
    assert chart.attrs["chart"][:2] == ("depth", "eval_loss")
    assert dict(zip(zip(chart["norm"], chart["depth"]), chart["eval_loss"])) == pytest.approx(
        {("post", 6): 3.1, ("post", 24): 4.5, ("pre", 6): 3.1, ("pre", 24): 2.9})


def test_rate_grid_gets_loss_against_rate_and_runs_stopped_once_trained_get_no_final_losses():
    grid = pd.concat([hand_runs(), hand_runs().assign(**{"train.lr": 3e-3})], ignore_index=True)
    tables = every_study_tables(grid)
    assert {"loss_vs_lr/L6", "loss_vs_lr/L24"} <= tables.keys() and "comparison" not in tables
    stopped = every_study_tables(grid.assign(**{"train.stop_when_trained": True}))
    assert set(stopped) == {"runs", "diagnoses"} or set(stopped) == {"runs"}


def test_hostile_records_go_to_the_table_as_text():
    frame = pd.DataFrame({"norm": ["<script>alert(1)</script>", None], "eval_loss": [3.0, "not a number"],
                          "depth": [6, 24], "trained": [True, False], "loss": [np.nan, np.inf]})
    out = wandb_frame(frame)
    assert out["norm"].tolist() == ["<script>alert(1)</script>", ""] and out["eval_loss"].tolist() == ["3.0", "not a number"]
    assert out["depth"].tolist() == [6.0, 24.0] and out["trained"].tolist() == ["True", "False"]
    import wandb

    wandb.Table(dataframe=out)  # W&B's type check accepts every column
    odd = wandb_frame(pd.DataFrame({"flag": pd.array([True, None], dtype="boolean"), "cell": [np.zeros(2), None]}))
    assert odd["flag"].tolist() == ["True", ""] and odd["cell"].tolist() == ["[0. 0.]", ""]  # pd.NA raised


def test_a_bisections_probes_and_runs_of_two_batteries_get_no_rate_or_loss_views():
    grid = pd.concat([hand_runs(), hand_runs().assign(**{"train.lr": 3e-3})], ignore_index=True)
    assert set(every_study_tables(grid, bisection=True)) <= {"runs", "diagnoses"}
    two = pd.concat([hand_runs(), hand_runs().assign(**{"train.steps": 2000, "run_name": "other"})], ignore_index=True)
    assert set(every_study_tables(two.assign(**{"train.steps": two["train.steps"].fillna(500)}))) <= {"runs", "diagnoses"}


def test_the_runs_table_holds_the_settings_the_runs_differ_in():
    runs = hand_runs().assign(**{"train.weight_decay": [0.0, 0.1, 0.0, 0.1, 0.0], "train.steps": 300,
                                 "norm.constants": ["a", "a", "a", "b", "b"]})
    table = every_study_tables(runs)["runs"]
    assert "train.weight_decay" in table and "train.steps" not in table and "norm.constants" not in table


@pytest.mark.slow
def test_the_mitigation_studys_dashboard_holds_its_verdicts(tmp_path):
    run, directory = logged(tmp_path, "mitigation_study")
    assert {"mitigations/path", "runs/path"} <= run["history_keys"]
    from deepnorm_exp.analysis.evidence import Evidence
    from deepnorm_exp.analysis.mitigations import mitigation_table

    expected = mitigation_table(Evidence(REPO / "runs").runs("mitigation_study"))
    logged_table = table(directory, "mitigations")
    assert logged_table["verdict"].tolist() == expected["verdict"].tolist() and len(expected) == 15
    assert {"model.qk_norm", "train.z_loss"} <= set(table(directory, "runs").columns)


def test_all_studies_skip_one_with_no_ended_run_and_go_on(tmp_path, capsys):
    from deepnorm_exp.analysis.dashboard import main

    shutil.copytree(REPO / "runs" / "frontier_depth" / "published", tmp_path / "runs" / "frontier_depth" / "published")
    unfinished = tmp_path / "runs" / "steps_to_train" / "post-L6-s0"  # a sweep under way: a run with a config only
    unfinished.mkdir(parents=True)
    (unfinished / "config.yaml").write_text(
        "experiment_name: steps_to_train\nnorm: {name: post}\ndepth: 6\nseed: 0\n")
    main(["--all", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert "steps_to_train: no run has ended yet, skipped" in out and "frontier_depth/wandb" in out


def test_the_command_without_a_study_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "deepnorm_exp.analysis.dashboard"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("name runs/<study> or --all runs")
