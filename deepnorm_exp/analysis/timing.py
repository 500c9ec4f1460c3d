"""How long a preset took here, from its records: the sweep log (`sweeps.jsonl`, one line when each
invocation starts and one when it ends) and the runs' summaries (`wall_s`, `finished_at`).

A preset may take several invocations (a sweep stopped and re-run continues where it was). Each invocation
counts from its start to its end line or, for one that was killed, to the last run that finished before the
next invocation began: time spent after that on runs that never finished is redone by the next invocation and
counted there. Worker time is the sum of the runs' `wall_s` (which spans a run's resumes).
"""

from __future__ import annotations

import datetime
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from .. import records
from ..config import CONF_DIR
from .escape import md_code, md_text
from ..rundir import StudyDir
from ..lifecycle.summary import FINAL


FINAL_OR_FAILED = (*FINAL, "failed")  # a failure stays one when re-run


@dataclass(frozen=True)
class PresetTime:
    runs: int
    worker_s: float  # sum of the runs' wall_s
    elapsed_s: Optional[float]  # the invocations' wall time together; None where no sweep log exists
    invocations: int
    open: int  # invocations without an end line: killed, or still running (their time ends at their last run)
    overrides: tuple[str, ...] = ()  # what the invocations added to `experiment=...`, if anything
    launchers: tuple[str, ...] = ()  # "JoblibLauncher x 2", ...
    devices: tuple[str, ...] = ()  # the runs' devices (summary.device), said where one is not the CPU

    def describe(self) -> str:
        if self.elapsed_s is None:
            return f"{self.runs} runs, {duration(self.worker_s)} of run time (no sweep log: elapsed not recorded)"
        text = f"{duration(self.elapsed_s)} elapsed"
        if self.invocations > 1:
            text += f" over {self.invocations} invocations"
        if self.open:
            text += f" ({self.open} stopped or still running: counted to {'its' if self.open == 1 else 'their'} last finished run)"
        text += f"; {self.runs} runs, {duration(self.worker_s)} of run time"
        if self.launchers:  # from the sweep log: escaped (Markdown, as every page shows it)
            text += f"; {md_text(', '.join(self.launchers))}"
        text += f" (with {' '.join(map(md_code, self.overrides))})" if self.overrides else ""
        return text + (f"; run on {md_text(', '.join(self.devices))}" if set(self.devices) - {"cpu"} else "")


def duration(seconds: float) -> str:
    """42 s, 5 min 43 s, 2 h 03 min."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _when(text: str) -> datetime.datetime:
    when = datetime.datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)  # the records write UTC


def _union_seconds(intervals: list[tuple[datetime.datetime, datetime.datetime]]) -> float:
    """Seconds covered by the intervals together (two sweeps at once count once)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is not None and start < reach:
            start = reach
        if end > start:
            total += (end - start).total_seconds()
            reach = end
    return total


CHECKED_GRID = "CheckedSweeper"  # the basic sweeper's grid behind the pre-flight (the frontier's bisection is not one)
GRIDS = (CHECKED_GRID, "BasicSweeper")  # a preset composed outside the app names Hydra's; a sweep runs it checked


def sweeper_setting(study: Path, key: str, default):
    """A setting of the sweeper that ran `study`, from the multirun.yaml Hydra leaves in the sweep directory
    (read as plain YAML: a record is never interpolated)."""
    path = study / StudyDir.MULTIRUN
    if not path.exists():
        return default
    node = records.read_yaml(path)
    for part in ("hydra", "sweeper", key):
        node = node.get(part, default) if isinstance(node, dict) else default
    return node


def grid_size(experiment_dir: str | Path, preset: Optional[dict] = None) -> Optional[int]:
    """How many jobs the preset's grid holds: the larger of the sweep's multirun.yaml (hydra.sweeper.params as
    the preset set them when it last ran: a command line that narrows an axis, `depth=18,6`, leaves them and
    changes only hydra.overrides) and `preset`, the preset's sweeper as the checkout composes it now (a grid
    that gained rates after its last sweep, before their runs, has not finished: `preset_sweeper`). None where
    the sweeper is not the checked grid, an axis is not a plain comma list (range(), choice()), or neither
    can be read (the pack refuses a damaged record)."""
    try:
        recorded = {key: sweeper_setting(Path(experiment_dir), key, None) for key in ("_target_", "params")}
    except (ValueError, OSError):
        recorded = {}
    sizes = [size for sweeper in (recorded, preset or {}) if (size := _grid(sweeper)) is not None]
    return max(sizes, default=None)


def _grid(sweeper: dict) -> Optional[int]:
    target, params = sweeper.get("_target_"), sweeper.get("params")
    if not str(target).endswith(GRIDS) or not isinstance(params, dict):
        return None
    axes = [str(values) for values in params.values()]
    if any("(" in values for values in axes):
        return None
    return math.prod(len(values.split(",")) for values in axes)


@functools.lru_cache(maxsize=None)
def preset_sweeper(name: str) -> Optional[dict]:
    """conf/experiment/<name>.yaml's hydra.sweeper as the checkout composes it now; None where no such preset
    (a study directory named after none) or it does not compose."""
    if not (CONF_DIR / "experiment" / f"{name}.yaml").is_file():
        return None
    from omegaconf import OmegaConf

    from ..compose import compose_with_hydra
    from ..errors import ConfigError
    try:
        cfg = compose_with_hydra([f"experiment={name}"])
    except ConfigError:
        return None
    return OmegaConf.to_container(cfg.hydra.sweeper, resolve=False)


def sweep_settled(experiment_dir: str | Path, runs: pd.DataFrame) -> bool:
    """Nothing of the experiment is running or was left stopped: every run is final (completed, diverged, or
    failed: a failure stays one when re-run) and the latest sweep invocation wrote its end line; an invocation
    may have narrowed the preset's grid (`sweep_finished` asks for the whole grid). Runs made without -m (no
    sweep log) are settled when final. Not seen: a sweep still running while a later one into the same
    directory has ended (its unfinished runs have no summary yet)."""
    if runs.empty or not runs["status"].isin(FINAL_OR_FAILED).all():
        return False
    log = [line for line in records.read_jsonl(Path(experiment_dir) / StudyDir.SWEEP_LOG) if "event" in line]
    starts = [line for line in log if line["event"] == "start"]
    if not starts:
        return True
    last = starts[-1]
    after = log[log.index(last) + 1:]
    # lines written before invocations had ids pair by position: None == None
    return any(line["event"] == "end" and line.get("id") == last.get("id") for line in after)


def sweep_finished(experiment_dir: str | Path, runs: pd.DataFrame, preset: Optional[dict] = None) -> bool:
    """The experiment's runs are the whole of what it was asked: settled (`sweep_settled`), and as many as the
    preset's grid holds (`grid_size`, where it can be read), so a sweep narrowed on the command line
    (`depth=18,6`) has not finished its preset."""
    grid = grid_size(experiment_dir, preset)
    return sweep_settled(experiment_dir, runs) and (grid is None or len(runs) >= grid)


def preset_time(experiment_dir: str | Path, runs: pd.DataFrame) -> PresetTime:
    """`runs`: load_runs(experiment_dir) (the caller has them already)."""
    worker = float(pd.to_numeric(runs.get("wall_s", pd.Series(dtype=float)), errors="coerce").sum())
    log = [line for line in records.read_jsonl(Path(experiment_dir) / StudyDir.SWEEP_LOG) if "at" in line]
    starts = [(i, line) for i, line in enumerate(log) if line.get("event") == "start"]
    if not starts:
        return PresetTime(len(runs), worker, None, 0, 0)
    finished = sorted(_when(t) for t in runs.get("finished_at", pd.Series(dtype=object)).dropna())
    intervals, still_open = [], 0
    for k, (index, line) in enumerate(starts):
        start = _when(line["at"])
        following = starts[k + 1][0] if k + 1 < len(starts) else len(log)
        if line.get("id"):  # paired by id: sweeps into one experiment may overlap
            ends = [_when(e["at"]) for e in log[index + 1:] if e.get("event") == "end" and e.get("id") == line["id"]]
        else:  # lines written before ids: the end before the next start
            ends = [_when(e["at"]) for e in log[index + 1:following] if e.get("event") == "end"]
        if ends:
            intervals.append((start, ends[0]))
            continue
        still_open += 1
        window_end = _when(log[following]["at"]) if following < len(log) else datetime.datetime.max.replace(
            tzinfo=datetime.timezone.utc)
        inside = [t for t in finished if start <= t < window_end]
        intervals.append((start, inside[-1] if inside else start))
    lines = [line for _, line in starts]
    added = dict.fromkeys(o for line in lines for o in line.get("overrides", []) if not o.startswith("experiment="))
    launchers = dict.fromkeys(f"{line['launcher']} x {line['workers']}" if line.get("workers") else line["launcher"]
                              for line in lines if line.get("launcher"))
    devices = tuple(sorted(runs["device"].dropna().astype(str).unique())) if "device" in runs else ()
    return PresetTime(len(runs), worker, _union_seconds(intervals), len(starts), still_open, tuple(added),
                      tuple(launchers), devices)
