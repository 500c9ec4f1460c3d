"""The board: every registered scheme at its own best learning rate per depth, ranked, with what the seeds can
and cannot tell apart (experiment=board; one scheme's row beside it: experiment=scorecard).

The rules, fixed before the board's runs (tests/test_board.py holds each against hand-made records):

* The battery (conf/experiment/board.yaml): depths 6, 24, 100; a grid of four rates (3e-4 to 1e-2, which holds
  the learning-rate study's best rates of Post-LN, Pre-LN and DeepNorm); two seeds; each run trains the whole
  budget (its final loss is what ranks) unless the divergence rule stops it. A comparison is made only between
  rows of the same battery (`battery`: every model, data and training setting, the grid, seeds and depths): a
  scorecard run at another budget or grid is refused, not ranked, and so are a board's own runs of two
  batteries (`unranked`). Revised after a review, before any board run: the battery had been six settings.
* A scheme's loss at a rate, its best rate, the flag where the best rate is an end of the grid and its LR
  sensitivity are the learning-rate study's (lr_study.py): the final eval loss capped at the loss at
  initialisation (a diverged run counts as its initial loss), the rate of the lowest mean over the seeds.
* Noise: the seeds' spread pooled over every cell of the depth whose seeds all completed and trained (a
  pooled standard deviation: the spread of one scheme's two seeds alone is too rough a guess). Scheme A ranks
  above B only when B's loss exceeds A's by more than NOISE_SE standard errors of the difference,
  sd_pooled * sqrt(1/n_A + 1/n_B); a scheme's rank is one more than the number of schemes surely better. Equal
  ranks are within noise of each other; `ties` names the schemes within noise of each row. Where seeds
  differ (a crashed one), a scheme of fewer seeds has wider margins, so it can rank above one of a slightly
  lower loss: fewer schemes are surely better than it. The row's `seeds` shows it.
* Steps-to-train at the best rate: the first evaluation by which half the seeds had learned 10% of the
  unigram-to-optimal gap (steps_to_train.median_steps), censored at the budget: "not by 500", never "never"
  (a run on the plateau at its budget may train later: issue 39).
* The grid around each scheme's own range (`grid_extensions`): where no rate of a cell trained every seed, the
  ladder's next rate (1-3-10) below its lowest; where its best rate trained a seed and is an end of its grid,
  the next rate past that end; until neither holds. The page lists the commands. Added before any board run.
* Frontier, at the grid's resolution: the largest rate at which every seed trained (a crashed or unfinished seed
  did not) and none diverged; "above"
  where that is the grid's top rate, "below" where no rate is; per scheme its change from the shallowest depth
  to the deepest (the grid's factor bounds what it can show: experiment=board_frontier bisects each cell under
  the same battery, its own section of the page),
  and its slope against depth, log(frontier) on log(depth), fitted through each seed's bracket on the grid
  (frontier_law.py's fit and interval; added after a review, before any board run).
* Collapse at initialisation: the last block's token cosine at step 0 (mean over the runs that recorded it;
  the diagnosis calls 0.99 or more collapsed).
* Failures: the diagnosis of every run of the scheme's grid at the depth that did not train.
* A scheme is ranked at a depth only once its grid there has ended (`waiting_cells`): every (rate, seed) pair
  the sweep invocations that reached the cell asked for (the command line's axes, else the preset's: asked.py)
  and every pair its runs hold, each completed, diverged or crashed. A best rate read from part of the grid is
  no best rate, and a board runs over many sessions. Until then the page names the cell under its depth. One
  scheme's grid extended around its own range leaves the others whole; a scorecard's battery is compared on the
  grid most cells share (`common_grid`). Added before any board run, with the sweep made scheme by scheme
  (conf/experiment/board.yaml) so each session ends with whole rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Optional

import numpy as np
import pandas as pd

from .lr_study import LR, capped_losses, lr_summary
from .escape import md_code, md_text
from .frontier_law import fit_frontier_law
from .page import Page, Study, charted, markdown_table
from .steps_to_train import median_steps
from .tables import counted, norm_depth_table
from .asked import asked_pairs, invocations, numbers
from .timing import FINAL_OR_FAILED
from ..lifecycle.diagnosis import COLLAPSED_COSINE

if TYPE_CHECKING:
    from .evidence import Evidence

NOISE_SE = 2.0  # standard errors of a difference that make it a ranking
# The battery: every model, data and training setting a run records, but the rate (the grid's), the depth and
# those that change how a run is carried out, not what it computes
BATTERY_PREFIXES = ("model.", "data.", "train.")
NOT_BATTERY = frozenset({LR, "model.decoder_depth", "model.activation_checkpointing", "train.log_every",
                         "train.ckpt_every", "train.keep_checkpoint", "train.compile", "train.parallel",
                         "train.micro_batch_size", "train.peak_tflops", "train.deterministic"})
GRID = ("rates", "seeds", "depths")  # what a battery spans rather than shares


def pooled_sd(runs: pd.DataFrame) -> pd.Series:
    """Per depth, the seeds' standard deviation pooled over the cells (scheme, rate) whose seeds all completed and
    trained, two or more of them, with a finite spread (NaN where no cell has)."""
    losses = capped_losses(runs)
    out = {}
    for depth, at_depth in losses.groupby("depth"):
        squares, dof = 0.0, 0
        for _, cell in at_depth.groupby(["norm", "lr"]):
            square = float(((cell["loss"] - cell["loss"].mean()) ** 2).sum())
            if len(cell) >= 2 and cell["trained"].all() and math.isfinite(square):  # 1e200 losses: no spread
                squares += square
                dof += len(cell) - 1
        out[int(depth)] = math.sqrt(squares / dof) if dof else math.nan
    return pd.Series(out, dtype=float, name="pooled_sd")


def rank_within_noise(rows: pd.DataFrame, sd: float) -> pd.DataFrame:
    """rows (norm, loss, seeds) at one depth -> with `rank` (1 + the schemes surely better) and `ties` (the
    schemes within noise of it). Without a pooled spread (NaN) no difference is sure: every rank is 1."""
    loss, seeds = rows["loss"].to_numpy(float), rows["seeds"].to_numpy(float)
    margin = NOISE_SE * sd * np.sqrt(1 / seeds[:, None] + 1 / seeds[None, :]) if math.isfinite(sd) else np.inf
    surely_better = (loss[None, :] + margin < loss[:, None])  # [i, j]: j surely better than i
    within = ~surely_better & ~surely_better.T
    np.fill_diagonal(within, False)
    names = rows["norm"].to_numpy()
    return rows.assign(rank=surely_better.sum(axis=1) + 1,
                       ties=[", ".join(sorted(names[within[i]])) for i in range(len(rows))])


def frontier_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: the largest grid rate at which every seed trained and none diverged, and where it
    sits on the grid ("above": the top rate; "below": none). The grid is every rate its runs tried: a seed
    that crashed or has not finished is not one that trained."""
    if runs.empty or LR not in runs:
        return pd.DataFrame(columns=["norm", "depth", "frontier", "where", "lowest"])
    status = runs.get("status", pd.Series(None, index=runs.index))
    cells = pd.DataFrame({"norm": runs["norm"], "depth": pd.to_numeric(runs["depth"], errors="coerce"),
                          "lr": pd.to_numeric(runs[LR], errors="coerce"),
                          "ok": status.eq("completed") & runs.get("trained", pd.Series(False, index=runs.index)).eq(True)})
    rows = []
    for (norm, depth), group in cells.dropna(subset=["depth", "lr"]).groupby(["norm", "depth"]):
        rates = sorted(group["lr"].unique())
        stable = [lr for lr, cell in group.groupby("lr") if cell["ok"].all()]
        top = max(stable) if stable else math.nan
        where = "below" if not stable else "above" if top == rates[-1] else ""
        rows.append({"norm": norm, "depth": int(depth), "frontier": top, "where": where, "lowest": rates[0]})
    return pd.DataFrame(rows, columns=["norm", "depth", "frontier", "where", "lowest"])


def grid_brackets(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme, depth and seed, the bracket the grid puts around the seed's frontier: the largest rate at
    which it trained without diverging (`max_stable_lr`) and the smallest rate above that at which it did not
    (`min_unstable_lr`; a rate below it that trained too slowly bounds nothing); NaN where no rate is on that
    side (censored). Runs that crashed or have not finished measure nothing and are left out."""
    columns = ["norm", "depth", "seed", "max_stable_lr", "min_unstable_lr"]
    ended = capped_losses(runs)
    rows = []
    for (norm, depth, seed), cell in ended.groupby(["norm", "depth", "seed"]):
        stable = cell["trained"] & cell["status"].eq("completed")
        lo = cell.loc[stable, "lr"].max()
        above = cell.loc[~stable & (cell["lr"] > lo if math.isfinite(lo) else True), "lr"]
        rows.append({"norm": norm, "depth": int(depth), "seed": seed, "max_stable_lr": lo, "min_unstable_lr": above.min()})
    return pd.DataFrame(rows, columns=columns)


def frontier_slopes(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme, the slope of log(frontier) on log(depth) through the grid's brackets (frontier_law.py's fit:
    its 95% interval over the brackets and the seeds; censored cells left out and their depths listed)."""
    brackets = grid_brackets(runs)
    if brackets.empty:
        return pd.DataFrame()
    law = fit_frontier_law(brackets)
    law["censored_depths"] = law["censored_depths"].map(lambda ds: ", ".join(map(str, ds)))
    law["depths"] = law["depths"].map(lambda ds: ", ".join(map(str, ds)))
    return law[["norm", "slope", "slope_low", "slope_high", "cells", "censored", "censored_depths", "depths"]]


def init_cosine(layers: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: the last block's token cosine at step 0, the mean over the runs that recorded it."""
    columns = ["norm", "depth", "init_cosine"]
    if layers.empty or "token_cosine" not in layers:
        return pd.DataFrame(columns=columns)
    cosine = pd.to_numeric(layers["token_cosine"], errors="coerce")  # raw local layers are not type-checked
    at_init = layers.assign(token_cosine=cosine.where(cosine.abs() <= 1))
    at_init = at_init[pd.to_numeric(at_init["step"], errors="coerce") == 0].dropna(subset=["token_cosine"])
    if at_init.empty:
        return pd.DataFrame(columns=columns)
    last = at_init.sort_values("position").groupby(["norm", "depth", "run_name"]).tail(1)  # a scorecard twin shares the name
    table = last.groupby(["norm", "depth"])["token_cosine"].mean().rename("init_cosine").reset_index()
    table["depth"] = table["depth"].astype(int)
    return table[columns]


def failures(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: "2 diverged, 1 stuck_on_plateau, 1 failed": how the runs of its grid that did not
    train ended (a run that crashed: "failed"; one not finished: "unfinished"; neither has a loss to rank, so
    the row's seeds are fewer)."""
    if runs.empty or "status" not in runs:
        return pd.DataFrame(columns=["norm", "depth", "failures"])
    rows = []
    for (norm, depth), group in runs.assign(depth=pd.to_numeric(runs["depth"], errors="coerce")).dropna(
            subset=["depth"]).groupby(["norm", "depth"]):
        failed = group[~(group["trained"].eq(True) & group["status"].eq("completed"))]
        ended = failed["status"].isin(("completed", "diverged"))
        diagnosis = failed.get("diagnosis.kind", pd.Series("none", index=failed.index)).fillna("none")
        kinds = np.where(failed["status"].eq("diverged"), "diverged", np.where(
            ended, diagnosis, np.where(failed["status"].eq("failed"), "failed", "unfinished")))
        rows.append({"norm": norm, "depth": int(depth), "failures": counted(kinds)})
    return pd.DataFrame(rows, columns=["norm", "depth", "failures"])


def best_rate_steps(runs: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: the median steps-to-train of its seeds at its best rate, how many trained, and the
    budget that censors it (its runs' train.steps)."""
    rows = []
    for row in summary.itertuples():
        at = runs[(runs["norm"] == row.norm) & (pd.to_numeric(runs["depth"], errors="coerce") == row.depth)
                  & (pd.to_numeric(runs[LR], errors="coerce") == row.best_lr) & runs["status"].isin(("completed", "diverged"))]
        trained_at = pd.to_numeric(at.get("trained_at_step", pd.Series(np.nan, index=at.index)), errors="coerce")
        budget = pd.to_numeric(at.get("train.steps", pd.Series(np.nan, index=at.index)), errors="coerce").max()
        rows.append({"norm": row.norm, "depth": row.depth, "steps_to_train": median_steps(trained_at),
                     "trained_by_budget": f"{int(trained_at.notna().sum())}/{len(at)}", "budget": budget})
    return pd.DataFrame(rows, columns=["norm", "depth", "steps_to_train", "trained_by_budget", "budget"])


def censored_steps(median: float, budget: float) -> str:
    """"100"; "not by 500" where fewer than half the seeds had trained by the budget: a seed on the plateau may be
    slower or never train, which the budget cannot tell (issue 39: steps_to_train's long budget tells them
    apart), so never "never"."""
    if math.isfinite(median):
        return f"{median:.0f}"
    return f"not by {budget:.0f}" if math.isfinite(budget) else "not by the budget"


def cell_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """norm, depth, lr, seed as numbers (rows that do not read as such, or of a fractional depth, left out) and
    whether the run ended,
    indexed by each run's position in `runs`."""
    if runs.empty or not {"norm", "depth", LR, "seed", "status"} <= set(runs.columns):
        return pd.DataFrame(columns=["norm", "depth", "lr", "seed", "ended"])
    cells = pd.DataFrame({"norm": runs["norm"].astype(str).to_numpy(),
                          "depth": pd.to_numeric(runs["depth"], errors="coerce").to_numpy(),
                          "lr": pd.to_numeric(runs[LR], errors="coerce").to_numpy(),
                          "seed": pd.to_numeric(runs["seed"], errors="coerce").to_numpy(),
                          "ended": runs["status"].isin(FINAL_OR_FAILED).to_numpy()})
    numeric = cells[["depth", "lr", "seed"]].to_numpy(float)
    return cells[np.isfinite(numeric).all(axis=1) & (numeric[:, 0] == np.floor(numeric[:, 0]))]


class Waiting(NamedTuple):
    """A cell whose grid has not ended: its runs ended, held (begun) and asked for."""

    ended: int
    held: int
    grid: int


def waiting_cells(runs: pd.DataFrame, study: Optional[Path] = None) -> dict[tuple[str, int], Waiting]:
    """(scheme, depth) -> its counts, for the cells whose grid has not ended (a run still going or not begun,
    or no run begun). A cell's grid: the (rate, seed) pairs the sweep invocations that reached it asked for
    (`study`'s sweep log, else its preset's axes: asked.py) and those its runs hold; with neither, every rate of
    its runs at every seed of its runs."""
    asked, cells = invocations(study), cell_runs(runs)
    keys = {(norm, depth) for norm, depth in zip(cells["norm"], cells["depth"])}
    keys |= {(norm, depth) for invocation in asked if invocation["norm"] and invocation["depth"]
             for norm in invocation["norm"] for depth in numbers(invocation["depth"]) if depth == int(depth)}
    waiting = {}
    for norm, depth in sorted(keys):
        cell = cells[(cells["norm"] == norm) & (cells["depth"] == depth)]
        held = set(zip(cell["lr"], cell["seed"]))
        grid = (asked_pairs(asked, norm, depth, held) if asked
                else {(lr, seed) for lr in set(cell["lr"]) for seed in set(cell["seed"])})
        ended = set(zip(cell.loc[cell["ended"], "lr"], cell.loc[cell["ended"], "seed"]))
        if not grid <= ended:
            waiting[(norm, int(depth))] = Waiting(len(grid & ended), len(held), len(grid))
    return waiting


def whole_cells(runs: pd.DataFrame, study: Optional[Path] = None) -> pd.DataFrame:
    """The runs of the (scheme, depth) cells whose grid has ended (`waiting_cells` left out): what a board ranks."""
    waiting = waiting_cells(runs, study)
    cells = cell_runs(runs)  # indexed by position in `runs`
    keep = [(norm, int(depth)) not in waiting for norm, depth in zip(cells["norm"], cells["depth"])]
    return runs.iloc[cells.index[keep]]


def board(runs: pd.DataFrame, layers: pd.DataFrame = pd.DataFrame()) -> pd.DataFrame:
    """One row per scheme and depth, ranked within the depth (the module docstring's rules), from whole cells
    (`whole_cells`: the caller's, who knows the sweeps that made them)."""
    summary = lr_summary(runs)
    if summary.empty:
        return pd.DataFrame()
    summary = summary.assign(se=np.nan)
    sds = pooled_sd(runs)
    keys = ["norm", "depth"]
    table = (summary.merge(best_rate_steps(runs, summary), on=keys, how="left")
             .merge(frontier_rates(runs), on=keys, how="left").merge(init_cosine(layers), on=keys, how="left")
             .merge(failures(runs), on=keys, how="left"))
    ranked = []
    for depth, rows in table.groupby("depth"):
        sd = float(sds.get(int(depth), math.nan))
        rows = rank_within_noise(rows.reset_index(drop=True), sd)
        rows["se"] = sd / np.sqrt(rows["seeds"]) if math.isfinite(sd) else np.nan
        ranked.append(rows.sort_values(["rank", "loss", "norm"]))
    return pd.concat(ranked, ignore_index=True)


def board_rows(table: pd.DataFrame, depth: int) -> pd.DataFrame:
    """The page's table at one depth: rank, the loss at the best rate with its standard error and the seeds it
    is the mean of, the rate (and the grid's edge), LR sensitivity, steps-to-train, the frontier, the collapse at init and the failures."""
    rows = table[table["depth"] == depth]
    loss = [f"{r.loss:.3f}" + (f" ± {r.se:.3f}" if math.isfinite(r.se) else "") for r in rows.itertuples()]
    rate = [f"{r.best_lr:g}" + (f" ({r.edge} edge)" if r.edge else "") for r in rows.itertuples()]
    steps = [censored_steps(r.steps_to_train, r.budget) + f" ({r.trained_by_budget})" for r in rows.itertuples()]
    frontier = [(f"{r.frontier:g}" if math.isfinite(r.frontier) else "") + (f" ({r.where})" if r.where else "")
                for r in rows.itertuples()]
    cosine = [("" if not math.isfinite(r.init_cosine) else f"{r.init_cosine:.3f}"
               + (" (collapsed)" if r.init_cosine >= COLLAPSED_COSINE else "")) for r in rows.itertuples()]
    return pd.DataFrame({"rank": rows["rank"].to_numpy(), "norm": rows["norm"].to_numpy(), "loss ± se": loss,
                         "seeds": rows["seeds"].to_numpy(), "best lr": rate, "lr sensitivity": rows["sensitivity"].round(3).to_numpy(),
                         "steps to train": steps, "frontier": frontier, "cosine at init": cosine,
                         "within noise of": rows["ties"].to_numpy(), "failures": rows["failures"].fillna("").to_numpy()})


RATES = tuple(m * 10.0 ** e for e in range(-7, 1) for m in (1, 3))  # the grid's 1-3-10 ladder, half a decade a rung


def past_the_end(rate: float, edge: str) -> float:
    """The ladder's next rate past `rate` on the `edge` ("low" or "high") side (NaN off the ladder's ends)."""
    beyond = [r for r in RATES if (r < rate * (1 - 1e-9) if edge == "low" else r > rate * (1 + 1e-9))]
    return (max(beyond) if edge == "low" else min(beyond)) if beyond else math.nan


def grid_extensions(table: pd.DataFrame, experiment: str) -> list[str]:
    """The rule that places each scheme's grid around its own range, in the same battery (the preset's seeds):
    a cell where no rate trained every seed gets the ladder's next rate below its lowest (a deeper model takes
    lower rates; the lowest loss among untrained rates is noise, no direction: a review); a cell whose best rate
    trained a seed and is an end of its grid gets the next rate past that end; until neither holds. One command
    per cell, deepest first (the costliest runs)."""
    lines = []
    for r in table.sort_values(["depth", "norm"], ascending=[False, True]).itertuples():
        if r.where == "below":
            end, edge, why = r.lowest, "low", f"no rate trained every seed, the lowest {r.lowest:g}"
        elif r.edge in ("low", "high") and r.trained > 0:
            end, edge, why = r.best_lr, r.edge, f"best rate at the {r.edge} end, {r.best_lr:g}"
        else:
            continue
        rate = past_the_end(end, edge)
        if math.isfinite(rate):
            command = f"python -m deepnorm_exp -m experiment={experiment} norm={r.norm} depth={int(r.depth)} train.lr={rate:g}"
            lines.append(f"{md_code(command)} ({why})")
    return lines


def frontier_change(rows: pd.DataFrame) -> str:
    """The frontier at the deepest depth over the shallowest, one scheme's rows: "0.1x"; "≥ 1x" where the
    deepest is the grid's top rate (its frontier may lie above), "≤ 0.3x" where the shallowest is; "" where
    both are, or the shallowest is below the grid; "below the grid at L100" where the deepest is."""
    rows = rows.sort_values("depth")
    first, last = rows.iloc[0], rows.iloc[-1]
    if len(rows) < 2 or not math.isfinite(first["frontier"]):
        return ""
    if not math.isfinite(last["frontier"]):
        return f"below the grid at L{int(last['depth'])}"
    floor, ceiling = last["where"] == "above", first["where"] == "above"
    if floor and ceiling:
        return ""
    return ("≥ " if floor else "≤ " if ceiling else "") + f"{last['frontier'] / first['frontier']:.3g}x"


def frontier_table(table: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: the frontier rate (at the grid's resolution), and its change from the shallowest depth to
    the deepest (`frontier_change`)."""
    cells: dict[str, dict] = {}
    for r in table.itertuples():
        cells.setdefault(r.norm, {})[int(r.depth)] = ((f"{r.frontier:g}" if math.isfinite(r.frontier) else "")
                                                      + (f" ({r.where})" if r.where else ""))
    frame = norm_depth_table(cells, sorted(cells))
    frame["change"] = [frontier_change(table[table["norm"] == norm]) for norm in frame.index]
    return frame


def _values(runs: pd.DataFrame, key: str, numeric: bool = False) -> tuple:
    column = runs.get(key, pd.Series(dtype=object))
    values = pd.to_numeric(column, errors="coerce").dropna() if numeric else column.dropna().astype(str)
    return tuple(sorted(values.unique()))


def common_grid(runs: pd.DataFrame) -> tuple[tuple, tuple]:
    """The rates and seeds most (scheme, depth) cells of `runs` hold (ties: the smaller grid), so one scheme's
    grid extended around its own stable range does not make the others' another battery."""
    cells = cell_runs(runs)
    if cells.empty:
        return (), ()
    grids = [(tuple(sorted(set(cell["lr"]))), tuple(sorted(set(cell["seed"]))))
             for _, cell in cells.groupby(["norm", "depth"])]
    return max(set(grids), key=lambda grid: (grids.count(grid), -len(grid[0]) * len(grid[1]), grid))


def battery(runs: pd.DataFrame) -> dict[str, tuple]:
    """What a board's runs share and a scorecard must share with them: every model, data and training setting
    (BATTERY_PREFIXES, less NOT_BATTERY), the grid of rates and seeds most cells hold, and the depths."""
    keys = [c for c in runs.columns if str(c).startswith(BATTERY_PREFIXES) and c not in NOT_BATTERY]
    shared = {key: _values(runs, key) for key in keys}
    rates, seeds = common_grid(runs)
    shared.update(rates=rates, seeds=seeds, depths=tuple(int(d) for d in _values(runs, "depth", numeric=True)))
    return shared


def _listed(values: tuple) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def battery_differences(board_runs: pd.DataFrame, candidate: pd.DataFrame) -> list[str]:
    """"train.steps: 200 here, 500 on the board": where a scorecard's battery is not the board's (empty: same),
    each read from its whole cells. A setting one side's records lack is not compared (records written before
    it existed); a scorecard at some of the board's depths is one whose other depths have not ended; one whose
    grid holds the board's and more rates or seeds (extended around its own range, as a board's scheme may be)
    is of the board's battery."""
    ours, theirs = battery(candidate), battery(board_runs)
    return [f"{key}: {_listed(ours[key])} here, {_listed(theirs[key])} on the board" for key in theirs
            if key in ours and (not set(ours[key]) <= set(theirs[key]) if key == "depths"
                                else not set(ours[key]) >= set(theirs[key]) if key in ("rates", "seeds")
                                else ours[key] != theirs[key])]


def mixed_battery(runs: pd.DataFrame) -> list[str]:
    """"train.steps: 500, 2000": the settings a board's own runs do not share (empty: one battery), whose rows
    would otherwise pool runs of different budgets as seeds of one cell."""
    return [f"{key}: {_listed(values)}" for key, values in battery(runs).items() if key not in GRID and len(values) > 1]


def stops_once_trained(runs: pd.DataFrame) -> bool:
    """Runs that stop once trained (train.stop_when_trained) end with no final loss to rank."""
    return bool(runs.get("train.stop_when_trained", pd.Series(dtype=object)).eq(True).any())


def unranked(runs: pd.DataFrame, whole: Optional[pd.DataFrame] = None) -> str:
    """Why `runs` cannot be a board ("" where they can): fewer than two rates in its whole cells (`whole`; all of
    `runs` where not given; no whole cell yet: not this reason, its cells wait), runs that stop once trained, or
    runs of more than one battery (both read from every run, whole cells or not)."""
    rated = runs if whole is None else whole
    if not rated.empty and len(_values(rated, LR, numeric=True)) < 2:
        return "one learning rate"
    if stops_once_trained(runs):
        return "its runs stop once trained (train.stop_when_trained): their last losses are no final ones"
    mixed = mixed_battery(runs)
    return f"its runs are of more than one battery ({'; '.join(mixed)})" if mixed else ""


def waiting_line(waiting: dict[tuple[str, int], Waiting], depth: int) -> list[str]:
    """The page's line naming the schemes at `depth` whose grid has not ended, begun ones with their count (none:
    no line)."""
    at_depth = sorted((norm, cell) for (norm, at), cell in waiting.items() if at == depth)
    begun = [f"{md_text(norm)} ({cell.ended} of {cell.grid} runs ended)" for norm, cell in at_depth if cell.held]
    fresh = [md_text(norm) for norm, cell in at_depth if not cell.held]
    parts = begun + ([f"not begun: {', '.join(fresh)}"] if fresh else [])
    return [f"Not ranked until its grid has ended: {'; '.join(parts)}."] if parts else []


def board_section(page: Page, evidence: Evidence, name: str) -> None:
    runs, study = evidence.runs(name), evidence.study_dir(name)
    whole, waiting = whole_cells(runs, study), waiting_cells(runs, study)
    reason = unranked(runs, whole)
    if reason:
        page.add(f"Not ranked: {md_text(reason)}. Another battery runs under its own `experiment_name`.")
        return
    table = board(whole, evidence.layers(name))
    if table.empty and not waiting:
        page.add("No run has ended yet.")
        return
    sds = pooled_sd(whole)
    for depth in sorted({*map(int, table.get("depth", [])), *(at for _, at in waiting)}):
        page.add(f"### Depth {depth}")
        if not table.empty and (table["depth"] == depth).any():
            sd = sds.get(depth, math.nan)
            spread = (f"the seeds' spread pooled over the depth's trained cells is {sd:.4f}, so a difference ranks "
                      f"only beyond {NOISE_SE:g} standard errors of it" if math.isfinite(sd) else
                      "no cell of the depth has every seed trained (with a finite spread), so the seeds' spread is not "
                      "known and no difference ranks")
            page.add(f"Ranked by the final eval loss at each scheme's best rate (capped at the loss at "
                     f"initialisation); {spread}; equal ranks are within noise. Steps to train: the median at the best "
                     "rate, censored at the budget (\"not by 500\": fewer than half the seeds had learned 10% of "
                     "the gap by then; one on the plateau may be slower or never train, which this budget cannot "
                     "tell and steps_to_train's long budget can; a diverged one never will).",
                     markdown_table(board_rows(table, depth), index=False))
        page.add(*waiting_line(waiting, depth))
    if table.empty:
        return
    extend = grid_extensions(table, name)
    if extend:
        page.add("Cells whose grid may not hold their optimum or their frontier. The rule: where no rate trained "
                 "every seed, the ladder's next rate below the lowest (1-3-10, half a decade a rung); where the best "
                 "rate trained a seed and is an end of the grid, the next rate past that end; the same battery, "
                 "until neither holds; the cell then waits for its new runs:", *(f"- {line}" for line in extend))
    page.add("The frontier per depth (the largest grid rate at which every seed trained and none diverged):",
             markdown_table(frontier_table(table)))
    slopes = frontier_slopes(whole)
    if not slopes.empty:
        page.add("The frontier's slope against depth, log(frontier) on log(depth), per scheme through each seed's "
                 "bracket on the grid (the largest rate it trained at, the next above at which it did not: a factor "
                 "of about 3.3, so the 95% interval is wide; `experiment=board_frontier` bisects each cell under this "
                 "battery: \"The board's frontier, bisected\", below):",
                 markdown_table(slopes, index=False))


def board_dashboard(evidence: Evidence, name: str) -> dict[str, pd.DataFrame]:
    """The board per depth (`board/L<depth>`) and the grid's frontier against depth."""
    every = evidence.runs(name)
    runs = whole_cells(every, evidence.study_dir(name))
    table = board(runs, evidence.layers(name))
    if table.empty or unranked(every, runs):
        return {}
    out = {f"board/L{depth}": board_rows(table, int(depth)) for depth in sorted(table["depth"].unique())}
    out["frontier/slopes"] = frontier_slopes(runs)
    out["frontier_vs_depth"] = charted(table[["norm", "depth", "frontier"]], "depth", "frontier",
                                       "largest rate of the grid at which every seed trained, against depth")
    return out


BOARD = Study("board", "The board: every scheme at its own best rate",
              "Every registered scheme at depths 6, 24 and 100, four rates from 3e-4 to 1e-2, two seeds, 500 steps "
              "each; ranked per depth by the loss at its best rate, within the seeds' noise (the rules: "
              "deepnorm_exp/analysis/board.py).", board_section, dashboard=board_dashboard)
