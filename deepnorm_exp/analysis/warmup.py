"""Decoder-only, with and without warm-up (not judged: the paper's contrast, Post-LN with and without warm-up
and Post-LN-init, is judged on early_update_encdec): the model update at a few steps and how the runs ended."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from . import plots
from .page import Page, Study, markdown_table
from .runs import config_by_run

if TYPE_CHECKING:
    from .evidence import Evidence

WARMUP_STEPS_SHOWN = (1, 10, 100, 200)


def warmup_table(runs: pd.DataFrame, scalars: pd.DataFrame) -> pd.DataFrame:
    """norm, depth, warm-up -> the mean model update at WARMUP_STEPS_SHOWN and the runs' outcomes."""
    if runs.empty or scalars.empty or "model_update" not in scalars:
        return pd.DataFrame()
    warmup = config_by_run(runs, "train.warmup_steps")
    data = scalars[scalars["step"].isin(WARMUP_STEPS_SHOWN)].assign(
        warmup=lambda f: warmup.reindex(f["run_name"]).to_numpy())
    table = data.pivot_table(index=["norm", "depth", "warmup"], columns="step", values="model_update", aggfunc="mean")
    table.columns = [f"step {c}" for c in table.columns]
    ended = runs.assign(warmup=warmup.to_numpy(), ok=runs["status"].eq("completed") & runs["trained"].eq(True))
    outcome = ended.groupby(["norm", "depth", "warmup"]).apply(
        lambda g: f"{int(g['ok'].sum())}/{len(g)} trained" + (f", {int(g['status'].eq('diverged').sum())} diverged"
                                                             if g["status"].eq("diverged").any() else ""))
    table["runs"] = outcome
    table = table.reset_index()
    order = {n: i for i, n in enumerate(plots.norms_in(table))}
    return table.sort_values(["norm", "depth", "warmup"], key=lambda c: c.map(order) if c.name == "norm" else c)


def warmup_section(page: Page, evidence: Evidence, name: str) -> None:
    runs, scalars = evidence.at_one_lr(name), evidence.scalars(name)
    page.add("Model update ||F(x,θt) − F(x,θ0)|| at a few steps (mean over the seeds), and how the runs "
             "ended:", markdown_table(warmup_table(runs, scalars), index=False))


LOW_LR = Study("warmup_contrast_low_lr", "Decoder-only, with and without warm-up (a second view, not judged)",
               "Post-LN and DeepNorm at 18 layers, warm-up 0 and 100 steps, two seeds, lr 1e-4, the model update every "
               "step. The paper's contrast (Post-LN with and without warm-up, and Post-LN-init) is judged on "
               "early_update_encdec.", warmup_section)
QUICK_RATE = Study("warmup_contrast", "The same at the quick start's rate (a second view, not judged)",
                   "warmup_contrast_low_lr's training at lr 1e-3.", warmup_section)
