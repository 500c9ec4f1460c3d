"""How long a preset took here, from its records: the sweep log (`sweeps.jsonl`, one line when each
invocation starts and one when it ends) and the runs' summaries (`wall_s`, `finished_at`).

A preset may take several invocations (a sweep stopped and re-run continues where it was). Each invocation
counts from its start to its end line or, for one that was killed, to the last run that finished before the
next invocation began: time spent after that on runs that never finished is redone by the next invocation and
counted there. Worker time is the sum of the runs' `wall_s` (which spans a run's resumes).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from .. import records
from ..sweeps.hydra_callbacks import SWEEP_LOG


@dataclass(frozen=True)
class PresetTime:
    runs: int
    worker_s: float  # sum of the runs' wall_s
    elapsed_s: Optional[float]  # the invocations' wall time together; None where no sweep log exists
    invocations: int
    killed: int  # invocations without an end line (their time ends at their last finished run)
    overrides: tuple[str, ...] = ()  # what the invocations added to `experiment=...`, if anything

    def describe(self) -> str:
        if self.elapsed_s is None:
            return f"{self.runs} runs, {duration(self.worker_s)} of run time (no sweep log: elapsed not recorded)"
        text = f"{duration(self.elapsed_s)} elapsed"
        if self.invocations > 1:
            text += f" over {self.invocations} invocations"
            if self.killed:
                text += f" ({self.killed} stopped and resumed)"
        text += f"; {self.runs} runs, {duration(self.worker_s)} of run time"
        return text + (f" (with {' '.join(f'`{o}`' for o in self.overrides)})" if self.overrides else "")


def duration(seconds: float) -> str:
    """42 s, 5 min 43 s, 2 h 03 min."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _when(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def preset_time(experiment_dir: str | Path, runs: pd.DataFrame) -> PresetTime:
    """`runs`: load_runs(experiment_dir) (the caller has them already)."""
    worker = float(pd.to_numeric(runs.get("wall_s", pd.Series(dtype=float)), errors="coerce").sum())
    log = records.read_jsonl(Path(experiment_dir) / SWEEP_LOG)
    starts = [(_when(line["at"]), i) for i, line in enumerate(log) if line.get("event") == "start"]
    if not starts:
        return PresetTime(len(runs), worker, None, 0, 0)
    finished = sorted(_when(t) for t in runs.get("finished_at", pd.Series(dtype=object)).dropna())
    elapsed, killed = 0.0, 0
    for k, (start, index) in enumerate(starts):
        following = starts[k + 1][1] if k + 1 < len(starts) else len(log)
        ends = [_when(line["at"]) for line in log[index + 1:following] if line.get("event") == "end"]
        if ends:
            end = ends[0]
        else:
            killed += 1
            window_end = starts[k + 1][0] if k + 1 < len(starts) else datetime.datetime.max.replace(
                tzinfo=datetime.timezone.utc)
            inside = [t for t in finished if start <= t < window_end]
            end = inside[-1] if inside else start
        elapsed += (end - start).total_seconds()
    added = dict.fromkeys(o for _, i in starts for o in log[i].get("overrides", []) if not o.startswith("experiment="))
    return PresetTime(len(runs), worker, elapsed, len(starts), killed, tuple(added))
