"""When a study's grid grew, from its records (analysis/grid_history.py), on hand-made sweep logs."""

import json

import pandas as pd
import yaml

from deepnorm_exp.analysis.grid_history import added_values, grid_history


def study(tmp_path, invocations: list[dict], runs: list[tuple[str, float, int]]) -> pd.DataFrame:
    """A study directory with `invocations` (start, end or None, overrides, commit) in its sweep log, a grid of
    rates and seeds in multirun.yaml, and the runs (started_at, train.lr, seed) as the records load them."""
    lines = []
    for i, inv in enumerate(invocations):
        lines.append({"at": inv["start"], "event": "start", "id": str(i), "overrides": inv.get("overrides", []),
                      "commit": inv.get("commit", "abcdef123456")})
        if inv.get("end"):
            lines.append({"at": inv["end"], "event": "end", "id": str(i)})
    lines.sort(key=lambda line: line["at"])
    (tmp_path / "sweeps.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    params = {"train.lr": "1e-4,1e-3", "seed": "0,1"}
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"params": params}}}))
    return pd.DataFrame(runs, columns=["started_at", "train.lr", "seed"])


def at(hour: int, minute: int = 0) -> str:
    return f"2026-12-07T{hour:02d}:{minute:02d}:00+00:00"


def test_a_rate_first_run_after_an_invocation_ended_without_it_was_added(tmp_path):
    runs = study(tmp_path, [{"start": at(1), "end": at(2)}, {"start": at(3), "commit": "0123456789ab"}],
                 [(at(1, 1), 1e-3, 0), (at(1, 2), 1e-3, 1), (at(3, 1), 1e-3, 0), (at(3, 2), 1e-4, 0),
                  (at(3, 3), 1e-4, 1)])
    added = added_values(runs, tmp_path)
    assert [(a.axis, a.value, a.after_runs, a.commit, a.day) for a in added] == [
        ("train.lr", "1e-4", 3, "0123456789ab", "2026-12-07")]  # the value as the preset writes it
    assert "<code>train.lr=1e-4</code> after 3 runs (the sweep of 2026-12-07 at commit <code>0123456789ab</code>)" \
        in grid_history(runs, tmp_path)


def test_a_value_first_run_after_a_stopped_invocation_is_the_same_grid_continued(tmp_path):
    """The first invocation was killed (no end line) before it reached 1e-4: the grid did not grow."""
    runs = study(tmp_path, [{"start": at(1)}, {"start": at(3), "end": at(4)}],
                 [(at(1, 1), 1e-3, 0), (at(3, 1), 1e-3, 1), (at(3, 2), 1e-4, 0), (at(3, 3), 1e-4, 1)])
    assert added_values(runs, tmp_path) == [] and grid_history(runs, tmp_path) == ""


def test_an_invocation_that_narrowed_the_axis_on_its_command_line_says_nothing_of_the_grid(tmp_path):
    runs = study(tmp_path, [{"start": at(1), "end": at(2), "overrides": ["train.lr=1e-3", "threads=1"]},
                            {"start": at(3), "end": at(4)}],
                 [(at(1, 1), 1e-3, 0), (at(1, 2), 1e-3, 1), (at(3, 2), 1e-4, 0), (at(3, 3), 1e-4, 1)])
    assert added_values(runs, tmp_path) == []


def test_seeds_added_later_are_named_and_values_of_the_first_invocation_never(tmp_path):
    runs = study(tmp_path, [{"start": at(1), "end": at(2)}, {"start": at(5), "end": at(6)}],
                 [(at(1, 1), 1e-3, 0), (at(1, 2), 1e-4, 0), (at(5, 1), 1e-3, 1), (at(5, 2), 1e-4, 1)])
    assert [(a.axis, a.value, a.after_runs) for a in added_values(runs, tmp_path)] == [("seed", "1", 2)]


def test_no_sweep_log_or_no_runs_says_nothing(tmp_path):
    assert grid_history(pd.DataFrame(), tmp_path) == ""
    runs = pd.DataFrame([(at(1), 1e-3, 0)], columns=["started_at", "train.lr", "seed"])
    assert grid_history(runs, tmp_path) == ""


def test_overrides_that_are_not_a_list_narrow_nothing(tmp_path):
    """A raw sweep log is the harness's own, but never a crash: overrides of another type are no command line."""
    runs = study(tmp_path, [{"start": at(1), "end": at(2), "overrides": 7}, {"start": at(3), "end": at(4)}],
                 [(at(1, 1), 1e-3, 0), (at(1, 2), 1e-3, 1), (at(3, 2), 1e-4, 0), (at(3, 3), 1e-4, 1)])
    assert [(a.value, a.after_runs) for a in added_values(runs, tmp_path)] == [("1e-4", 2)]


def test_a_run_without_a_start_and_a_log_line_without_a_time_are_left_out_and_modified_code_is_said(tmp_path):
    """A run killed before its summary has no start time; a published log line may lack one: neither crashes."""
    runs = study(tmp_path, [{"start": at(1), "end": at(2)}, {"start": at(3), "end": at(4)}],
                 [(at(1, 1), 1e-3, 0), (at(1, 2), 1e-3, 1), (None, 1e-4, 1), (at(3, 2), 1e-4, 0)])
    log = tmp_path / "sweeps.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lines[2]["modified"] = True  # the second invocation ran uncommitted code
    lines += [{"event": "start", "id": "x"}, {"at": None, "event": "end", "id": "0"}, {"at": "not a time"}, [1]]
    log.write_text("\n".join(map(json.dumps, lines)) + "\n")
    assert "(the sweep of 2026-12-07 at commit <code>abcdef123456</code> with uncommitted changes)" \
        in grid_history(runs, tmp_path)
