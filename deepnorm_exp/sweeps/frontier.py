"""The stability frontier: for each cell of a grid (norm x depth x ...), the largest learning rate that
trains without divergence, found by bisection on a log scale instead of a full learning-rate grid.

Pure search logic, so it can be tested on a planted threshold; the Hydra sweeper that launches the probes
as ordinary runs is `hydra_plugins/deepnorm_exp_frontier/`. Assumes stability is monotone in the learning
rate within the bounds (stable below some rate, unstable above), which is what a frontier means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Sequence


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
    # what earlier runs saw, as it bounds this search (lr, stable, the rate it was seen at): no probe of it
    prior: list[tuple[float, bool, float]] = field(default_factory=list)

    def _tried(self, lr: float) -> bool:
        return any(seen == lr for seen, _, _ in self.probes) or any(seen == lr for seen, _, _ in self.prior)

    def know(self, lr: float, stable: bool) -> None:
        """An earlier run's outcome at `lr` (a grid's, `prior_brackets`): it bounds the search as a probe does
        and costs none. Within the range only: stable above it is stable at hi, unstable below it unstable at
        lo (the frontier is monotone); a stable rate below lo or an unstable one above hi bounds nothing here."""
        bound = min(lr, self.hi) if stable else max(lr, self.lo)
        if not self.lo <= bound <= self.hi:
            return
        self.prior.append((bound, stable, lr))
        self._bound(bound, stable)

    def next_lr(self) -> float | None:
        """The rate to probe next, or None when the cell is settled."""
        if self.error is not None:
            return None
        if self.unstable is None:  # the optimistic end first: a stable hi settles the cell at once
            return None if self._tried(self.hi) else self.hi  # at or above the range
        if self.stable is None:  # unstable at the low end too: the frontier is below the range
            return None if self._tried(self.lo) else self.lo
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
        self._bound(lr, stable)

    def _bound(self, lr: float, stable: bool) -> None:
        if stable:
            self.stable = lr if self.stable is None else max(self.stable, lr)
        else:
            self.unstable = lr if self.unstable is None else min(self.unstable, lr)

    def result(self) -> dict:
        return {"max_stable_lr": self.stable, "min_unstable_lr": self.unstable, "runs": len(self.probes),
                "probes": [{"lr": lr, "stable": ok, **({"error": error} if error else {})}
                           for lr, ok, error in self.probes],
                **({"prior": [{"lr": lr, "stable": ok, **({"seen_at": seen} if seen != lr else {})}
                              for lr, ok, seen in self.prior]} if self.prior else {}),
                "error": self.error}


def grid_runs(lo: float, hi: float, resolution: float) -> int:
    """Runs a log-spaced grid from lo to hi with neighbours `resolution` apart would take per cell."""
    return math.ceil(math.log(hi / lo) / math.log(resolution) - 1e-9) + 1


def prior_brackets(outcomes: Sequence[tuple[float, bool]]) -> list[tuple[float, bool]]:
    """What a grid's runs of one cell say of its frontier, as (lr, stable) to `Cell.know`: the largest rate seen
    stable and the smallest seen unstable above it. An unstable rate below a stable one (a run too slow to
    train in the budget) bounds nothing a frontier means, so it is left out rather than closing the bracket."""
    stable = [lr for lr, ok in outcomes if ok]
    top = max(stable) if stable else None
    above = [lr for lr, ok in outcomes if not ok and (top is None or lr > top)]
    return ([(top, True)] if top is not None else []) + ([(min(above), False)] if above else [])


def search(keys: Sequence[Hashable], lo: float, hi: float, resolution: float,
           probe: Callable[[list[tuple[Hashable, float]]], list[bool | str]],
           prior: Mapping[Hashable, Sequence[tuple[float, bool]]] | None = None) -> list[Cell]:
    """Bisect every cell at once: each round probes one rate per unsettled cell (a batch the launcher can
    run in parallel). `probe` returns, per (cell key, lr), whether the run was stable, or the error of a
    run that failed (a string). `prior`: per cell key, (lr, stable) that earlier runs saw (`prior_brackets`),
    where the search starts instead of the range's ends."""
    cells = [Cell(key, lo, hi, resolution) for key in keys]
    for cell in cells:
        for lr, stable in (prior or {}).get(cell.key, ()):
            cell.know(lr, stable)
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
