"""The mechanism claims (the paper's figures 3-5): the model update, LayerNorm inputs and per-layer gradients,
read from the model_update study and compared between schemes at the same depth, or across depth.

Each check returns (met?, the numbers it read); None: the data cannot decide. claims.py lists them as claims.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from .evidence import Evidence
from .runs import config_by_run, config_column


def _ratio_bottom_top(layers: pd.DataFrame, norm: str, depth: int, metric: str = "grad_norm") -> float:
    """Mean `metric` of the bottom 10% of blocks over that of the top 10%, at each run's last per-layer step."""
    rows = layers[(layers["norm"] == norm) & (layers["depth"] == depth) & layers[metric].notna()]
    if rows.empty:
        return float("nan")
    rows = rows[rows["step"] == rows.groupby("run_name")["step"].transform("max")]
    profile = rows.groupby("position")[metric].mean()
    tenth = max(1, len(profile) // 10)
    return float(profile.iloc[:tenth].mean() / profile.iloc[-tenth:].mean())


def _rows(frame: pd.DataFrame) -> str:
    return "; ".join(f"{n}: " + ", ".join(f"L{d} {v:.3g}" for d, v in frame.loc[n].dropna().items()) for n in frame.index)


# The mechanism claims (the paper's figures 3-5) read the model_update study at the depths the paper measured
# (PAPER_DEPTHS, 6L-6L to 100L-100L there) and compare schemes at the same depth, or one scheme across depth,
# instead of against a constant; the 1,000-layer runs (model_update_1000l) are shown beside the verdict as an
# extension, never in it. Each reads the records at the step where the learning rate reached its peak (the
# end of the warm-up): earlier, every scheme takes Adam's near-sign steps at a fraction of its rate.
PAPER_DEPTHS = (6, 100)
EXTENSION = "model_update_1000l"
SATURATED = 0.8  # of sqrt(2 d): the distance between unrelated LayerNorm outputs, where the model update ends
# The claims about the update's size read model_update at a tenth of its rate: at 1e-3 every scheme's update
# has reached the saturation above by the peak, where no contrast is left (conf/experiment/model_update_low_lr.yaml).
# The 1,000-layer runs are at 1e-3, so these two claims show no extension.
SIZE_STUDY = "model_update_low_lr"


def peak_steps(runs: pd.DataFrame) -> pd.Series:
    """run_name -> the first step at the peak learning rate (the end of the warm-up; step 1 without one)."""
    return config_by_run(runs, "train.warmup_steps").fillna(0).clip(lower=1).astype(int)


def _in_paper_range(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[d for d in frame.columns if PAPER_DEPTHS[0] <= d <= PAPER_DEPTHS[1]]]


def _per_run(e: Evidence, study: str, metric: str, window: Callable[[int], tuple[int, int]]) -> pd.DataFrame:
    """norm, depth, run_name, value: each run's mean `metric` over the steps window(peak step) (inclusive)."""
    s, runs = e.scalars(study), e.at_one_lr(study)
    if s.empty or metric not in s or runs.empty:
        return pd.DataFrame(columns=["norm", "depth", "run_name", "value"])
    peaks = peak_steps(runs)
    rows = []
    for (norm, depth, name), at in s[s[metric].notna()].groupby(["norm", "depth", "run_name"]):
        if name not in peaks.index:
            continue
        first, last = window(int(peaks[name]))
        inside = at[(at["step"] >= first) & (at["step"] <= last)][metric]
        rows.append({"norm": norm, "depth": int(depth), "run_name": name,
                     "value": float(inside.mean()) if len(inside) else np.nan})
    return pd.DataFrame(rows, columns=["norm", "depth", "run_name", "value"])


def _mean(per_run: pd.DataFrame) -> pd.DataFrame:
    """norm x depth: the mean over seeds."""
    if per_run.empty:
        return pd.DataFrame()
    return per_run.groupby(["norm", "depth"])["value"].mean().unstack("depth")


def _at_peak(e: Evidence, study: str, metric: str) -> pd.DataFrame:
    return _mean(_per_run(e, study, metric, lambda peak: (peak, peak)))


def _extension_text(e: Evidence, read: Callable[[Evidence, str], pd.DataFrame]) -> str:
    if e.runs(EXTENSION).empty:
        return ""
    frame = read(e, EXTENSION)
    return f" (extension, not judged, `{EXTENSION}`: {_rows(frame)})" if not frame.empty else ""


def _saturation(e: Evidence, study: str) -> float:
    d_model = pd.to_numeric(config_column(e.at_one_lr(study), "model.d_model"), errors="coerce").dropna()
    return SATURATED * float(np.sqrt(2 * d_model.iloc[0])) if len(d_model) else np.inf


def _depth_pair(frame: pd.DataFrame, *norms: str) -> Optional[tuple[int, int]]:
    """The shallowest and deepest paper-range depths where every one of `norms` has a finite value."""
    if frame.empty or not set(norms) <= set(frame.index):
        return None
    paper = _in_paper_range(frame)
    depths = [d for d in paper.columns if all(np.isfinite(paper.loc[n, d]) for n in norms)]
    return (min(depths), max(depths)) if len(depths) >= 2 else None


def post_update_explodes(e: Evidence):
    """A ratio between schemes at the same depth, and its trend across depth: the update where the rate peaks,
    Post-LN over DeepNorm. Where DeepNorm's own update is saturated (as far as unrelated outputs lie apart)
    no contrast is left to read."""
    upd = _at_peak(e, SIZE_STUDY, "model_update")
    pair = _depth_pair(upd, "post", "deepnorm")
    if pair is None:
        return None, f"Post-LN and DeepNorm need model updates at two depths in {PAPER_DEPTHS}: {_rows(upd)}"
    shallow, deep = pair
    ratio = {d: upd.loc["post", d] / upd.loc["deepnorm", d] for d in (shallow, deep)}
    text = (f"model update at the peak learning rate: {_rows(_in_paper_range(upd))}; Post-LN / DeepNorm "
            f"L{shallow} {ratio[shallow]:.3g}, L{deep} {ratio[deep]:.3g}")
    if upd.loc["deepnorm", deep] >= _saturation(e, SIZE_STUDY):
        return None, text + f" (DeepNorm's is saturated at L{deep}: over {SATURATED} sqrt(2 d))"
    return bool(ratio[deep] > 1 and ratio[deep] > ratio[shallow]), text


def _late_over_early(e: Evidence, study: str) -> pd.DataFrame:
    """norm x depth: mean per-step change over the peak's next `peak` steps over that in the first tenth of
    the warm-up."""
    early = _per_run(e, study, "model_update_step", lambda peak: (1, max(1, peak // 10)))
    late = _per_run(e, study, "model_update_step", lambda peak: (peak + 1, 2 * peak))
    if early.empty or late.empty:
        return pd.DataFrame()
    both = early.merge(late, on=["norm", "depth", "run_name"], suffixes=("_early", "_late"))
    return _mean(both.assign(value=both["value_late"] / both["value_early"]))


def post_update_then_stops(e: Evidence):
    """Post-LN's late-over-early ratio against DeepNorm's at the same depth (the warm-up and the decay act on
    both), and that contrast's trend across depth."""
    ratios = _late_over_early(e, "model_update")
    pair = _depth_pair(ratios, "post", "deepnorm")
    if pair is None:
        return None, ("Post-LN and DeepNorm need per-step changes in the first tenth of the warm-up and after the "
                      f"peak at two depths in {PAPER_DEPTHS}")
    shallow, deep = pair
    relative = {d: ratios.loc["post", d] / ratios.loc["deepnorm", d] for d in (shallow, deep)}
    text = (f"per-step change over the `warm-up` steps after the peak over that in the first tenth of the warm-up: "
            f"{_rows(_in_paper_range(ratios))}; Post-LN's over DeepNorm's L{shallow} {relative[shallow]:.3g}, "
            f"L{deep} {relative[deep]:.3g}" + _extension_text(e, _late_over_early))
    return bool(relative[deep] < 1 and relative[deep] < relative[shallow]), text


def deepnorm_update_bounded(e: Evidence):
    """A trend across depth: DeepNorm's update where the rate peaks does not grow from the shallowest to the
    deepest paper-range depth by more than the seeds' spread. Growth read below the saturation is read; no
    growth where either end is saturated is geometry's bound, not the scheme's: no reading."""
    per_run = _per_run(e, SIZE_STUDY, "model_update", lambda peak: (peak, peak))
    upd = _mean(per_run)
    row = _in_paper_range(upd).loc["deepnorm"].dropna() if "deepnorm" in upd.index else pd.Series(dtype=float)
    row = row[np.isfinite(row)]
    if len(row) < 2:
        return None, f"DeepNorm's model update at fewer than two depths in {PAPER_DEPTHS} (or not finite)"
    shallow, deep = row.index[0], row.index[-1]
    spread = per_run[per_run["norm"] == "deepnorm"].groupby("depth")["value"].std(ddof=1).reindex([shallow, deep])
    spread = float(np.nan_to_num(spread.max()))
    text = (f"DeepNorm's model update at the peak learning rate: {', '.join(f'L{d} {v:.3g}' for d, v in row.items())} "
            f"(seeds' spread {spread:.3g})")
    grew = row[deep] > row[shallow] + spread
    if not grew and max(row[shallow], row[deep]) >= _saturation(e, SIZE_STUDY):
        return None, text + f" (saturated: over {SATURATED} sqrt(2 d), where it could not have grown)"
    return bool(not grew), text


def _layers_near_peak(e: Evidence, study: str, metric: str) -> pd.DataFrame:
    """Per-layer rows of `metric` at each run's first per-layer step at or after its peak step (its last one
    where none is)."""
    layers, runs = e.layers(study), e.at_one_lr(study)
    if layers.empty or metric not in layers:
        return pd.DataFrame()
    peaks = peak_steps(runs)
    rows = layers[layers[metric].notna()]
    chosen = []
    for name, at in rows.groupby("run_name"):
        steps = sorted(at["step"].unique())
        after = [s for s in steps if s >= peaks.get(name, 1)]
        chosen.append(at[at["step"] == (after[0] if after else steps[-1])])
    return pd.concat(chosen, ignore_index=True) if chosen else pd.DataFrame()


def _ln_input_per_run(e: Evidence, study: str) -> pd.DataFrame:
    """norm, depth, run_name, value: each run's mean LN input near the peak, in units of alpha sqrt(d) (alpha 1
    but for DeepNorm)."""
    rows, runs = _layers_near_peak(e, study, "ln_input_norm"), e.at_one_lr(study)
    if rows.empty:
        return pd.DataFrame()
    scale = config_by_run(runs, "model.d_model") ** 0.5
    alpha = runs.set_index("run_name").get("alpha.decoder", pd.Series(1.0, index=scale.index)).astype(float)
    rows = rows.assign(value=rows["ln_input_norm"] / (scale.reindex(rows["run_name"]).to_numpy()
                                                      * alpha.reindex(rows["run_name"]).fillna(1.0).to_numpy()))
    return rows.groupby(["norm", "depth", "run_name"])["value"].mean().reset_index()


def _spread(per_run: pd.DataFrame, cells: list[tuple[str, int]]) -> float:
    """The largest standard deviation over seeds among `cells` (norm, depth); 0 where each has one seed."""
    std = per_run.groupby(["norm", "depth"])["value"].std(ddof=1)
    return float(np.nan_to_num(max((std.get(cell, np.nan) for cell in cells), default=np.nan)))


def post_beyond_deepnorm(read_per_run: Callable[[Evidence, str], pd.DataFrame], what: str, above: bool):
    """Post-LN's mean over seeds against DeepNorm's at the deepest paper-range depth, and against its own at
    the shallowest: beyond both (above them, or below them where `above` is false) by more than the seeds'
    spread (the largest std over seeds of the three cells compared)."""
    def read(e: Evidence, study: str) -> pd.DataFrame:
        return _mean(read_per_run(e, study))

    def check(e: Evidence):
        per_run = read_per_run(e, "model_update")
        values = _mean(per_run)
        pair = _depth_pair(values, "post", "deepnorm")
        if pair is None:
            return None, f"Post-LN and DeepNorm need finite values at two depths in {PAPER_DEPTHS}"
        shallow, deep = pair
        post, deepnorm = values.loc["post"], values.loc["deepnorm", deep]
        spread = _spread(per_run, [("post", deep), ("post", shallow), ("deepnorm", deep)])
        beyond = (lambda a, b: a > b + spread) if above else (lambda a, b: a < b - spread)
        text = (f"{what}: {_rows(_in_paper_range(values))} (seeds' spread {spread:.3g})"
                + _extension_text(e, read))
        return bool(beyond(post[deep], deepnorm) and beyond(post[deep], post[shallow])), text
    return check


# Against DeepNorm at the same depth (each in its own unit), and across depth.
post_ln_inputs_grow = post_beyond_deepnorm(
    _ln_input_per_run, "mean LN input near the peak learning rate, in units of alpha sqrt(d) (alpha 1 but for "
    "DeepNorm)", above=True)


def _bottom_over_top_per_run(e: Evidence, study: str) -> pd.DataFrame:
    """norm, depth, run_name, value: each run's bottom-10% over top-10% blocks' gradient norm near the peak
    learning rate."""
    rows = _layers_near_peak(e, study, "grad_norm")
    if rows.empty:
        return pd.DataFrame()
    return pd.DataFrame([{"norm": n, "depth": int(d), "run_name": name, "value": _ratio_bottom_top(at, n, d)}
                         for (n, d, name), at in rows.groupby(["norm", "depth", "run_name"])])


def _bottom_over_top(e: Evidence, study: str) -> pd.DataFrame:
    return _mean(_bottom_over_top_per_run(e, study))


# Against DeepNorm at the same depth (a scheme whose gradient also vanishes does not make it Post-LN's trait),
# and across depth.
post_gradient_vanishes = post_beyond_deepnorm(
    _bottom_over_top_per_run, "bottom-10% over top-10% blocks' gradient norm near the peak learning rate",
    above=False)


def pre_bottom_gradients_larger(e: Evidence):
    """Bottom against top layers of the same model: 1 is where they are equal."""
    ratio = _bottom_over_top(e, "model_update")
    if ratio.empty or "pre" not in ratio.index:
        return None, "no per-layer gradients of Pre-LN"
    paper = _in_paper_range(ratio).loc["pre"].dropna()
    paper = paper[np.isfinite(paper)]
    if paper.empty:
        return None, f"no finite Pre-LN gradients at depths in {PAPER_DEPTHS}"
    text = (f"bottom-10% over top-10% blocks' gradient norm near the peak learning rate: "
            f"{_rows(_in_paper_range(ratio))}" + _extension_text(e, _bottom_over_top))
    return bool(paper.iloc[-1] > 1), text


# The contrast is read at a tenth of warmup_contrast's rate, for the reason SIZE_STUDY is: at 1e-3 Post-LN's
# update is near saturation after 10 steps with warm-up and without (conf/experiment/warmup_contrast_low_lr.yaml).
WARMUP_STUDY, EARLY_STEPS = "warmup_contrast_low_lr", 10


def warmup_matters_more_for_post(e: Evidence):
    """The paper's contrast, with and without warm-up, against DeepNorm's: the model update after the first
    EARLY_STEPS steps without warm-up over that with it, Post-LN's ratio over DeepNorm's (the warm-up's lower
    rate shrinks every scheme's early steps; the claim is that it is what holds Post-LN's back). A depth where
    any of the four updates is saturated has no ratio left to read: it is left out, and with no depth left
    the claim is not testable."""
    s, runs = e.scalars(WARMUP_STUDY), e.at_one_lr(WARMUP_STUDY)
    if s.empty or "model_update" not in s:
        return None, "no model_update records"
    warm = config_by_run(runs, "train.warmup_steps") > 0
    at = s[(s["step"] == EARLY_STEPS) & s["model_update"].notna()]
    at = at.assign(warm=warm.reindex(at["run_name"]).to_numpy())
    means = at.groupby(["norm", "depth", "warm"])["model_update"].mean()
    bound = _saturation(e, WARMUP_STUDY)
    ratios, saturated = {}, set()
    for (norm, depth), group in means.groupby(level=["norm", "depth"]):
        values = group.droplevel(["norm", "depth"])
        if {True, False} <= set(values.index):
            ratios[norm, int(depth)] = values[False] / values[True]
            if max(values[False], values[True]) >= bound:
                saturated.add(int(depth))
    depths = sorted({d for (n, d) in ratios if (("post", d) in ratios and ("deepnorm", d) in ratios)})
    text = (f"model update after {EARLY_STEPS} steps, without warm-up over with it: "
            + ", ".join(f"{n} L{d} {r:.3g}" for (n, d), r in sorted(ratios.items())))
    if not depths:
        return None, text + " (Post-LN and DeepNorm need runs with and without warm-up at one depth)"
    readable = [d for d in depths if d not in saturated]
    if not readable:
        return None, text + (f" (saturated at {', '.join(f'L{d}' for d in depths)}: an update over {SATURATED} "
                             "sqrt(2 d), as far as unrelated outputs lie apart)")
    return bool(all(ratios["post", d] > ratios["deepnorm", d] for d in readable)), text + (
        f" (saturated, left out: {', '.join(f'L{d}' for d in sorted(saturated & set(depths)))})"
        if saturated & set(depths) else "")
