"""summary.json helpers and the sweep table."""

import json
import math

import pytest

from deepnorm_exp.lifecycle.summary import format_table, learned_fraction, load_summaries, read_summary, write_summary
import deepnorm_exp
from deepnorm_exp.lifecycle.run import run_experiment

from conftest import TINY, run_cli, config


def test_learned_fraction_spans_unigram_to_optimal():
    assert learned_fraction(4.0, unigram=4.0, optimal=2.0) == 0.0
    assert learned_fraction(2.0, unigram=4.0, optimal=2.0) == 1.0
    assert learned_fraction(3.5, unigram=4.0, optimal=2.0) == pytest.approx(0.25)
    assert learned_fraction(2.0, unigram=4.0, optimal=None) == pytest.approx(0.5)
    assert learned_fraction(float("nan"), unigram=4.0, optimal=2.0) is None


def test_summary_json_is_strict_json_and_keeps_non_finite_values(tmp_path):
    write_summary(tmp_path / "summary.json", {"eval_loss": float("nan"), "final_loss": math.inf, "depth": 3,
                                              "divergence": {"loss": float("nan")}})

    def refuse(constant):
        raise ValueError(constant)

    raw = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert raw == {"eval_loss": "nan", "final_loss": "inf", "depth": 3, "divergence": {"loss": "nan"}}
    back = read_summary(tmp_path / "summary.json")
    assert math.isnan(back["eval_loss"]) and back["final_loss"] == math.inf and math.isnan(back["divergence"]["loss"])


def test_a_damaged_summary_is_listed_by_path_under_the_table(tmp_path):
    for s in (summary("pre", 6), summary("post", 6)):
        (tmp_path / s["run_name"]).mkdir()
        write_summary(tmp_path / s["run_name"] / "summary.json", s)
    (tmp_path / "post-L6-s0" / "summary.json").write_bytes(b"\x00" * 100)
    summaries, damaged = load_summaries(tmp_path)
    assert [s["run_name"] for s in summaries] == ["pre-L6-s0"]
    assert damaged == [tmp_path / "post-L6-s0" / "summary.json"]
    assert format_table(summaries, damaged).splitlines()[-1].startswith(f"unreadable: {damaged[0]}")


def summary(norm, depth, status="completed", trained=True, **extra):
    return {"run_name": f"{norm}-L{depth}-s0", "norm": norm, "depth": depth, "status": status, "trained": trained,
            "final_loss": 3.0, "eval_loss": 3.1, "excess_loss": 0.4, "learned_fraction": 0.5,
            "optimal_loss": 2.7, "unigram_loss": 4.5, "diverged_at_step": extra.get("step"), **extra}


def test_table_orders_by_depth_and_marks_untrained_and_diverged(tmp_path):
    for s in (summary("pre", 48), summary("post", 48, trained=False), summary("post", 6),
              summary("deepnorm", 6, status="diverged", step=17)):
        (tmp_path / s["run_name"]).mkdir()
        write_summary(tmp_path / s["run_name"] / "summary.json", s)
    lines = format_table(*load_summaries(tmp_path)).splitlines()
    assert [line.split()[0] for line in lines[2:6]] == ["deepnorm-L6-s0", "post-L6-s0", "post-L48-s0", "pre-L48-s0"]
    assert lines[2].endswith("diverged @17") and lines[4].endswith("(untrained)")
    assert "optimal loss 2.700" in lines[-1]


def test_a_run_has_ended_when_its_summary_says_completed_or_diverged():
    """The one test of "this run has ended" (summary.has_ended) that re-runs, sweeps and analysis share."""
    from deepnorm_exp.lifecycle.summary import has_ended

    assert has_ended({"status": "completed"}) and has_ended({"status": "diverged"})
    for summary in (None, {}, {"status": "interrupted"}, {"status": "failed"}, {"status": "skipped"}, ["completed"]):
        assert not has_ended(summary), summary


def test_the_typed_summary_writes_every_field_in_order_with_the_constants_in_place():
    from deepnorm_exp.lifecycle.schema import RunSummary

    roles = {"residual_multiplier": {"decoder": 2.0}, "branch_multiplier": {"decoder": 1.0}, "init_gain": {"decoder": 0.5}}
    summary = RunSummary(depth=6, constants=roles)
    summary.update(status="completed", eval_loss=1.5)
    record = summary.record()
    keys = list(record)
    assert keys[keys.index("seed") + 1: keys.index("params")] == list(roles)
    assert "constants" not in record and record["status"] == "completed" and record["eval_loss"] == 1.5
    assert keys[0] == "status" and keys[-1] == "error" and len(keys) == 45
    with pytest.raises(AttributeError):
        summary.update(eval_los=1.0)  # a misspelt field is refused, never written as a new key
    with pytest.raises(AttributeError):
        summary.trained_at = 3


def test_every_summary_field_is_read_by_a_rule_and_named_in_the_records_page():
    """One list of the fields (RunSummary): the reader's rules come from it, and docs/records.md's table of
    summary.json names exactly these keys."""
    import re
    from dataclasses import fields

    from conftest import REPO
    from deepnorm_exp.lifecycle.schema import CONSTANTS, SUMMARY, RunSummary

    written = [f.name for f in fields(RunSummary) if f.name != "constants"] + list(CONSTANTS)  # roles, old names
    unread = {f.name for f in fields(RunSummary) if f.metadata["check"] is None} - {"constants"}
    assert set(SUMMARY) == set(written) - unread and unread == {"divergence"}
    page = (REPO / "docs" / "records.md").read_text()
    table = page.split("## The summary (`summary.json`)")[1].split("\n\n**")[0]
    documented = set(re.findall(r"`([a-z_]+)`", "\n".join(line.split(" | ")[0] for line in table.splitlines()
                                                          if line.startswith("| `"))))
    assert documented == set(written)


def test_every_scheme_reports_its_constants_by_role_and_the_roles_mean_what_they_say():
    from deepnorm_exp.constant_roles import ROLES
    from deepnorm_exp.schemes import SCHEMES, build_scheme

    for name in SCHEMES.names():
        for depths in ({"decoder": 12}, {"encoder": 6, "decoder": 12}):
            constants = build_scheme({"name": name}, depths, 1e-5).constants()
            assert list(constants) == list(ROLES) and all(set(c) == set(depths) for c in constants.values()), name
    # the names of the papers, by role: DeepNorm's alpha multiplies x, CompleteP's the branch, Sub-LN's is a gain
    deepnorm = build_scheme({"name": "deepnorm"}, {"decoder": 12}, 1e-5).constants()
    assert deepnorm["residual_multiplier"]["decoder"] == pytest.approx(24**0.25)
    assert deepnorm["init_gain"]["decoder"] == pytest.approx(96**-0.25)
    completep = build_scheme({"name": "completep", "base_depth": 3}, {"decoder": 12}, 1e-5).constants()
    assert completep["branch_multiplier"]["decoder"] == pytest.approx(0.25) and completep["residual_multiplier"]["decoder"] == 1.0


@pytest.mark.parametrize("norm, old, roles", [
    ("deepnorm", {"alpha": {"decoder": 2.0}, "beta": {"decoder": 0.5}},
     {"residual_multiplier": {"decoder": 2.0}, "init_gain": {"decoder": 0.5}}),
    ("completep", {"alpha": {"decoder": 0.25}, "beta": {"decoder": 1.0}}, {"branch_multiplier": {"decoder": 0.25}}),
    ("deepscalelm", {"alpha": {"decoder": 0.9}, "beta": {"decoder": 0.4}},
     {"residual_multiplier": {"decoder": 0.9}, "branch_multiplier": {"decoder": 0.4}}),
])
def test_a_record_from_before_the_names_by_role_reads_as_the_roles(norm, old, roles):
    from deepnorm_exp.constant_roles import by_role
    from deepnorm_exp.lifecycle.schema import SUMMARY, fields_problem
    from deepnorm_exp.lifecycle.summary import format_summary

    record = {"norm": norm, **old}
    assert by_role(record) == roles
    assert by_role({"norm": norm, **roles, **old}) == roles  # a record by role is read as it is
    assert fields_problem(record, SUMMARY) is None and "alpha is" in fields_problem({"alpha": "1"}, SUMMARY)
    text = format_summary({"status": "completed", "trained": True, "depth": 6, "seed": 0, "run_dir": "r",
                           "steps_completed": 1, "steps": 1, "wall_s": 1.0, "tokens_per_s": 1.0, "device": "cpu",
                           "final_loss": 1.0, "eval_loss": 1.0, "optimal_loss": 0.5, "excess_loss": 0.5,
                           "unigram_loss": 2.0, "params": 10, **record})
    assert "decoder: " + ", ".join(f"{r.replace('_', ' ')} {v['decoder']:.4g}" for r, v in roles.items()) in text


def test_the_committed_records_from_before_the_names_by_role_read_as_todays_schemes_report():
    """An oracle the translation did not write: every zoo record (each registered scheme at depths 6, 24 and
    100, written by the code before the names by role) read by role equals what the scheme reports today for
    the same preset and depth, role by role."""
    from conftest import REPO
    from deepnorm_exp import compose
    from deepnorm_exp.analysis import published
    from deepnorm_exp.build import make_scheme
    from deepnorm_exp.constant_roles import by_role

    summaries, damaged = published.load(REPO / "runs" / "zoo_depth_sweep").summaries()
    old = [s for s in summaries if "alpha" in s and "residual_multiplier" not in s]
    assert not damaged and {s["norm"] for s in old} >= {"completep", "depth_mup", "deepscalelm", "ngpt", "deepnorm"}
    for summary in old:
        cfg = compose(["experiment=zoo_depth_sweep", f"norm={summary['norm']}", f"depth={summary['depth']}"])
        today = make_scheme(cfg).constants()
        for role, values in by_role(summary).items():
            assert values == pytest.approx(today[role]), (summary["run_name"], role)


@pytest.mark.slow
def test_a_damaged_summary_is_named_and_does_not_stop_the_sweep_table_or_the_analysis(tmp_path):
    args = [*TINY, f"paths.runs={tmp_path}", "logger=none"]
    assert run_cli("-m", "norm=post,pre", *args).returncode == 0
    (post,) = tmp_path.glob("default/post-*/summary.json")
    post.write_text('{"status": "compl')  # cut short
    result = run_cli("-m", "norm=deepnorm", *args)  # another run of the same experiment
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout[result.stdout.index("run "):]
    assert "deepnorm-L6" in table and "pre-L6" in table and f"unreadable: {post}" in table
    runs = deepnorm_exp.load_runs(tmp_path / "default")
    assert sorted(runs["norm"]) == ["deepnorm", "pre"]


def test_the_summary_says_which_weights_the_eval_loss_measured(tmp_path):
    spiked = run_experiment(config(tmp_path / "a", "norm=post", "depth=2", "train.lr=1", "train.warmup_steps=0",
                                   "train.steps=30", "train.divergence.spike_patience=2",
                                   "train.divergence.spike_factor=1.5"), progress=False)
    assert spiked["status"] == "diverged" and spiked["divergence_reason"].startswith("loss above")
    assert spiked["eval_step"] == spiked["diverged_at_step"] - 1 and "include the updates of the 1 step" in \
        spiked["eval_weights"]
    nan = run_experiment(config(tmp_path / "b", "norm=post", "depth=2", "train.lr=1e30", "train.warmup_steps=0"),
                         progress=False)
    assert nan["eval_weights"].startswith("the last healthy weights")
    done = run_experiment(config(tmp_path / "c"), progress=False)
    assert done["eval_step"] == 6 and done["eval_weights"] == "the final weights (step 6)"
