"""Slow or unstable: how many steps each run took to train, read with censoring (experiment=steps_to_train).

The studies before this one judged "Post-LN fails with depth" on 300 steps, and a run still on the unigram
plateau at step 300 read as failed; Post-LN at depth 18 leaves that plateau by step 600-900 (budget_study).
The paper's failures are divergence and runs that "did not converge" within its budget (its IWSLT depth sweep
trained 8,000 steps, "since most divergence occurs at the beginning of optimization"). So each run here trains
until it has trained (`train.stop_when_trained`: the 10% rule, `summary.trained_at_step`) or to a budget ten
times the old one, and ends as one of:

* trained at step t (its steps-to-train, on the evaluation grid);
* diverged without having trained (the divergence rule stopped it);
* censored: it ran the whole budget without training (its diagnosis says why: plateau, collapse, ...).

Per cell (scheme, depth, rate): the share of seeds trained by the old budget (SHORT_BUDGET) and by the run's
budget, and the median steps-to-train, the first step by which half the seeds had trained (every censored seed
ran the whole budget, so this is the Kaplan-Meier median; a diverged seed never trains). Per scheme and depth,
its best rate: the largest share of seeds trained, then the smallest median (none counts as infinite).

The rules (fixed before the study's runs; tests/test_steps_to_train.py holds each against frames where it is
false): a scheme *fails* at a depth when no seed at any rate trained within the budget; it *trains early* there
when every seed at its best rate trained by SHORT_BUDGET. "Post-LN becomes unstable with depth" is reproduced
when Post-LN fails at the deepest depth and trains at the shallowest, while Pre-LN or DeepNorm trains early at
the deepest; not reproduced when Post-LN trains at every depth (then the numbers say how much slower it is);
not testable when no other scheme trains early at the deepest depth (the budget, not the scheme, decides)
or when Post-LN fails at the shallowest depth too; the data cannot tell (cannot_tell.py) when the rates tried at
the deepest depth reach no lower than its best rate at the nearest shallower depth where it trained
(`below_its_range`, added after the study's first 96 runs, with the grid's 1e-4 and before its runs: a
deeper model takes a lower rate, and Post-LN's only rate that trained at L18 was the grid's lowest), or when
Post-LN fails at a depth between and trains at the deepest. "DeepNorm trains at every depth": every DeepNorm
seed at its best rate trained within the budget at every depth. Records these rules cannot read (`unreadable`:
a crashed run, runs of two budgets) make every claim that reads them not testable, saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .cannot_tell import CANNOT_TELL, Met
from .escape import md_text
from .page import Page, Study, charted, markdown_table, unmeasured_note
from .plots import NORM_NAMES, depth_axis, empty, norm_colors, norms_in
from .runs import config_column, outcomes
from .tables import counted
from ..lifecycle.summary import TRAINED_FRACTION

if TYPE_CHECKING:
    from .evidence import Evidence

SHORT_BUDGET = 300  # the studies' budget before this one: a scheme that trains by it "trains early"
CELL = ["norm", "depth", "lr"]


def run_outcomes(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run that ended: its cell, seed, budget, steps-to-train (NaN: never) and how it ended
    (diverged, whether or not it had trained first, as a run not stopped once trained may; else trained, else
    censored), with its diagnosis where it did not train."""
    ended = outcomes(runs)
    if ended.empty:
        return pd.DataFrame(columns=[*CELL, "seed", "budget", "trained_at", "ended", "why"])
    trained_at = pd.to_numeric(ended.get("trained_at_step", pd.Series(np.nan, index=ended.index)), errors="coerce")
    ended_as = np.where(ended["status"].eq("diverged"), "diverged", np.where(trained_at.notna(), "trained", "censored"))
    why = ended.get("diagnosis.kind", pd.Series(None, index=ended.index)).fillna("none")
    return pd.DataFrame({"norm": ended["norm"], "depth": ended["depth"].astype(int),
                         "lr": pd.to_numeric(config_column(ended, "train.lr"), errors="coerce"),
                         "seed": ended["seed"], "budget": pd.to_numeric(ended["steps"], errors="coerce"),
                         "trained_at": trained_at, "ended": ended_as,
                         "why": np.where(ended_as == "trained", "", np.where(ended_as == "diverged", "diverged", why))})


def median_steps(trained_at: pd.Series) -> float:
    """The first step by which half the seeds had trained (NaN where fewer than half ever did)."""
    times = np.sort(trained_at.dropna().to_numpy())
    needed = int(np.ceil(len(trained_at) / 2))
    return float(times[needed - 1]) if len(times) >= needed else float("nan")


def cell_table(ran: pd.DataFrame) -> pd.DataFrame:
    """Per cell: seeds, trained by SHORT_BUDGET and by the budget (counts), the median steps-to-train, and
    how the seeds that did not train ended."""
    rows = []
    for (norm, depth, lr), cell in ran.groupby(CELL, sort=True, dropna=False):  # a run of unknown rate counts
        rows.append({"norm": norm, "depth": depth, "lr": lr, "seeds": len(cell), "budget": int(cell["budget"].max()),
                     "by_short": int((cell["trained_at"] <= SHORT_BUDGET).sum()),
                     "by_budget": int(cell["trained_at"].notna().sum()),
                     "median": median_steps(cell["trained_at"]),
                     "not_trained": counted(cell.loc[cell["trained_at"].isna(), "why"])})
    return pd.DataFrame(rows, columns=[*CELL, "seeds", "budget", "by_short", "by_budget", "median", "not_trained"])


def best_rates(cells: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth, the cell of its best rate: the largest share of seeds trained by the budget, then
    the smallest median steps-to-train, then the most trained by SHORT_BUDGET, then the smaller rate. (Until
    the review of 2026-12-05, with 86 of the study's 96 runs ended, the median came first: with two seeds it is the
    faster seed's step, so a rate where one seed trained at step 100 and the other diverged ranked above one
    where both trained by 150. On the records then, no best rate changed.)"""
    if cells.empty:
        return cells
    ranked = cells.assign(_share=cells["by_budget"] / cells["seeds"], _median=cells["median"].fillna(np.inf))
    ranked = ranked.sort_values(["norm", "depth", "_share", "_median", "by_short", "lr"],
                                ascending=[True, True, False, True, False, True])
    return (ranked.groupby(["norm", "depth"], sort=True).head(1).drop(columns=["_share", "_median"])
            .reset_index(drop=True))


def unreadable(runs: pd.DataFrame) -> Optional[str]:
    """Why a study's runs cannot be read by these rules, or None: a run that crashed (status failed) is a seed
    the rules have not seen, not one that failed to train (the sweep, run again, resumes it); and a censored
    run counts as untrained within *the* budget, so runs of two budgets in one study are not read as one."""
    failed = runs[runs["status"].eq("failed")] if "status" in runs else runs.iloc[:0]
    if len(failed):
        names = ", ".join(map(str, failed["run_name"].head(3))) + (", ..." if len(failed) > 3 else "")
        return (f"{len(failed)} run{'s' * (len(failed) > 1)} crashed ({names}): the rules read every seed; the "
                "sweep, run again, resumes them")
    budgets = sorted(pd.to_numeric(runs.get("steps", pd.Series(dtype=float)), errors="coerce").dropna().unique())
    if len(budgets) > 1:
        return (f"runs of {len(budgets)} budgets ({', '.join(f'{int(b):,}' for b in budgets)} steps) in one study: "
                "the rules read one")
    return None


def at_long_budget(ran: pd.DataFrame, norm: str, depth: int, finished: bool) -> str:
    """What this study's long budget says of `norm` at `depth` (`run_outcomes`' rows), for a study of a
    shorter budget in which no rate trained there: it trains, only slower; it trains at no rate of the grid
    (each run's end counted); or nothing can be said yet. A trained run settles it even before the sweep
    has finished; "at no rate" waits for every run."""
    of = ran[(ran["norm"] == norm) & (ran["depth"] == depth)]
    trained = of[of["trained_at"].notna()].sort_values(["trained_at", "lr"])
    if not trained.empty:
        first = trained.iloc[0]
        return (f"trains within {int(first['budget']):,} steps (first at lr {first['lr']:.3g}, by step "
                f"{int(first['trained_at'])}; {len(trained)} of {len(of)} runs): slower, not unstable")
    if of.empty:
        return "no run at the long budget at this depth"
    if not finished:
        return f"none of its {len(of)} runs at the long budget has trained so far (the sweep has not finished)"
    return (f"trains at no rate ({of['lr'].min():.3g} to {of['lr'].max():.3g}) within {int(of['budget'].max()):,} "
            f"steps ({len(of)} runs: {md_text(counted(of['why']))})")  # diagnosis kinds: record values


def fails(cells: pd.DataFrame, norm: str, depth: int) -> bool:
    """No seed of `norm` at any rate trained within the budget at `depth`."""
    of = cells[(cells["norm"] == norm) & (cells["depth"] == depth)]
    return not of.empty and int(of["by_budget"].sum()) == 0


def below_its_range(cells: pd.DataFrame, best: pd.DataFrame, norm: str, depth: int) -> Optional[str]:
    """Why `norm` failing at `depth` may be the grid's, or None: a deeper model takes a lower rate (the
    learning-rate study: Post-LN's best rate falls with depth), so a failure counts only where the rates tried
    reach below the best rate at the nearest shallower depth where `norm` trained."""
    trained = best[(best["norm"] == norm) & (best["depth"] < depth) & (best["by_budget"] > 0)]
    tried = cells.loc[(cells["norm"] == norm) & (cells["depth"] == depth), "lr"].dropna()
    if trained.empty or tried.empty:
        return None
    nearest = trained.sort_values("depth").iloc[-1]
    if tried.min() < nearest["lr"] * (1 - 1e-9):
        return None
    return (f"{NORM_NAMES[norm]} trained at no rate at L{depth}, but the lowest rate tried there ({tried.min():.3g}) "
            f"is no lower than its best rate at L{nearest['depth']} ({nearest['lr']:.3g}): a lower rate may train")


def how_far(runs: pd.DataFrame, norm: str, depth: int) -> str:
    """How far the runs of a failed cell got: how many diverged, and the largest share of the gap any closed
    (a run that learned 4% by the budget is slow, not stuck: the reader sees which)."""
    of = runs[(runs["norm"] == norm) & (runs["depth"] == depth)]
    diverged = int(of["status"].eq("diverged").sum())
    learned = pd.to_numeric(of.get("learned_fraction", pd.Series(dtype=float)), errors="coerce").dropna()
    return f"{diverged or 'none'} of its {len(of)} runs diverged{_most_learned(learned)}"


def _most_learned(learned: pd.Series) -> str:
    """The largest share closed, as the page prints it; a best that prints as no gain says so in words (every run
    ended a hair above the unigram loss reads "none closed any", not "the most any closed -0.1%")."""
    if learned.empty:
        return ""
    if round(float(learned.max()), 3) <= 0:
        return f", none closed any of the unigram-to-optimal gap (the most: {learned.max():.1%})"
    return f", the most any closed {learned.max():.1%} of the unigram-to-optimal gap ({TRAINED_FRACTION:.0%} trains)"


def trains_early(best: pd.DataFrame, norm: str, depth: int) -> bool:
    """Every seed of `norm` at its best rate trained by SHORT_BUDGET at `depth`."""
    row = best[(best["norm"] == norm) & (best["depth"] == depth)]
    return not row.empty and int(row["by_short"].iloc[0]) == int(row["seeds"].iloc[0])


def describe(best: pd.DataFrame, norm: str) -> str:
    """"post: L6 100 (2/2), L100 none (0/2: 2 stuck_on_plateau)": median steps-to-train at the best rate."""
    parts = []
    for row in best[best["norm"] == norm].itertuples():
        median = "none" if np.isnan(row.median) else f"{row.median:.0f}"
        failed = f": {md_text(row.not_trained)}" if row.not_trained else ""  # diagnosis kinds: record values
        parts.append(f"L{row.depth} {median} ({row.by_budget}/{row.seeds} by {row.budget}{failed})")
    return f"{norm}: " + ", ".join(parts)


def post_unstable_with_depth(runs: pd.DataFrame) -> tuple[Met, str]:
    """The claim's rule (module docstring): fails, slower, or the data cannot tell."""
    if why := unreadable(runs):
        return None, why
    cells = cell_table(run_outcomes(runs))
    best = best_rates(cells)
    depths = sorted(best.loc[best["norm"] == "post", "depth"].unique())
    if len(depths) < 2:
        return None, f"Post-LN ran at {len(depths)} depth(s)"
    shallowest, deepest = depths[0], depths[-1]
    text = ("median steps-to-train at each scheme's best rate (seeds trained by the budget): "
            + "; ".join(describe(best, norm) for norm in ("post", "pre", "deepnorm") if norm in set(best["norm"])))
    if all(not fails(cells, "post", depth) for depth in depths):  # the reverse shown, whatever the others did
        return False, text + " (Post-LN trains at every depth: slower with depth where its median grows, not unstable)"
    if not any(trains_early(best, norm, deepest) for norm in ("pre", "deepnorm")):
        return None, text + f" (neither Pre-LN nor DeepNorm trains every seed by step {SHORT_BUDGET} at L{deepest})"
    if fails(cells, "post", shallowest):
        return None, text + f" (Post-LN fails at L{shallowest} too: not a depth effect)"
    if fails(cells, "post", deepest) and (grid := below_its_range(cells, best, "post", deepest)):
        return CANNOT_TELL, text + f" ({grid}: the data cannot tell)"
    if fails(cells, "post", deepest):
        how = how_far(runs, "post", deepest)
        return True, text + f" (Post-LN fails at L{deepest}: no seed at any rate trained; {how})"
    return CANNOT_TELL, text + " (Post-LN fails at a depth between, not at the deepest: the data cannot tell)"


def deepnorm_trains_everywhere(runs: pd.DataFrame) -> tuple[Optional[bool], str]:
    if why := unreadable(runs):
        return None, why
    best = best_rates(cell_table(run_outcomes(runs)))
    of = best[best["norm"] == "deepnorm"]
    if of.empty:
        return None, "no DeepNorm run"
    return bool((of["by_budget"] == of["seeds"]).all()), "median steps-to-train at its best rate: " + describe(best, "deepnorm")


def steps_figure(best: pd.DataFrame):
    """Median steps-to-train at each scheme's best rate against depth, a line per scheme; a depth where fewer
    than half the seeds trained is drawn as an open triangle at the budget (censored: at least that)."""
    if best.empty:
        return empty("Steps to train against depth", "no run has ended yet")
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    colors = norm_colors(norms_in(best))
    for norm, rows in best.groupby("norm", sort=True):
        rows = rows.sort_values("depth")
        trained = rows[rows["median"].notna()]
        ax.plot(trained["depth"], trained["median"], marker="o", color=colors[norm], label=norm)
        censored = rows[rows["median"].isna()]
        ax.plot(censored["depth"], censored["budget"], marker="^", linestyle="none", markerfacecolor="none",
                markersize=9, color=colors[norm], label=f"{norm}: not trained by the budget" if len(censored) else None)
    depth_axis(ax, sorted(best["depth"].unique()))
    ax.set(yscale="log", xlabel="depth", ylabel="median steps to train (best rate)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.suptitle("Steps to train against depth")
    return fig


def steps_section(page: Page, evidence: Evidence, name: str) -> None:
    """A steps-to-train study's cells: trained by the old budget and by the run's, the censored median, how the
    rest ended, and each scheme's best rate per depth."""
    cells = cell_table(run_outcomes(evidence.runs(name)))
    page.add(f"Per scheme, depth and rate: seeds trained by step {SHORT_BUDGET} (`by_short`) and "
             "by the budget (`by_budget`), the median steps-to-train (the first step by which half the seeds had "
             "trained; empty: fewer than half ever did), and how the others ended (diverged, or their diagnosis):",
             markdown_table(cells, index=False) + unmeasured_note(evidence.runs(name)))
    best = best_rates(cells)
    page.add("Each scheme's best rate per depth (the largest share of seeds trained, then the smallest median):",
             markdown_table(best, index=False))
    if best["depth"].nunique() > 1:  # against depth: one depth (1,000 layers) is the table alone
        page.figure(name, steps_figure(best), "Median steps to train at each scheme's best rate against depth; "
                    "open triangles: fewer than half the seeds trained by the budget (at least that many steps).")


def steps_dashboard(evidence: Evidence, name: str) -> dict[str, pd.DataFrame]:
    """Every cell, and the median steps-to-train at each scheme's best rate against depth (a depth where fewer
    than half the seeds trained has no point: see the cells)."""
    cells = cell_table(run_outcomes(evidence.runs(name)))
    if cells.empty:
        return {}
    best = best_rates(cells)
    return {"steps/cells": cells, "steps/best_rates": best,
            "steps_vs_depth": charted(best[["norm", "depth", "median"]], "depth", "median",
                                      "median steps to train at the best rate, against depth")}


DECODER = Study("steps_to_train", "Slow or unstable: steps to train against depth",
                "Post-LN, Pre-LN and DeepNorm at depths 6-100, rates 1e-4 to 1e-2, two seeds, each run trained "
                "until it has trained or for 3,000 steps (ten times the other studies' 300); steps-to-train read "
                "with censoring (the rules: deepnorm_exp/analysis/steps_to_train.py).", steps_section, dashboard=steps_dashboard)
ENCDEC = Study("steps_to_train_encdec", "Slow or unstable, encoder-decoder",
               "The same on N-N encoder-decoders and the synthetic translation task, N = 6, 24, 100, rates 3e-5 to "
               "3e-3, two seeds, until trained or 3,000 steps.",
               steps_section, dashboard=steps_dashboard)
FP16 = Study("precision_fp16", "Mixed precision, as the paper trained",
             "Post-LN and DeepNorm in fp16 with dynamic loss scaling at two depths and a rate where fp32 Post-LN "
             "trains at both (the preset), two seeds, steps_to_train's training, each run for its whole budget.",
             steps_section, dashboard=steps_dashboard)
THOUSAND_LAYERS = Study("encdec_1000l", "1,000 layers at this width",
                        "DeepNorm and Pre-LN 500L-500L encoder-decoders at d_model 64 on the synthetic translation task, "
                        "one seed each, the encoder-decoder depth sweep's training, each until it has trained or for "
                        "2,000 steps.", steps_section, dashboard=steps_dashboard)
