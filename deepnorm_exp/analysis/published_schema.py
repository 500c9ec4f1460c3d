"""What a study's published records (`runs/<study>/published/`) may hold, checked when they are loaded.

The records are committed, so anyone can change them in a pull request, and the results page is built
from them. The manifest's checksums catch damage, not intent: a forged file comes with a forged checksum.
So every file is held to what `pack` writes, before anything reads it whole:

* each table's row count and decoded size are read from its Parquet footer and bounded (`MAX_ROWS`,
  `MAX_DECODED_BYTES`: 16x and 65x the largest table published so far), so a small file cannot decode into
  gigabytes;
* `runs.parquet`: one row per run, run names unique and single path components (`schema.NAME`), each
  summary and config of the types and ranges `lifecycle/schema.py` gives, each summary of its own run;
* the per-step tables: rows only of the listed runs, integer steps, text columns holding text (a scheme's
  column, its name);
* the sweep log: the manifest's `commands` and `commits` are exactly what its start lines give (the log is
  under the checksums, so the manifest's copy cannot differ from it unnoticed), commits are hexadecimal;
* `frontier.json` and `multirun.yaml` of the shapes the sweeper writes (the YAML read plain, never
  interpolated).

`check` raises ValueError naming the file, the row and the field; published.py says it as one line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd

from .. import records
from ..lifecycle.schema import (NAME, config_problem, fields_problem, integer, list_of, name_problem, number, summary_problem,
                                text_problem, timestamp_problem)

MAX_ROWS = 2_000_000  # the largest table published so far: 126,000 rows (model_update_1000l's layers)
MAX_DECODED_BYTES = 256 * 2**20  # the largest so far: 3.9 MB decoded
RUNS_COLUMNS = ["run_name", "summary", "config"]
COMMIT = re.compile(r"[0-9a-f]{7,64}")


def table_size_problem(path: Path) -> Optional[str]:
    """Why the Parquet file at `path` is too large to read whole, from its footer alone, or None."""
    return records.parquet_size_problem(path, MAX_ROWS, MAX_DECODED_BYTES)


def runs_problem(runs: pd.DataFrame) -> Optional[str]:
    """Why `runs.parquet`'s frame is not one row per run as pack writes it, or None."""
    if list(runs.columns) != RUNS_COLUMNS:
        return f"columns {list(runs.columns)}, not {RUNS_COLUMNS}"
    seen = set()
    for number, row in enumerate(runs.itertuples(index=False)):
        where = f"row {number} (run {str(row.run_name)[:60]!r})"
        if why := name_problem(row.run_name):
            return f"{where}: run_name is {why}"
        if row.run_name in seen:
            return f"{where}: run_name appears twice"
        seen.add(row.run_name)
        if why := _run_records_problem(row.run_name, row.summary, row.config):
            return f"{where}: {why}"
    return None


def _run_records_problem(run_name: str, summary_text: Any, config_text: Any) -> Optional[str]:
    try:
        summary, config = records.loads(summary_text), records.loads(config_text)
    except (TypeError, ValueError, RecursionError) as e:
        return f"not JSON ({type(e).__name__})"
    if summary != {}:  # a run that left no summary was packed with {}
        if why := summary_problem(summary):
            return f"summary: {why}"
        if summary["run_name"] != run_name:
            return f"summary: run_name is {str(summary['run_name'])[:60]!r}, another run's"
    return f"config: {why}" if (why := config_problem(config)) else None


def steps_problem(frame: pd.DataFrame, run_names: set) -> Optional[str]:
    """Why a per-step table (scalars, layers, events) is not one `pack` writes for these runs, or None."""
    if frame.empty:
        return None
    for column in ("run_name", "step"):
        if column not in frame:
            return f"no {column} column"
    if not pd.api.types.is_integer_dtype(frame["step"]):
        return f"step is {frame['step'].dtype}, not integers"
    strangers = ~frame["run_name"].isin(run_names)
    if strangers.any():
        return f"row {int(strangers.argmax())}: run {str(frame['run_name'][strangers].iloc[0])[:60]!r} is not in runs.parquet"
    for column in frame.columns:
        if pd.api.types.is_numeric_dtype(frame[column]) or pd.api.types.is_bool_dtype(frame[column]):
            continue
        check = name_problem if column == "norm" else text_problem  # a scheme's name; else text (an event's reason)
        bad = next((v for v in frame[column].dropna().unique() if check(v)), None)  # each value once
        if bad is not None:
            return f"row {int(frame[column].eq(bad).argmax())}: {column} is {check(bad)}"
    return None


_START = {"at": timestamp_problem, "event": name_problem, "id": name_problem, "overrides": list_of(text_problem), "launcher": name_problem,
          "sweeper": name_problem, "workers": integer(-1), "commit": lambda v: None if COMMIT.fullmatch(str(v)) else
          f"{str(v)[:40]!r}, not a commit"}


def sweep_log_problem(lines: list[dict]) -> Optional[str]:
    return next((f"line {i + 1}: {why}" for i, line in enumerate(lines) if (why := fields_problem(line, _START))), None)


def provenance_problem(manifest: dict, commands: list[str], commits: list[dict]) -> Optional[str]:
    """Why the manifest's commands and commits are not those of its sweep log (`commands`, `commits`: what
    pack derives from it), or None. A commit stated when packing (a log from before commits were logged) is
    the one entry the log cannot give: it must be a commit's hexadecimal name."""
    if manifest.get("commands", []) != commands:
        return "its commands are not those of its sweep log"
    stated = [c for c in manifest.get("commits", []) if isinstance(c, dict) and c not in commits]
    if [c for c in manifest.get("commits", []) if c not in stated] != commits:
        return "its commits are not those of its sweep log"
    bad = next((c for c in stated if not str(c.get("source", "")).startswith("stated")
                or not COMMIT.fullmatch(str(c.get("commit")))), None)
    return f"its commit entry {str(bad)[:80]} is neither in its sweep log nor a stated commit" if bad else None


_PROBE = {"lr": number(0.0), "stable": lambda v: None if isinstance(v, bool) else "not true or false"}
_CELL = {"norm": name_problem, "depth": lambda v: name_problem(str(v)), "seed": lambda v: name_problem(str(v)),
         "experiment": text_problem, "overrides": list_of(text_problem), "max_stable_lr": number(0.0),
         "min_unstable_lr": number(0.0), "runs": integer(), "error": text_problem,
         "probes": list_of(lambda p: fields_problem(p, _PROBE) if isinstance(p, dict) else "not a probe")}
_FRONTIER = {"key": text_problem, "lr_min": number(0.0), "lr_max": number(0.0), "resolution": number(0.0),
             "stable_if": name_problem, "runs_spent": integer(), "grid_runs": integer(),
             "cells": list_of(lambda c: fields_problem(c, _CELL, ("norm", "depth")) if isinstance(c, dict) else "not a cell")}


def frontier_problem(report: Any) -> Optional[str]:
    if not isinstance(report, dict):
        return "not a frontier report"
    return fields_problem(report, _FRONTIER, ("cells", "runs_spent", "grid_runs", "lr_min", "lr_max"))


def first_problem(checks: list[tuple[str, Callable[[], Optional[str]]]]) -> Optional[str]:
    """"<file>: <why>" of the first check that finds one, in order (a later check may rely on an earlier)."""
    return next((f"{name}: {why}" for name, check in checks if (why := check())), None)
