"""Tables of a sweep: the norm x depth comparison the quick start prints, as a DataFrame."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .plots import norms_in
from .runs import outcomes


def comparison_table(runs: pd.DataFrame, metric: str = "eval_loss", untrained: bool = False) -> pd.DataFrame:
    """norm x depth: "mean ± std" of `metric` over the seeds that completed, "k/n diverged" and "k/n failed or
    unfinished" (runs left out);
    `untrained`: also "k/n untrained" (completed without learning 10% of the gap: summary.trained false)."""
    if runs.empty:
        return pd.DataFrame()
    cells: dict[str, dict[int, str]] = {}
    for (norm, depth), group in runs.groupby(["norm", "depth"]):
        diverged = int(group["status"].eq("diverged").sum())
        # only finished runs' losses: a stopped run's last eval would pass for a final one
        values = group.loc[group["status"].eq("completed"), metric].dropna()
        unfinished = len(group) - len(outcomes(group))
        text = f"{values.mean():.3f}" if len(values) else "–"
        if len(values) > 1:
            text += f" ± {values.std():.3f}"
        if diverged:
            text += f" ({diverged}/{len(group)} diverged)"
        stuck = int((group["status"].eq("completed") & group["trained"].eq(False)).sum()) if untrained else 0
        if stuck:
            text += f" ({stuck}/{len(group)} untrained)"
        if unfinished:
            text += f" ({unfinished}/{len(group)} failed or unfinished)"
        cells.setdefault(norm, {})[int(depth)] = text
    return norm_depth_table(cells, norms_in(runs))


def counted(values) -> str:
    """"2 collapsed_at_init, 1 stuck_on_plateau": how many of `values` are each value, most first, then by name
    (missing values are not counted: a caller that wants them names them first)."""
    counts = pd.Series(list(values), dtype=object).value_counts()
    return ", ".join(f"{n} {value}" for value, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def diagnosis_table(runs: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: how many of the runs that ended got each diagnosis (lifecycle/diagnosis.py), most first:
    "2 collapsed_at_init, 1 stuck_on_plateau"."""
    ended = outcomes(runs)
    if ended.empty or "diagnosis.kind" not in ended:
        return pd.DataFrame()
    cells: dict[str, dict[int, str]] = {}
    for (norm, depth), group in ended.groupby(["norm", "depth"]):
        cells.setdefault(norm, {})[int(depth)] = counted(group["diagnosis.kind"].fillna("none"))
    return norm_depth_table(cells, norms_in(ended))


def not_measured(runs: pd.DataFrame) -> dict[str, int]:
    """Of the runs that ended, how many had each quantity a diagnosis rule needed and could not read (its
    instrument was off): their diagnoses' `not_measured`, read as untrusted input (anything but names dropped)."""
    ended = outcomes(runs)
    counts: dict[str, int] = {}
    for names in ended.get("diagnosis.not_measured", pd.Series(dtype=object)):
        if isinstance(names, str):
            names = [names]
        if isinstance(names, (list, tuple, np.ndarray)):
            for name in {str(n) for n in names if isinstance(n, str)}:
                counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def norm_depth_table(cells: dict[str, dict[int, str]], norms: list[str]) -> pd.DataFrame:
    """{norm: {depth: text}} as a norm x depth table: the rows in `norms`' order, the depths ascending, "" where a
    cell is missing."""
    table = pd.DataFrame(cells).T.reindex(norms)
    table = table[sorted(table.columns)]
    table.index.name, table.columns.name = "norm", "depth"
    return table.fillna("")


def shared_value(runs: pd.DataFrame, key: str) -> str:
    """The one value (3 decimals) that every run has for `key` (the data's unigram or optimal loss), else
    "varies" or "unknown": a table's reference levels hold only when its runs share them."""
    values = runs[key].dropna().round(3).unique() if key in runs else []
    return f"{values[0]:.3f}" if len(values) == 1 else ("varies" if len(values) else "unknown")
