"""The DeepNet paper's claims, each judged on the runs made here by a rule stated in advance.

A claim names the paper's statement, the study (experiment directory under `runs/`) that tests it, and a
rule a measurement either meets or not; its check returns the verdict with the numbers it read. Where the
study has not run, the verdict says so and gives the command; where the data cannot decide (no run diverged,
a fit with one depth), it says "not testable here" and why. Thresholds are in the rules, in the open:
changing one changes the page, never silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd

from .frontier_law import fit_frontier_law
from .runs import at_one_lr, load_frontier, load_layer_records, load_runs, load_scalars

REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE, NOT_RUN = (
    "reproduced at this scale", "not reproduced", "not testable here", "not run yet")


@dataclass(frozen=True)
class Verdict:
    outcome: str
    numbers: str


class Evidence:
    """The records of `runs/<study>/`, each kind loaded once."""

    def __init__(self, root: str | Path):
        self.root, self._cache = Path(root), {}

    def _get(self, kind: str, study: str, load: Callable[[], pd.DataFrame]) -> pd.DataFrame:
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
        met, numbers = self.check(evidence)
        return Verdict(NOT_TESTABLE if met is None else REPRODUCED if met else NOT_REPRODUCED, numbers)


# -- what the checks read ------------------------------------------------------------------------------
def trained(runs: pd.DataFrame) -> pd.Series:
    """Learned 10% of the unigram-to-optimal gap and did not diverge."""
    return runs["status"].eq("completed") & runs["trained"].eq(True)


def trained_by_depth(runs: pd.DataFrame, norm: str) -> dict[int, tuple[int, int]]:
    of = runs[runs["norm"] == norm]
    return {int(d): (int(trained(g).sum()), len(g)) for d, g in of.groupby("depth")}


def _shares(counts: dict[int, tuple[int, int]]) -> str:
    return ", ".join(f"L{d} {k}/{n}" for d, (k, n) in counts.items())


def mean_eval(runs: pd.DataFrame, norm: str, depth: int) -> float:
    """Mean eval loss of the runs of (norm, depth) that trained; NaN if none did."""
    rows = runs[(runs["norm"] == norm) & (runs["depth"] == depth)]
    return float(rows.loc[trained(rows), "eval_loss"].mean())


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
    def check(e: Evidence):
        counts = trained_by_depth(e.runs(study), "post")
        if len(counts) < 2:
            return None, f"Post-LN ran at {len(counts)} depth(s)"
        (k0, n0), (k1, n1) = counts[min(counts)], counts[max(counts)]
        return bool(k1 / n1 <= 0.5 and k1 / n1 < k0 / n0), f"Post-LN trained: {_shares(counts)}"
    return check


def deepnorm_trains_everywhere(study: str):
    def check(e: Evidence):
        counts = trained_by_depth(e.runs(study), "deepnorm")
        if not counts:
            return None, "no DeepNorm run"
        return all(k == n for k, n in counts.values()), f"DeepNorm trained: {_shares(counts)}"
    return check


def lower_loss_than(norm: str, other: str, study: str, only_where_all_trained: bool = False):
    def check(e: Evidence):
        runs = e.runs(study)
        compared = []
        for depth in sorted(runs["depth"].unique()):
            counts = trained_by_depth(runs[runs["depth"] == depth], norm).get(int(depth), (0, 0))
            if only_where_all_trained and counts[0] < counts[1]:
                continue
            a, b = mean_eval(runs, norm, depth), mean_eval(runs, other, depth)
            if np.isfinite(a) and np.isfinite(b):
                compared.append((int(depth), a, b))
        if not compared:
            return None, f"no depth where both {norm} and {other} trained"
        text = "; ".join(f"L{d} {a:.3f} vs {b:.3f}" for d, a, b in compared)
        return all(a < b for _, a, b in compared), f"mean eval loss {norm} vs {other}: {text}"
    return check


def _model_update(e: Evidence, study: str, metric: str, steps: tuple[int, int]) -> pd.DataFrame:
    """norm x depth: the largest `metric` over steps in [first, last], mean over seeds."""
    s = e.scalars(study)
    if s.empty or metric not in s:
        return pd.DataFrame()
    window = s[(s["step"] >= steps[0]) & (s["step"] <= steps[1]) & s[metric].notna()]
    per_run = window.groupby(["norm", "depth", "run_name"])[metric].max()
    return per_run.groupby(["norm", "depth"]).mean().unstack("depth")


def post_update_explodes(e: Evidence):
    early = _model_update(e, "model_update", "model_update", (1, 10))
    if early.empty or not {"post", "deepnorm"} <= set(early.index):
        return None, "no model_update records of Post-LN and DeepNorm"
    deepest = max(early.columns)
    ratio = early.loc["post", deepest] / early.loc["deepnorm", deepest]
    rows = "; ".join(f"{n}: " + ", ".join(f"L{d} {v:.3g}" for d, v in early.loc[n].items()) for n in early.index)
    return bool(ratio > 10), f"largest model update in steps 1-10: {rows} (Post-LN / DeepNorm at L{deepest}: {ratio:.3g})"


def post_update_then_stops(e: Evidence):
    early = _model_update(e, "model_update", "model_update_step", (1, 10))
    late = _model_update(e, "model_update", "model_update_step", (51, 100))
    if early.empty or late.empty or "post" not in early.index:
        return None, "no model_update_step records of Post-LN after step 50"
    deepest = max(early.columns)
    ratios = {n: late.loc[n, deepest] / early.loc[n, deepest] for n in early.index}
    text = ", ".join(f"{n} {r:.3g}" for n, r in ratios.items())
    return bool(ratios["post"] < 0.1), (f"largest per-step change in steps 51-100 over that in steps 1-10, L{deepest}: {text}")


def deepnorm_update_bounded(e: Evidence):
    whole = _model_update(e, "model_update", "model_update", (1, 10**9))
    if whole.empty or "deepnorm" not in whole.index or whole.shape[1] < 2:
        return None, "DeepNorm's model update at fewer than two depths"
    row = whole.loc["deepnorm"].dropna()
    ratio = row.iloc[-1] / row.iloc[0]
    text = ", ".join(f"L{d} {v:.3g}" for d, v in row.items())
    return bool(ratio <= 3), f"DeepNorm's largest model update over the run: {text} (L{row.index[-1]} / L{row.index[0]}: {ratio:.3g})"


def post_ln_inputs_grow(e: Evidence):
    layers, runs = e.layers("model_update"), e.at_one_lr("model_update")
    if layers.empty or "ln_input_norm" not in layers:
        return None, "no ln_input_norm records"
    scale = runs.set_index("run_name")["model.d_model"].astype(float) ** 0.5
    alpha = runs.set_index("run_name").get("alpha.decoder", pd.Series(1.0, index=scale.index)).astype(float)
    rows = layers[layers["ln_input_norm"].notna()].copy()
    rows = rows[rows["step"] == rows.groupby("run_name")["step"].transform("max")]
    rows["units"] = rows["ln_input_norm"] / (scale.reindex(rows["run_name"]).to_numpy()
                                             * alpha.reindex(rows["run_name"]).fillna(1.0).to_numpy())
    deepest = int(rows["depth"].max())
    level = rows[rows["depth"] == deepest].groupby("norm")["units"].mean()
    if not {"post", "deepnorm"} <= set(level.index):
        return None, "no LN inputs of Post-LN and DeepNorm"
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
            return None, f"no {norm} gradients at L{deepest}"
        met = (below is None or r < below) and (above is None or r > above)
        return bool(met), f"bottom-10% over top-10% blocks' gradient norm at the last per-layer step, L{deepest}: {text}"
    return check


def frontier_flatter_for_deepnorm(e: Evidence):
    frontier = e.frontier("frontier_depth")
    if frontier.empty:
        return None, "the frontier sweep has not finished (no frontier.json)"
    law = fit_frontier_law(frontier).set_index("norm")
    if not {"post", "deepnorm"} <= set(law.index) or not np.isfinite(law.loc[["post", "deepnorm"], "slope"]).all():
        return None, "a slope could not be fitted (fewer than two depths with a bracketed frontier): " + ", ".join(
            f"{n} censored at {list(r['censored_depths'])}" for n, r in law.iterrows())
    post, deep = law.loc["post"], law.loc["deepnorm"]
    text = "; ".join(f"{n} {r['slope']:.2f} [{r['slope_low']:.2f}, {r['slope_high']:.2f}] over depths "
                     f"{list(r['depths'])}" + (f", censored at {list(r['censored_depths'])}" if r["censored"] else "")
                     for n, r in law.iterrows())
    return bool(post["slope_high"] < 0 and deep["slope_low"] > post["slope_high"]), f"slope of log max-trainable lr on log depth: {text}"


def divergence_is_early(e: Evidence):
    runs = [e.runs(s) for s in ("paper_depth_sweep", "paper_depth_sweep_encdec", "frontier_depth")]
    runs = pd.concat([r for r in runs if not r.empty], ignore_index=True) if any(not r.empty for r in runs) else None
    if runs is None or not runs["status"].eq("diverged").any():
        return None, "no run diverged"
    diverged = runs[runs["status"] == "diverged"]
    share = (diverged["diverged_at_step"] / diverged["steps"]).astype(float)
    return bool((share <= 1 / 3).mean() >= 0.75), (f"{len(diverged)} diverged runs; {(share <= 1 / 3).sum()} in the first "
                                             f"third of their steps; median at {share.median():.0%} of the budget")


def thousand_layers(e: Evidence):
    runs = e.runs("paper_1000l")
    return bool(trained(runs).any()), f"{int(trained(runs).sum())} of {len(runs)} runs trained"


CLAIMS = [
    Claim("Post-LN training becomes unstable as depth grows.", "paper_depth_sweep",
          "Post-LN trains in at most half of its runs at the deepest depth, and in a larger share at the shallowest",
          post_unstable_with_depth("paper_depth_sweep")),
    Claim("DeepNorm trains at every depth.", "paper_depth_sweep", "every DeepNorm run trains",
          deepnorm_trains_everywhere("paper_depth_sweep")),
    Claim("DeepNorm ends better than Pre-LN at the same depth.", "paper_depth_sweep",
          "DeepNorm's mean eval loss is below Pre-LN's at every depth where both trained",
          lower_loss_than("deepnorm", "pre", "paper_depth_sweep")),
    Claim("Post-LN, where it trains, ends better than Pre-LN.", "paper_depth_sweep",
          "at every depth where every Post-LN seed trained, Post-LN's mean eval loss is below Pre-LN's",
          lower_loss_than("post", "pre", "paper_depth_sweep", only_where_all_trained=True)),
    Claim("The same holds for encoder-decoder models (the paper's N-N translation models): Post-LN fails with "
          "depth.", "paper_depth_sweep_encdec", "as for the decoder", post_unstable_with_depth("paper_depth_sweep_encdec")),
    Claim("... and DeepNorm trains at every depth (encoder-decoder).", "paper_depth_sweep_encdec",
          "every DeepNorm run trains", deepnorm_trains_everywhere("paper_depth_sweep_encdec")),
    Claim("Post-LN's model update ||F(x,θt) − F(x,θ0)|| explodes in the first steps (figures 4-5).", "model_update",
          "at the deepest depth, Post-LN's largest model update in steps 1-10 is over 10x DeepNorm's",
          post_update_explodes),
    Claim("... and then almost stops.", "model_update",
          "at the deepest depth, Post-LN's largest per-step change in steps 51-100 is under 1/10 of that in steps 1-10",
          post_update_then_stops),
    Claim("DeepNorm's model update stays bounded whatever the depth.", "model_update",
          "DeepNorm's largest model update at the deepest depth is at most 3x that at the shallowest",
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
          "Post-LN's frontier slope has its 95% interval below 0 and DeepNorm's interval lies above Post-LN's",
          frontier_flatter_for_deepnorm),
    Claim("Divergence happens early in training (why the paper's depth sweep trained only 8,000 steps).",
          "paper_depth_sweep", "at least 3/4 of the diverged runs (depth and frontier sweeps) diverged in the first "
          "third of their steps", divergence_is_early),
    Claim("A 1,000-layer DeepNorm model (500L-500L) trains.", "paper_1000l", "a paper_1000l run trains",
          thousand_layers, needs="a GPU (3.68B parameters); none was lent to this project's sessions"),
]


def judge(root: str | Path) -> list[tuple[Claim, Verdict]]:
    evidence = Evidence(root)
    return [(claim, claim.judge(evidence)) for claim in CLAIMS]
