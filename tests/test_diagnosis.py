"""The per-run diagnosis (lifecycle/diagnosis.py): every kind produced on purpose by a tiny run through the
real training path, and withheld in a control that differs in the one thing that produces it; then the rules'
thresholds and their ordering on records built by hand."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import deepnorm_exp
from deepnorm_exp.lifecycle import diagnosis as dg
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.lifecycle.summary import format_summary, format_table
from deepnorm_exp.models.decoder import DecoderLM

from conftest import TINY

FAST = ["train.warmup_steps=0", "train.steps=40", "metrics.layer_every=10"]
# Enough data not to overfit: the control that trains and has stopped improving
TRAINS = ["data.train_sequences=1024", "train.steps=300", "train.eval_every=75", "train.warmup_steps=20",
          "train.lr=3e-3", "metrics.layer_every=100"]


def diagnosed(tmp_path, *overrides) -> dict:
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", *overrides])
    summary = run_experiment(cfg, progress=False)
    assert summary["diagnosis"] is not None and summary["diagnosis"]["kind"] in dg.KINDS
    assert summary["diagnosis"]["kind"] in format_summary(summary) and summary["diagnosis"]["kind"] in format_table([summary])
    return summary["diagnosis"]


@pytest.mark.parametrize("overrides,kind,control", [
    # deep Post-LN is collapsed before any step; DeepNorm at the same depth is not
    (["norm=post", "depth=24", "train.steps=6"], "collapsed_at_init", ["norm=deepnorm", "depth=24", "train.steps=6"]),
    # Adam's epsilon above every gradient's RMS: the step is shrunk by epsilon, not normalised
    (["train.adam_eps=1e3"], "gradient_vanishing", []),
    # lr 0.3 without warm-up: the attention logits grow; QK-LayerNorm holds them
    ([*FAST, "train.lr=0.3"], "attention_logit_growth", [*FAST, "train.lr=0.3", "model.qk_norm=layernorm"]),
    # lr 3 without warm-up: log Z runs away, then the loss blows up; at lr 1e-3 neither
    ([*FAST, "train.lr=3"], "output_logit_divergence", [*FAST, "train.lr=1e-3"]),
    # the same run with log Z unrecorded: the blow-up itself is what is left to name
    ([*FAST, "train.lr=3", "metrics.log_z=false", "metrics.representation=false"], "loss_blow_up",
     [*FAST, "metrics.log_z=false", "metrics.representation=false"]),
    # a learning rate that moves nothing: stuck where it started; the same steps at a real rate still learn
    (["train.lr=1e-9"], "stuck_on_plateau", ["train.warmup_steps=0", "train.lr=1e-2"]),
])
def test_each_kind_is_produced_on_purpose_and_withheld_in_its_control(tmp_path, overrides, kind, control):
    made = diagnosed(tmp_path / "made", *overrides)
    assert made["kind"] == kind, made
    held = diagnosed(tmp_path / "control", *control)
    assert held["kind"] != kind and kind not in [f["kind"] for f in held["also"]], held


def test_hyper_connections_composite_gain_grows_where_mhcs_doubly_stochastic_mixing_holds_it(tmp_path):
    """The mHC paper's contrast in miniature: at lr 3e-2 without warm-up, HC's product of stream mixings passes
    10 within 40 steps (measured: 15.6 at step 30; at lr 0.3 about 2e7 by step 10), while mHC's, the same run
    with Sinkhorn's doubly stochastic H_res, stays at 1."""
    hc = diagnosed(tmp_path / "hc", *FAST, "train.lr=3e-2", "norm=hyper_connections")
    assert "stream_gain_growth" in [hc["kind"], *(f["kind"] for f in hc["also"])], hc
    mhc = diagnosed(tmp_path / "mhc", *FAST, "train.lr=3e-2", "norm=mhc")
    assert "stream_gain_growth" not in [mhc["kind"], *(f["kind"] for f in mhc["also"])], mhc
    assert "mix_gain_forward" not in mhc["not_measured"]


@pytest.mark.slow
def test_a_run_that_trains_and_has_stopped_improving_is_trained_and_a_short_one_still_learning(tmp_path):
    trained = diagnosed(tmp_path / "long", *TRAINS)
    assert trained["kind"] == "trained" and trained["not_measured"] == [], trained
    short = diagnosed(tmp_path / "short", *TRAINS[:4], "train.lr=3e-3", "train.steps=100", "train.eval_every=25")
    assert short["kind"] == "still_learning", short


def test_an_injected_loss_spike_is_named_and_the_same_run_without_it_is_not(tmp_path, monkeypatch):
    # lr ~0: the loss sits on its starting level with the batches' own noise, and the run does not train
    flat = ["train.steps=30", "train.log_every=1", "train.warmup_steps=0", "metrics.spike_window=10", "train.lr=1e-9"]
    control = diagnosed(tmp_path / "control", *flat)
    assert control["kind"] == "stuck_on_plateau" and control["also"] == [], control
    from deepnorm_exp.models import decoder

    original, calls = decoder.next_token_loss, {"n": 0}

    def loss_with_a_spike(logits, targets, **kw):
        out = original(logits, targets, **kw)
        calls["n"] += torch.is_grad_enabled()  # training steps only (evaluation and probes run without grad)
        # the 20th step's loss 5 nats higher, as a bad batch would read; its gradient unchanged
        return out._replace(loss=out.loss + 5.0) if torch.is_grad_enabled() and calls["n"] == 20 else out

    monkeypatch.setattr(decoder, "next_token_loss", loss_with_a_spike)
    made = diagnosed(tmp_path / "made", *flat)
    assert made["kind"] == "loss_spikes" and made["step"] == 20 and "1 loss spike(s)" in made["evidence"], made


def test_non_finite_and_loss_scale_collapse_are_the_divergence_events_own(tmp_path, monkeypatch):
    # fp16 runs on the CPU too (tests/test_fidelity.py): a scale of 1e12 overflows at every step until it is under 1e11
    scale = diagnosed(tmp_path / "fp16", "train.precision=fp16", "train.loss_scale_init=1e12", "train.min_loss_scale=1e11")
    assert scale["kind"] == "loss_scale_collapse" and scale["step"] == 4, scale
    assert diagnosed(tmp_path / "fp16-ok", "train.precision=fp16")["kind"] not in dg.DIVERGENCE_KINDS
    original = DecoderLM.forward
    monkeypatch.setattr(DecoderLM, "forward", lambda self, tokens: original(self, tokens) * (math.nan if self.training else 1))
    made = diagnosed(tmp_path / "nan")
    assert made["kind"] == "non_finite" and made["step"] == 1 and "non-finite loss" in made["evidence"]


# --- the rules on records built by hand ---------------------------------------------------------------

def summary(**kw) -> dict:
    return {"status": "completed", "trained": False, "steps": 100, "steps_completed": 100, "eval_loss": 3.0,
            "unigram_loss": 3.0, "optimal_loss": 1.0, "learned_fraction": 0.0, **kw}


def layers(rows) -> pd.DataFrame:
    """rows: (step, layer, column -> value); one decoder stack, one block per layer."""
    return pd.DataFrame([{"step": s, "stack": "decoder", "layer": layer, "sublayer": "attn", "position": layer, **v}
                         for s, layer, v in rows])


NO_EVENTS = pd.DataFrame()


def scalars(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_collapse_needs_the_last_block_at_the_bound_and_names_where_it_starts():
    def top(cos):
        return layers([(0, i, {"token_cosine": c}) for i, c in enumerate([0.5, 0.995, 0.98, 0.995, cos])])

    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, top(dg.COLLAPSED_COSINE))
    assert found["kind"] == "collapsed_at_init" and "from layer 3 (attn) up" in found["evidence"]
    assert dg.diagnose(summary(), scalars([]), NO_EVENTS, top(0.9899))["kind"] == "stuck_on_plateau"


def test_vanishing_reads_the_bottom_tenth_of_each_stack_and_its_first_step():
    bottom = {10: 0.0, 50: 0.6, 90: 0.7}  # layer 0; layer 1 is at 0.4 throughout, the rest at 0
    rows = [(s, i, {"adam_below_eps": bottom[s] if i == 0 else 0.4 if i == 1 else 0.0})
            for s in (10, 50, 90) for i in range(20)]  # the bottom 10% of 20 layers: layers 0 and 1
    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, layers(rows))
    # (0.6 + 0.4) / 2 = 0.5 at step 50 is not above the bound; 0.55 at step 90 is
    assert found["kind"] == "gradient_vanishing" and found["step"] == 90 and "layers 0-1" in found["evidence"]
    rows = [(s, i, {"adam_below_eps": v}) for s, i, v in [(10, 0, 0.5), (10, 1, 0.5), *[(10, i, 1.0) for i in range(2, 20)]]]
    assert dg.diagnose(summary(), scalars([]), NO_EVENTS, layers(rows))["kind"] == "stuck_on_plateau"


def test_vanishing_is_judged_per_stack_by_each_stacks_own_bottom_layers():
    def stack(name, start, bottom_share):  # 10 layers: the bottom 10% is its layer 0
        return [{"step": 50, "stack": name, "layer": i, "sublayer": "ffn", "position": start + i,
                 "adam_below_eps": bottom_share if i == 0 else 0.0} for i in range(10)]

    # the decoder's bottom (position 10, above the whole encoder) is where the gradient vanished
    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, pd.DataFrame(stack("encoder", 0, 0.0) + stack("decoder", 10, 0.9)))
    assert found["kind"] == "gradient_vanishing" and "decoder layers 0-0" in found["evidence"]
    held = dg.diagnose(summary(), scalars([]), NO_EVENTS, pd.DataFrame(stack("encoder", 0, 0.0) + stack("decoder", 10, 0.5)))
    assert held["kind"] == "stuck_on_plateau"


def test_a_diverged_run_is_named_by_its_divergence_even_without_the_event():
    old = summary(status="diverged", trained=True, divergence=None, diverged_at_step=17,
                  divergence_reason="non-finite gradient norm")  # summaries before the event was kept in them
    found = dg.diagnose(old, scalars([]), NO_EVENTS, layers([]))
    assert found["kind"] == "non_finite" and found["step"] == 17
    bare = dg.diagnose(summary(status="diverged", divergence=None), scalars([]), NO_EVENTS, layers([]))
    assert bare["kind"] == "loss_blow_up" and "no reason recorded" in bare["evidence"]


def test_a_rule_that_raises_leaves_the_run_without_a_diagnosis_and_says_so(caplog, monkeypatch):
    monkeypatch.setitem(dg.FINDINGS, "loss_spikes", (lambda *a: 1 / 0, "scalars", "loss_spikes"))
    assert dg.diagnosed_or_none("runs/x", summary(), scalars([{"step": 1, "loss_spikes": 0}]), NO_EVENTS, layers([])) is None
    assert "runs/x: the diagnosis failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_logit_growth_is_against_each_layers_own_step_zero():
    rows = [(0, 0, {"attn_logit_max": 1.0}), (0, 1, {"attn_logit_max": 5.0}),
            (50, 0, {"attn_logit_max": 10.0}), (50, 1, {"attn_logit_max": 49.0}),  # 10x and 9.8x: not above
            (100, 0, {"attn_logit_max": 10.5}), (100, 1, {"attn_logit_max": 51.0})]
    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, layers(rows))
    assert found["kind"] == "attention_logit_growth" and found["step"] == 100 and "layer 0" in found["evidence"]


def test_log_z_is_against_its_first_finite_record():
    rows = [{"step": 10, "log_z_abs_max": math.nan}, {"step": 20, "log_z_abs_max": 6.0},
            {"step": 30, "log_z_abs_max": 12.0}, {"step": 40, "log_z_abs_max": 12.1}]
    found = dg.diagnose(summary(), scalars(rows), NO_EVENTS, layers([]))
    assert found["kind"] == "output_logit_divergence" and found["step"] == 40


def test_the_earliest_finding_wins_and_a_trained_run_keeps_them_as_also():
    recs = layers([(0, 0, {"attn_logit_max": 1.0}), (50, 0, {"attn_logit_max": 20.0})])
    early_z = scalars([{"step": 10, "log_z_abs_max": 5.0}, {"step": 30, "log_z_abs_max": 11.0}])
    diverged = summary(status="diverged", divergence={"step": 40, "reason": "loss above 4x its minimum"})
    found = dg.diagnose(diverged, early_z, NO_EVENTS, recs)
    assert [found["kind"], *[f["kind"] for f in found["also"]]] == ["output_logit_divergence", "loss_blow_up",
                                                                     "attention_logit_growth"]
    trained = dg.diagnose(summary(trained=True, learned_fraction=0.5), early_z, NO_EVENTS, recs)
    assert trained["kind"] == "trained" and trained["step"] == 100
    assert [f["kind"] for f in trained["also"]] == ["output_logit_divergence", "attention_logit_growth"]
    # at equal steps the order of FINDINGS decides: a divergence before anything read at that step
    same = dg.diagnose(summary(status="diverged", divergence={"step": 50, "reason": "non-finite loss"}),
                       scalars([]), NO_EVENTS, recs)
    assert same["kind"] == "non_finite" and same["also"][0]["kind"] == "attention_logit_growth"


def test_stream_gain_growth_reads_the_larger_gain_above_the_bound_and_only_where_streams_are_recorded():
    """A multi-stream run whose composite gain (forward or backward) passes 10 at some block and step is named
    there, with both gains; at the bound it is not; a single-stream run (no mix columns) is neither judged by
    it nor listed as not measured."""
    def gains(at_step_50):
        return layers([(s, i, {"mix_gain_forward": f, "mix_gain_backward": b})
                       for s in (0, 50) for i, (f, b) in enumerate([(1.0, 1.0), (2.0, 3.0)] if s == 0 else at_step_50)])

    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, gains([(4.0, 2.0), (3.0, dg.STREAM_GAIN + 0.5)]))
    assert found["kind"] == "stream_gain_growth" and found["step"] == 50
    assert "through decoder layer 1" in found["evidence"] and "backward 10.5" in found["evidence"]
    held = dg.diagnose(summary(), scalars([]), NO_EVENTS, gains([(dg.STREAM_GAIN, 2.0), (3.0, dg.STREAM_GAIN)]))
    assert held["kind"] == "stuck_on_plateau" and "mix_gain_forward" not in held["not_measured"]
    single = dg.diagnose(summary(), scalars([]), NO_EVENTS, layers([(0, 0, {"token_cosine": 0.5})]))
    assert "mix_gain_forward" not in single["not_measured"]


@pytest.mark.parametrize("rows, flagged", [
    ([{"mix_gain_forward": 50.0}], True),  # one column of the two (a hand-edited record): read, not a crash
    ([{"mix_gain_forward": math.nan, "mix_gain_backward": 50.0}], True),  # the other gain still counts
    ([{"mix_gain_forward": math.inf, "mix_gain_backward": math.nan}], True),  # a blow-up recorded as inf
    ([{"mix_gain_forward": "50", "mix_gain_backward": "x"}], True),  # text where a number belongs: coerced
    ([{"mix_gain_forward": math.nan, "mix_gain_backward": math.nan}], False),  # recorded, never measured
])
def test_stream_gain_reads_hostile_or_partial_records_without_losing_the_diagnosis(rows, flagged):
    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, layers([(50, 0, row) for row in rows]))
    kinds = [found["kind"], *(f["kind"] for f in found["also"])]
    assert ("stream_gain_growth" in kinds) == flagged, found
    assert ("mix_gain_forward" in found["not_measured"]) == (not flagged), found


def test_a_quantity_not_recorded_is_named_not_guessed():
    found = dg.diagnose(summary(), scalars([{"step": 10, "loss": 3.0}]), NO_EVENTS, layers([]))
    assert set(found["not_measured"]) == {"token_cosine", "adam_below_eps", "attn_logit_max", "log_z_abs_max",
                                          "loss_spikes"}
    # a column that is there but empty (another run of the table recorded it) is not measured either
    recs = layers([(0, 0, {"token_cosine": math.nan, "attn_logit_max": 1.0})])
    assert "token_cosine" in dg.diagnose(summary(), scalars([]), NO_EVENTS, recs)["not_measured"]
    assert dg.diagnose(summary(status="interrupted"), scalars([]), NO_EVENTS, layers([])) is None


def test_loss_fall_is_the_last_quarter_in_units_of_the_gap():
    evals = pd.Series({25: 3.0, 50: 2.8, 75: 2.5, 100: 2.46})
    assert dg.loss_fall(evals, 100, 3.0, 1.0) == pytest.approx(0.02)
    assert dg.loss_fall(evals, 100, 3.0, None) == pytest.approx(0.04 / 3.0)  # no optimum: the gap runs to 0 nats
    assert dg.loss_fall(pd.Series({70: 2.5, 100: 2.4}), 100, 3.0, 1.0) == pytest.approx(0.05)  # last eval before 3/4
    assert math.isnan(dg.loss_fall(pd.Series({80: 2.5, 100: 2.4}), 100, 3.0, 1.0))
    # strict (the budget study's rule): the evaluation exactly at 3/4, and a known optimum
    assert math.isnan(dg.loss_fall(pd.Series({70: 2.5, 100: 2.4}), 100, 3.0, 1.0, strict=True))
    assert math.isnan(dg.loss_fall(evals, 100, 3.0, None, strict=True))
    assert dg.loss_fall(evals, 100, 3.0, 1.0, strict=True) == pytest.approx(0.02)


def test_the_analysis_gives_an_old_run_the_diagnosis_the_run_gave_itself(tmp_path):
    """A run recorded before diagnoses existed gets its diagnosis from the same records, both from its directory
    (load_runs) and from its published pack."""
    from deepnorm_exp import records
    from deepnorm_exp.analysis import load_runs, published

    study = tmp_path / "tiny"
    written = {}
    for norm, lr in (("post", "1e-9"), ("deepnorm", "0.3")):
        s = run_experiment(deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "experiment_name=tiny",
                                                 *FAST, f"norm={norm}", f"train.lr={lr}"]), progress=False)
        written[s["run_name"]] = s["diagnosis"]
        path = Path(s["run_dir"]) / "summary.json"
        records.write_json(path, {k: v for k, v in records.read_json(path).items() if k != "diagnosis"})
    assert {d["kind"] for d in written.values()} == {"stuck_on_plateau", "attention_logit_growth"}
    from_dirs = load_runs(study).set_index("run_name")
    published.pack(study)
    from_pack = published.load(study).runs().set_index("run_name")
    for name, diagnosis in written.items():
        for frame in (from_dirs, from_pack):
            assert frame.loc[name, "diagnosis.kind"] == diagnosis["kind"]
            assert frame.loc[name, "diagnosis.evidence"] == diagnosis["evidence"]
            assert list(frame.loc[name, "diagnosis.not_measured"]) == diagnosis["not_measured"]


def test_a_diagnosis_older_rules_made_is_made_again_from_the_published_records():
    """The zoo's hyper_connections runs at depths 24 and 100 were diagnosed (d261ca4) before stream_gain_growth
    existed (9493cdf): their packed diagnosis has no such finding, their records a composite gain of 10.75 and
    27.6. Read back, they carry it; a diagnosis of today's rules is kept as the run wrote it."""
    from deepnorm_exp import records
    from deepnorm_exp.analysis.published import load
    from deepnorm_exp.analysis.runs import needs_diagnosis

    from conftest import REPO

    pack = load(REPO / "runs" / "zoo_depth_sweep")
    packed = {r.run_name: records.loads(r.summary) for r in pack.table("runs").itertuples()}
    runs = pack.runs().set_index("run_name")
    for depth in (24, 100):
        name = f"hyper_connections-L{depth}-s0"
        assert "rules" not in packed[name]["diagnosis"] and not packed[name]["diagnosis"]["also"]
        assert [f["kind"] for f in runs.loc[name, "diagnosis.also"]] == ["stream_gain_growth"]
        assert runs.loc[name, "diagnosis.rules"] == dg.RULES_VERSION
    # a one-stream run of the same pack: the pack's layers table has the gain columns (NaN for it), its own files
    # had none, so they are not "not measured" (was: mix_gain_forward listed for 75 of the zoo's 81 runs)
    assert "mix_gain_forward" not in runs.loc["pre-L24-s0", "diagnosis.not_measured"]
    assert "token_cosine" not in runs.loc["pre-L24-s0", "diagnosis.not_measured"]  # the zoo's instruments were on
    today = {"status": "completed", "diagnosis": {"kind": "trained", "rules": dg.RULES_VERSION}}
    assert not needs_diagnosis(today) and needs_diagnosis({**today, "diagnosis": {"kind": "trained", "rules": 1}})
    assert needs_diagnosis({"status": "completed", "diagnosis": "trained"})  # not a diagnosis: made again


# The rules' code as of RULES_VERSION: a change to any of it without a new version would leave every run
# diagnosed before it, published ones included, read by the old rules
RULES_CODE = {2: "fe51140364c21a2b", 3: "9df8301d9dbc59dc"}


def test_the_rules_code_is_the_code_its_version_names():
    import hashlib
    import inspect

    code = [inspect.getsource(f) for f in (dg.diagnose, dg._outcome, dg._evaluations, dg._plateau_from, dg.loss_fall,
                                           dg.fall_span, dg._one_per_step, dg._earliest, dg.stream_gains,
                                           *(rule for rule, _, _ in dg.FINDINGS.values()))]
    constants = (dg.COLLAPSED_COSINE, dg.VANISHING_SHARE, dg.BELOW_EPS_SHARE, dg.LOGIT_GROWTH, dg.LOG_Z_GROWTH,
                 dg.STREAM_GAIN, dg.CONVERGED_FALL, dg.WHERE_RECORDED, dg.AGAINST_STEP_0, list(dg.FINDINGS))
    digest = hashlib.sha256(("".join(code) + repr(constants)).encode()).hexdigest()[:16]
    assert RULES_CODE.get(dg.RULES_VERSION) == digest, (
        f"the diagnosis rules changed ({digest}): bump diagnosis.RULES_VERSION and add {{version: '{digest}'}} here")


def test_the_diagnosis_table_counts_the_runs_that_ended():
    from deepnorm_exp.analysis.tables import diagnosis_table

    runs = pd.DataFrame([{"norm": "post", "depth": 48, "status": "completed", "diagnosis.kind": "collapsed_at_init"},
                         {"norm": "post", "depth": 48, "status": "diverged", "diagnosis.kind": "non_finite"},
                         {"norm": "post", "depth": 48, "status": "completed", "diagnosis.kind": "collapsed_at_init"},
                         {"norm": "pre", "depth": 48, "status": "running", "diagnosis.kind": None}])
    assert diagnosis_table(runs).loc["post", 48] == "2 collapsed_at_init, 1 non_finite"
    assert list(diagnosis_table(runs).index) == ["post"]
    assert diagnosis_table(runs[runs["status"] == "running"]).empty


# --- a review's findings (2026-12-05), each failing before its fix (RULES_VERSION 3) ---------------------------
def evals(*pairs) -> pd.DataFrame:
    """(step, eval loss) rows; unigram 3.0, optimal 1.0 in `summary`: the trained line is 2.8."""
    return scalars([{"step": s, "eval_loss": v, "loss_spikes": 0.0} for s, v in pairs])  # the spike counter on


def spike(step: int) -> pd.DataFrame:
    return pd.DataFrame([{"event": "loss_spike", "step": step, "loss": 3.4, "median": 3.0, "k": 6.0,
                          "deviation": 0.05}])


def test_a_finding_after_the_run_settled_on_its_plateau_is_not_what_went_wrong_first():
    """On the plateau from its first evaluation (step 50), a spike at step 80: the plateau came first, the spike
    is kept under `also` (was: loss_spikes, a label a study with spikes off read as stuck_on_plateau)."""
    found = dg.diagnose(summary(), evals((50, 3.0), (100, 3.0)), spike(80), layers([]))
    assert found["kind"] == "stuck_on_plateau" and [f["kind"] for f in found["also"]] == ["loss_spikes"]
    # the spike before the run fell back to the plateau (it had learned 20% at step 50): the spike came first
    back = dg.diagnose(summary(), evals((50, 2.6), (100, 3.0)), spike(70), layers([]))
    assert back["kind"] == "loss_spikes"
    # before the first evaluation: the finding came first
    assert dg.diagnose(summary(), evals((50, 3.0), (100, 3.0)), spike(40), layers([]))["kind"] == "loss_spikes"
    # far above the unigram loss (still coming down from the initial loss) is not the plateau: the spike came first
    coming_down = dg.diagnose(summary(), evals((50, 5.0), (100, 4.0)), spike(80), layers([]))
    assert coming_down["kind"] == "loss_spikes"
    # exactly at the unigram loss (learned 0%) is on it
    assert dg.diagnose(summary(), evals((50, 3.0)), spike(80), layers([]))["kind"] == "stuck_on_plateau"
    # a collapse at initialisation comes before any plateau
    collapsed = layers([(0, 0, {"token_cosine": 0.999})])
    assert dg.diagnose(summary(), evals((50, 3.0), (100, 3.0)), spike(80), collapsed)["kind"] == "collapsed_at_init"


def test_the_rules_that_compare_with_step_0_are_not_measured_without_it():
    """Per-layer records at step 50 alone (a resumed run whose step-0 file was lost): the collapse and the
    logit growth could not be read, and were named as read."""
    later = layers([(50, 0, {"token_cosine": 0.999, "attn_logit_max": 500.0})])
    found = dg.diagnose(summary(), scalars([]), NO_EVENTS, later)
    assert {"token_cosine", "attn_logit_max"} <= set(found["not_measured"])


def test_the_page_says_which_quantities_its_diagnoses_could_not_read():
    """steps_to_train ran with the instruments off: its untrained Post-LN runs read stuck_on_plateau where the
    frontier's, instruments on, read the same models collapsed_at_init; the table now says so beneath it."""
    from deepnorm_exp.analysis.page import unmeasured_note

    runs = pd.DataFrame([{"status": "completed", "diagnosis.not_measured": ["token_cosine", "loss_spikes"]},
                         {"status": "diverged", "diagnosis.not_measured": np.array(["token_cosine"])},
                         {"status": "completed", "diagnosis.not_measured": [7, {"x": 1}, "<script>"]},
                         {"status": "running", "diagnosis.not_measured": ["adam_below_eps"]}])
    note = unmeasured_note(runs)
    assert note.startswith("\n\nNot measured (instruments off), so the rules that read them did not run: "
                           "`&lt;script&gt;` (1 of 3 runs), `loss_spikes` (1 of 3 runs), `token_cosine` (2 of 3 runs).")
    assert "adam_below_eps" not in note  # a run that has not ended says nothing yet
    assert unmeasured_note(runs.assign(**{"diagnosis.not_measured": [[]] * 4})) == ""
