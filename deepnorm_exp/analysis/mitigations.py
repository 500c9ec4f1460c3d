"""Which mitigation lets which scheme train (the mitigation study, conf/experiment/mitigation_study.yaml).

The rule, fixed before the study's runs were made (the preset says the same): a mitigation *lets a scheme
train* when at least half of its seeds train with it (summary.trained) and fewer than half without it; it
*stops it training* in the reverse case; otherwise it changes nothing about whether the scheme trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .page import Page, Study, markdown_table
from .runs import config_column, outcomes
from .tables import counted

if TYPE_CHECKING:
    from .evidence import Evidence

# The keys a mitigation sets (config.py, all off by default) and their values when off
MITIGATION_KEYS = {"model.qk_norm": "none", "model.attn_softcap": None, "model.logit_softcap": None,
                   "train.z_loss": 0.0, "train.weight_decay": 0.0}
NONE, UNKNOWN = "none", "unknown"


def mitigation_of(runs: pd.DataFrame) -> pd.Series:
    """Each run's mitigation, from its config: the keys it has on, as `key=value` ("none": all off)."""
    def on(column: str, off) -> pd.Series:
        values = config_column(runs, column)
        is_off = values.isna() | values.eq(off) if off is not None else values.isna()
        short = column.split(".", 1)[1]
        return values.map(lambda v: f"{short}={v:g}" if isinstance(v, float) else f"{short}={v}").where(~is_off, "")

    if not len(runs):
        return pd.Series(dtype=str)
    parts = pd.concat([on(column, off) for column, off in MITIGATION_KEYS.items()], axis=1)
    labels = parts.apply(lambda row: ", ".join(p for p in row if p), axis=1)
    labels = labels.where(labels.ne(""), NONE)
    # every readable config has model.qk_norm: without it the run's config was not read, and its mitigation is unknown
    return labels.where(config_column(runs, "model.qk_norm").notna(), UNKNOWN)


def mitigation_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (norm, mitigation) of the runs that ended: seeds trained, eval loss mean ± std, the
    diagnoses, and the rule's verdict against the same scheme without a mitigation."""
    ended = outcomes(runs)
    if ended.empty:
        return pd.DataFrame()
    ended = ended.assign(mitigation=mitigation_of(ended))
    ended = ended[ended["mitigation"].ne(UNKNOWN)]  # counted in neither side of a verdict
    if ended.empty:
        return pd.DataFrame()
    share = ended.groupby(["norm", "mitigation"])["trained"].apply(lambda t: t.eq(True).mean())
    rows = []
    for (norm, mitigation), group in ended.groupby(["norm", "mitigation"], sort=True):
        losses = group.loc[group["status"].eq("completed"), "eval_loss"].dropna()
        rows.append({
            "norm": norm, "mitigation": mitigation, "depth": ", ".join(str(int(d)) for d in sorted(group["depth"].unique())),
            "trained": f"{int(group['trained'].eq(True).sum())}/{len(group)}",
            "eval loss": f"{losses.mean():.3f}" + (f" ± {losses.std():.3f}" if len(losses) > 1 else "") if len(losses) else "–",
            "diagnosis": counted(group.get("diagnosis.kind", pd.Series(dtype=object)).dropna()),
            "verdict": verdict(share.get((norm, NONE)), share[(norm, mitigation)]) if mitigation != NONE else "",
        })
    return pd.DataFrame(rows)


def verdict(without: float | None, with_: float) -> str:
    """The rule on the shares of seeds that trained without and with a mitigation."""
    if without is None:
        return "no run without a mitigation to compare"
    if with_ >= 0.5 > without:
        return "lets it train"
    if without >= 0.5 > with_:
        return "stops it training"
    return "no change in whether it trains"


def mitigation_section(page: Page, evidence: Evidence, name: str) -> None:
    table = mitigation_table(evidence.runs(name))
    if table.empty:
        page.add("No run of the study has ended yet.")
        return
    page.add("Per scheme and mitigation: the seeds that trained, the eval loss (mean ± std over the seeds that "
             "completed), the diagnoses, and the rule's verdict against the same scheme with no mitigation:",
             markdown_table(table, index=False))


def mitigation_dashboard(evidence: Evidence, name: str) -> dict[str, pd.DataFrame]:
    """The page's table: per scheme and mitigation, the seeds trained, the loss, the diagnoses, the verdict."""
    table = mitigation_table(evidence.runs(name))
    return {} if table.empty else {"mitigations": table}


MITIGATIONS = Study("mitigation_study", "Mitigations where Post-LN fails (an extension, not judged)",
                    "Post-LN, Pre-LN and DeepNorm at depth 48 with the quick start's training, with no mitigation and "
                    "with each of QK-LayerNorm, z-loss 1e-4, soft-capping (attention 50, output 30) and weight decay "
                    "0.1, two seeds (the rule: deepnorm_exp/analysis/mitigations.py).", mitigation_section,
                    dashboard=mitigation_dashboard)
