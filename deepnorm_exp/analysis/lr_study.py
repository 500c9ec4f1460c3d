"""Final loss against learning rate, per scheme and depth (Wortsman et al. 2023, "Small-scale proxies for
large-scale Transformer training instabilities"), and each scheme at its own best rate.

The rules, fixed before the study's runs were made (conf/experiment/lr_study.yaml says the same):

* A seed's loss at a rate is its final eval loss, capped at its loss at initialisation (`initial_eval_loss`):
  min(loss(lr), loss at init), so a rate that diverged or trained into a worse state than the start counts as
  no better than the start. A diverged run counts as its initial loss; a run that failed (crashed) or has not
  finished is left out and counted.
* The best rate of a scheme at a depth: the grid rate with the lowest mean capped loss over the seeds. A best
  rate at either end of the grid is flagged: the optimum may lie beyond.
* LR sensitivity: the mean over the grid of [mean capped loss(lr) - the best mean capped loss]: 0 when every
  rate is as good as the best, large when few rates train.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd

from .. import records
from .page import Page, Study, by_depth, diagnoses, markdown_table
from .tables import norm_depth_table
from .plots import depth_color, empty, norms_in, panels
from .timing import FINAL_OR_FAILED, preset_time, sweeper_setting
from ..lifecycle.summary import TRAINED_FRACTION

if TYPE_CHECKING:
    from .evidence import Evidence

LR = "train.lr"


def capped_losses(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run that ended (completed or diverged): norm, depth, seed, lr, `loss` = min(eval loss, loss at
    initialisation) with a diverged or non-finite loss counted as the loss at initialisation."""
    if runs.empty or LR not in runs:
        return pd.DataFrame(columns=["norm", "depth", "seed", "lr", "loss", "status", "trained"])
    ended = runs[runs["status"].isin(("completed", "diverged"))].copy()
    initial = pd.to_numeric(ended.get("initial_eval_loss", pd.Series(np.nan, index=ended.index)), errors="coerce")
    final = pd.to_numeric(ended["eval_loss"], errors="coerce")
    final = final.where(ended["status"].eq("completed") & np.isfinite(final), np.inf)
    ended["loss"] = np.fmin(final, initial.fillna(np.inf))
    ended["lr"] = ended[LR].astype(float)
    ended["depth"] = ended["depth"].astype(int)
    # learned 10% of the unigram-to-optimal gap (summary.trained): a best rate where nothing did is no optimum
    ended["trained"] = ended.get("trained", pd.Series(False, index=ended.index)).eq(True) & ended["status"].eq("completed")
    return ended[["norm", "depth", "seed", "lr", "loss", "status", "trained"]].reset_index(drop=True)


def lr_curves(runs: pd.DataFrame) -> pd.DataFrame:
    """norm, depth, lr -> mean and std of the capped loss over the seeds, the seeds counted, the diverged."""
    losses = capped_losses(runs)
    if losses.empty:
        return pd.DataFrame(columns=["norm", "depth", "lr", "mean", "std", "seeds", "diverged"])
    grouped = losses.groupby(["norm", "depth", "lr"])
    return pd.DataFrame({"mean": grouped["loss"].mean(), "std": grouped["loss"].std(), "seeds": grouped["loss"].size(),
                         "diverged": grouped["status"].apply(lambda s: int(s.eq("diverged").sum())),
                         "trained": grouped["trained"].sum().astype(int)}).reset_index()


def lr_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and depth: the best rate, the loss there (mean, std over seeds), LR sensitivity, whether the
    best rate lies at an end of the grid, the grid's size and the runs left out (failed or unfinished)."""
    curves = lr_curves(runs)
    rows = []
    for (norm, depth), curve in curves.groupby(["norm", "depth"]):
        curve = curve.sort_values("lr")
        if not np.isfinite(curve["mean"]).any():
            continue
        best = curve.loc[curve["mean"].idxmin()]
        edge = "low" if best["lr"] == curve["lr"].min() else "high" if best["lr"] == curve["lr"].max() else ""
        group = runs[(runs["norm"] == norm) & (runs["depth"].astype(int) == depth)]
        rows.append({"norm": norm, "depth": int(depth), "best_lr": float(best["lr"]), "loss": float(best["mean"]),
                     "loss_std": float(best["std"]) if pd.notna(best["std"]) else math.nan,
                     "seeds": int(best["seeds"]), "trained": int(best["trained"]),
                     "sensitivity": float((curve["mean"] - best["mean"]).mean()),
                     "edge": edge, "rates": len(curve),
                     "left_out": int(len(group) - group["status"].isin(("completed", "diverged")).sum())})
    return pd.DataFrame(rows, columns=["norm", "depth", "best_lr", "loss", "loss_std", "seeds", "trained",
                                       "sensitivity", "edge", "rates", "left_out"])


def partial_cells(runs: pd.DataFrame, params: object) -> dict[tuple[str, int], str]:
    """The (scheme, depth) cells whose runs do not yet cover the preset's grid of rates (hydra.sweeper.params:
    every `train.lr`, each with as many ended runs as the `seed` axis lists), each with how many rates it
    has: a best rate read from part of the grid (a sweep stopped between runs, or narrowed on the command
    line) is no tuned rate. None of them where the record holds no plain grid of rates."""
    axes = params if isinstance(params, dict) else {}
    rates_axis, seeds_axis = str(axes.get(LR, "")), str(axes.get("seed", "0"))
    if not rates_axis or "(" in rates_axis + seeds_axis:
        return {}
    rates, seeds = [float(r) for r in rates_axis.split(",")], len(seeds_axis.split(","))
    partial = {}
    for (norm, depth), cell in runs.groupby(["norm", "depth"]):
        done = cell[cell["status"].isin(FINAL_OR_FAILED)]
        whole = [r for r in rates if np.isclose(done[LR].astype(float), r, rtol=1e-9).sum() >= seeds]
        if len(whole) < len(rates):
            partial[(str(norm), int(depth))] = f"{len(whole)} of {len(rates)} rates ended"
    return partial


def tuned_lr_yaml(summary: pd.DataFrame, study: str, partial: Optional[dict] = None) -> str:
    """conf/tuned_lr/<study>.yaml: the best rate per scheme and depth, which a preset reads with
    `train.lr: ${tuned_lr:}` (deepnorm_exp/config.py), written from the records, never by hand. A cell of
    `partial` (`partial_cells`) gets no rate, a comment saying why: a preset that reads it refuses in one line."""
    partial = partial or {}
    keep = [(row.norm, int(row.depth)) not in partial for row in summary.itertuples()]
    summary = summary[keep] if len(summary) else summary
    lines = [f"# Generated by `make results` from the records of {study} (runs/{study}/published/); do not edit.",
             "# Read by `train.lr: ${tuned_lr:}` with `tuned_lr=" + study + "` (a preset: `- override /tuned_lr: " + study + "`).",
             *([f"# No records yet: `python -m deepnorm_exp -m experiment={study}`, then `make results`, fill the table."]
               if summary.empty else []),
             f"source: {study}",
             "rule: the grid rate with the lowest mean eval loss over the seeds, each capped at the loss at "
             "initialisation (deepnorm_exp/analysis/lr_study.py)",
             *(f"# {norm} L{depth}: {why}, no rate until the grid is whole" for (norm, depth), why in sorted(partial.items())),
             "rates: {}" if summary.empty else "rates:"]
    for norm in norms_in(summary):
        lines.append(f"  {norm}:")
        for row in summary[summary["norm"] == norm].sort_values("depth").itertuples():
            edge = f"  # the {row.edge} end of the grid: the optimum may lie beyond it" if row.edge else ""
            lines.append(f"    L{row.depth}: {row.best_lr!r}{edge}")
    return "\n".join(lines) + "\n"


def best_rate_table(summary: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: "loss ± std at lr" of each scheme at its own best rate ("(edge)" where the best rate is an
    end of the grid, "(k/n untrained)" where seeds learned nothing even there)."""
    if summary.empty:
        return pd.DataFrame()
    cells: dict[str, dict[int, str]] = {}
    for row in summary.itertuples():
        text = f"{row.loss:.3f}" + (f" ± {row.loss_std:.3f}" if math.isfinite(row.loss_std) else "")
        text += f" at {row.best_lr:g}" + (f" ({row.edge} edge)" if row.edge else "")
        if row.trained < row.seeds:  # no optimum where the seeds learned nothing: the least bad rate
            text += f" ({row.seeds - row.trained}/{row.seeds} untrained)"
        cells.setdefault(row.norm, {})[row.depth] = text
    return norm_depth_table(cells, norms_in(summary))


def sensitivity_table(summary: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: LR sensitivity, and per scheme how far its best rate moves from the shallowest depth to
    the deepest (their ratio; 1: it does not move on this grid)."""
    if summary.empty:
        return pd.DataFrame()
    table = summary.pivot(index="norm", columns="depth", values="sensitivity").reindex(norms_in(summary))
    moves = {}
    for norm, rows in summary.sort_values("depth").groupby("norm"):
        moves[norm] = rows["best_lr"].iloc[-1] / rows["best_lr"].iloc[0]
    table["best lr, deepest / shallowest"] = pd.Series(moves)
    table.columns.name = "depth"
    return table


def curve_table(curves: pd.DataFrame) -> pd.DataFrame:
    """(norm, depth) x lr: the mean capped loss over the seeds, "(k div)" where k of them diverged."""
    if curves.empty:
        return pd.DataFrame()
    text = curves.assign(cell=[f"{m:.3f}" + (f" ({d} div)" if d else "") for m, d in zip(curves["mean"], curves["diverged"])])
    table = text.pivot(index=["norm", "depth"], columns="lr", values="cell")
    order = {norm: i for i, norm in enumerate(norms_in(curves))}
    table = table.iloc[sorted(range(len(table)), key=lambda i: (order[table.index[i][0]], table.index[i][1]))]
    table.columns = [f"{lr:g}" for lr in table.columns]
    return table.fillna("")


def lr_figure(runs: pd.DataFrame):
    """Final loss (capped at the loss at initialisation) against learning rate, a panel per scheme, a line per
    depth (mean over seeds, bars: std); a circle marks each depth's best rate."""
    curves = lr_curves(runs)
    if curves.empty:
        return empty("Loss against learning rate", "no runs at several learning rates (experiment=lr_study)")
    norms = norms_in(curves)
    color = depth_color(curves["depth"])
    fig, axes = panels(len(norms), "Final eval loss against learning rate (capped at the loss at initialisation)")
    for ax, norm in zip(axes, norms):
        for depth, curve in curves[curves["norm"] == norm].groupby("depth"):
            curve = curve.sort_values("lr")
            ax.errorbar(curve["lr"], curve["mean"], yerr=curve["std"].fillna(0), color=color(depth), marker=".",
                        capsize=2, label=f"L{depth}")
            best = curve.loc[curve["mean"].idxmin()]
            ax.plot([best["lr"]], [best["mean"]], marker="o", markersize=9, markerfacecolor="none",
                    color=color(depth))
        ax.set(xscale="log", xlabel="learning rate", title=norm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("eval loss")
    return fig


def lr_section(page: Page, evidence: Evidence, name: str) -> None:
    """A learning-rate grid's tables and figure: each scheme at its best rate, LR sensitivity, loss against
    rate, every cell, the diagnoses."""
    runs = evidence.runs(name)
    summary = lr_summary(runs)
    page.add("Each scheme at its own best rate per depth: the mean ± std over the seeds of the final eval loss "
             "(capped at the loss at initialisation; a diverged seed counts as that), and the rate; "
             "`edge`: the best rate is an end of the grid, so the optimum may lie beyond it; `untrained`: seeds "
             f"that learned nothing (under {TRAINED_FRACTION:.0%} of the unigram-to-optimal gap) even at the best rate.",
             markdown_table(by_depth(best_rate_table(summary))))
    page.add("LR sensitivity (the mean over the grid of the capped loss minus the best; 0: every rate is as "
             "good as the best, which is also what a scheme that learns at no rate reads: see the table above) "
             "per depth, and how far the best rate moves from the shallowest depth to the deepest (their "
             "ratio):", markdown_table(by_depth(sensitivity_table(summary))))
    page.figure(name, lr_figure(runs),
                "Final eval loss against learning rate, a panel per scheme, a line per depth (circles: the best "
                "rate).")
    page.add("Every cell (mean capped loss over the seeds; `(k div)`: k seeds diverged):",
             markdown_table(curve_table(lr_curves(runs))))
    diagnoses(page, runs, "over every rate of the grid")


def lr_block(evidence: Evidence, name: str) -> Optional[str]:
    """The README's and the comparisons page's table, once the sweep has finished."""
    if not evidence.finished(name):
        return None
    runs = evidence.runs(name)
    summary = lr_summary(runs)
    time = preset_time(evidence.study_dir(name), runs).describe()
    return (f"**Measured** (`python -m deepnorm_exp -m experiment={name}`; {time}): each scheme "
            "at its own best learning rate per depth, the final eval loss (mean ± std over the "
            "seeds, capped at the loss at initialisation) and the rate; then LR sensitivity.\n\n"
            + markdown_table(by_depth(best_rate_table(summary))) + "\n\n"
            + markdown_table(by_depth(sensitivity_table(summary))))


def write_tuned_rates(evidence: Evidence, name: str, conf: Path) -> Optional[Path]:
    """conf/tuned_lr/<name>.yaml from a study's records, for the cells whose grid of rates its ended runs cover
    (`partial_cells`: a sweep stopped, still running or narrowed leaves the others out; at a depth it lacks, a
    study that reads the rate refuses in one line), so the table follows from the committed records alone.
    Generated into conf/ because that is the one place the rates live as a fact of the studies that run at
    them: Hydra composes them there (`${tuned_lr:}`), and a study already run keeps the rates it ran at until
    `make results` rewrites them and the diff is committed (a preset that read the records instead would change
    under runs already made)."""
    runs = evidence.runs(name)
    if runs.empty:
        return None
    path = conf / "tuned_lr" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_cells(runs, sweeper_setting(evidence.study_dir(name), "params", None))
    records.write_text(path, tuned_lr_yaml(lr_summary(runs), name, partial))
    return path


SYNTHETIC = Study("lr_study", "Final loss against learning rate (each scheme at its own best rate)",
                  "Post-LN, Pre-LN and DeepNorm at depths 6, 18 and 50, two seeds, on a half-decade grid of learning "
                  "rates from 1e-4 to 1e-1, 300 steps (Wortsman et al. 2023; the rules: "
                  "deepnorm_exp/analysis/lr_study.py).", lr_section, "lr_study", lr_block)
TEXT = Study("text_lr", "Real text: each scheme's rate tuned at the final budget",
             "Post-LN, Pre-LN and DeepNorm decoders at depths 6, 18 and 50 on Shakespeare's plays (bytes, held-out "
             "plays; data=shakespeare), dropout 0.1, 3,000 steps of a cosine schedule that anneals, rates 3e-4 to "
             "1e-2, seed 0: the best rate per scheme and depth (conf/tuned_lr/text_lr.yaml) for text_final.",
             lr_section)
TUNING = (SYNTHETIC, TEXT)  # the studies whose best rates others read (`train.lr: ${tuned_lr:}`)
