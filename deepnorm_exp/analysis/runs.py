"""Run records -> pandas DataFrames. Reads only the local files a run writes (never W&B's servers).

A root is any directory above run directories: `runs/`, `runs/<experiment>/`, or one run's directory.
A run directory is one holding `summary.json` or `config.yaml` (written when the run starts). A run being
trained now (its lock held) is listed with status "running", whatever an earlier attempt's summary says; one
with a config and no summary that nothing is training is "unfinished" (killed before its first summary).
Records are decoded by `records.py` (a NaN loss is a float NaN); a damaged file is named in a warning and
skipped (a damaged line of a JSON-lines file, alone), never allowed to stop the analysis of the others.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional
import pandas as pd

from .. import records
from ..errors import first_line
from ..lifecycle.schema import REQUIRED, config_problem
from ..lifecycle.diagnosis import RULES_VERSION, diagnose_run_dir
from ..lifecycle.summary import FINAL, has_ended, summary_of
from ..rundir import RunDir, StudyDir

log = logging.getLogger("deepnorm_exp")

RUN_KEYS = ("experiment", "run_name", "norm", "depth", "seed")  # carried onto every per-step or per-layer row


def run_dirs(root: str | Path) -> list[Path]:
    root = Path(root)
    if RunDir(root).is_run():
        return [root]
    found = sorted({p.parent for marker in RunDir.MARKERS for p in root.rglob(marker)})
    return [d for d in found if not any(part.startswith(".") for part in d.relative_to(root).parts)]


def _flat(prefix: str, tree: dict) -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(_flat(f"{name}.", value) if isinstance(value, dict) else {name: value})
    return out


def load_runs(root: str | Path) -> pd.DataFrame:
    """One row per run: every `summary.json` field (per-stack constants as `residual_multiplier.decoder`, ...; `alpha.decoder` in records from before the names by role), then the
    run's whole config flattened to dotted columns (`train.lr`, `model.d_model`, ...), and `run_dir`."""
    rows = []
    for run_dir in run_dirs(root):
        records_ = run_records(run_dir)
        if records_ is None:
            continue
        summary, config = records_
        running = RunDir(run_dir).held_elsewhere()
        if needs_diagnosis(summary) and not running:
            summary = {**summary, "diagnosis": diagnose_run_dir(run_dir, summary)}
        row = run_row(summary, config, run_dir)
        if running:
            row["status"] = "running"
        rows.append(row)
    return pd.DataFrame(rows)


def needs_diagnosis(summary: dict) -> bool:
    """A run that ended before runs wrote a diagnosis, or whose diagnosis older rules made (its `rules` below
    diagnosis.RULES_VERSION): analysis makes it from the same records, so every run that ended has one by
    today's rules."""
    diagnosis = summary.get("diagnosis")
    return has_ended(summary) and (not isinstance(diagnosis, dict) or diagnosis.get("rules", 1) < RULES_VERSION)


def run_records(run_dir: Path) -> Optional[tuple[dict, dict]]:
    """(summary, config) of a run directory ({} for one it lacks), or None where neither is readable or a
    field the analysis reads has the wrong type (lifecycle/schema.py; the warning names the file and field)."""
    files = RunDir(run_dir)
    summary = summary_of(run_dir, REQUIRED) if files.summary.is_file() else {}
    if summary is None:
        return None  # damaged: read_summary named it
    config = _config(files.config)
    if not summary and not config:
        return None  # neither record readable: nothing to list it by (the warning named the file)
    if why := config_problem(config):
        log.warning("%s is damaged and its run was left out (%s)", files.config, why)
        return None
    return summary, config


def run_row(summary: dict, config: dict, run_dir: Path) -> dict:
    """load_runs' row of one run: its summary's fields, then its config's, flattened, and `run_dir`."""
    row = _flat("", summary) if summary else _from_config(config, run_dir)
    for key, value in _flat("", config).items():
        row.setdefault(key, value)  # summary fields win: depth, seed are the same in both
    row["run_dir"] = str(run_dir)
    return row


def _from_config(config: dict, run_dir: Path) -> dict:
    """The run keys of a run that has no summary yet, from its config."""
    return {"experiment": config.get("experiment_name"), "run_name": run_dir.name,
            "norm": (config.get("norm") or {}).get("name"), "depth": config.get("depth"), "seed": config.get("seed"),
            "status": "unfinished"}


def config_column(runs: pd.DataFrame, key: str) -> pd.Series:
    """A config value of every run (`model.d_model`), NaN for a run whose config.yaml was unreadable (the
    column is missing altogether when no run's was readable)."""
    return runs[key] if key in runs else pd.Series(float("nan"), index=runs.index, dtype=float)


def config_by_run(runs: pd.DataFrame, key: str) -> pd.Series:
    """run_name -> a config value of each run, as numbers (NaN where a run's config lacks it)."""
    return pd.Series(pd.to_numeric(config_column(runs, key), errors="coerce").to_numpy(),
                     index=runs["run_name"].to_numpy())


def _config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        config = records.read_yaml(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:  # damaged, too large, aliases: never expanded
        log.warning("%s is damaged; its run is listed without its config (%s: %s)", path, type(e).__name__,
                    first_line(e))
        return {}
    return config if isinstance(config, dict) else {}


def _per_run(runs: pd.DataFrame, read) -> pd.DataFrame:
    frames = []
    for _, run in runs.iterrows():
        frame = read(Path(run["run_dir"]))
        if len(frame):
            frames.append(frame.assign(**{key: run[key] for key in RUN_KEYS if key in run}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*RUN_KEYS, "step"])


def read_jsonl(path: Path) -> pd.DataFrame:
    """A JSON-lines record file as a DataFrame ("nan"/"inf" read back as floats; damaged lines skipped)."""
    return pd.DataFrame(records.read_jsonl(path))


def load_scalars(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's `metrics.jsonl`, one row per logged step, with the run's keys (RUN_KEYS) as columns."""
    return _per_run(runs, lambda d: read_jsonl(RunDir(d).metrics))


def load_events(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's `events.jsonl` (divergence events), with the run's keys."""
    return _per_run(runs, lambda d: read_jsonl(RunDir(d).events))


def load_layer_records(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's per-layer vectors (`layers/*.parquet`): one row per (step, residual block), run keys added."""
    from ..sinks.layers import load_layers

    return _per_run(runs, load_layers)


def load_frontier(root: str | Path) -> pd.DataFrame:
    """The cells of every `frontier.json` under `root` (hydra/sweeper=frontier), one row per cell."""
    rows = []
    for path in sorted(Path(root).rglob(StudyDir.FRONTIER)):
        if StudyDir.PUBLISHED in path.relative_to(root).parts[:-1]:
            continue  # a copy packed for publication (analysis/published.py), not another sweep
        report = records.read_json(path)
        if not isinstance(report, dict) or "cells" not in report:
            continue
        for cell in report["cells"]:
            rows.append({**cell, "sweep_dir": str(path.parent), "runs_spent": report["runs_spent"],
                         "grid_runs": report["grid_runs"], "lr_min": report["lr_min"], "lr_max": report["lr_max"]})
    return pd.DataFrame(rows)


def is_missing(value: Any) -> bool:
    """None, NaN, NaT or pd.NA (a record's cell may hold any of them); a list or array is a value."""
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def outcomes(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that ended (completed or diverged): what tables, figures and claims read. A run that failed (a
    crash) or is unfinished (stopped, still running) has no final loss and says nothing about stability."""
    return runs[runs["status"].isin(FINAL)] if "status" in runs else runs


def at_one_lr(runs: pd.DataFrame, lr_key: str = "train.lr") -> tuple[pd.DataFrame, Optional[float]]:
    """The runs at the most common learning rate (with the rate), where a sweep has several: curves and
    per-layer profiles averaged over seeds should not mix learning rates."""
    if runs.empty or lr_key not in runs or runs[lr_key].nunique() <= 1:
        return runs, None
    lr = runs[lr_key].mode().iloc[0]
    return runs[runs[lr_key] == lr], float(lr)
