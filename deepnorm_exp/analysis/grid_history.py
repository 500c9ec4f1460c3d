"""When a study's grid grew, read from its records: the one source of "1e-4 was added after the first 96 runs".

A preset's grid may gain a value after some of its runs (a lower rate where the best rate was the grid's end,
more seeds where the seeds overlapped). The page says which values came later, and when, from what the records
hold: each run's config and start (`started_at`, the run's latest start: a resumed run counts from its resume)
and the sweep log (each invocation's start, commit, command-line overrides and end). An invocation that ended ran
every value of its grid, so a value whose first run started after such an invocation ended, where that invocation
did not narrow the value's axis on its command line (`depth=50`), was not in the preset's grid then: it was added
(or its runs were made again: the records keep a run's latest). It came "after N runs": N of the study's runs had
started before it, in the invocation the page names.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from .. import records
from ..rundir import StudyDir
from .asked import command_line
from .escape import md_code
from .timing import _when, sweeper_setting



@dataclass(frozen=True)
class Added:
    axis: str  # the override's key: train.lr, seed (an axis the runs record under that name)
    value: str  # as the preset writes it (3e-4), else as the runs record it
    after_runs: int  # runs of the study that had started before its first
    commit: str  # the code of the invocation that began it ("" where the log has no commit)
    modified: bool  # that code had uncommitted changes
    day: str  # that invocation's date, YYYY-MM-DD

    def describe(self) -> str:
        code = f" at commit {md_code(self.commit)}" if self.commit else ""
        code += " with uncommitted changes" if self.modified else ""
        return f"{md_code(f'{self.axis}={self.value}')} after {self.after_runs} runs (the sweep of {self.day}{code})"


def swept_axes(study_dir: Path) -> dict[str, list[str]]:
    """The axes of the preset's grid and their values as written (hydra.sweeper.params in multirun.yaml)."""
    try:
        params = sweeper_setting(study_dir, "params", None)
    except (ValueError, OSError):
        return {}
    return {str(key): str(values).split(",") for key, values in params.items()} if isinstance(params, dict) else {}


@dataclass(frozen=True)
class Invocation:
    began: datetime.datetime
    ended: Optional[datetime.datetime]  # None: killed, still running, or a log line without an id
    commit: str  # "" where the log has none
    modified: bool
    narrowed: frozenset[str]  # the axes its command line set


def invocations(study_dir: Path) -> list[Invocation]:
    """The sweep log's invocations, in the order they began (an end line pairs with its start by id); a line
    without a readable time is left out (records are untrusted: never a crash)."""
    try:
        log = [line for line in records.read_jsonl(study_dir / StudyDir.SWEEP_LOG)
               if isinstance(line, dict) and _time(line.get("at")) is not None]
    except OSError:
        return []
    ends = {line.get("id"): _time(line["at"]) for line in log if line.get("event") == "end" and line.get("id")}
    return sorted((Invocation(_time(line["at"]), ends.get(line.get("id")) if line.get("id") else None,
                              str(line.get("commit") or ""), line.get("modified") is True,
                              frozenset(command_line(line)))
                   for line in log if line.get("event") == "start"), key=lambda i: i.began)


def _time(text: object) -> Optional[datetime.datetime]:
    try:
        return _when(text) if isinstance(text, str) else None
    except ValueError:
        return None


def added_values(runs: pd.DataFrame, study_dir: Path) -> list[Added]:
    """Each value of a swept axis that was not in the preset's grid when an earlier invocation ran it whole
    (the module's rule), in the order they came. A run without a start time (killed before its summary) and an
    axis the runs do not record under its key (a config group: model=) are left out."""
    sweeps = invocations(study_dir)
    if runs.empty or "started_at" not in runs or not sweeps:
        return []
    began = runs["started_at"].map(_time)
    runs, began = runs[began.notna()], began[began.notna()]
    added = []
    for axis, written in swept_axes(study_dir).items():
        if axis not in runs:
            continue
        for value, first in began.groupby(runs[axis]).min().items():
            if not any(s.ended is not None and s.ended < first and axis not in s.narrowed for s in sweeps):
                continue
            sweep = max((s for s in sweeps if s.began <= first), key=lambda s: s.began, default=sweeps[0])
            added.append(Added(axis, _as_written(value, written), int((began < first).sum()), sweep.commit,
                               sweep.modified, sweep.began.date().isoformat()))
    return sorted(added, key=lambda a: (a.after_runs, a.axis, a.value))


def _as_written(value: object, written: list[str]) -> str:
    """The preset's own spelling of a value the runs record (3e-4 for 0.0003), else the value's."""
    for text in written:
        try:
            if text.strip() == str(value) or float(text) == float(value):
                return text.strip()
        except (TypeError, ValueError):
            continue
    return f"{value:g}" if isinstance(value, float) else str(value)


def grid_history(runs: pd.DataFrame, study_dir: Path) -> str:
    """The page's line on when the study's grid grew, or "" where every value ran from its first invocation."""
    added = added_values(runs, study_dir)
    if not added:
        return ""
    return ("Values the grid gained after its first runs, or whose runs were made again (from the records: no "
            "run of the value kept began before an earlier invocation of the sweep ended without it; each with the "
            "invocation that began its first): " + "; ".join(a.describe() for a in added) + ".")
