"""The frontier law: slope of log(max stable lr) on log(depth), with an interval over brackets and seeds."""

import math

import numpy as np
import pandas as pd
import pytest

from deepnorm_exp.analysis.frontier_law import bracket_table, fit_frontier_law


def cells(norm, slope, depths=(6, 12, 24, 50, 100), seeds=(0, 1), width=1.5, scale=1e-2, jitter=0.0):
    """Frontier cells whose true frontier is scale * depth^slope (times a per-seed jitter), each bracketed
    by a factor `width` around it (the bisection's resolution), the true value at a random place inside."""
    rng = np.random.default_rng(0)
    rows = []
    for depth in depths:
        for seed in seeds:
            true = scale * depth ** slope * math.exp(jitter * rng.standard_normal())
            below = width ** rng.uniform()  # where in the bracket the truth lies
            rows.append({"norm": norm, "depth": str(depth), "seed": str(seed),
                         "max_stable_lr": true / below, "min_unstable_lr": true / below * width})
    return rows


def test_a_planted_law_is_recovered_with_an_interval_that_holds_it():
    frame = pd.DataFrame(cells("post", -0.8) + cells("deepnorm", 0.0))
    fit = fit_frontier_law(frame).set_index("norm")
    for norm, slope in (("post", -0.8), ("deepnorm", 0.0)):
        row = fit.loc[norm]
        assert row.slope_low <= slope <= row.slope_high
        assert row.slope == pytest.approx(slope, abs=0.1)
        assert row.slope_high - row.slope_low < 0.4 and row.cells == 10 and row.censored == 0


def test_the_point_slope_is_least_squares_through_the_geometric_midpoints():
    frame = pd.DataFrame(cells("pre", -0.3, jitter=0.2))
    x = np.log(frame["depth"].astype(float))
    y = np.log(np.sqrt(frame["max_stable_lr"] * frame["min_unstable_lr"]))
    by_hand = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()  # cov / var
    assert fit_frontier_law(frame)["slope"].iloc[0] == pytest.approx(by_hand, rel=1e-9)


def test_open_brackets_are_censored_and_one_depth_gives_no_slope():
    rows = cells("post", -0.5)
    rows[0]["min_unstable_lr"] = None  # stable at lr_max: the frontier is above the range
    rows[1]["max_stable_lr"] = None  # unstable at lr_min
    rows[2]["max_stable_lr"] = rows[2]["min_unstable_lr"] = None  # a failed probe: an error, not a bound
    fit = fit_frontier_law(pd.DataFrame(rows)).iloc[0]
    assert (fit.cells, fit.censored, fit.errors, fit.censored_depths) == (7, 2, 1, [6])
    rows[3]["error"] = "the run at lr 0.0173 failed: OOM"  # a prior's bracket, then a failed probe: an error too
    fit = fit_frontier_law(pd.DataFrame(rows)).iloc[0]
    assert (fit.cells, fit.censored, fit.errors) == (6, 2, 2)
    single = fit_frontier_law(pd.DataFrame(cells("pre", 0.0, depths=(6,)))).iloc[0]
    assert math.isnan(single.slope) and single.depths == [6]


def test_wider_brackets_and_noisier_seeds_widen_the_interval():
    narrow = fit_frontier_law(pd.DataFrame(cells("post", -0.5, width=1.1))).iloc[0]
    wide = fit_frontier_law(pd.DataFrame(cells("post", -0.5, width=3.0))).iloc[0]
    noisy = fit_frontier_law(pd.DataFrame(cells("post", -0.5, width=1.1, jitter=0.5))).iloc[0]
    width = lambda r: r.slope_high - r.slope_low  # noqa: E731
    assert width(narrow) < width(wide) and width(narrow) < width(noisy)


def test_brackets_so_far_read_the_finished_probes_as_the_sweeper_judges_them():
    import pandas as pd

    from deepnorm_exp.analysis.frontier_law import brackets_so_far

    runs = pd.DataFrame([
        # norm, depth, seed, lr, status, trained
        ("post", 6, 0, 1e-3, "completed", True), ("post", 6, 0, 0.3, "diverged", None),
        ("post", 6, 0, 0.0173, "completed", False),  # finished but stuck: unstable under stable_if=trained
        ("post", 12, 0, 1e-3, "completed", False), ("post", 12, 0, 0.3, "interrupted", None),  # says nothing
        ("pre", 6, 1, 1e-3, "completed", True), ("pre", 6, 1, 0.0173, "failed", None),  # an error, not a bound
    ], columns=["norm", "depth", "seed", "train.lr", "status", "trained"])
    got = brackets_so_far(runs, stable_if="trained").set_index(["norm", "depth", "seed"])
    assert got.loc[("post", 6, 0)].tolist() == [3, 1e-3, 0.0173]
    assert got.loc[("post", 12, 0), "probes"] == 1 and got.loc[("post", 12, 0), "min_unstable_lr"] == 1e-3
    assert pd.isna(got.loc[("post", 12, 0), "max_stable_lr"])
    assert got.loc[("pre", 6, 1)]["probes"] == 1 and pd.isna(got.loc[("pre", 6, 1), "min_unstable_lr"])
    completed = brackets_so_far(runs, stable_if="completed").set_index(["norm", "depth", "seed"])
    assert completed.loc[("post", 6, 0)].tolist() == [3, 0.0173, 0.3]  # finishing is enough there


def test_the_bracket_table_shows_each_cells_bracket_and_says_when_seeds_or_ends_differ():
    rows = [{"norm": "post", "depth": "6", "seed": s, "max_stable_lr": 0.00204, "min_unstable_lr": 0.00416}
            for s in ("0", "1")]
    rows += [{"norm": "post", "depth": "12", "seed": s, "max_stable_lr": None, "min_unstable_lr": 0.001}
             for s in ("0", "1")]
    rows += [{"norm": "pre", "depth": "6", "seed": "1", "max_stable_lr": 0.147, "min_unstable_lr": 0.3},
             {"norm": "pre", "depth": "6", "seed": "0", "max_stable_lr": 0.3, "min_unstable_lr": None},
             {"norm": "pre", "depth": "6", "seed": "2", "max_stable_lr": 0.3, "min_unstable_lr": None},
             {"norm": "pre", "depth": "12", "seed": "0", "max_stable_lr": None, "min_unstable_lr": None}]
    table = bracket_table(pd.DataFrame(rows))
    assert list(table.columns) == [6, 12] and list(table.index) == ["post", "pre"]
    assert table.loc["post", 6] == "0.00204-0.00416" and table.loc["post", 12] == "< 0.001"
    assert table.loc["pre", 6] == "> 0.3 / 0.147-0.3 / > 0.3"  # seeds 0, 1, 2: every seed's when they differ
    assert table.loc["pre", 12] == "error"


def test_the_frontier_figure_draws_censored_cells_as_arrows_at_the_ranges_end():
    from deepnorm_exp.analysis.plots import frontier_law

    rows = cells("post", -0.5)
    for row in rows[2:]:  # depths 12-100: unstable even at lr_min, as Post-LN here
        row["max_stable_lr"], row["min_unstable_lr"] = None, 1e-3
    rows[0]["min_unstable_lr"] = None  # depth 6, seed 0: stable at lr_max
    fig = frontier_law(pd.DataFrame(rows))
    drawn = {line.get_gid(): line.get_xydata() for line in fig.axes[0].get_lines() if line.get_gid()}
    # at each depth, seed 0 left of seed 1 (x 0.985 and 1.015 on the log axis), as the bracketed cells are
    expected = [[d * (1 + 0.03 * (s - 0.5)), 1e-3] for d in (12, 24, 50, 100) for s in (0, 1)]
    assert np.allclose(drawn["censored-v-post"], expected)
    assert np.allclose(drawn["censored-^-post"], [[6 * 0.985, rows[0]["max_stable_lr"]]])
