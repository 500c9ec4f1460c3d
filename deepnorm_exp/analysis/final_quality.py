"""Final quality where it can show: the final-quality claims judged on real text (experiment=text_final).

The synthetic language is nearly solved at depth 6 (Pre-LN closes 0.97 of the unigram-to-optimal gap in 4,800
steps), so a difference in final quality has little room to show there. text_final trains byte-level decoders
on Shakespeare's plays (held-out plays for eval) with dropout and a cosine schedule that anneals, each scheme
at its best rate per depth tuned at the same budget by text_lr with another seed, three seeds each.

The rules, fixed before the study's runs (conf/experiment/text_final.yaml says the same):

* A seed's loss is its final eval loss capped at its loss at initialisation (lr_study.capped_losses: a diverged
  seed counts as the loss at initialisation).
* "A ends better than B at a depth": A's mean loss is below B's by more than SE_MULTIPLE standard errors of the
  difference of the means, sqrt(s_A^2 / n_A + s_B^2 / n_B) (s the seeds' standard deviation); a difference
  within that cannot tell them apart. A claim over depths holds when it holds at every depth judged.
* "Post-LN, where it trains": at the depths where every Post-LN seed trained (summary.trained).
* "DeepNorm keeps improving as the model goes deeper" (figure 6): each deeper depth's mean below the one before
  by more than SE_MULTIPLE standard errors.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .evidence import Evidence
from .lr_study import capped_losses

STUDY = "text_final"
SE_MULTIPLE = 2.0


def _losses(e: Evidence) -> pd.DataFrame:
    return capped_losses(e.runs(STUDY))


def _stats(losses: pd.Series) -> tuple[float, float, int]:
    """Mean, standard error of the mean, seeds."""
    n = len(losses)
    return float(losses.mean()), float(losses.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"), n


def _difference(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """mean(b) - mean(a) and its standard error."""
    (ma, sa, _), (mb, sb, _) = _stats(a), _stats(b)
    return mb - ma, float(np.hypot(sa, sb))


def _said(depth: int, name_a: str, a: pd.Series, name_b: str, b: pd.Series) -> str:
    gap, se = _difference(a, b)
    return (f"L{depth} {name_a} {a.mean():.3f} vs {name_b} {b.mean():.3f} ({len(a)} and {len(b)} seeds): "
            f"{name_a} lower by {gap:.3f} ± {se:.3f} (SE)")


def ends_better(norm: str, other: str, where_trained: str | None = None):
    """`norm` ends better than `other` at every depth both ran (with two seeds or more each), or only at the
    depths where every seed of `where_trained` trained."""
    def check(e: Evidence):
        losses = _losses(e)
        compared, met = [], []
        for depth, at in losses.groupby("depth"):
            a, b = (at.loc[at["norm"] == n, "loss"] for n in (norm, other))
            if min(len(a), len(b)) < 2:
                continue
            if where_trained and not at.loc[at["norm"] == where_trained, "trained"].all():
                continue
            gap, se = _difference(a, b)
            compared.append(_said(int(depth), norm, a, other, b))
            met.append(bool(gap > SE_MULTIPLE * se))
        if not compared:
            scope = f" where every {where_trained} seed trained" if where_trained else ""
            return None, f"no depth{scope} with two seeds or more of both {norm} and {other}"
        return all(met), "; ".join(compared) + f" (better: by more than {SE_MULTIPLE:g} SE)"
    return check


def improves_with_depth(norm: str):
    def check(e: Evidence):
        losses = _losses(e)
        of = {int(d): g["loss"] for d, g in losses[losses["norm"] == norm].groupby("depth") if len(g) >= 2}
        depths = sorted(of)
        if len(depths) < 2:
            return None, f"{norm} needs two seeds or more at two depths"
        steps = [(shallow, deep, *_difference(of[deep], of[shallow])) for shallow, deep in zip(depths, depths[1:])]
        means = ", ".join(f"L{d} {of[d].mean():.3f}" for d in depths)
        text = "; ".join(f"L{deep} below L{shallow} by {gap:.3f} ± {se:.3f} (SE)" for shallow, deep, gap, se in steps)
        return (all(gap > SE_MULTIPLE * se for _, _, gap, se in steps),
                f"{norm}'s mean eval loss {means}; {text} (improving: by more than {SE_MULTIPLE:g} SE)")
    return check


def final_table(e: Evidence) -> pd.DataFrame:
    """norm x depth: "mean ± SE (n)" of the capped final eval loss."""
    losses = _losses(e)
    if losses.empty:
        return pd.DataFrame()
    cells = losses.groupby(["norm", "depth"])["loss"].apply(
        lambda s: "{:.3f} ± {:.3f} ({})".format(*_stats(s)))
    return cells.unstack("depth")
