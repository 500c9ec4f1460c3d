"""The final-quality claims on real text (analysis/final_quality.py): differences in standard errors, on
hand-made runs where each claim holds and where it is false."""

import numpy as np
import pandas as pd

from deepnorm_exp.analysis import claims, final_quality as final
from deepnorm_exp.analysis.cannot_tell import CANNOT_TELL

from test_results import evidence

SEEDS = (1, 2, 3)


def runs(loss: dict, trained: dict | None = None, diverged: tuple = ()) -> pd.DataFrame:
    """loss[(norm, depth)]: the seeds' final eval losses; a (norm, depth, seed) in `diverged` diverged."""
    rows = []
    for (norm, depth), values in loss.items():
        for seed, value in zip(SEEDS, values):
            rows.append(dict(norm=norm, depth=depth, seed=seed, eval_loss=value, initial_eval_loss=5.5,
                             status="diverged" if (norm, depth, seed) in diverged else "completed",
                             trained=(trained or {}).get((norm, depth), True), run_name=f"{norm}-L{depth}-s{seed}",
                             **{"train.lr": 1e-3}))
    return pd.DataFrame(rows)


def judged(check, frame):
    """text_final's runs judged with text_lr's grid placing each cell's rate inside it."""
    cells = {(norm, depth) for norm, depth in zip(frame["norm"], frame["depth"])}
    return check(evidence(**{f"runs_{final.STUDY}": frame,
                             f"runs_{final.TUNING}": tuned({cell: (3e-4, 1e-3, 3e-3) for cell in cells})}))


BETTER = {("deepnorm", 6): (2.00, 2.01, 2.02), ("pre", 6): (2.10, 2.11, 2.12),
          ("deepnorm", 18): (1.90, 1.91, 1.92), ("pre", 18): (2.00, 2.02, 2.04)}


def test_ends_better_is_welchs_one_sided_t_test_at_every_depth():
    met, numbers = judged(final.ends_better("deepnorm", "pre"), runs(BETTER))
    assert met is True
    assert numbers.startswith("L6 deepnorm 2.010 vs pre 2.110 (3 and 3 seeds): deepnorm below pre by 0.100 ± 0.008 (SE; below needs 2.13 SE)")
    # at L18 the gap (0.01) is within t SE of the seeds' spread, either way: the data cannot tell (as the preset
    # states); not reproduced needs the reverse shown
    close = {**BETTER, ("deepnorm", 18): (1.99, 2.01, 2.03)}
    met, numbers = judged(final.ends_better("deepnorm", "pre"), runs(close))
    assert met is CANNOT_TELL and ("L18 deepnorm 2.010 vs pre 2.020 (3 and 3 seeds): deepnorm below pre by 0.010 ± "
                                   "0.016 (SE; below needs 2.13 SE) (within the test: the data cannot tell)") in numbers
    reverse = {**BETTER, ("deepnorm", 18): (2.10, 2.11, 2.12)}
    assert judged(final.ends_better("deepnorm", "pre"), runs(reverse))[0] is False
    # a scheme that ends higher is said to be above, not "lower by" a negative gap
    worse = {**BETTER, ("deepnorm", 18): (2.05, 2.06, 2.07)}
    assert "L18 deepnorm 2.060 vs pre 2.020 (3 and 3 seeds): deepnorm above pre by 0.040" in judged(
        final.ends_better("deepnorm", "pre"), runs(worse))[1]
    # ... and a diverged seed counts as its loss at initialisation: one of three widens the spread past telling,
    # three are surely above
    assert judged(final.ends_better("deepnorm", "pre"), runs(BETTER, diverged=(("deepnorm", 6, 2),)))[0] is CANNOT_TELL
    every_seed = tuple(("deepnorm", 6, seed) for seed in (1, 2, 3))
    assert judged(final.ends_better("deepnorm", "pre"), runs(BETTER, diverged=every_seed))[0] is False
    # one seed each: no standard error, no verdict
    one = {cell: values[:1] for cell, values in BETTER.items()}
    assert judged(final.ends_better("deepnorm", "pre"), runs(one))[0] is None


def test_post_ln_is_compared_only_where_every_seed_of_it_trained():
    post = {("post", 6): (2.00, 2.01, 2.02), ("pre", 6): (2.10, 2.11, 2.12),
            ("post", 50): (3.00, 3.01, 3.02), ("pre", 50): (2.10, 2.11, 2.12)}
    check = final.ends_better("post", "pre", where_trained="post")
    met, numbers = judged(check, runs(post, trained={("post", 50): False}))
    assert met is True and "L50" not in numbers
    assert judged(check, runs(post))[0] is False  # trained at L50, and worse there
    met, numbers = judged(check, runs(post, trained={("post", 6): False, ("post", 50): False}))
    assert met is None and numbers == "no depth where every post run trained with two seeds or more of both post and pre"


def test_deepnorm_keeps_improving_only_when_each_deeper_depth_is_lower_by_the_test():
    deeper = {("deepnorm", 6): (2.30, 2.31, 2.32), ("deepnorm", 18): (2.10, 2.11, 2.12),
              ("deepnorm", 50): (2.00, 2.01, 2.02)}
    met, numbers = judged(final.improves_with_depth("deepnorm"), runs(deeper))
    assert met is True and numbers.startswith("deepnorm's mean eval loss L6 2.310, L18 2.110, L50 2.010; "
                                              "L18 below L6 by 0.200 ± 0.008 (SE; below needs 2.13 SE)")
    flat = {**deeper, ("deepnorm", 50): (2.10, 2.12, 2.14)}  # L50 neither below L18 nor surely above it
    assert judged(final.improves_with_depth("deepnorm"), runs(flat))[0] is CANNOT_TELL
    worse = {**deeper, ("deepnorm", 50): (2.30, 2.31, 2.32)}  # L50 surely above L18: the reverse is shown
    assert judged(final.improves_with_depth("deepnorm"), runs(worse))[0] is False
    # 2 SE is not enough with three seeds: a gap of 2.5 SE passes, one of 2 SE does not (t = 2.13 at 4 df)
    def gap_of(ses: float):
        sem = 0.01 / np.sqrt(3)  # each side's standard error (std 0.01)
        gap = ses * np.hypot(sem, sem)
        return {("deepnorm", 6): (2.30, 2.31, 2.32), ("deepnorm", 18): tuple(v - gap for v in (2.30, 2.31, 2.32))}
    assert judged(final.improves_with_depth("deepnorm"), runs(gap_of(2.5)))[0] is True
    assert judged(final.improves_with_depth("deepnorm"), runs(gap_of(2.0)))[0] is CANNOT_TELL
    assert judged(final.improves_with_depth("deepnorm"), runs(gap_of(-2.5)))[0] is False


def test_post_ln_where_it_trains_counts_a_run_that_did_not_end_as_untrained():
    post = {("post", 6): (2.00, 2.01, 2.02), ("pre", 6): (2.10, 2.11, 2.12)}
    frame = runs(post)
    frame.loc[(frame.norm == "post") & (frame.seed == 3), "status"] = "failed"  # crashed: not every run trained
    assert judged(final.ends_better("post", "pre", where_trained="post"), frame)[0] is None


def test_the_final_quality_claims_read_the_real_text_study():
    checks = [c for c in claims.CLAIMS if c.study == final.STUDY]
    assert [c.paper for c in checks] == ["DeepNorm ends better than Pre-LN at the same depth.",
                                         "Post-LN, where it trains, ends better than Pre-LN.",
                                         "DeepNorm keeps improving as the model goes deeper."]


def tuned(rates: dict) -> pd.DataFrame:
    """text_lr's runs: rates[(norm, depth)] the grid it tried there (seed 0), and runs(...)'s rate 1e-3 for text_final."""
    return pd.DataFrame([dict(norm=norm, depth=depth, seed=0, eval_loss=2.0, initial_eval_loss=5.5, status="completed",
                              trained=True, run_name=f"{norm}-L{depth}-lr{lr}", **{"train.lr": lr})
                         for (norm, depth), grid in rates.items() for lr in grid])


def test_a_verdict_that_a_loser_tuned_at_its_grids_end_could_turn_cannot_tell():
    """Tuning further can only lower a loss: where the scheme that lost was tuned at an end of text_lr's grid,
    its optimum may lie beyond it and the verdict may turn; where the winner was, the verdict only widens."""
    interior, edge = (3e-4, 1e-3, 3e-3), (1e-3, 3e-3, 1e-2)  # every text_final run here is at 1e-3
    for grids, expected in (({("deepnorm", d): interior for d in (6, 18)} | {("pre", d): interior for d in (6, 18)}, True),
                            ({("deepnorm", d): interior for d in (6, 18)} | {("pre", 6): interior, ("pre", 18): edge}, CANNOT_TELL),
                            ({("deepnorm", d): edge for d in (6, 18)} | {("pre", d): interior for d in (6, 18)}, True)):
        met, numbers = final.ends_better("deepnorm", "pre")(
            evidence(**{f"runs_{final.STUDY}": runs(BETTER), f"runs_{final.TUNING}": tuned(grids)}))
        assert met is expected, (grids, numbers)
    assert numbers.count("low end of text_lr's grid") == 0
    met, numbers = final.ends_better("deepnorm", "pre")(evidence(**{
        f"runs_{final.STUDY}": runs(BETTER), f"runs_{final.TUNING}": tuned(
            {("deepnorm", d): interior for d in (6, 18)} | {("pre", 6): interior, ("pre", 18): edge})}))
    assert ("(pre at L18: lr 0.001, the low end of text_lr's grid, its optimum may lie beyond it: the data cannot "
            "tell) (better: Welch's") in numbers
    # a loser that is surely worse with its rate inside the grid stays a failure, an edge elsewhere or not
    close = {**BETTER, ("deepnorm", 18): (2.05, 2.06, 2.07)}
    met, _ = final.ends_better("deepnorm", "pre")(evidence(**{
        f"runs_{final.STUDY}": runs(close), f"runs_{final.TUNING}": tuned(
            {("deepnorm", 6): interior, ("deepnorm", 18): interior, ("pre", 6): edge, ("pre", 18): edge})}))
    assert met is False
    # improving with depth: the shallower depth lost, tuned at its grid's end
    deeper = {("deepnorm", 6): (2.10, 2.11, 2.12), ("deepnorm", 18): (2.00, 2.01, 2.02)}
    met, numbers = final.improves_with_depth("deepnorm")(evidence(**{
        f"runs_{final.STUDY}": runs(deeper), f"runs_{final.TUNING}": tuned(
            {("deepnorm", 6): edge, ("deepnorm", 18): interior})}))
    assert met is CANNOT_TELL and "deepnorm at L6: lr 0.001, the low end of text_lr's grid" in numbers


def test_a_loser_whose_tuning_grid_cannot_be_read_is_not_testable():
    """No text_lr records (or one rate of them ended): the rule cannot place the loser's rate, so it cannot say
    the verdict would not turn (a review: it read such a cell as tuned inside its grid); nothing was measured
    there, so not testable rather than cannot tell (another review)."""
    met, numbers = final.ends_better("deepnorm", "pre")(evidence(**{f"runs_{final.STUDY}": runs(BETTER)}))
    assert met is None and ("pre at L6: no grid of text_lr's with more than one rate to place its rate in: whether "
                            "its optimum lies beyond it cannot be read") in numbers
    one_rate = tuned({("deepnorm", 6): (1e-3,), ("pre", 6): (1e-3,), ("deepnorm", 18): (1e-3,), ("pre", 18): (1e-3,)})
    assert final.ends_better("deepnorm", "pre")(evidence(**{f"runs_{final.STUDY}": runs(BETTER),
                                                            f"runs_{final.TUNING}": one_rate}))[0] is None


def test_the_table_prints_mean_se_and_seeds_and_no_standard_error_for_one_seed():
    table = final.final_table(evidence(**{f"runs_{final.STUDY}": runs({("pre", 6): (1.60, 1.62, 1.64),
                                                                      ("pre", 50): (1.53,)})}))
    assert table.loc["pre", 6] == "1.620 ± 0.012 (3)" and table.loc["pre", 50] == "1.530 (1)"
