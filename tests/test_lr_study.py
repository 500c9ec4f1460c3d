"""The LR study's rules (deepnorm_exp/analysis/lr_study.py) on hand-made records, against values worked by
hand: the capped loss, the best rate, LR sensitivity, the edge flag, the runs left out."""

import math

import pandas as pd
import pytest

from deepnorm_exp.analysis.lr_study import best_rate_table, capped_losses, lr_summary, sensitivity_table

INIT = 5.5


def run(norm, depth, lr, seed, loss, status="completed", initial=INIT, trained=True):
    return {"norm": norm, "depth": depth, "train.lr": lr, "seed": seed, "eval_loss": loss, "status": status,
            "initial_eval_loss": initial, "trained": trained}


@pytest.fixture
def runs():
    return pd.DataFrame([
        run("post", 6, 1e-3, 0, 3.0), run("post", 6, 1e-3, 1, 3.2),
        run("post", 6, 1e-2, 0, 3.5), run("post", 6, 1e-2, 1, 2.0, status="diverged"),  # counts as 5.5
        run("post", 6, 1e-1, 0, 6.0), run("post", 6, 1e-1, 1, float("nan")),  # capped at 5.5; NaN -> 5.5
        run("post", 6, 1e-1, 2, 1.0, status="failed"),  # a crash: left out, counted
        run("pre", 6, 1e-3, 0, 4.0), run("pre", 6, 1e-2, 0, 3.0), run("pre", 6, 1e-1, 0, 3.6),
        run("pre", 24, 1e-3, 0, 4.2), run("pre", 24, 1e-2, 0, 4.1), run("pre", 24, 1e-1, 0, 2.9),
    ])


def test_a_seeds_loss_is_capped_at_its_loss_at_initialisation_and_a_divergence_counts_as_that(runs):
    losses = capped_losses(runs).set_index(["norm", "depth", "lr", "seed"])["loss"]
    assert losses[("post", 6, 1e-2, 1)] == INIT and losses[("post", 6, 1e-1, 0)] == INIT
    assert losses[("post", 6, 1e-1, 1)] == INIT and losses[("post", 6, 1e-3, 0)] == 3.0
    assert ("post", 6, 1e-1, 2) not in losses.index


def test_best_rate_loss_sensitivity_and_edges_as_worked_by_hand(runs):
    summary = lr_summary(runs).set_index(["norm", "depth"])
    post = summary.loc[("post", 6)]
    # means over seeds: 1e-3 -> 3.1, 1e-2 -> (3.5 + 5.5) / 2 = 4.5, 1e-1 -> 5.5
    assert post["best_lr"] == 1e-3 and post["loss"] == pytest.approx(3.1)
    assert post["loss_std"] == pytest.approx(math.sqrt(0.02))
    assert post["sensitivity"] == pytest.approx(((3.1 - 3.1) + (4.5 - 3.1) + (5.5 - 3.1)) / 3)
    assert (post["edge"], post["rates"], post["left_out"]) == ("low", 3, 1)
    pre6, pre24 = summary.loc[("pre", 6)], summary.loc[("pre", 24)]
    assert (pre6["best_lr"], pre6["edge"]) == (1e-2, "") and pre6["sensitivity"] == pytest.approx((1.0 + 0 + 0.6) / 3)
    assert (pre24["best_lr"], pre24["edge"]) == (1e-1, "high")


def test_the_tables_show_each_scheme_at_its_own_rate_and_how_far_the_rate_moves_with_depth(runs):
    summary = lr_summary(runs)
    table = best_rate_table(summary)
    assert table.loc["post", 6] == "3.100 ± 0.141 at 0.001 (low edge)"
    assert table.loc["pre", 24] == "2.900 at 0.1 (high edge)" and table.loc["post", 24] == ""
    moves = sensitivity_table(summary)["best lr, deepest / shallowest"]
    assert moves["pre"] == pytest.approx(10.0) and moves["post"] == pytest.approx(1.0)
    # a best rate at which the seeds learned nothing is marked: the least bad rate is no optimum
    stuck = runs.assign(trained=runs["norm"].ne("pre") | runs["depth"].ne(24))
    assert best_rate_table(lr_summary(stuck)).loc["pre", 24] == "2.900 at 0.1 (high edge) (1/1 untrained)"


def test_the_tuned_rate_table_holds_each_cells_best_rate_and_flags_the_edges(runs):
    from omegaconf import OmegaConf

    from deepnorm_exp.analysis.lr_study import curve_table, lr_curves, tuned_lr_yaml

    text = tuned_lr_yaml(lr_summary(runs), "lr_study")
    table = OmegaConf.create(text)
    assert table.source == "lr_study" and OmegaConf.to_container(table.rates) == {
        "post": {"L6": 1e-3}, "pre": {"L6": 1e-2, "L24": 1e-1}}
    assert "L6: 0.001  # the low end of the grid" in text and "L24: 0.1  # the high end of the grid" in text
    cells = curve_table(lr_curves(runs))
    assert cells.loc[("post", 6), "0.01"] == "4.500 (1 div)" and cells.loc[("pre", 24), "0.001"] == "4.200"


def test_a_cell_whose_grid_of_rates_is_not_whole_gets_no_tuned_rate(runs):
    """Was: a sweep stopped between runs (or narrowed to some rates) wrote the best of the rates it had run as
    the cell's tuned rate, which the next study would have trained at."""
    from omegaconf import OmegaConf

    from deepnorm_exp.analysis.lr_study import partial_cells, tuned_lr_yaml

    params = {"train.lr": "1e-3,1e-2,1e-1", "seed": "0", "depth": "6,24"}
    assert partial_cells(runs, params) == {}
    short = runs[~((runs["norm"] == "pre") & (runs["depth"] == 24) & (runs["train.lr"] == 1e-1))]
    partial = partial_cells(short, params)
    assert partial == {("pre", 24): "2 of 3 rates ended"}
    text = tuned_lr_yaml(lr_summary(short), "lr_study", partial)
    assert OmegaConf.to_container(OmegaConf.create(text).rates) == {"post": {"L6": 1e-3}, "pre": {"L6": 1e-2}}
    assert "# pre L24: 2 of 3 rates ended, no rate until the grid is whole" in text
    running = runs.assign(status=runs["status"].mask((runs["norm"] == "pre") & (runs["depth"] == 6), "running"))
    assert set(partial_cells(running, {**params, "seed": "0"})) == {("pre", 6)}  # a run not ended is no rate
    assert partial_cells(short, {**params, "seed": "0,1"}).keys() == {("pre", 6), ("pre", 24)}  # one seed of two
    assert partial_cells(short, None) == {} and partial_cells(short, {"train.lr": "interval(1e-4,1e-1)"}) == {}
