"""The stability frontier: for each cell of a grid (norm x depth x ...), the largest learning rate that
trains without divergence, found by bisection on a log scale instead of a full learning-rate grid.

Pure search logic, so it can be tested on a planted threshold; the Hydra sweeper that launches the probes
as ordinary runs is `hydra_plugins/deepnorm_exp_frontier/`. Assumes stability is monotone in the learning
rate within the bounds (stable below some rate, unstable above), which is what a frontier means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence


def finished_stable(status: str, trained, stable_if: str) -> bool:
    """Whether a probe that finished (`status` completed or diverged) was stable: not diverged, and under
    `stable_if: trained` also learned (summary.trained). The sweeper's rule, and the analysis's."""
    return status == "completed" and (bool(trained) if stable_if == "trained" else True)


@dataclass
class Cell:
    """The search in one cell: `stable` is the largest rate seen stable, `unstable` the smallest unstable."""

    key: Hashable
    lo: float
    hi: float
    resolution: float
    stable: float | None = None
    unstable: float | None = None
    probes: list[tuple[float, bool | None, str | None]] = field(default_factory=list)  # lr, stable, error
    error: str | None = None

    def next_lr(self) -> float | None:
        """The rate to probe next, or None when the cell is settled."""
        if self.error is not None:
            return None
        if not self.probes:
            return self.hi  # the optimistic end first: a stable hi settles the cell at once
        if self.unstable is None:
            return None  # hi was stable: the frontier is at or above the range
        if self.stable is None:
            tried_lo = any(lr == self.lo for lr, _, _ in self.probes)
            return None if tried_lo else self.lo  # lo unstable too: the frontier is below
        if self.unstable / self.stable <= self.resolution:
            return None
        # Bisection on a log scale at the exact midpoint (no rounding: rounded rates made two brackets that
        # exact bisection makes equal differ by 0.07%, and a claim read that difference)
        return math.sqrt(self.stable * self.unstable)

    def record(self, lr: float, stable: bool | str) -> None:
        """A probe's outcome: stable (True), diverged (False), or the error of a run that failed (str), which
        settles the cell: a failure says nothing about stability, and repeating it would fail again."""
        if isinstance(stable, str):
            self.probes.append((lr, None, stable))
            self.error = f"the run at lr {lr:g} failed: {stable}"
            return
        self.probes.append((lr, stable, None))
        if stable:
            self.stable = lr if self.stable is None else max(self.stable, lr)
        else:
            self.unstable = lr if self.unstable is None else min(self.unstable, lr)

    def result(self) -> dict:
        return {"max_stable_lr": self.stable, "min_unstable_lr": self.unstable, "runs": len(self.probes),
                "probes": [{"lr": lr, "stable": ok, **({"error": error} if error else {})}
                           for lr, ok, error in self.probes],
                "error": self.error}


def grid_runs(lo: float, hi: float, resolution: float) -> int:
    """Runs a log-spaced grid from lo to hi with neighbours `resolution` apart would take per cell."""
    return math.ceil(math.log(hi / lo) / math.log(resolution) - 1e-9) + 1


def search(keys: Sequence[Hashable], lo: float, hi: float, resolution: float,
           probe: Callable[[list[tuple[Hashable, float]]], list[bool | str]]) -> list[Cell]:
    """Bisect every cell at once: each round probes one rate per unsettled cell (a batch the launcher can
    run in parallel). `probe` returns, per (cell key, lr), whether the run was stable, or the error of a
    run that failed (a string)."""
    cells = [Cell(key, lo, hi, resolution) for key in keys]
    while True:
        batch = [(cell, cell.next_lr()) for cell in cells]
        batch = [(cell, lr) for cell, lr in batch if lr is not None]
        if not batch:
            return cells
        for (cell, lr), stable in zip(batch, probe([(cell.key, lr) for cell, lr in batch])):
            cell.record(lr, stable)


def check_owned_keys(key: str, overrides: Sequence[str]) -> None:
    """The sweeper sets `key` on every probe: a user's value for it would be listed as a cell coordinate
    that no probe used. ConfigError naming it."""
    from ..errors import ConfigError

    for override in overrides:
        name = override.split("=", 1)[0].lstrip("+~")
        if name == key:
            raise ConfigError(name, override.split("=", 1)[1] if "=" in override else "", "hydra/sweeper=frontier "
                              f"probes {key} itself (between hydra.sweeper.lr_min and lr_max); drop the override")
