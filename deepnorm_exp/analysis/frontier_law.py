"""The stability frontier across depth as a measured law: log(max stable lr) against log(depth), per scheme.

Each cell of a `hydra/sweeper=frontier` sweep brackets its frontier: the largest rate seen stable (lo) and
the smallest seen unstable (hi); the true frontier lies between them. The slope of log(frontier) on
log(depth) is fitted by least squares; its interval accounts for both sources of uncertainty at once:
each draw puts every cell's frontier uniformly (in log) inside its bracket and resamples the seeds of every
depth with replacement, fits the slope, and the interval is the draws' central 95%. A cell whose bracket is
open (stable at lr_max, or unstable at lr_min) is censored: it says only that the frontier lies beyond the
range, so it is left out of the fit and counted, with its depth listed. Censoring is not at random (Post-LN
is unstable even at lr_min exactly at its deepest depths; DeepNorm stable at lr_max where it is flattest),
so a fit with censored depths is biased toward the uncensored depths' trend and its interval is too narrow:
read `censored_depths` beside the slope. A cell whose probe failed (not diverged) is an error, not a bound.
Each cell is placed in its bracket independently: seeds whose brackets coincide (a coarse bisection often
gives both the same) count as two measurements, so with few bisection steps the interval is narrower than
the brackets alone allow; `bracket_table` shows them.

If the DeepNet paper's argument holds, Post-LN's frontier falls with depth (negative slope) and DeepNorm's
stays nearly flat (slope near 0).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .runs import outcomes


def frontier_cells(frontier: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (norm, depth, seed, lo, hi, censored) from `load_frontier`'s rows."""
    cells = pd.DataFrame({
        "norm": frontier["norm"].astype(str),
        "depth": frontier["depth"].astype(int),
        "seed": frontier["seed"].astype(int) if "seed" in frontier else 0,
        "lo": pd.to_numeric(frontier["max_stable_lr"], errors="coerce"),
        "hi": pd.to_numeric(frontier["min_unstable_lr"], errors="coerce"),
    })
    # A cell whose probe failed (not diverged) is an error, not a measurement: it has neither end, or, where a
    # prior study's runs bracketed it first (hydra.sweeper.prior), its bracket stopped short
    failed = frontier["error"].notna().to_numpy() if "error" in frontier else False
    cells["error"] = (cells["lo"].isna() & cells["hi"].isna()) | failed
    cells["censored"] = (cells["lo"].isna() | cells["hi"].isna()) & ~cells["error"]
    return cells


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def fit_frontier_law(frontier: pd.DataFrame, draws: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per norm: `slope` and `intercept` of log(lr) = intercept + slope log(depth) through the brackets'
    geometric midpoints, `slope_low`/`slope_high` (the 95% interval over brackets and seeds), the cells
    used and censored, and the depths. Needs two depths with uncensored cells, else the slope is NaN."""
    cells = frontier_cells(frontier)
    rng = np.random.default_rng(seed)
    rows = []
    for norm, group in cells.groupby("norm", sort=True):
        used = group[~group["censored"] & ~group["error"]]
        row = {"norm": norm, "cells": len(used), "censored": int(group["censored"].sum()),
               "errors": int(group["error"].sum()),
               "censored_depths": sorted(group.loc[group["censored"], "depth"].unique().tolist()),
               "depths": sorted(used["depth"].unique().tolist()), "slope": np.nan, "intercept": np.nan,
               "slope_low": np.nan, "slope_high": np.nan}
        if used["depth"].nunique() >= 2:
            x = np.log(used["depth"].to_numpy(float))
            log_lo, log_hi = np.log(used["lo"].to_numpy(float)), np.log(used["hi"].to_numpy(float))
            row["slope"], row["intercept"] = _slope(x, (log_lo + log_hi) / 2)
            by_depth = [np.flatnonzero(used["depth"].to_numpy() == d) for d in sorted(used["depth"].unique())]
            slopes = np.empty(draws)
            for i in range(draws):
                pick = np.concatenate([rng.choice(idx, size=len(idx), replace=True) for idx in by_depth])
                y = rng.uniform(log_lo[pick], log_hi[pick])
                slopes[i] = _slope(x[pick], y)[0]
            row["slope_low"], row["slope_high"] = np.quantile(slopes, [0.025, 0.975]).tolist()
        rows.append(row)
    return pd.DataFrame(rows)


def brackets_so_far(runs: pd.DataFrame, stable_if: str) -> pd.DataFrame:
    """Per (norm, depth, seed), from the probe runs finished so far (`load_runs` of an unfinished frontier
    sweep): the largest rate seen stable and the smallest seen unstable, judged by the sweeper's rule
    (`finished_stable`, with its `stable_if`). Probes that failed or were stopped are left out: they say
    nothing about stability. NaN: no probe on that side yet."""
    from ..sweeps.frontier import finished_stable

    finished = outcomes(runs)
    stable = [finished_stable(status, trained, stable_if) for status, trained in
              zip(finished["status"], finished["trained"].where(finished["trained"].notna(), False))]
    probes = finished.assign(stable=stable, lr=finished["train.lr"].astype(float))
    rows = []
    for (norm, depth, seed), cell in probes.groupby(["norm", "depth", "seed"]):
        rows.append({"norm": norm, "depth": int(depth), "seed": int(seed), "probes": len(cell),
                     "max_stable_lr": cell.loc[cell["stable"], "lr"].max(),
                     "min_unstable_lr": cell.loc[~cell["stable"], "lr"].min()})
    return pd.DataFrame(rows, columns=["norm", "depth", "seed", "probes", "max_stable_lr", "min_unstable_lr"])


def bracket_table(frontier: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: each cell's bracket "lo-hi" (the frontier lies between), "< lr_min" when not trained even at
    the range's lowest rate, "> lr_max" when stable at its highest; a depth whose seeds disagree lists every
    seed's, "/"-separated, in seed order; "error" for a probe that failed."""
    cells = frontier_cells(frontier).sort_values(["norm", "depth", "seed"])

    def bracket(lo: float, hi: float, error: bool) -> str:
        if error:
            return "error"
        if np.isnan(lo):
            return f"< {hi:.3g}"
        return f"> {lo:.3g}" if np.isnan(hi) else f"{lo:.3g}-{hi:.3g}"

    table = {}
    for (norm, depth), group in cells.groupby(["norm", "depth"], sort=True):
        texts = [bracket(*row) for row in group[["lo", "hi", "error"]].itertuples(index=False)]
        table.setdefault(norm, {})[depth] = texts[0] if len(set(texts)) == 1 else " / ".join(texts)
    frame = pd.DataFrame(table).T
    frame = frame[sorted(frame.columns)]
    frame.index.name, frame.columns.name = "norm", "depth"
    return frame.fillna("")
