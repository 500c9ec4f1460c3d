"""Why a run ended as it did, from its records alone: `diagnosis` in summary.json.

Each rule (RULES) reads one recorded quantity against a threshold fixed here, before any study's numbers were
looked at; a rule whose quantity was not recorded (an instrument turned off) is skipped and named in
`not_measured`. Every rule that holds is a *finding* with the first step it holds at. The diagnosis is:

* a run that diverged: the earliest finding (the first thing that went wrong; at equal steps, the order of
  FINDINGS);
* a run that completed without training: the same, unless the run had settled on the unigram plateau (from an
  evaluation on, its held-out loss within `TRAINED_FRACTION` of the gap of the unigram loss) before the earliest
  finding: then,
  as for a run with no finding, `still_learning` when its held-out loss was still falling at the end, else
  `stuck_on_plateau`, its findings kept under `also`;
* a run that trained: `still_learning` or `trained` by the same test; its findings are kept under `also`.

Steps are those of the records: per-layer quantities exist every `metrics.layer_every` steps (and step 0),
scalars every `train.log_every`, so a finding read from per-layer files can only be dated to that grid.

The rules and their thresholds are RULES below (docs/stability.md shows the same text, generated from it).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from .. import records
from ..rundir import RunDir
from .summary import TRAINED_FRACTION, has_ended, learned_fraction

log = logging.getLogger("deepnorm_exp")

COLLAPSED_COSINE = 0.99
VANISHING_SHARE = 0.10
BELOW_EPS_SHARE = 0.5
LOGIT_GROWTH = 10.0
LOG_Z_GROWTH = 2.0
STREAM_GAIN = 10.0
CONVERGED_FALL = 0.02

# The rules' version, stamped on every diagnosis (`rules`). Analysis re-makes, from the run's records, a
# diagnosis an older version made (the published records' included), so a rule added or changed reaches
# every run on the page. 1: every diagnosis before the stamp; 2: stream_gain_growth (9493cdf); 3: a finding
# after an untrained run settled on its plateau is kept under `also`, and the rules read against step 0 need
# step 0's records to count as measured (a review, 2026-12-05). Bump it with
# any change to a rule or threshold (tests/test_diagnosis.py holds the rules' code to this number).
RULES_VERSION = 3
OUTCOMES = ("trained", "still_learning", "stuck_on_plateau")  # kinds that are not findings
DIVERGENCE_KINDS = ("non_finite", "loss_scale_collapse", "loss_blow_up")


def loss_fall(evals: pd.Series, steps: int, unigram: float, optimal: Optional[float], strict: bool = False) -> float:
    """How much the held-out loss fell toward the end of `steps`, in units of the unigram-to-optimal gap (to 0
    nats without an optimum): from the last evaluation at or before 3/4 of the steps to the one at the end.
    `strict` (the budget study's rule): the evaluation exactly at 3/4 and a known optimum, else NaN.
    `evals`: step -> eval loss. NaN where an evaluation is missing."""
    evals = _one_per_step(evals)
    start, end = fall_span(evals, steps, strict)
    if start is None or end is None:
        return math.nan
    if strict and (optimal is None or not math.isfinite(optimal)):
        return math.nan
    gap = unigram - (optimal if optimal is not None and math.isfinite(optimal) else 0.0)
    return float((evals[start] - evals[end]) / gap)


def fall_span(evals: pd.Series, steps: int, strict: bool = False) -> tuple[Optional[int], Optional[int]]:
    """The two evaluation steps `loss_fall` compares (None where one is missing)."""
    evals = _one_per_step(evals)
    before = evals.index[evals.index == steps * 3 // 4] if strict else evals.index[evals.index <= steps * 3 // 4]
    start = int(max(before)) if len(before) else None
    return start, (steps if steps in evals.index else None)


def _one_per_step(evals: pd.Series) -> pd.Series:
    evals = evals.dropna()
    return evals[~evals.index.duplicated(keep="last")]


def _finding(kind: str, step: int, evidence: str) -> dict:
    return {"kind": kind, "step": int(step), "evidence": evidence}


def _divergence(summary: dict, *_) -> Optional[dict]:
    if summary.get("status") != "diverged":
        return None
    event = summary.get("divergence") if isinstance(summary.get("divergence"), dict) else {}
    # summaries written before the event was kept in them have only the reason and the step
    reason = str(event.get("reason") or summary.get("divergence_reason") or "")
    step = event.get("step", summary.get("diverged_at_step"))
    kind = ("non_finite" if reason.startswith("non-finite")
            else "loss_scale_collapse" if reason.startswith("loss scale") else "loss_blow_up")
    return _finding(kind, step if step is not None else summary.get("steps_completed") or 0,
                    f"the divergence rule: {reason or 'no reason recorded'}")


def _collapsed(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    at_init = layers[layers["step"] == 0].dropna(subset=["token_cosine"]).sort_values("position")
    if at_init.empty:
        return None
    top = at_init.iloc[-1]
    if not top["token_cosine"] >= COLLAPSED_COSINE:
        return None
    stack = at_init[at_init["stack"] == top["stack"]]
    below = stack[stack["token_cosine"] < COLLAPSED_COSINE]
    run = stack[stack["position"] > below["position"].max()] if len(below) else stack
    first = run.iloc[0]
    return _finding("collapsed_at_init", 0, f"token_cosine of the last block {top['token_cosine']:.4f} at step 0 "
                    f"(>= {COLLAPSED_COSINE}); every {top['stack']} block from layer {int(first['layer'])} "
                    f"({first['sublayer']}) up is at or above it")


def _vanishing(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    measured = layers.dropna(subset=["adam_below_eps"])
    for step, at in measured.groupby("step", sort=True):
        for stack, blocks in at.groupby("stack", sort=False):
            layers_in = sorted(blocks["layer"].unique())
            bottom = layers_in[:max(1, math.floor(len(layers_in) * VANISHING_SHARE))]
            share = float(blocks[blocks["layer"].isin(bottom)]["adam_below_eps"].mean())
            if share > BELOW_EPS_SHARE:
                return _finding("gradient_vanishing", step, f"adam_below_eps {share:.1%} in {stack} layers "
                                f"{bottom[0]}-{bottom[-1]} at step {step} (> {BELOW_EPS_SHARE:.0%})")
    return None


def _earliest(rows: pd.DataFrame) -> Optional[pd.Series]:
    """A per-layer rule's first row that holds, by step then block (None where none does)."""
    return None if rows.empty else rows.sort_values(["step", "position"]).iloc[0]


def _where(row: pd.Series) -> str:
    return f"{row['stack']} layer {int(row['layer'])} at step {int(row['step'])}"


def _logit_growth(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    measured = layers.dropna(subset=["attn_logit_max"])
    keys = ["stack", "position"]
    initial = measured[measured["step"] == 0].set_index(keys)["attn_logit_max"]
    later = measured[measured["step"] > 0].join(initial.rename("initial"), on=keys).dropna(subset=["initial"])
    first = _earliest(later[later["attn_logit_max"] > LOGIT_GROWTH * later["initial"]])
    if first is None:
        return None
    return _finding("attention_logit_growth", first["step"], f"attn_logit_max {first['attn_logit_max']:.4g} in "
                    f"{_where(first)}, {first['attn_logit_max'] / first['initial']:.1f}x its step-0 "
                    f"{first['initial']:.4g} (> {LOGIT_GROWTH:g}x)")


STREAM_GAINS = ("mix_gain_forward", "mix_gain_backward")


def stream_gains(layers: pd.DataFrame) -> pd.DataFrame:
    """The gain columns a table holds, as numbers (records are read as untrusted input: text reads as NaN), with
    `gain`, the larger of the two where either was measured. The zoo's table reads the same."""
    gains = layers[[c for c in STREAM_GAINS if c in layers]].apply(pd.to_numeric, errors="coerce")
    return gains.assign(gain=gains.max(axis=1, skipna=True))


def _stream_gain(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    gains = stream_gains(layers)
    columns = [c for c in STREAM_GAINS if c in gains]
    measured = layers.assign(**gains)
    first = _earliest(measured[measured["gain"] > STREAM_GAIN])
    if first is None:
        return None
    both = "; ".join(f"{c.removeprefix('mix_gain_')} {first[c]:.4g}" for c in columns)
    return _finding("stream_gain_growth", first["step"], f"composite gain {first['gain']:.4g} through {_where(first)} "
                    f"(> {STREAM_GAIN:g}; {both})")


def _log_z(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    series = scalars.dropna(subset=["log_z_abs_max"]).sort_values("step")
    series = series[series["log_z_abs_max"].map(math.isfinite)]
    if series.empty:
        return None
    first = float(series["log_z_abs_max"].iloc[0])
    over = series[series["log_z_abs_max"] > LOG_Z_GROWTH * first]
    if over.empty:
        return None
    row = over.iloc[0]
    return _finding("output_logit_divergence", row["step"], f"log_z_abs_max {row['log_z_abs_max']:.4g} at step "
                    f"{int(row['step'])}, {row['log_z_abs_max'] / first:.1f}x its first recorded {first:.4g} "
                    f"(> {LOG_Z_GROWTH:g}x)")


def _spikes(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    spikes = events[events["event"] == "loss_spike"].sort_values("step") if "event" in events else events.iloc[0:0]
    if spikes.empty:
        return None
    first = spikes.iloc[0]
    return _finding("loss_spikes", first["step"], f"{len(spikes)} loss spike(s), the first at step {int(first['step'])}: "
                    f"loss {first['loss']:.4g} against a median {first['median']:.4g} + {first['k']:g} x {first['deviation']:.3g}")


# kind -> (its rule, the table and column it reads (or columns, any of them measured will do): None for the
# summary, always there); in this order at equal steps
FINDINGS: dict[str, tuple[Callable, Optional[str], Optional[str | tuple[str, ...]]]] = {
    "divergence": (_divergence, None, None),
    "collapsed_at_init": (_collapsed, "layers", "token_cosine"),
    "gradient_vanishing": (_vanishing, "layers", "adam_below_eps"),
    "attention_logit_growth": (_logit_growth, "layers", "attn_logit_max"),
    "stream_gain_growth": (_stream_gain, "layers", STREAM_GAINS),
    "output_logit_divergence": (_log_z, "scalars", "log_z_abs_max"),
    "loss_spikes": (_spikes, "scalars", "loss_spikes"),
}
# read only where recorded: a run without the column (its scheme has one stream) is not named as not measured;
# a column there but empty is
WHERE_RECORDED = ("stream_gain_growth",)
# read against the records of step 0: measured only where step 0 has them
AGAINST_STEP_0 = ("collapsed_at_init", "attention_logit_growth")
KINDS = (*DIVERGENCE_KINDS, *(k for k in FINDINGS if k != "divergence"), *OUTCOMES)  # every value of `kind`

# kind -> its rule, as the manual shows it (a threshold's number comes from its constant above)
RULES = {
    "non_finite": "the divergence rule stopped the run at a non-finite loss or gradient norm (train/callbacks.py)",
    "loss_scale_collapse": "the divergence rule: fp16's loss scale fell below `train.min_loss_scale`",
    "loss_blow_up": "the divergence rule: the loss stayed above `spike_factor` x its minimum for `spike_patience` steps",
    "collapsed_at_init": f"at step 0 the last block's `token_cosine` (mean cosine between positions) is at least "
                         f"{COLLAPSED_COSINE}: unit vectors that close differ by sqrt(2 (1 - {COLLAPSED_COSINE})) = "
                         f"{math.sqrt(2 * (1 - COLLAPSED_COSINE)):.2f} of their length, so the output head sees nearly "
                         "one vector at every position (rank collapse, Dong et al. 2021)",
    "gradient_vanishing": f"in the bottom {VANISHING_SHARE:.0%} of a stack's layers (at least one), the mean over their "
                          "blocks of the share of coordinates whose sqrt(v_hat) is below Adam's epsilon "
                          f"(`adam_below_eps`) is above {BELOW_EPS_SHARE:.0%}: there Adam's step is shrunk by epsilon "
                          "instead of normalised (Wortsman et al. 2023). A bias whose gradient is exactly zero counts "
                          "as below; about 1% of a block",
    "attention_logit_growth": f"a layer's `attn_logit_max` above {LOGIT_GROWTH:g}x its own value at step 0: a softmax "
                              f"{LOGIT_GROWTH:g}x sharper than the initialisation's (Dehghani et al. 2023)",
    "stream_gain_growth": f"a multi-stream scheme's composite gain (the larger of `mix_gain_forward` and "
                          f"`mix_gain_backward`, the product of the stream mixings H_res through a stack) above "
                          f"{STREAM_GAIN:g}: a signal through the streams alone could grow {STREAM_GAIN:g}-fold (the "
                          "mHC paper saw HC's reach about 3,000 before its loss spikes; a doubly stochastic H_res holds "
                          "1). Runs without the columns (one stream, or `metrics.stream_mixing=false`) are not judged "
                          "by it and not listed as not measured; columns recorded but empty are listed",
    "output_logit_divergence": f"`log_z_abs_max` above {LOG_Z_GROWTH:g}x its first recorded value. At initialisation "
                               "log Z is about log V (near-uniform logits); doubling it moves the logits' common level by "
                               "that much again, which the loss does not see (Wortsman et al. 2023)",
    "loss_spikes": "at least one loss spike (`spike_k` robust deviations above the median of the `spike_window` steps "
                   "before it; metrics/spikes.py)",
    "still_learning": f"completed, and the held-out loss fell, from the last evaluation at or before 3/4 of the "
                      f"steps to the end, by at least {CONVERGED_FALL:.0%} of the unigram-to-optimal gap (to 0 nats "
                      "without a known optimum): the budget study's threshold, which reads the evaluation exactly at 3/4",
    "stuck_on_plateau": "completed without training (`trained: false`), no finding, and not still learning",
    "trained": "completed and trained (`trained: true`), and not still learning",
}


def rules_markdown() -> str:
    """The manual's table of the diagnosis kinds, in the order a tie is broken."""
    rows = [f"| `{kind}` | {RULES[kind]} |" for kind in KINDS]
    return "\n".join(["| kind | holds when |", "|---|---|", *rows])


def diagnose(summary: dict, scalars: pd.DataFrame, events: pd.DataFrame, layers: pd.DataFrame) -> Optional[dict]:
    """The diagnosis of one run that ended (None for one that did not), from its summary and its records:
    `scalars` (metrics.jsonl), `events` (events.jsonl) and `layers` (the per-layer files), one run's rows.
    {"kind", "step", "evidence", "also": [other findings], "not_measured": [quantities a rule needed], "rules":
    RULES_VERSION}."""
    if not has_ended(summary):
        return None
    tables = {"scalars": scalars, "layers": layers}
    findings, not_measured = [], []
    for kind, (rule, table, column) in FINDINGS.items():
        columns = (column,) if isinstance(column, str) else column or ()  # any of several measured will do
        read = [c for c in columns if table is not None and c in tables[table]]
        rows = tables[table] if table is not None else None
        if kind in AGAINST_STEP_0 and rows is not None and "step" in rows:
            rows = rows[rows["step"] == 0]
        if table is not None and not any(rows[c].notna().any() for c in read):
            if kind not in WHERE_RECORDED or read:  # recorded, but never measured
                not_measured.append(columns[0])
        elif (found := rule(summary, scalars, events, layers)) is not None:
            findings.append(found)
    order = list(FINDINGS)
    findings.sort(key=lambda f: (f["step"], order.index("divergence" if f["kind"] in DIVERGENCE_KINDS else f["kind"])))
    if summary["status"] == "diverged":
        main, also = findings[0], findings[1:]  # a diverged run always has its divergence finding
    elif findings and not summary.get("trained") and not findings[0]["step"] > _plateau_from(summary, scalars):
        main, also = findings[0], findings[1:]
    else:
        main, also = _outcome(summary, scalars), findings
    return {**main, "also": also, "not_measured": not_measured, "rules": RULES_VERSION}


def _evaluations(summary: dict, scalars: pd.DataFrame) -> pd.Series:
    """step -> held-out loss: the recorded evaluations, and the summary's final one where the records lack it."""
    step = int(summary.get("steps_completed") or summary.get("steps") or 0)
    evals = (scalars.dropna(subset=["eval_loss"]).set_index("step")["eval_loss"] if "eval_loss" in scalars
             else pd.Series(dtype=float))
    if summary.get("eval_loss") is not None and step not in evals.index:
        evals = pd.concat([evals, pd.Series({step: float(summary["eval_loss"])})])
    return _one_per_step(evals.sort_index())


def _plateau_from(summary: dict, scalars: pd.DataFrame) -> float:
    """The first evaluation (after step 0) from which the run's held-out loss stayed on the unigram plateau:
    within TRAINED_FRACTION of the gap of the unigram loss, on either side (below it the run would be trained;
    far above it, it is still coming down from the initial loss, or has blown up). Infinite where the run did
    not end on the plateau, or has no evaluation to date it by."""
    evals = _evaluations(summary, scalars)
    evals = evals[evals.index > 0]
    unigram, optimal = float(summary.get("unigram_loss") or math.nan), summary.get("optimal_loss")

    def on_plateau(loss: float) -> bool:
        learned = learned_fraction(loss, unigram, optimal)
        return learned is not None and abs(learned) < TRAINED_FRACTION  # NaN (no unigram loss): never
    off = [step for step, loss in evals.items() if not on_plateau(float(loss))]
    after = evals.index[evals.index > max(off)] if off else evals.index
    return float(after[0]) if len(after) else math.inf


def _outcome(summary: dict, scalars: pd.DataFrame) -> dict:
    """trained, still_learning or stuck_on_plateau: what a completed run with no failure finding ended as."""
    step = int(summary.get("steps_completed") or summary.get("steps") or 0)
    evals = _evaluations(summary, scalars)
    fall = loss_fall(evals, step, float(summary.get("unigram_loss") or math.nan), summary.get("optimal_loss"))
    learned = summary.get("learned_fraction")
    state = f"learned {learned:.0%} of the unigram-to-optimal gap" if learned is not None else "learned: unknown"
    if math.isnan(fall):
        falling, trend = False, "no evaluation at or before 3/4 of the steps to compare with"
    else:
        moved = f"fell {fall:.1%}" if fall >= 0 else f"rose {-fall:.1%}"
        falling = fall >= CONVERGED_FALL
        trend = f"the held-out loss {moved} of the gap from step {fall_span(evals, step)[0]} to {step}"
    kind = "still_learning" if falling else ("trained" if summary.get("trained") else "stuck_on_plateau")
    bound = f"(still learning from {CONVERGED_FALL:.0%})"
    return _finding(kind, step, f"{state}; {trend} {bound}")


def diagnose_run_dir(run_dir: Path, summary: dict) -> Optional[dict]:
    """`diagnose` on the records a run directory holds (what a run calls when it ends)."""
    from ..sinks.layers import load_layers

    scalars = pd.DataFrame(records.read_jsonl(RunDir(run_dir).metrics))
    events = pd.DataFrame(records.read_jsonl(RunDir(run_dir).events))
    return diagnosed_or_none(run_dir, summary, scalars, events, load_layers(run_dir))


def diagnosed_or_none(where: Path | str, summary: dict, scalars: pd.DataFrame, events: pd.DataFrame,
                      layers: pd.DataFrame) -> Optional[dict]:
    """`diagnose`, where a rule that raises is a bug here and not in the run: it is logged, naming the run, and
    the run keeps no diagnosis rather than losing its summary (or stopping the analysis of the others)."""
    try:
        return diagnose(summary, scalars, events, layers)
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.error("%s: the diagnosis failed (a bug in deepnorm_exp/lifecycle/diagnosis.py; the run's records are "
                  "whole): %s: %s", where, type(e).__name__, e)
        return None
