"""The mechanism claims (the paper's figures 4 and 5), read where the paper reads them.

The early_update_encdec study (conf/experiment/early_update_encdec.yaml) runs figure 5's 64-128-2
encoder-decoders at 6L-6L to 100L-100L for figure 4(a)'s window, the first WINDOW steps, with the paper's 4k
warm-up and without, for Post-LN, Post-LN-init (section 3's better init), DeepNorm and Pre-LN. Each rule reads
one figure's quantity in its setting:

  figure 5      the model update ||F(x,theta_t) - F(x,theta_0)|| of Post-LN against DeepNorm at each depth, and
                its growth across depth, with warm-up (the paper's training); ratios between schemes, never a
                scheme against a constant (Adam moves every weight by about the rate, so every update grows
                with depth somewhat: the paper's derivation is for SGD)
  figure 4(a)   at 18L-18L: Post-LN's update without warm-up against Post-LN with warm-up and Post-LN-init,
                and its per-step change late in the window over its first step ("then nearly no update")
  figure 4(b,c) the LN inputs' growth within each run, ||x_t|| / ||x_0|| (a level present at step 0 is not
                the update's doing), without warm-up against with it and against Post-LN-init
  figure 4(d)   the decoder's bottom-10% over top-10% layers' gradient norm, in the same contrast

A comparison "A above B" holds when every seed of A is above every seed of B: the seeds' ranges do not overlap
(a chance ordering has probability 1/6 with two seeds each, 1/70 with four); it fails only when every seed of B
is above every seed of A, and where the ranges overlap the data cannot tell (CANNOT_TELL; until 2026-12-06 an
overlap read as false, where the frontier's rule already read it as "cannot tell"). Where both sides of a
comparison of updates lie at the saturation (SATURATED sqrt(2 d): as far as unrelated LayerNorm outputs lie
apart) the comparison is left out; none left: not testable (None). Each check returns (met?, the numbers it
read); claims.py lists them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import plots
from .cannot_tell import CANNOT_TELL, Met, every
from .evidence import Evidence
from .page import Page, Study, markdown_table
from .runs import config_by_run

STUDY = "early_update_encdec"
WINDOW = 30  # figure 4(a)'s x-axis: the first 30 iterations
LATE = (11, WINDOW)  # "then nearly no update shortly": the window's last two thirds
FIG4_DEPTH = 18  # figure 4's 18L-18L
SATURATED = 0.8  # of sqrt(2 d)
TENTH = 0.1  # bottom and top share of the decoder's blocks

Values = dict[tuple[str, int, bool], pd.Series]  # (norm, depth, warm-up?) -> one value per seed, indexed by seed


def _runs(e: Evidence) -> pd.DataFrame:
    runs = e.at_one_lr(STUDY)
    if runs.empty:
        return runs
    warm = config_by_run(runs, "train.warmup_steps").fillna(0) > 0
    return runs.assign(warm=warm.reindex(runs["run_name"]).to_numpy())


def _by_cell(runs: pd.DataFrame, per_run: pd.Series) -> Values:
    """Each cell's per-run values indexed by seed, in seed order (runs without a value left out)."""
    rows = runs.assign(value=per_run.reindex(runs["run_name"]).to_numpy()).dropna(subset=["value"])
    return {(n, int(d), bool(w)): g.set_index("seed")["value"].sort_index().astype(float)
            for (n, d, w), g in rows.groupby(["norm", "depth", "warm"])}


def _scalar(e: Evidence, metric: str, first: int, last: int) -> Values:
    """Each run's mean `metric` over steps first..last (inclusive). A run without a value at every step of the
    window is left out: the update grows through the window, so a mean over its first steps alone reads low."""
    runs, s = _runs(e), e.scalars(STUDY)
    if runs.empty or s.empty or metric not in s:
        return {}
    inside = s[(s["step"] >= first) & (s["step"] <= last) & s[metric].notna()].groupby("run_name")
    whole = inside["step"].nunique() == last - first + 1
    return _by_cell(runs, inside[metric].mean()[whole])


def _last_layer_record(e: Evidence, metric: str) -> pd.DataFrame:
    """Per-layer rows of `metric` at the window's end (a run without a record there is left out)."""
    layers = e.layers(STUDY)
    if layers.empty or metric not in layers:
        return pd.DataFrame()
    return layers[layers[metric].notna() & (layers["step"] == WINDOW)]


BLOCK = ["run_name", "stack", "layer", "sublayer"]  # one LayerNorm's records across steps


def _ln_input_growth(e: Evidence) -> Values:
    """Each run's mean LN input at the window's end over that at step 0, over the blocks recorded at both
    (blocks at different levels: one missing at one end only would move the ratio)."""
    layers = e.layers(STUDY)
    if layers.empty or "ln_input_norm" not in layers:
        return {}
    start = layers[(layers["step"] == 0) & layers["ln_input_norm"].notna()]
    both = _last_layer_record(e, "ln_input_norm").merge(start[BLOCK + ["ln_input_norm"]], on=BLOCK,
                                                          suffixes=("_end", "_start"))
    means = both.groupby("run_name")[["ln_input_norm_end", "ln_input_norm_start"]].mean()
    return _by_cell(_runs(e), means["ln_input_norm_end"] / means["ln_input_norm_start"])


def _ln_input_level(e: Evidence) -> Values:
    """Each run's mean LN input at the window's end, in units of sqrt(d)."""
    runs = _runs(e)
    end = _last_layer_record(e, "ln_input_norm").groupby("run_name")["ln_input_norm"].mean()
    if end.empty:
        return {}
    return _by_cell(runs, end / config_by_run(runs, "model.d_model").astype(float) ** 0.5)


def _decoder_bottom_over_top(e: Evidence) -> Values:
    """Each run's decoder at the window's end: the gradient norm of its bottom 10% of layers over that of its top
    10%, a layer's norm over its sublayers (self-attention, cross-attention, FFN) together, so that both ends
    hold the same mix of sublayers."""
    rows = _last_layer_record(e, "grad_norm")
    if rows.empty:
        return {}
    rows = rows[rows["stack"] == "decoder"]

    def ratio(run: pd.DataFrame) -> float:
        per_layer = run.groupby("layer")["grad_norm"].apply(lambda g: float(np.sqrt((g.astype(float) ** 2).sum())))
        n = max(1, int(len(per_layer) * TENTH))
        return float(per_layer.iloc[:n].mean() / per_layer.iloc[-n:].mean())
    return _by_cell(_runs(e), rows.groupby("run_name").apply(ratio, include_groups=False))


def _bound(e: Evidence) -> float:
    d_model = config_by_run(_runs(e), "model.d_model").dropna()
    return SATURATED * float(np.sqrt(2 * d_model.iloc[0])) if len(d_model) else np.inf


def _seeds(values: pd.Series) -> str:
    return "/".join(f"{v:.3g}" for v in values)


def _above(a: pd.Series, b: pd.Series) -> bool:
    return bool(len(a) and len(b) and a.min() > b.max())


def _ordered(a: pd.Series, b: pd.Series, bound: float = np.inf) -> Met:
    """Every seed of `a` above every seed of `b`: True; every seed of `b` above every seed of `a`: False; the
    seeds' ranges overlap: CANNOT_TELL. An ordering whose two deciding values (the nearest seeds of the two
    sides) both reach `bound` is the ceiling's, not the schemes': None (not testable)."""
    if _above(a, b):
        return True if min(a.min(), b.max()) < bound else None
    if _above(b, a):
        return False if min(b.min(), a.max()) < bound else None
    return CANNOT_TELL


OVERLAP = " (the seeds' ranges overlap: the data cannot tell)"
CEILING = f" (an ordering turns on two values over {SATURATED} sqrt(2 d), the ceiling's, not the schemes')"


def _why(met: Met) -> str:
    """What the numbers cannot say, where they cannot."""
    return OVERLAP if met is CANNOT_TELL else CEILING if met is None else ""


def _depths(values: Values, warm: bool, *norms: str) -> list[int]:
    return sorted({d for (n, d, w) in values if w == warm and all((m, d, warm) in values for m in norms)})


# -- figure 5: Post-LN against DeepNorm across depth, with warm-up ------------------------------------------
def _mean_update(e: Evidence) -> Values:
    return _scalar(e, "model_update", 1, WINDOW)


def post_update_larger_than_deepnorms(e: Evidence):
    """At every depth, every Post-LN seed's mean update over the window above every DeepNorm seed's."""
    upd, bound = _mean_update(e), _bound(e)
    depths = _depths(upd, True, "post", "deepnorm")
    if not depths:
        return None, f"Post-LN and DeepNorm need runs with warm-up in {STUDY}"
    text = (f"mean model update over the first {WINDOW} steps, with warm-up, Post-LN vs DeepNorm (per seed): "
            + "; ".join(f"L{d} {_seeds(upd['post', d, True])} vs {_seeds(upd['deepnorm', d, True])}" for d in depths))
    # the deciding values: Post-LN's lowest seed and DeepNorm's highest (as _compare's)
    readable = [d for d in depths if min(upd["post", d, True].min(), upd["deepnorm", d, True].max()) < bound]
    if not readable:
        return None, text + f" (every depth saturated: over {SATURATED} sqrt(2 d))"
    met = every([_ordered(upd["post", d, True], upd["deepnorm", d, True], bound) for d in readable])
    return met, text + _why(met)


def _growth(upd: Values, norm: str, shallow: int, deep: int) -> tuple[float, float]:
    """(at least, at most) of a scheme's growth from `shallow` to `deep`: its seeds at one depth are other
    models than at the other, so no seed is paired with another; the growth lies between the extremes."""
    a, b = upd[norm, deep, True], upd[norm, shallow, True]
    return float(a.min() / b.max()), float(a.max() / b.min())


def deepnorm_update_flat_with_depth(e: Evidence):
    """From the shallowest to the deepest depth both have, with warm-up: Post-LN's growth of its mean update
    surely above DeepNorm's (the least Post-LN's can have grown over the most DeepNorm's can). A saturated
    Post-LN update at the deepest depth caps its growth: a growth not shown there is not read."""
    upd, bound = _mean_update(e), _bound(e)
    depths = _depths(upd, True, "post", "deepnorm")
    if len(depths) < 2:
        return None, f"Post-LN and DeepNorm need runs with warm-up at two depths in {STUDY}"
    shallow, deep = depths[0], depths[-1]
    (post_low, post_high), (dn_low, dn_high) = _growth(upd, "post", shallow, deep), _growth(upd, "deepnorm", shallow, deep)
    text = (f"mean model update over the first {WINDOW} steps with warm-up, L{deep} over L{shallow} (the seeds' "
            f"extremes, unpaired): Post-LN {post_low:.3g}x to {post_high:.3g}x, DeepNorm {dn_low:.3g}x to {dn_high:.3g}x")
    met = True if post_low > dn_high else False if post_high < dn_low else CANNOT_TELL
    if met is not True and upd["post", deep, True].max() >= bound:
        return None, text + f" (Post-LN saturated at L{deep}: over {SATURATED} sqrt(2 d), its growth capped)"
    return met, text + (OVERLAP if met is CANNOT_TELL else "")


# -- figure 4, at 18L-18L: Post-LN without warm-up against its two remedies ---------------------------------
def _compare(values: Values, what: str, against: list[tuple[str, bool]], above: bool, bound: float = np.inf):
    """Post-LN without warm-up at FIG4_DEPTH against each (norm, warm-up?) cell: above (or below) every seed of
    each. A comparison whose deciding values both reach `bound` is left out."""
    key = ("post", FIG4_DEPTH, False)
    cells = [(n, w) for n, w in against if (n, FIG4_DEPTH, w) in values]
    if key not in values or len(cells) < len(against):
        return None, f"{what}: Post-LN without warm-up and {', '.join(n for n, _ in against)} need runs at L{FIG4_DEPTH}"

    def name(n: str, w: bool) -> str:
        return plots.NORM_NAMES.get(n, n) + (
            " with warm-up" if w else " without")
    post = values[key]
    text = f"{what} at L{FIG4_DEPTH} (per seed): Post-LN without warm-up {_seeds(post)}; " + "; ".join(
        f"{name(n, w)} {_seeds(values[n, FIG4_DEPTH, w])}" for n, w in cells)

    def readable(other: pd.Series) -> bool:
        """Not when the two values an ordering turns on (Post-LN's nearest to the other side, and the other's
        nearest to Post-LN's) are both at the bound: there the ceiling, not the scheme, orders them."""
        return min(post.min(), other.max()) < bound if above else min(post.max(), other.min()) < bound
    kept = [(n, w) for n, w in cells if readable(values[n, FIG4_DEPTH, w])]
    if not kept:
        return None, text + f" (saturated on both sides: over {SATURATED} sqrt(2 d))"
    left_out = len(cells) - len(kept)
    met = every([_ordered(post, values[n, FIG4_DEPTH, w], bound) if above
                else _ordered(values[n, FIG4_DEPTH, w], post, bound) for n, w in kept])
    return met, text + (f" ({left_out} comparison(s) saturated on both sides, left out)" if left_out else "") + (
        _why(met))


REMEDIES = [("post", True), ("post_init", False)]  # warm-up; a better init (same schedule)


def warmup_and_init_hold_post_back(e: Evidence):
    """Post-LN's accumulated update over the window (its mean over steps 1..WINDOW, the curve figure 4(a) draws),
    without warm-up, above Post-LN's with warm-up and above Post-LN-init's without warm-up (the init's effect
    alone). Until 2026-12-06 it read step WINDOW alone, where every run without warm-up nears the ceiling."""
    return _compare(_mean_update(e), f"mean model update over the first {WINDOW} steps", REMEDIES, above=True,
                    bound=_bound(e))


def _late_over_first(e: Evidence) -> Values:
    late, first = _scalar(e, "model_update_step", *LATE), _scalar(e, "model_update_step", 1, 1)
    return {k: (late[k] / first[k]).dropna() for k in late.keys() & first.keys()}  # per run: aligned by seed


def post_update_then_stops(e: Evidence):
    """Without warm-up: the per-step change over steps LATE over that of step 1, Post-LN's below Post-LN-init's
    and DeepNorm's (the same schedule: the decay acts on all three)."""
    return _compare(_late_over_first(e), f"per-step change over steps {LATE[0]}-{LATE[1]} over step 1's, without "
                    "warm-up", [("post_init", False), ("deepnorm", False)], above=False)


def post_ln_inputs_grow(e: Evidence):
    """The LN inputs' growth within the window, Post-LN without warm-up above with it and above Post-LN-init."""
    met, text = _compare(_ln_input_growth(e), "mean LN input at the window's end over at step 0", REMEDIES, above=True)
    level = _ln_input_level(e).get(("post", FIG4_DEPTH, False))
    return met, text + (f"; Post-LN's level without warm-up {_seeds(level)} sqrt(d)" if level is not None else "")


def post_gradient_vanishes(e: Evidence):
    """The decoder's bottom-10% over top-10% gradient norm, Post-LN without warm-up below with it and below
    Post-LN-init."""
    return _compare(_decoder_bottom_over_top(e), "decoder bottom-10% over top-10% layers' gradient norm at the "
                    "window's end", REMEDIES, above=False)


def pre_bottom_gradients_larger(e: Evidence):
    """Pre-LN's decoder, at the deepest depth, with warm-up: bottom over top above 1 for every seed."""
    ratio = _decoder_bottom_over_top(e)
    depths = _depths(ratio, True, "pre")
    if not depths:
        return None, f"no per-layer gradients of Pre-LN with warm-up in {STUDY}"
    text = ("decoder bottom-10% over top-10% layers' gradient norm at the window's end, Pre-LN with warm-up "
            "(per seed): " + "; ".join(f"L{d} {_seeds(ratio['pre', d, True])}" for d in depths))
    deepest = ratio["pre", depths[-1], True]
    met = True if deepest.min() > 1 else False if deepest.max() <= 1 else CANNOT_TELL
    return met, text + (" (its seeds lie on both sides of 1: the data cannot tell)" if met is CANNOT_TELL else "")



def window_table(e: Evidence) -> pd.DataFrame:
    """Per scheme, depth and warm-up, the means over seeds of what the rules read."""
    columns = {"update @1": _scalar(e, "model_update", 1, 1), f"update @{WINDOW // 3}": _scalar(
        e, "model_update", WINDOW // 3, WINDOW // 3), f"update @{WINDOW}": _scalar(e, "model_update", WINDOW, WINDOW),
        f"step change {LATE[0]}-{LATE[1]} / step 1": _late_over_first(e), "LN input growth": _ln_input_growth(e),
        "decoder bottom / top grad": _decoder_bottom_over_top(e)}
    cells = sorted({cell for values in columns.values() for cell in values})
    return pd.DataFrame([{"norm": n, "depth": d, "warm-up": "4k" if w else "none",
                          **{name: float(values[n, d, w].mean()) if (n, d, w) in values else np.nan
                             for name, values in columns.items()}} for n, d, w in cells])


def early_section(page: Page, evidence: Evidence, name: str) -> None:
    runs, scalars = evidence.at_one_lr(name), evidence.scalars(name)
    warm = config_by_run(runs, "train.warmup_steps").fillna(0) > 0
    for flag, label, figure in ((True, "with the 4k warm-up (figure 5's training)", "early_update_warmup"),
                                (False, "without warm-up (figure 4(a)'s contrast)", "early_update_no_warmup")):
        of = scalars[scalars["run_name"].isin(warm.index[warm == flag])] if not scalars.empty else scalars
        page.figure(figure, plots.model_update(of), f"||F(x,θt) − F(x,θ0)|| over the first "
                    f"{WINDOW} steps {label}, per scheme, one line per depth (N-N).")
    page.add("What the rules read, mean over the seeds (update @k: ||F(x,θk) − F(x,θ0)||; step change: "
             "||F(x,θt) − F(x,θt−1)||; LN input growth: the mean over blocks at the window's end over step 0; "
             "decoder bottom / top grad: its bottom-10% over top-10% layers' gradient norm at the window's end):",
             markdown_table(window_table(evidence), index=False))


EARLY_UPDATE = Study(STUDY, "The first steps at the paper's shape (its figures 4 and 5)",
                     "64-128-2 encoder-decoders at 6L-6L to 100L-100L, Post-LN, Post-LN-init, DeepNorm and Pre-LN, with "
                     "the paper's 4k warm-up and without, four seeds, the first 30 steps at peak rate 5e-4, every scalar "
                     "every step, per-layer vectors every 5 (the rules: deepnorm_exp/analysis/early_window.py).",
                     early_section)
