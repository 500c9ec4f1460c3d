"""The board: every registered scheme at its own best learning rate per depth, ranked, with what the seeds can
and cannot tell apart (experiment=board; one scheme's row beside it: experiment=scorecard).

The rules, fixed before the board's runs (tests/test_board.py holds each against hand-made records):

* The battery (conf/experiment/board.yaml): depths 6, 24, 100; a grid of four rates (3e-4 to 1e-2, which holds
  the learning-rate study's best rates of Post-LN, Pre-LN and DeepNorm); two seeds; each run trains the whole
  budget (its final loss is what ranks) unless the divergence rule stops it. A comparison is made only between
  rows of the same battery (`battery`): a scorecard run at another budget or grid is refused, not ranked.
* A scheme's loss at a rate, its best rate, the flag where the best rate is an end of the grid and its LR
  sensitivity are the learning-rate study's (lr_study.py): the final eval loss capped at the loss at
  initialisation (a diverged run counts as its initial loss), the rate of the lowest mean over the seeds.
* Noise: the seeds' spread pooled over every cell of the depth whose seeds all completed and trained (a
  pooled standard deviation: the spread of one scheme's two seeds alone is too rough a guess). Scheme A ranks
  above B only when B's loss exceeds A's by more than NOISE_SE standard errors of the difference,
  sd_pooled * sqrt(1/n_A + 1/n_B); a scheme's rank is one more than the number of schemes surely better. Equal
  ranks are within noise of each other; `ties` names the schemes within noise of each row.
* Steps-to-train at the best rate: the first evaluation by which half the seeds had learned 10% of the
  unigram-to-optimal gap (steps_to_train.median_steps; censored seeds never trained).
* Frontier, at the grid's resolution: the largest rate at which every seed trained and none diverged; "above"
  where that is the grid's top rate, "below" where no rate is; per scheme its change from the shallowest depth
  to the deepest (the grid's factor bounds what it can show: exact bisection is experiment=frontier_depth's).
* Collapse at initialisation: the last block's token cosine at step 0 (mean over the runs that recorded it;
  the diagnosis calls 0.99 or more collapsed).
* Failures: the diagnosis of every run of the scheme's grid at the depth that did not train.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd

from .lr_study import LR, capped_losses, lr_summary
from .page import Page, Study, charted, markdown_table
from .steps_to_train import median_steps
from .tables import norm_depth_table
from ..lifecycle.diagnosis import COLLAPSED_COSINE

if TYPE_CHECKING:
    from .evidence import Evidence

NOISE_SE = 2.0  # standard errors of a difference that make it a ranking
BATTERY_KEYS = ("train.steps", "train.batch_size", "train.seq_len", "train.schedule", "model.d_model", "data.name")


def pooled_sd(runs: pd.DataFrame) -> pd.Series:
    """Per depth, the seeds' standard deviation pooled over the cells (scheme, rate) whose seeds all completed and
    trained, two or more of them (NaN where no cell has)."""
    losses = capped_losses(runs)
    out = {}
    for depth, at_depth in losses.groupby("depth"):
        squares, dof = 0.0, 0
        for _, cell in at_depth.groupby(["norm", "lr"]):
            if len(cell) >= 2 and cell["trained"].all():
                squares += float(((cell["loss"] - cell["loss"].mean()) ** 2).sum())
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
    sits on the grid ("above": the top rate; "below": none)."""
    losses = capped_losses(runs)
    rows = []
    for (norm, depth), group in losses.groupby(["norm", "depth"]):
        rates = sorted(group["lr"].unique())
        stable = [lr for lr, cell in group.groupby("lr") if cell["trained"].all() and not cell["status"].eq("diverged").any()]
        top = max(stable) if stable else math.nan
        where = "below" if not stable else "above" if top == rates[-1] else ""
        rows.append({"norm": norm, "depth": int(depth), "frontier": top, "where": where})
    return pd.DataFrame(rows, columns=["norm", "depth", "frontier", "where"])


def init_cosine(layers: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: the last block's token cosine at step 0, the mean over the runs that recorded it."""
    columns = ["norm", "depth", "init_cosine"]
    if layers.empty or "token_cosine" not in layers:
        return pd.DataFrame(columns=columns)
    at_init = layers[(layers["step"] == 0)].dropna(subset=["token_cosine"])
    if at_init.empty:
        return pd.DataFrame(columns=columns)
    last = at_init.sort_values("position").groupby(["norm", "depth", "run_name"]).tail(1)  # a scorecard twin shares the name
    table = last.groupby(["norm", "depth"])["token_cosine"].mean().rename("init_cosine").reset_index()
    table["depth"] = table["depth"].astype(int)
    return table[columns]


def failures(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: "2 diverged, 1 stuck_on_plateau": how the runs of its grid that did not train ended."""
    ended = runs[runs["status"].isin(("completed", "diverged"))] if "status" in runs else runs
    rows = []
    for (norm, depth), group in ended.groupby(["norm", "depth"]):
        failed = group[~(group["trained"].eq(True) & group["status"].eq("completed"))]
        kinds = np.where(failed["status"].eq("diverged"), "diverged",
                         failed.get("diagnosis.kind", pd.Series("none", index=failed.index)).fillna("none"))
        counts = pd.Series(kinds, dtype=object).value_counts()
        rows.append({"norm": norm, "depth": int(depth),
                     "failures": ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))})
    return pd.DataFrame(rows, columns=["norm", "depth", "failures"])


def best_rate_steps(runs: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: the median steps-to-train of its seeds at its best rate, and how many trained."""
    rows = []
    for row in summary.itertuples():
        at = runs[(runs["norm"] == row.norm) & (runs["depth"].astype(int) == row.depth)
                  & (pd.to_numeric(runs[LR], errors="coerce") == row.best_lr) & runs["status"].isin(("completed", "diverged"))]
        trained_at = pd.to_numeric(at.get("trained_at_step", pd.Series(np.nan, index=at.index)), errors="coerce")
        rows.append({"norm": row.norm, "depth": row.depth, "steps_to_train": median_steps(trained_at),
                     "trained_by_budget": f"{int(trained_at.notna().sum())}/{len(at)}"})
    return pd.DataFrame(rows, columns=["norm", "depth", "steps_to_train", "trained_by_budget"])


def board(runs: pd.DataFrame, layers: pd.DataFrame = pd.DataFrame()) -> pd.DataFrame:
    """One row per scheme and depth, ranked within the depth (the module docstring's rules)."""
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
    """The page's table at one depth: rank, the loss at the best rate with its standard error, the rate (and
    the grid's edge), LR sensitivity, steps-to-train, the frontier, the collapse at init and the failures."""
    rows = table[table["depth"] == depth]
    loss = [f"{r.loss:.3f}" + (f" ± {r.se:.3f}" if math.isfinite(r.se) else "") for r in rows.itertuples()]
    rate = [f"{r.best_lr:g}" + (f" ({r.edge} edge)" if r.edge else "") for r in rows.itertuples()]
    steps = [("never" if not math.isfinite(r.steps_to_train) else f"{r.steps_to_train:.0f}") + f" ({r.trained_by_budget})"
             for r in rows.itertuples()]
    frontier = [(f"{r.frontier:g}" if math.isfinite(r.frontier) else "") + (f" ({r.where})" if r.where else "")
                for r in rows.itertuples()]
    cosine = [("" if not math.isfinite(r.init_cosine) else f"{r.init_cosine:.3f}"
               + (" (collapsed)" if r.init_cosine >= COLLAPSED_COSINE else "")) for r in rows.itertuples()]
    return pd.DataFrame({"rank": rows["rank"].to_numpy(), "norm": rows["norm"].to_numpy(), "loss ± se": loss,
                         "best lr": rate, "lr sensitivity": rows["sensitivity"].round(3).to_numpy(),
                         "steps to train": steps, "frontier": frontier, "cosine at init": cosine,
                         "within noise of": rows["ties"].to_numpy(), "failures": rows["failures"].fillna("").to_numpy()})


def frontier_table(table: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: the frontier rate (at the grid's resolution), and its change from the shallowest depth."""
    cells: dict[str, dict[int, str]] = {}
    for r in table.itertuples():
        cells.setdefault(r.norm, {})[int(r.depth)] = ((f"{r.frontier:g}" if math.isfinite(r.frontier) else "")
                                                      + (f" ({r.where})" if r.where else ""))
    return norm_depth_table(cells, sorted(cells))


def battery(runs: pd.DataFrame) -> dict[str, tuple]:
    """What a board's runs share and a scorecard must share with them: the budget and data (BATTERY_KEYS), the
    grid of rates, the seeds and the depths."""
    shared = {key: tuple(sorted(runs[key].dropna().astype(str).unique())) for key in BATTERY_KEYS if key in runs}
    shared.update(rates=tuple(sorted(pd.to_numeric(runs[LR], errors="coerce").dropna().unique())),
                  seeds=tuple(sorted(runs["seed"].unique())), depths=tuple(sorted(runs["depth"].astype(int).unique())))
    return shared


def battery_differences(board_runs: pd.DataFrame, candidate: pd.DataFrame) -> list[str]:
    """"train.steps: 200 here, 500 on the board": where a scorecard's battery is not the board's (empty: same)."""
    ours, theirs = battery(candidate), battery(board_runs)
    return [f"{key}: {', '.join(map(str, ours.get(key, ())))} here, {', '.join(map(str, value))} on the board"
            for key, value in theirs.items() if ours.get(key, ()) != value]


def board_section(page: Page, evidence: Evidence, name: str) -> None:
    runs = evidence.runs(name)
    table = board(runs, evidence.layers(name))
    if table.empty:
        page.add("No run has ended yet.")
        return
    sds = pooled_sd(runs)
    for depth in sorted(table["depth"].unique()):
        sd = sds.get(int(depth), math.nan)
        spread = (f"the seeds' spread pooled over the depth's trained cells is {sd:.4f}, so a difference ranks only "
                  f"beyond {NOISE_SE:g} standard errors of it" if math.isfinite(sd) else
                  "no cell of the depth has every seed trained, so the seeds' spread is not known and no difference ranks")
        page.add(f"### Depth {depth}", f"Ranked by the final eval loss at each scheme's best rate (capped at the loss "
                 f"at initialisation); {spread}; equal ranks are within noise.",
                 markdown_table(board_rows(table, int(depth)), index=False))
    page.add("The frontier per depth (the largest grid rate at which every seed trained and none diverged):",
             markdown_table(frontier_table(table)))


def board_dashboard(evidence: Evidence, name: str) -> dict[str, pd.DataFrame]:
    """The board per depth (`board/L<depth>`) and the grid's frontier against depth."""
    table = board(evidence.runs(name), evidence.layers(name))
    if table.empty:
        return {}
    out = {f"board/L{depth}": board_rows(table, int(depth)) for depth in sorted(table["depth"].unique())}
    out["frontier_vs_depth"] = charted(table[["norm", "depth", "frontier"]], "depth", "frontier",
                                       "largest rate of the grid at which every seed trained, against depth")
    return out


BOARD = Study("board", "The board: every scheme at its own best rate",
              "Every registered scheme at depths 6, 24 and 100, four rates from 3e-4 to 1e-2, two seeds, 500 steps "
              "each; ranked per depth by the loss at its best rate, within the seeds' noise (the rules: "
              "deepnorm_exp/analysis/board.py).", board_section, dashboard=board_dashboard)
