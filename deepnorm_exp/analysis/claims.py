"""The DeepNet paper's claims, each judged on the runs made here by a rule stated in advance.

A claim names the paper's statement, the study (experiment directory under `runs/`) that tests it, and a
rule a measurement either meets or not; its check returns the verdict with the numbers it read. Where the
study has not run, the verdict says so and gives the command; while its sweep has not finished (stopped, or
running), no verdict is drawn from its first runs, which are the deepest and say nothing across depth; where
the data cannot decide (no run diverged,
a fit with one depth), it says "not testable here" and why. Thresholds are in the rules, in the open:
changing one changes the page, never silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd

from .frontier_law import fit_frontier_law, frontier_cells
from .runs import at_one_lr, config_column, load_frontier, load_layer_records, load_runs, load_scalars, outcomes
from .timing import sweep_finished

REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE, NOT_RUN, UNFINISHED = (
    "reproduced at this scale", "not reproduced", "not testable here", "not run yet", "sweep not finished")


@dataclass(frozen=True)
class Verdict:
    outcome: str
    numbers: str


class Evidence:
    """The records of `runs/<study>/`, each kind loaded once."""

    def __init__(self, root: str | Path):
        self.root, self._cache = Path(root), {}

    def _get(self, kind: str, study: str, load: Callable[[], Any]) -> Any:
        if (kind, study) not in self._cache:
            self._cache[kind, study] = load()
        return self._cache[kind, study]

    def runs(self, study: str) -> pd.DataFrame:
        path = self.root / study
        return self._get("runs", study, lambda: load_runs(path) if path.is_dir() else pd.DataFrame())

    def at_one_lr(self, study: str) -> pd.DataFrame:
        return at_one_lr(self.runs(study))[0]

    def scalars(self, study: str) -> pd.DataFrame:
        return self._get("scalars", study, lambda: load_scalars(self.at_one_lr(study)))

    def layers(self, study: str) -> pd.DataFrame:
        return self._get("layers", study, lambda: load_layer_records(self.at_one_lr(study)))

    def frontier(self, study: str) -> pd.DataFrame:
        return self._get("frontier", study, lambda: load_frontier(self.root / study))

    def frontier_law(self, study: str) -> pd.DataFrame:
        """`fit_frontier_law` of its frontier, fitted once (2,000 draws; the claims, the page and the README
        read it)."""
        return self._get("frontier_law", study, lambda: fit_frontier_law(self.frontier(study)))

    def finished(self, study: str) -> bool:
        """Its sweep's latest invocation ended and every run is final (`timing.sweep_finished`)."""
        return self._get("finished", study, lambda: sweep_finished(self.root / study, self.runs(study)))


@dataclass(frozen=True)
class Claim:
    paper: str  # what the paper says
    study: str  # the experiment (conf/experiment/<study>.yaml) whose runs test it
    rule: str  # what "reproduced" means here
    check: Callable[[Evidence], tuple[Optional[bool], str]]  # (met?, numbers); None: the data cannot decide
    needs: str = ""  # what this machine lacks to run the study, if it does

    def judge(self, evidence: Evidence) -> Verdict:
        if evidence.runs(self.study).empty:
            if self.needs:
                return Verdict(NOT_TESTABLE, f"needs {self.needs}")
            return Verdict(NOT_RUN, f"`python -m deepnorm_exp -m experiment={self.study}`")
        if not evidence.finished(self.study):
            return Verdict(UNFINISHED, f"{len(evidence.runs(self.study))} runs so far; `python -m deepnorm_exp -m "
                                       f"experiment={self.study}` continues it")
        met, numbers = self.check(evidence)
        return Verdict(NOT_TESTABLE if met is None else REPRODUCED if met else NOT_REPRODUCED, numbers)


# -- what the checks read ------------------------------------------------------------------------------
def trained(runs: pd.DataFrame) -> pd.Series:
    """Learned 10% of the unigram-to-optimal gap and did not diverge."""
    return runs["status"].eq("completed") & runs["trained"].eq(True)


def _excluded(runs: pd.DataFrame) -> str:
    n = len(runs) - len(outcomes(runs))
    return f" ({n} failed or unfinished runs left out)" if n else ""


def trained_by_depth(runs: pd.DataFrame, norm: str) -> dict[int, tuple[int, int]]:
    of = outcomes(runs)[lambda f: f["norm"] == norm]
    return {int(d): (int(trained(g).sum()), len(g)) for d, g in of.groupby("depth")}


def _shares(counts: dict[int, tuple[int, int]]) -> str:
    return ", ".join(f"L{d} {k}/{n}" for d, (k, n) in counts.items())


def _finite(*values) -> bool:
    return all(v is not None and np.isfinite(v) for v in values)


def _ratio_bottom_top(layers: pd.DataFrame, norm: str, depth: int, metric: str = "grad_norm") -> float:
    """Mean `metric` of the bottom 10% of blocks over that of the top 10%, at each run's last per-layer step."""
    rows = layers[(layers["norm"] == norm) & (layers["depth"] == depth) & layers[metric].notna()]
    if rows.empty:
        return float("nan")
    rows = rows[rows["step"] == rows.groupby("run_name")["step"].transform("max")]
    profile = rows.groupby("position")[metric].mean()
    tenth = max(1, len(profile) // 10)
    return float(profile.iloc[:tenth].mean() / profile.iloc[-tenth:].mean())


# -- the checks ----------------------------------------------------------------------------------------
def post_unstable_with_depth(study: str):
    """Post-LN failing at depth means something only where the budget lets another scheme train there."""
    def check(e: Evidence):
        runs = e.at_one_lr(study)
        counts = trained_by_depth(runs, "post")
        if len(counts) < 2:
            return None, f"Post-LN ran at {len(counts)} depth(s)"
        deepest = max(counts)
        (k0, n0), (k1, n1) = counts[min(counts)], counts[deepest]
        others = {norm: trained_by_depth(runs, norm).get(deepest, (0, 0)) for norm in ("pre", "deepnorm")}
        text = f"Post-LN trained: {_shares(counts)}; at L{deepest} " + ", ".join(
            f"{norm} {k}/{n}" for norm, (k, n) in others.items()) + _excluded(runs)
        if not any(n and k == n for k, n in others.values()):
            return None, text + f": neither Pre-LN nor DeepNorm trains every run at L{deepest} in this budget"
        return bool(k1 / n1 <= 0.5 and k1 / n1 < k0 / n0), text
    return check


def deepnorm_trains_everywhere(study: str):
    def check(e: Evidence):
        runs = e.at_one_lr(study)
        counts = trained_by_depth(runs, "deepnorm")
        if not counts:
            return None, "no DeepNorm run"
        return all(k == n for k, n in counts.values()), f"DeepNorm trained: {_shares(counts)}{_excluded(runs)}"
    return check


def lower_loss_than(norm: str, other: str, study: str):
    """At each depth where every run of both schemes trained: the mean eval losses, and whether `norm`'s is
    lower by more than the seeds' spread (the larger standard deviation of the two; 0 with one seed)."""
    def check(e: Evidence):
        runs = outcomes(e.at_one_lr(study))
        compared = []
        for depth, at in runs.groupby("depth"):
            a, b = (at[at["norm"] == n] for n in (norm, other))
            if len(a) and len(b) and trained(a).all() and trained(b).all():
                spread = max(a["eval_loss"].std(ddof=1), b["eval_loss"].std(ddof=1)) if min(len(a), len(b)) > 1 else 0.0
                compared.append((int(depth), a["eval_loss"].mean(), b["eval_loss"].mean(), spread))
        if not compared:
            return None, f"no depth where every run of both {norm} and {other} trained"
        text = "; ".join(f"L{d} {x:.3f} vs {y:.3f} (spread {sd:.3f})" for d, x, y, sd in compared)
        return all(y - x > sd for _, x, y, sd in compared), f"mean eval loss {norm} vs {other}: {text}"
    return check


FIRST_UPDATE = (1, 1)  # steps


def _model_update(e: Evidence, study: str, metric: str, steps: tuple[int, int]) -> pd.DataFrame:
    """norm x depth: the largest `metric` over steps in [first, last], mean over seeds."""
    s = e.scalars(study)
    if s.empty or metric not in s:
        return pd.DataFrame()
    window = s[(s["step"] >= steps[0]) & (s["step"] <= steps[1]) & s[metric].notna()]
    per_run = window.groupby(["norm", "depth", "run_name"])[metric].max()
    return per_run.groupby(["norm", "depth"]).mean().unstack("depth")


def _value(frame: pd.DataFrame, norm: str, depth: int) -> float:
    try:
        return float(frame.loc[norm, depth])
    except KeyError:
        return float("nan")


def _rows(frame: pd.DataFrame) -> str:
    return "; ".join(f"{n}: " + ", ".join(f"L{d} {v:.3g}" for d, v in frame.loc[n].dropna().items()) for n in frame.index)


def post_update_explodes(e: Evidence):
    """The first update (step 1): within tens of steps every scheme's output has moved about as far as two
    unrelated outputs lie apart (the metric saturates), so a later or longer window cannot tell them apart."""
    first = _model_update(e, "model_update", "model_update", FIRST_UPDATE)
    if first.empty:
        return None, "no model_update records"
    shallow, deepest = min(first.columns), max(first.columns)
    post, post_shallow, deep = (_value(first, "post", deepest), _value(first, "post", shallow),
                                _value(first, "deepnorm", deepest))
    if shallow == deepest or not _finite(post, post_shallow, deep) or deep <= 0:
        return None, f"Post-LN and DeepNorm need finite first updates at two depths: {_rows(first)}"
    return bool(post > 10 * deep and post > post_shallow), (
        f"model update after the first step: {_rows(first)} (Post-LN / DeepNorm at L{deepest}: {post / deep:.3g})")


def post_update_then_stops(e: Evidence):
    """Against DeepNorm's own ratio: a warm-up raises every scheme's later steps, a decay lowers them."""
    early = _model_update(e, "model_update", "model_update_step", (1, 10))
    late = _model_update(e, "model_update", "model_update_step", (51, 100))
    if early.empty or late.empty:
        return None, "no model_update_step records after step 50"
    deepest = max(early.columns)
    ratios = {n: _value(late, n, deepest) / _value(early, n, deepest) for n in ("post", "pre", "deepnorm")}
    if not _finite(ratios["post"], ratios["deepnorm"]):
        return None, f"Post-LN and DeepNorm need per-step changes in both windows at L{deepest}"
    text = ", ".join(f"{n} {r:.3g}" for n, r in ratios.items() if np.isfinite(r))
    return bool(ratios["post"] < 0.1 and ratios["post"] < ratios["deepnorm"] / 10), (
        f"largest per-step change in steps 51-100 over that in steps 1-10, L{deepest}: {text}")


def deepnorm_update_bounded(e: Evidence):
    """The first update, for the reason post_update_explodes gives."""
    first = _model_update(e, "model_update", "model_update", FIRST_UPDATE)
    row = first.loc["deepnorm"].dropna() if "deepnorm" in first.index else pd.Series(dtype=float)
    if len(row) < 2 or not np.isfinite(row).all() or row.iloc[0] <= 0:
        return None, "DeepNorm's first update at fewer than two depths (or not finite)"
    ratio = row.iloc[-1] / row.iloc[0]
    text = ", ".join(f"L{d} {v:.3g}" for d, v in row.items())
    return bool(ratio <= 3), f"DeepNorm's model update after the first step: {text} (L{row.index[-1]} / L{row.index[0]}: {ratio:.3g})"


def post_ln_inputs_grow(e: Evidence):
    layers, runs = e.layers("model_update"), e.at_one_lr("model_update")
    if layers.empty or "ln_input_norm" not in layers:
        return None, "no ln_input_norm records"
    scale = pd.Series(config_column(runs, "model.d_model").to_numpy(), index=runs["run_name"]).astype(float) ** 0.5
    alpha = runs.set_index("run_name").get("alpha.decoder", pd.Series(1.0, index=scale.index)).astype(float)
    rows = layers[layers["ln_input_norm"].notna()].copy()
    rows = rows[rows["step"] == rows.groupby("run_name")["step"].transform("max")]
    rows["units"] = rows["ln_input_norm"] / (scale.reindex(rows["run_name"]).to_numpy()
                                             * alpha.reindex(rows["run_name"]).fillna(1.0).to_numpy())
    deepest = int(rows["depth"].max())
    level = rows[rows["depth"] == deepest].groupby("norm")["units"].mean()
    if not {"post", "deepnorm"} <= set(level.index) or not _finite(level["post"], level["deepnorm"]):
        return None, f"no finite LN inputs of Post-LN and DeepNorm at L{deepest}"
    text = ", ".join(f"{n} {v:.3g}" for n, v in level.items())
    return bool(level["post"] > 1.5 and level["deepnorm"] <= 1.5), (
        f"mean LN input at the last per-layer step, L{deepest}, in units of alpha sqrt(d) (alpha 1 but for "
        f"DeepNorm): {text}")


def gradient_profile(norm: str, below: Optional[float] = None, above: Optional[float] = None):
    def check(e: Evidence):
        layers = e.layers("model_update")
        if layers.empty or "grad_norm" not in layers:
            return None, "no per-layer grad_norm records"
        deepest = int(layers["depth"].max())
        ratios = {n: _ratio_bottom_top(layers, n, deepest) for n in sorted(layers["norm"].unique())}
        text = ", ".join(f"{n} {r:.3g}" for n, r in ratios.items())
        r = ratios.get(norm, float("nan"))
        if not np.isfinite(r):
            return None, f"no finite {norm} gradients at L{deepest}"
        met = (below is None or r < below) and (above is None or r > above)
        return bool(met), f"bottom-10% over top-10% blocks' gradient norm at the last per-layer step, L{deepest}: {text}"
    return check


def frontier_flatter_for_deepnorm(e: Evidence):
    """On the brackets themselves, so that censored cells count: a Post-LN cell unstable even at lr_min bounds
    its frontier from above by lr_min, the strongest evidence of a fall, which a fit has to leave out. Each
    scheme's fall from the shallowest to the deepest depth both have lies between (shallowest's smallest lower end) /
    (deepest's largest upper end) and (shallowest's largest upper end) / (deepest's smallest lower end).
    Reproduced when Post-LN surely fell and surely fell more than DeepNorm; not reproduced when it surely did
    not (it cannot have fallen, or DeepNorm surely fell at least as much); otherwise, with every bracket
    closed, the brackets' geometric midpoints decide; with an open one the data cannot."""
    frontier = e.frontier("frontier_depth")
    if frontier.empty:
        return None, "the frontier sweep has not finished (no frontier.json)"
    cells = frontier_cells(frontier)
    cells = cells[~cells["error"]]
    # over the depths both have, so that the two falls span the same range (a depth whose cells all failed
    # would otherwise shorten one scheme's span)
    common = set(cells.loc[cells["norm"] == "post", "depth"]) & set(cells.loc[cells["norm"] == "deepnorm", "depth"])
    if len(common) < 2:
        return None, "Post-LN and DeepNorm need cells at two common depths"
    shallowest, deepest = min(common), max(common)

    def fall(norm: str) -> tuple[float, float]:
        """(at least, at most) from the shallowest to the deepest common depth; an open end makes a bound 0
        or infinite."""
        of = cells[cells["norm"] == norm]
        shallow, deep = of[of["depth"] == shallowest], of[of["depth"] == deepest]
        with np.errstate(divide="ignore"):  # an open end: 0 or infinity, as meant
            at_least = np.float64(shallow["lo"].fillna(0).min()) / deep["hi"].fillna(np.inf).max()
            at_most = np.float64(shallow["hi"].fillna(np.inf).max()) / deep["lo"].fillna(0).min()
        return at_least, at_most

    def between(low: float, high: float) -> str:
        return f"by {low:.3g}x to {high:.3g}x" if np.isfinite(high) else f"by at least {low:.3g}x, with no upper bound"

    (post_low, post_high), (dn_low, dn_high) = fall("post"), fall("deepnorm")
    law = e.frontier_law("frontier_depth").set_index("norm")
    slopes = "; ".join(f"{n} {r['slope']:.2f} [{r['slope_low']:.2f}, {r['slope_high']:.2f}]" +
                       (f" (censored at {list(r['censored_depths'])})" if r["censored"] else "")
                       for n, r in law.iterrows() if np.isfinite(r["slope"]))
    below = sorted(cells.loc[(cells["norm"] == "post") & cells["lo"].isna(), "depth"].unique().tolist())
    text = (f"Post-LN's frontier fell from L{shallowest} to L{deepest} {between(post_low, post_high)}"
            + (f" (unstable even at the range's lowest rate at {', '.join(f'L{d}' for d in below)})" if below else "")
            + f"; DeepNorm's {between(dn_low, dn_high)}"
            + (f"; fitted slopes of log lr on log depth: {slopes}" if slopes else ""))
    if post_low > 1 and post_low > dn_high:
        return True, text
    if post_high <= 1 or post_high <= dn_low:
        return False, text
    if _finite(post_high, dn_high) and post_low > 0 and dn_low > 0:
        post_mid, dn_mid = np.sqrt(post_low * post_high), np.sqrt(dn_low * dn_high)
        return bool(post_mid > 1 and post_mid > dn_mid), text + f" (midpoints: Post-LN {post_mid:.3g}x, DeepNorm {dn_mid:.3g}x)"
    return None, text + " (the brackets overlap and one is open: the data cannot tell which fell more)"


def divergence_is_early(e: Evidence):
    """The depth sweeps at their own learning rate; not the frontier's probes, which diverge by design."""
    studies = ("paper_depth_sweep", "paper_depth_sweep_encdec")
    unfinished = [s for s in studies if not e.runs(s).empty and not e.finished(s)]
    left_out = f" ({', '.join(unfinished)} left out: its sweep has not finished)" if unfinished else ""
    runs = [e.at_one_lr(s) for s in studies if s not in unfinished]
    runs = [r for r in runs if not r.empty]
    if not runs:
        return None, "no depth sweep has run to its end" + left_out
    runs = pd.concat(runs, ignore_index=True)
    diverged = runs[runs["status"] == "diverged"]
    if diverged.empty:
        return None, f"no run of the depth sweeps diverged ({len(runs)} runs){left_out}"
    share = (diverged["diverged_at_step"] / diverged["steps"]).astype(float)
    return bool((share <= 1 / 3).mean() >= 0.75), (
        f"{len(diverged)} diverged runs; {(share <= 1 / 3).sum()} in the first third of their steps; median at "
        f"{share.median():.0%} of the budget{left_out}")


def thousand_layers(e: Evidence):
    runs = e.runs("paper_1000l")
    return bool(trained(runs).any()), f"{int(trained(runs).sum())} of {len(runs)} runs trained"


CLAIMS = [
    Claim("Post-LN training becomes unstable as depth grows.", "paper_depth_sweep",
          "Post-LN trains in at most half of its runs at the deepest depth and in a larger share at the shallowest, "
          "where Pre-LN or DeepNorm trains every run at that depth (else the budget, not the scheme, decides)",
          post_unstable_with_depth("paper_depth_sweep")),
    Claim("DeepNorm trains at every depth.", "paper_depth_sweep", "every DeepNorm run trains",
          deepnorm_trains_everywhere("paper_depth_sweep")),
    Claim("DeepNorm ends better than Pre-LN at the same depth.", "paper_depth_sweep",
          "at every depth where every run of both trained, DeepNorm's mean eval loss is below Pre-LN's by more "
          "than the seeds' spread", lower_loss_than("deepnorm", "pre", "paper_depth_sweep")),
    Claim("Post-LN, where it trains, ends better than Pre-LN.", "paper_depth_sweep",
          "at every depth where every run of both trained, Post-LN's mean eval loss is below Pre-LN's by more "
          "than the seeds' spread", lower_loss_than("post", "pre", "paper_depth_sweep")),
    Claim("The same holds for encoder-decoder models (the paper's N-N translation models): Post-LN fails with "
          "depth.", "paper_depth_sweep_encdec", "as for the decoder", post_unstable_with_depth("paper_depth_sweep_encdec")),
    Claim("... and DeepNorm trains at every depth (encoder-decoder).", "paper_depth_sweep_encdec",
          "every DeepNorm run trains", deepnorm_trains_everywhere("paper_depth_sweep_encdec")),
    Claim("Post-LN's model update ||F(x,θt) − F(x,θ0)|| explodes in the first steps (figures 4-5).", "model_update",
          "after the first step, at the deepest depth, Post-LN's model update is over 10x DeepNorm's, and larger "
          "than at the shallowest depth (later steps saturate: every output has moved as far as unrelated ones lie)",
          post_update_explodes),
    Claim("... and then almost stops.", "model_update",
          "at the deepest depth, Post-LN's largest per-step change in steps 51-100 is under 1/10 of that in steps "
          "1-10, and under 1/10 of DeepNorm's same ratio (the warm-up acts on both)",
          post_update_then_stops),
    Claim("DeepNorm's model update stays bounded whatever the depth.", "model_update",
          "after the first step, DeepNorm's model update at the deepest depth is at most 3x that at the shallowest",
          deepnorm_update_bounded),
    Claim("Post-LN's LayerNorm inputs grow beyond sqrt(d), shrinking the gradient through the LN (figure 3).",
          "model_update", "at the deepest depth and the last per-layer step, Post-LN's mean LN input exceeds "
          "1.5 sqrt(d) while DeepNorm's stays within 1.5 alpha sqrt(d)", post_ln_inputs_grow),
    Claim("Post-LN's gradient vanishes toward the bottom layers (the consequence of the above).", "model_update",
          "bottom-10% over top-10% blocks' gradient norm under 0.1 for Post-LN at the deepest depth",
          gradient_profile("post", below=0.1)),
    Claim("Pre-LN's bottom layers get larger gradients than its top layers.", "model_update",
          "that ratio over 1 for Pre-LN at the deepest depth", gradient_profile("pre", above=1.0)),
    Claim("DeepNorm widens the stable region: Post-LN's largest stable learning rate falls with depth, "
          "DeepNorm's much less.", "frontier_depth",
          "from the brackets (censored cells included): Post-LN's frontier fell from its shallowest to its deepest "
          "depth by a factor that is surely over 1 and over the most DeepNorm's can have fallen (not reproduced: "
          "surely not; closed brackets that overlap: their midpoints decide; an open one: the data cannot)",
          frontier_flatter_for_deepnorm),
    Claim("Divergence happens early in training (why the paper's depth sweep trained only 8,000 steps).",
          "paper_depth_sweep", "at least 3/4 of the diverged runs of the two depth sweeps diverged in the first "
          "third of their steps", divergence_is_early),
    Claim("A 1,000-layer DeepNorm model (500L-500L) trains.", "paper_1000l", "a paper_1000l run trains",
          thousand_layers, needs="hours on a GPU (3.68B parameters): the one H200 lent to this project "
          "had 15 minutes, in which 10 steps ran (69.8 GiB peak, 4.4 s a step; README, \"On one GPU\"), too few "
          "to learn"),
]


def judge(evidence: Evidence) -> list[tuple[Claim, Verdict]]:
    return [(claim, claim.judge(evidence)) for claim in CLAIMS]
