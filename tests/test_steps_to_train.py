"""Steps-to-train (issue 39, slow or unstable): the first evaluation at which a run had trained, recorded
in every summary, and `train.stop_when_trained`, which ends the run there."""

import numpy as np
import pandas as pd
import pytest

from deepnorm_exp.analysis import claims
from deepnorm_exp.analysis.cannot_tell import CANNOT_TELL
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.train.callbacks import TrainedAt

from conftest import config
from test_results import evidence


class Steps:
    def __init__(self):
        self.record, self.reason = {}, None

    def request_stop(self, reason):
        self.reason = self.reason or reason


class Out:
    def __init__(self, step):
        self.step = step


@pytest.mark.parametrize("stop", [False, True])
def test_the_first_evaluation_that_trained_is_kept_and_stops_the_run_only_when_asked(stop):
    watch, trainer = TrainedAt(lambda loss: loss < 3.0, stop), Steps()
    for step, loss in ((1, None), (2, 3.5), (3, None), (4, 2.9), (5, None), (6, 2.5)):
        trainer.record = {} if loss is None else {"eval_loss": loss}
        watch.on_step_end(trainer, Out(step))
    assert watch.step == 4 and watch.state_dict() == {"step": 4}
    assert trainer.reason == ("trained at step 4 (train.stop_when_trained)" if stop else None)
    resumed = TrainedAt(lambda loss: True, stop)
    resumed.load_state_dict({"step": 4})
    trainer.record = {"eval_loss": 1.0}
    resumed.on_step_end(trainer, Out(8))
    assert resumed.step == 4  # the first time it trained, not the latest


def test_a_run_that_trains_records_when_and_stops_there_when_asked(tmp_path):
    common = ["train.steps=60", "train.eval_every=5", "train.lr=1e-2", "train.warmup_steps=10"]
    full = run_experiment(config(tmp_path / "full", *common), progress=False)
    assert full["status"] == "completed" and full["steps_completed"] == 60
    trained_at = full["trained_at_step"]
    assert trained_at is not None and trained_at % 5 == 0 and trained_at < 60
    stopped = run_experiment(config(tmp_path / "stopped", *common, "train.stop_when_trained=true"), progress=False)
    assert stopped["status"] == "completed" and stopped["trained"]
    assert stopped["trained_at_step"] == stopped["steps_completed"] == stopped["eval_step"] == trained_at


# -- the study's rules, on hand-made runs ----------------------------------------------------------------------
def runs_frame(cells) -> "pd.DataFrame":
    """cells: (norm, depth, lr, [(trained_at or None, status, diagnosis kind)] per seed), budget 3,000."""
    import pandas as pd

    rows = [{"norm": norm, "depth": depth, "train.lr": lr, "seed": seed, "steps": 3000, "status": status,
             "trained_at_step": at, "diagnosis.kind": kind, "run_name": f"{norm}-L{depth}-lr{lr}-s{seed}"}
            for norm, depth, lr, seeds in cells for seed, (at, status, kind) in enumerate(seeds)]
    return pd.DataFrame(rows)


EARLY = [(100, "completed", "trained")] * 2
LATE = [(900, "completed", "still_learning"), (1500, "completed", "still_learning")]
NEVER = [(None, "completed", "stuck_on_plateau"), (None, "diverged", "loss_blow_up")]


def study(post_deep, post_shallow=EARLY, others_deep=EARLY):
    return runs_frame([("post", 6, 1e-3, post_shallow), ("post", 100, 1e-3, post_deep),
                       ("post", 100, 3e-4, post_deep),
                       *[(norm, depth, 1e-3, EARLY if depth == 6 else others_deep)
                         for norm in ("pre", "deepnorm") for depth in (6, 100)]])


def test_the_median_is_the_step_by_which_half_the_seeds_had_trained():
    import pandas as pd

    from deepnorm_exp.analysis.steps_to_train import median_steps

    assert median_steps(pd.Series([300.0, 100.0, None, None])) == 300.0  # 2 of 4 by step 300
    assert median_steps(pd.Series([100.0, None, None])) != median_steps(pd.Series([100.0, None, None]))  # NaN


def test_post_ln_that_never_trains_at_depth_while_the_others_train_early_fails():
    from deepnorm_exp.analysis.steps_to_train import post_unstable_with_depth

    met, numbers = post_unstable_with_depth(study(post_deep=NEVER))
    assert met is True and numbers.endswith("(Post-LN fails at L100: no seed at any rate trained; 2 of its 4 runs "
                                            "diverged)")
    assert "post: L6 100 (2/2 by 3000), L100 none (0/2 by 3000: 1 diverged, 1 stuck_on_plateau)" in numbers
    # how far the failed runs got, so a slow descent is not read as a stall
    runs = study(post_deep=NEVER).assign(learned_fraction=0.5)
    runs.loc[(runs["norm"] == "post") & (runs["depth"] == 100), "learned_fraction"] = [0.02, -0.01, 0.041, 0.0]
    assert post_unstable_with_depth(runs)[1].endswith(
        "2 of its 4 runs diverged, the most any closed 4.1% of the unigram-to-optimal gap (10% trains))")
    # runs that ended a hair above the unigram loss closed none of the gap: said in words, not as "-0.1%"
    runs.loc[(runs["norm"] == "post") & (runs["depth"] == 100), "learned_fraction"] = [-0.0012, -0.003, -0.02, -0.001]
    assert post_unstable_with_depth(runs)[1].endswith(
        "2 of its 4 runs diverged, none closed any of the unigram-to-optimal gap (the most: -0.1%))")
    # a diagnosis kind is a record's value: the name rule lets "~" through, which GitHub reads as strikethrough
    runs.loc[runs["diagnosis.kind"] == "stuck_on_plateau", "diagnosis.kind"] = "x~~"
    assert "~" not in post_unstable_with_depth(runs)[1]


def test_post_ln_that_trains_late_at_depth_is_slower_not_unstable():
    """The pattern budget_study showed at L18: untrained at step 300, trained by 600-900."""
    from deepnorm_exp.analysis.steps_to_train import post_unstable_with_depth

    met, numbers = post_unstable_with_depth(study(post_deep=LATE))
    assert met is False and "L100 900 (2/2 by 3000)" in numbers and "slower with depth" in numbers


def test_the_budget_decides_where_no_other_scheme_trains_early_at_depth():
    from deepnorm_exp.analysis.steps_to_train import post_unstable_with_depth

    met, numbers = post_unstable_with_depth(study(post_deep=NEVER, others_deep=LATE))
    assert met is None and "neither Pre-LN nor DeepNorm trains every seed by step 300 at L100" in numbers
    # ... but Post-LN training at every depth shows the reverse whatever the others did (a review: read None)
    met, numbers = post_unstable_with_depth(study(post_deep=LATE, others_deep=LATE))
    assert met is False and "Post-LN trains at every depth" in numbers


def test_post_ln_failing_where_its_grid_stops_at_its_shallower_best_rate_cannot_tell():
    """Deeper Post-LN takes lower rates (the learning-rate study), so it fails at depth only where the rates
    tried there reach below its best rate at the nearest shallower depth where it trained: steps_to_train's
    Post-LN trained at L18 only at 3e-4, the grid's lowest, and failed at L50 and L100 at 3e-4 and up."""
    from deepnorm_exp.analysis.steps_to_train import post_unstable_with_depth

    runs = study(post_deep=NEVER)
    no_lower = runs[~((runs.norm == "post") & (runs.depth == 100) & (runs["train.lr"] == 3e-4))]
    met, numbers = post_unstable_with_depth(no_lower)
    assert met is CANNOT_TELL and numbers.endswith(
        "(Post-LN trained at no rate at L100, but the lowest rate tried there (0.001) is no lower than its best "
        "rate at L6 (0.001): a lower rate may train: the data cannot tell)")
    trained_at_the_lower = runs.copy()
    trained_at_the_lower.loc[(runs.norm == "post") & (runs.depth == 6) & (runs["train.lr"] == 1e-3),
                             "train.lr"] = 3e-4  # L6's best is now the lowest rate L100 tried
    assert post_unstable_with_depth(trained_at_the_lower)[0] is CANNOT_TELL
    assert post_unstable_with_depth(runs)[0] is True  # L100 tried 3e-4, below L6's best


def test_post_ln_failing_at_a_depth_between_and_training_at_the_deepest_cannot_tell():
    """Not testable would say the study cannot test the claim; here it did, and its depths disagree."""
    from deepnorm_exp.analysis.steps_to_train import post_unstable_with_depth

    runs = pd.concat([study(post_deep=LATE), runs_frame([("post", 50, 1e-3, NEVER), ("post", 50, 3e-4, NEVER)])])
    met, numbers = post_unstable_with_depth(runs)
    assert met is CANNOT_TELL and numbers.endswith("(Post-LN fails at a depth between, not at the deepest: the data "
                                                   "cannot tell)")
    claim = claims.Claim("", "steps_to_train", "", lambda e: post_unstable_with_depth(e.runs("steps_to_train")))
    assert claim.judge(evidence(runs_steps_to_train=runs)).outcome == claims.UNDECIDED == "the data cannot tell"


def test_post_ln_failing_at_the_shallowest_depth_too_is_not_a_depth_effect():
    from deepnorm_exp.analysis.steps_to_train import post_unstable_with_depth

    assert post_unstable_with_depth(study(post_deep=NEVER, post_shallow=NEVER))[0] is None


def test_one_rate_that_trains_is_enough_not_to_fail_and_the_best_rate_is_the_fastest():
    from deepnorm_exp.analysis.steps_to_train import best_rates, cell_table, post_unstable_with_depth, run_outcomes

    runs = study(post_deep=NEVER)
    runs.loc[(runs.norm == "post") & (runs.depth == 100) & (runs["train.lr"] == 3e-4), "trained_at_step"] = 2000.0
    assert post_unstable_with_depth(runs)[0] is False
    best = best_rates(cell_table(run_outcomes(runs))).set_index(["norm", "depth"])
    assert best.loc[("post", 100), "lr"] == 3e-4 and best.loc[("post", 100), "median"] == 2000.0


def test_deepnorm_trains_everywhere_only_if_every_seed_at_its_best_rate_trained():
    from deepnorm_exp.analysis.steps_to_train import deepnorm_trains_everywhere

    assert deepnorm_trains_everywhere(study(post_deep=NEVER))[0] is True
    assert deepnorm_trains_everywhere(study(post_deep=NEVER, others_deep=NEVER))[0] is False


def test_the_figure_draws_a_censored_depth_at_the_budget_apart_from_the_trained_ones():
    from deepnorm_exp.analysis.steps_to_train import steps_figure

    best = pd.DataFrame({"norm": ["post", "post", "post", "pre", "pre"], "depth": [6, 18, 100, 6, 100],
                         "lr": 1e-3, "seeds": 2, "budget": 3000, "by_short": 0, "by_budget": [2, 2, 0, 2, 2],
                         "median": [100.0, 450.0, np.nan, 50.0, 50.0], "not_trained": ""})
    (ax,) = steps_figure(best).axes
    lines = {(line.get_label(), line.get_marker()): (list(line.get_xdata()), list(line.get_ydata()))
             for line in ax.get_lines()}
    assert lines[("post", "o")] == ([6, 18], [100.0, 450.0])
    assert lines[("post: not trained by the budget", "^")] == ([100], [3000])
    assert lines[("pre", "o")] == ([6, 100], [50.0, 50.0])
    assert not any(label.startswith("pre:") for label, _ in lines)  # pre is never censored: no triangle


# -- records the rules cannot read as they stand (a review's findings, each failing before its fix) ------------
def test_a_crashed_seed_is_not_read_as_a_seed_that_trained_or_as_a_missing_depth():
    """A run that crashed (status failed) is a seed the rule has not seen: DeepNorm with one seed trained and
    one crashed read 'trains everywhere' (1/1), and Post-LN's deepest depth, all crashed, vanished, so the next
    depth was read as the deepest."""
    from deepnorm_exp.analysis.steps_to_train import deepnorm_trains_everywhere, post_unstable_with_depth

    runs = study(post_deep=NEVER)
    crashed = (runs.norm == "deepnorm") & (runs.depth == 100) & (runs.seed == 1)
    runs.loc[crashed, ["status", "trained_at_step"]] = ["failed", None]
    met, numbers = deepnorm_trains_everywhere(runs)
    assert met is None and numbers.startswith("1 run crashed (deepnorm-L100-lr0.001-s1)")
    whole_depth = study(post_deep=NEVER)
    whole_depth.loc[(whole_depth.norm == "post") & (whole_depth.depth == 100), "status"] = "failed"
    met, numbers = post_unstable_with_depth(whole_depth)
    assert met is None and numbers.startswith("4 runs crashed") and "run again, resumes them" in numbers


def test_a_run_that_trained_and_then_diverged_ended_diverged_and_still_trained_at_its_step():
    """A run not stopped once trained (precision_fp16) may diverge after: it ended diverged, and its
    steps-to-train stands (trained by the budget, not among the seeds that did not train)."""
    from deepnorm_exp.analysis.steps_to_train import at_long_budget, cell_table, run_outcomes

    ran = run_outcomes(runs_frame([("post", 18, 3e-4, [(550, "diverged", "loss_blow_up"),
                                                       (None, "completed", "stuck_on_plateau")])]))
    assert list(ran["ended"]) == ["diverged", "censored"] and list(ran["why"]) == ["diverged", "stuck_on_plateau"]
    cell = cell_table(ran).iloc[0]
    assert (cell["by_budget"], cell["median"], cell["not_trained"]) == (1, 550, "1 stuck_on_plateau")
    assert at_long_budget(ran, "post", 18, finished=True).startswith("trains within 3,000 steps (first at lr")


def test_runs_of_two_budgets_are_not_read_as_one():
    """Post-LN's deepest runs at 300 steps beside the others' 3,000: a 300-step plateau read as 'fails'."""
    from deepnorm_exp.analysis.steps_to_train import deepnorm_trains_everywhere, post_unstable_with_depth

    runs = study(post_deep=[(None, "completed", "stuck_on_plateau")] * 2)
    runs.loc[(runs.norm == "post") & (runs.depth == 100), "steps"] = 300
    met, numbers = post_unstable_with_depth(runs)
    assert (met, numbers) == (None, "runs of 2 budgets (300, 3,000 steps) in one study: the rules read one")
    assert deepnorm_trains_everywhere(runs)[0] is None


def test_a_run_whose_rate_is_unknown_still_counts():
    """A run whose config could not be read has no rate: it was dropped from its cell, and a Post-LN depth
    whose one trained run it was read as failing."""
    from deepnorm_exp.analysis.steps_to_train import cell_table, fails, run_outcomes

    runs = study(post_deep=NEVER)
    deep = (runs.norm == "post") & (runs.depth == 100) & (runs["train.lr"] == 3e-4) & (runs.seed == 1)
    runs.loc[deep, ["status", "trained_at_step", "train.lr"]] = ["completed", 200.0, None]
    cells = cell_table(run_outcomes(runs))
    assert not fails(cells, "post", 100) and cells["seeds"].sum() == len(runs)


def test_the_best_rate_is_the_one_whose_seeds_all_trained_before_the_fastest_seed():
    """With two seeds the median is the faster seed: a rate where one seed trained at step 100 and the other
    diverged ranked above one where both trained by 150, and DeepNorm read as not training everywhere."""
    from deepnorm_exp.analysis.steps_to_train import best_rates, cell_table, deepnorm_trains_everywhere, run_outcomes

    runs = runs_frame([("deepnorm", 100, 1e-3, [(100, "completed", "trained"), (None, "diverged", "loss_blow_up")]),
                       ("deepnorm", 100, 3e-4, [(150, "completed", "trained")] * 2),
                       ("deepnorm", 6, 1e-3, EARLY)])
    best = best_rates(cell_table(run_outcomes(runs))).set_index(["norm", "depth"])
    assert best.loc[("deepnorm", 100), "lr"] == 3e-4
    assert deepnorm_trains_everywhere(runs)[0] is True
