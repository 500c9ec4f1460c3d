"""The records a results page reads, per study: its published records where it has them, else its raw runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd

from .frontier_law import fit_frontier_law
from .published import Published, load as load_published
from .runs import at_one_lr, load_frontier, load_layer_records, load_runs, load_scalars
from .timing import grid_size, sweep_finished, sweep_settled
from ..lifecycle.summary import load_summaries


class Evidence:
    """The records of each study, each kind loaded once: its published records (`runs/<study>/published/`,
    published.py) where it has them, else its raw run directories (`runs/<study>/`)."""

    def __init__(self, root: str | Path):
        self.root, self._cache = Path(root), {}

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
        """"N of M runs so far": what an unfinished sweep has recorded, of the preset's grid where it is known."""
        n, grid = len(self.runs(study)), grid_size(self.study_dir(study))
        return f"{n}{f' of {grid}' if grid else ''} run{'' if (grid or n) == 1 else 's'} so far"

    def settled(self, study: str) -> bool:
        """Nothing of it is running or was left stopped, though a sweep may have run part of the preset's grid
        (`timing.sweep_settled`)."""
        return self._get("settled", study, lambda: sweep_settled(self.study_dir(study), self.runs(study)))

    def finished(self, study: str) -> bool:
        """Its sweep's latest invocation ended, every run is final and the preset's grid is done
        (`timing.sweep_finished`)."""
        return self._get("finished", study, lambda: sweep_finished(self.study_dir(study), self.runs(study)))


