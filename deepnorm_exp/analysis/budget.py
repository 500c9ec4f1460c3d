"""Does the order of the schemes change with training length? Each run of the budget study trains the longest
budget once; under the inverse-sqrt schedule (whose rate at a step does not depend on the run's length) its eval
loss at step b is that of a run of b steps, so one run holds every shorter budget.

The rules, fixed before the study's runs were made (conf/experiment/budget_study.yaml says the same):

* The budgets are the eval steps the preset names (`BUDGETS`); a run's loss at a budget is its eval loss at
  that step (a run that diverged before it has none there).
* A run has converged at its longest budget when its eval loss fell, over the last quarter of its steps, by
  less than 2% of the gap from the unigram loss to the optimal one (the data's own scale: 2% of what there is
  to learn); the final-quality claims are judged only on converged runs, and say "not testable at this
  budget" where one of the runs compared has not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ..lifecycle.diagnosis import CONVERGED_FALL, loss_fall
from .page import Page, Study, by_depth, markdown_table
from .tables import norm_depth_table
from .plots import norms_in

if TYPE_CHECKING:
    from .evidence import Evidence

BUDGETS = (300, 1200, 4800)  # steps; the preset evaluates every 300, which holds each of them


def evals(scalars: pd.DataFrame) -> pd.DataFrame:
    """run_name, step, eval_loss: the evaluations of every run."""
    if scalars.empty or "eval_loss" not in scalars:
        return pd.DataFrame(columns=["run_name", "step", "eval_loss"])
    return scalars.loc[scalars["eval_loss"].notna(), ["run_name", "step", "eval_loss"]]


def with_convergence(runs: pd.DataFrame, scalars: pd.DataFrame) -> pd.DataFrame:
    """`runs` with `fall` (the eval loss's fall over the last quarter of the run's steps, in units of the
    unigram-to-optimal gap: lifecycle/diagnosis.py's `loss_fall`, strict: the evaluation exactly at 3/4) and
    `converged` (a completed run whose fall is under CONVERGED_FALL, the per-run diagnosis's threshold)."""
    ev = evals(scalars)
    by_run = {name: group.set_index("step")["eval_loss"] for name, group in ev.groupby("run_name")}
    falls = [loss_fall(by_run.get(run.run_name, pd.Series(dtype=float)), int(run.steps), run.unigram_loss,
                       run.optimal_loss, strict=True) for run in runs.itertuples()]
    out = runs.assign(fall=falls)
    return out.assign(converged=out["status"].eq("completed") & (out["fall"] < CONVERGED_FALL))


def budget_losses(runs: pd.DataFrame, scalars: pd.DataFrame) -> pd.DataFrame:
    """norm, depth, budget -> mean and std of the eval loss at that step over the seeds, and the seeds."""
    ev = evals(scalars)
    ev = ev[ev["step"].isin(BUDGETS)].merge(runs[["run_name", "norm", "depth"]], on="run_name")
    grouped = ev.groupby(["norm", "depth", "step"])["eval_loss"]
    return pd.DataFrame({"mean": grouped.mean(), "std": grouped.std(), "seeds": grouped.size()}).reset_index().rename(
        columns={"step": "budget"})


def budget_table(losses: pd.DataFrame) -> pd.DataFrame:
    """(depth, budget) x norm: "mean ± std", and per row the schemes in order of loss, best first."""
    if losses.empty:
        return pd.DataFrame()
    norms = norms_in(losses)
    rows = []
    for (depth, budget), at in losses.groupby(["depth", "budget"]):
        at = at.set_index("norm")
        row = {"depth": int(depth), "steps": int(budget)}
        for norm in norms:
            if norm in at.index:
                m, s = at.loc[norm, "mean"], at.loc[norm, "std"]
                row[norm] = f"{m:.3f}" + (f" ± {s:.3f}" if pd.notna(s) else "")
        row["order (best first)"] = " < ".join(at["mean"].sort_values().index)
        rows.append(row)
    return pd.DataFrame(rows)


def order_changes(losses: pd.DataFrame) -> dict[int, bool]:
    """depth -> whether the schemes' order by mean loss differs between any two budgets."""
    table = budget_table(losses)
    return {int(d): g["order (best first)"].nunique() > 1 for d, g in table.groupby("depth")} if len(table) else {}


def convergence_table(runs: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: each seed's fall over the last quarter (`with_convergence`), "(not converged)" marked."""
    if runs.empty:
        return pd.DataFrame()
    cells: dict[str, dict[int, str]] = {}
    for (norm, depth), group in runs.sort_values("seed").groupby(["norm", "depth"]):
        cells.setdefault(norm, {})[int(depth)] = " / ".join(
            ("–" if pd.isna(r.fall) else f"{r.fall:.3f}") + ("" if r.converged else " (not converged)")
            for r in group.itertuples())
    return norm_depth_table(cells, norms_in(runs))


def budget_figure(runs: pd.DataFrame, scalars: pd.DataFrame):
    """Eval loss against steps, a panel per depth, a line per scheme (mean over seeds); dotted: the budgets."""
    from .plots import empty, norm_colors, panels

    ev = evals(scalars).merge(runs[["run_name", "norm", "depth"]], on="run_name")
    if ev.empty:
        return empty("Eval loss against steps", "no evaluations (experiment=budget_study)")
    depths = sorted(ev["depth"].unique())
    colors = norm_colors(norms_in(ev))
    fig, axes = panels(len(depths), "Eval loss against steps, each scheme at its own best rate")
    for ax, depth in zip(axes, depths):
        curves = ev[ev["depth"] == depth].groupby(["norm", "step"])["eval_loss"].mean()
        for norm in norms_in(ev[ev["depth"] == depth]):
            curve = curves.loc[norm]
            ax.plot(curve.index, curve.to_numpy(), color=colors[norm], marker=".", label=norm)
        for budget in BUDGETS:
            ax.axvline(budget, color="grey", linestyle=":", linewidth=1)
        ax.set(xscale="log", xlabel="step", title=f"L{depth}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("eval loss")
    return fig


def budget_section(page: Page, evidence: Evidence, name: str) -> None:
    runs, scalars = evidence.runs(name), evidence.every_runs_scalars(name)
    losses = budget_losses(runs, scalars)
    changes = order_changes(losses)
    page.add("Eval loss (mean ± std over the seeds) at each budget, and the schemes in order of it: the order "
             + ("changes with the budget at " + ", ".join(f"L{d}" for d, c in changes.items() if c)
                if any(changes.values()) else "does not change with the budget") + ".",
             markdown_table(budget_table(losses), index=False))
    page.add("Converged at the longest budget? The eval loss's fall over the last quarter of the steps, in units "
             f"of the unigram-to-optimal gap, per seed (converged: under {CONVERGED_FALL}):",
             markdown_table(by_depth(convergence_table(with_convergence(runs, scalars)))))
    page.figure(name, budget_figure(runs, scalars),
                "Eval loss against steps, a panel per depth, a line per scheme (dotted: the budgets).")


BUDGET = Study("budget_study", "Training length on the synthetic language (a second view, not judged)",
               "Post-LN, Pre-LN and DeepNorm at depths 6 and 18, two seeds, each at its best rate from the "
               "learning-rate study (conf/tuned_lr/lr_study.yaml), 4,800 steps read at 300, 1,200 and 4,800 (the "
               "rules: deepnorm_exp/analysis/budget.py).", budget_section)
