"""The records a results page reads, per study: its published records where it has them, else its raw runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd

from .frontier_law import fit_frontier_law
from .published import Published, load as load_published
from .runs import at_one_lr, load_frontier, load_layer_records, load_runs, load_scalars
from .escape import md_text
from .timing import FINAL_OR_FAILED, grid_size, preset_sweeper, sweep_finished, sweep_settled
from ..lifecycle.summary import load_summaries


class Evidence:
    """The records of each study, each kind loaded once: its published records (`runs/<study>/published/`,
    published.py) where it has them, else its raw run directories (`runs/<study>/`); `presets`, each study's
    preset's sweeper as the checkout holds it now (whether its grid is done: `timing.grid_size`)."""

    def __init__(self, root: str | Path, presets: Callable[[str], Optional[dict]] = preset_sweeper):
        self.root, self._cache, self.presets = Path(root), {}, presets

    def _get(self, kind: str, study: str, load: Callable[[], Any]) -> Any:
        if (kind, study) not in self._cache:
            self._cache[kind, study] = load()
        return self._cache[kind, study]

    def published(self, study: str) -> Optional[Published]:
        return self._get("published", study, lambda: load_published(self.root / study))

    def study_dir(self, study: str) -> Path:
        """Where the study's sweep files (sweeps.jsonl, multirun.yaml, frontier.json) are read."""
        published = self.published(study)
        return published.directory if published else self.root / study

    def runs(self, study: str) -> pd.DataFrame:
        path, published = self.root / study, self.published(study)
        return self._get("runs", study, lambda: published.runs() if published else
                         load_runs(path) if path.is_dir() else pd.DataFrame())

    def summaries(self, study: str) -> tuple[list[dict], list[Path]]:
        """Every run's summary, and the summary files that could not be read (`load_summaries`)."""
        published = self.published(study)
        return published.summaries() if published else load_summaries(self.root / study)

    def at_one_lr(self, study: str) -> pd.DataFrame:
        return at_one_lr(self.runs(study))[0]

    def _series(self, kind: str, study: str, load_raw: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
        published = self.published(study)
        return self._get(kind, study, lambda: published.of_runs(kind, self.at_one_lr(study)) if published
                         else load_raw(self.at_one_lr(study)))

    def scalars(self, study: str) -> pd.DataFrame:
        return self._series("scalars", study, load_scalars)

    def every_runs_scalars(self, study: str) -> pd.DataFrame:
        """The scalar series of every run, whatever its learning rate (a study whose cells run at their own)."""
        published = self.published(study)
        return self._get("every_runs_scalars", study, lambda: published.of_runs("scalars", self.runs(study))
                         if published else load_scalars(self.runs(study)))

    def layers(self, study: str) -> pd.DataFrame:
        return self._series("layers", study, load_layer_records)

    def frontier(self, study: str) -> pd.DataFrame:
        return self._get("frontier", study, lambda: load_frontier(self.study_dir(study)))

    def frontier_law(self, study: str) -> pd.DataFrame:
        """`fit_frontier_law` of its frontier, fitted once (2,000 draws; the claims, the page and the README
        read it)."""
        return self._get("frontier_law", study, lambda: fit_frontier_law(self.frontier(study)))

    def so_far(self, study: str) -> str:
        """"N of M runs so far": what an unfinished sweep has recorded, of the preset's grid where it is known,
        and which of them have not ended (stopped, or still running: a record that says so is not a result)."""
        runs = self.runs(study)
        n, grid = len(runs), grid_size(self.study_dir(study), self.presets(study))
        text = f"{n}{f' of {grid}' if grid else ''} run{'' if (grid or n) == 1 else 's'} so far"
        stopped = runs[~runs["status"].isin(FINAL_OR_FAILED)] if "status" in runs else runs.iloc[:0]
        if stopped.empty:
            return text
        named = ", ".join(_stopped(row) for row in stopped.head(3).to_dict("records"))
        return text + f", {len(stopped)} not ended: {named}{', ...' if len(stopped) > 3 else ''}"

    def settled(self, study: str) -> bool:
        """Nothing of it is running or was left stopped, though a sweep may have run part of the preset's grid
        (`timing.sweep_settled`)."""
        return self._get("settled", study, lambda: sweep_settled(self.study_dir(study), self.runs(study)))

    def finished(self, study: str) -> bool:
        """Its sweep's latest invocation ended, every run is final and the preset's grid is done
        (`timing.sweep_finished`)."""
        return self._get("finished", study, lambda: sweep_finished(self.study_dir(study), self.runs(study),
                                                                   self.presets(study)))


def _stopped(run: dict) -> str:
    """"deepnorm-L500-s0 interrupted at step 685" (record values, escaped)."""
    step = run.get("steps_completed")
    at = f" at step {int(step)}" if isinstance(step, (int, float)) and pd.notna(step) else ""
    return f"{md_text(run.get('run_name', '?'))} {md_text(run['status'])}{at}"
