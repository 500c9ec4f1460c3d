"""The stability frontier study's section and README block: each cell's bracket from the bisection
(hydra/sweeper=frontier) and the law fitted across depth (frontier_law.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd

from . import plots
from .escape import md_text
from .frontier_law import bracket_table, brackets_so_far, frontier_cells
from .page import Page, Study, charted, diagnoses, markdown_table
from .timing import preset_time, sweeper_setting

if TYPE_CHECKING:
    from .evidence import Evidence


def frontier_section(page: Page, evidence: Evidence, name: str) -> None:
    cells = evidence.frontier(name)
    if cells.empty:
        probes_so_far(page, evidence, name)
        return
    fit = evidence.frontier_law(name)
    law = fit.copy()
    law["depths"] = law["depths"].map(lambda ds: ", ".join(map(str, ds)))
    law["censored_depths"] = law["censored_depths"].map(lambda ds: ", ".join(map(str, ds)))
    page.add(frontier_brackets_text(cells))
    page.add("The law per scheme (slope: 95% interval over the brackets and the seeds; censored cells, whose "
             "frontier lies outside the searched range, are left out of the fit and listed):",
             markdown_table(law[["norm", "slope", "slope_low", "slope_high", "intercept", "cells", "censored",
                                 "censored_depths", "errors", "depths"]], index=False))
    page.figure("frontier_law", plots.frontier_law(cells, fit),
                "Largest learning rate that trains against depth (bars: the bisection's bracket).")
    columns = [c for c in ("norm", "depth", "seed", "max_stable_lr", "min_unstable_lr", "runs") if c in cells]
    # frontier.json keeps the overrides' text: "6", not 6
    cells = cells.assign(**{c: cells[c].astype(int) for c in ("depth", "seed") if c in cells})
    sweeps = cells.drop_duplicates("sweep_dir")
    page.add(f"Every cell ({int(sweeps['runs_spent'].sum())} probe runs; a grid at the same resolution "
             f"would have taken {int(sweeps['grid_runs'].sum())}):",
             markdown_table(cells[columns].sort_values([c for c in ("norm", "depth", "seed") if c in columns]),
                            index=False))
    diagnoses(page, evidence.runs(name), "every probe, at every rate it tried")


def probes_so_far(page: Page, evidence: Evidence, name: str) -> None:
    """Before frontier.json: the brackets the probes made so far (the study's own line above already says
    whether the sweep has finished)."""
    page.add("No `frontier.json` yet: it, and the law, come when every cell is settled.")
    runs = evidence.runs(name)
    if runs.empty:
        return
    stable_if = sweeper_setting(evidence.study_dir(name), "stable_if", "trained")
    prior = sweeper_setting(evidence.study_dir(name), "prior", None)
    started = (f"; the sweep started each cell inside the bracket of {md_text(Path(str(prior)).name)}'s runs "
               "(`hydra.sweeper.prior`), which these brackets, from its own probes alone, leave out" if prior else "")
    page.add(f"The brackets so far, from the {len(runs)} probe runs made (stable: {md_text(stable_if)}, the "
             f"sweep's `stable_if`; an empty end: no probe on that side yet{started}):",
             markdown_table(brackets_so_far(runs, stable_if).sort_values(["norm", "depth", "seed"]), index=False))
    diagnoses(page, runs, "every probe, at every rate it tried")


def frontier_brackets_text(cells: pd.DataFrame) -> str:
    return ("Largest learning rate that trains, per scheme and depth: the bisection's bracket (the frontier lies "
            "between; `<`: no rate of the range trained within the budget, unstable or too slow, which the bisection "
            "cannot tell; `>`: stable at its highest; seeds that differ "
            "are listed in seed order, `/`-separated):\n\n" + markdown_table(bracket_table(cells)))


def frontier_law_text(fit: pd.DataFrame) -> str:
    """One line per scheme of `fit_frontier_law`'s rows: the slope with its interval, or why there is none."""
    lines = []
    for _, row in fit.iterrows():
        censored = f"; censored at L{', L'.join(map(str, row['censored_depths']))}" if row["censored"] else ""
        if np.isfinite(row["slope"]):
            lines.append(f"- {md_text(row['norm'])}: slope {row['slope']:.2f}, 95% interval [{row['slope_low']:.2f}, "
                         f"{row['slope_high']:.2f}], from {row['cells']} cells at L{', L'.join(map(str, row['depths']))}"
                         + censored)
        else:
            lines.append(f"- {md_text(row['norm'])}: no slope (uncensored cells at fewer than two depths{censored})")
    return "\n".join(lines)


def frontier_block(evidence: Evidence, name: str) -> Optional[str]:
    """The README's frontier: each cell's bracket and the law, once frontier.json is written."""
    frontier = evidence.frontier(name)
    if frontier.empty:
        return None
    time = preset_time(evidence.study_dir(name), evidence.runs(name)).describe()
    seeds = frontier["seed"].nunique() if "seed" in frontier else 1
    return (f"**Measured** (`python -m deepnorm_exp -m experiment={name}`, {seeds} seed{'s' * (seeds > 1)}; "
            f"{time}). " + frontier_brackets_text(frontier) + "\n\nThe law, log(max stable lr) against "
            "log(depth):\n\n" + frontier_law_text(evidence.frontier_law(name)))


def frontier_dashboard(evidence: Evidence, name: str) -> dict[str, pd.DataFrame]:
    """Every cell's bracket, the law, and the frontier against depth: per scheme and depth, the geometric mean
    over the seeds of the largest rate found stable (cells censored below the range left out)."""
    frontier = evidence.frontier(name)
    if frontier.empty:
        return {}
    cells = frontier_cells(frontier)
    found = cells[cells["lo"].map(np.isfinite) & (cells["lo"] > 0)]
    stable = (found.assign(lr=np.log(found["lo"])).groupby(["norm", "depth"], as_index=False)["lr"].mean()
              .assign(lr=lambda f: np.exp(f["lr"])))
    law = evidence.frontier_law(name).copy()
    for column in ("depths", "censored_depths"):
        law[column] = law[column].map(lambda ds: ", ".join(map(str, ds)))
    return {"frontier/cells": cells, "frontier/law": law,
            "frontier_vs_depth": charted(stable, "depth", "lr", "largest rate found stable against depth "
                                                             "(geometric mean over seeds)")}


FRONTIER = Study("frontier_depth", "Stability frontier across depth",
                 "Per scheme, depth and seed, the largest learning rate that trains, found by bisection "
                 "(hydra/sweeper=frontier), and the law log(max lr) = a + b log(depth) fitted per scheme.",
                 frontier_section, "frontier", frontier_block, dashboard=frontier_dashboard)
BOARD_FRONTIER = Study("board_frontier", "The board's frontier, bisected",
                       "Per scheme, depth and seed, the largest learning rate that trains under the board's battery, "
                       "found by bisection that starts inside the bracket the board's grid put around it "
                       "(hydra.sweeper.prior), and the law fitted per scheme.", frontier_section,
                       dashboard=frontier_dashboard)
