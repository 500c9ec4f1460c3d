"""The board's rules (deepnorm_exp/analysis/board.py) on hand-made records, each where its claim is false too,
and the scorecard: a battery that is not the board's is refused, a scheme the board has is scored apart."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from deepnorm_exp.analysis.board import (battery_differences, board, board_rows, failures, frontier_change, frontier_rates,
                                         grid_extensions, past_the_end,
                                         frontier_slopes, grid_brackets, init_cosine, mixed_battery, pooled_sd, rank_within_noise, unranked,
                                         waiting_cells, waiting_line, whole_cells, common_grid)
from deepnorm_exp.analysis.scorecard import MARK, scored

INIT = 5.0


def run(norm, depth, lr, seed, loss, status="completed", trained=True, trained_at=100.0, kind=None, steps=500):
    return {"norm": norm, "depth": depth, "train.lr": lr, "seed": seed, "eval_loss": loss, "status": status,
            "initial_eval_loss": INIT, "trained": trained, "trained_at_step": trained_at if trained else np.nan,
            "diagnosis.kind": kind, "run_name": f"{norm}-L{depth}-{lr}-s{seed}", "train.steps": steps}


def grid(norm, depth, losses, **kwargs):
    """{lr: (loss seed 0, loss seed 1)} -> runs."""
    return [run(norm, depth, lr, seed, loss, **kwargs) for lr, pair in losses.items() for seed, loss in enumerate(pair)]


def test_the_pooled_spread_reads_only_cells_whose_seeds_all_trained():
    runs = pd.DataFrame(grid("a", 6, {1e-3: (3.0, 3.2), 3e-3: (3.1, 3.5)})
                        + [run("b", 6, 1e-3, 0, 3.0), run("b", 6, 1e-3, 1, 4.9, trained=False, kind="stuck_on_plateau")])
    expected = math.sqrt((2 * 0.1 ** 2 + 2 * 0.2 ** 2) / 2)  # b's cell (one seed untrained) left out
    assert pooled_sd(runs)[6] == pytest.approx(expected)


def test_a_difference_within_two_standard_errors_does_not_rank():
    rows = pd.DataFrame({"norm": ["a", "b", "c"], "loss": [3.00, 3.05, 3.50], "seeds": [2, 2, 2]})
    ranked = rank_within_noise(rows, sd=0.05)  # margin 2 * 0.05 * 1 = 0.1
    assert ranked["rank"].tolist() == [1, 1, 3]
    assert ranked["ties"].tolist() == ["b", "a", ""]
    tight = rank_within_noise(rows, sd=0.01)  # margin 0.02: a ranks above b
    assert tight["rank"].tolist() == [1, 2, 3]
    assert rank_within_noise(rows, sd=float("nan"))["rank"].tolist() == [1, 1, 1]  # no spread known: nothing sure


def test_the_board_ranks_each_scheme_at_its_own_best_rate_with_a_diverged_seed_at_its_initial_loss():
    runs = pd.DataFrame(
        grid("good", 6, {3e-4: (3.40, 3.42), 1e-3: (3.10, 3.12), 3e-3: (3.20, 3.22)})
        # best mean 3.0 at 3e-3 were the diverged seed left out; counted at its initial loss, 1e-3 is best
        + grid("fragile", 6, {3e-4: (3.60, 3.62), 1e-3: (3.30, 3.32)})
        + [run("fragile", 6, 3e-3, 0, 3.00), run("fragile", 6, 3e-3, 1, float("nan"), status="diverged", trained=False)])
    table = board(runs)
    good, fragile = (table[table["norm"] == n].iloc[0] for n in ("good", "fragile"))
    assert (good["best_lr"], good["loss"], good["rank"]) == (1e-3, pytest.approx(3.11), 1)
    assert (fragile["best_lr"], fragile["loss"], fragile["rank"]) == (1e-3, pytest.approx(3.31), 2)
    assert fragile["failures"] == "1 diverged"
    assert fragile["frontier"] == 1e-3 and fragile["where"] == ""
    assert good["frontier"] == 3e-3 and good["where"] == "above"  # the grid's top rate held: the frontier lies beyond
    assert good["sensitivity"] == pytest.approx(np.mean([0.30, 0.0, 0.10]))
    assert good["steps_to_train"] == 100 and good["trained_by_budget"] == "2/2"
    shown = board_rows(table, 6)
    assert shown["rank"].tolist() == [1, 2] and shown["loss ± se"].iloc[0].startswith("3.110 ± ")


def test_the_frontier_is_below_the_grid_where_no_rate_trains_every_seed():
    runs = pd.DataFrame([run("stuck", 24, lr, s, 4.5, trained=False, kind="stuck_on_plateau")
                         for lr in (3e-4, 1e-3) for s in (0, 1)])
    (row,) = frontier_rates(runs).itertuples()
    assert math.isnan(row.frontier) and row.where == "below"
    assert failures(runs)["failures"].tolist() == ["4 stuck_on_plateau"]
    steps = board(runs)["steps_to_train"]
    assert steps.isna().all()  # censored at the budget
    # said as censored, not as a failure: a run on the plateau at step 500 may train by 900 (issue 39)
    assert board_rows(board(runs), 24)["steps to train"].tolist() == ["not by 500 (0/2)"]


def test_a_best_rate_at_an_end_of_its_grid_gets_the_next_rate_past_it():
    assert (past_the_end(3e-4, "low"), past_the_end(1e-3, "low")) == (pytest.approx(1e-4), pytest.approx(3e-4))
    assert (past_the_end(1e-2, "high"), past_the_end(3e-2, "high")) == (pytest.approx(3e-2), pytest.approx(0.1))
    untrained = {"trained": False, "kind": "stuck_on_plateau"}
    runs = pd.DataFrame(grid("low", 100, {3e-4: (3.0, 3.1), 1e-3: (3.5, 3.6)})
                        + grid("high", 100, {3e-4: (3.5, 3.6), 1e-3: (3.0, 3.1)})
                        + grid("inside", 6, {3e-4: (3.5, 3.6), 1e-3: (3.0, 3.1), 3e-3: (3.4, 3.4)})
                        # nothing trained: its lowest loss at the top rate is noise, so down, not up (a review)
                        + grid("stuck", 100, {3e-4: (4.91, 4.92), 1e-2: (4.90, 4.90)}, **untrained)
                        + grid("a_b&c", 24, {1e-3: (3.0, 3.1), 3e-3: (3.5, 3.6)}))
    command = "<code>python -m deepnorm_exp -m experiment=board norm={} depth={} train.lr={}</code> ({})"
    assert grid_extensions(board(runs), "board") == [
        command.format("high", 100, "0.003", "best rate at the high end, 0.001"),
        command.format("low", 100, "0.0001", "best rate at the low end, 0.0003"),
        command.format("stuck", 100, "0.0001", "no rate trained every seed, the lowest 0.0003"),
        command.format("a_b&amp;c", 24, "0.0003", "best rate at the low end, 0.001")]  # renders as typed


def test_the_collapse_at_initialisation_is_the_last_blocks_cosine_at_step_0():
    layers = pd.DataFrame({"step": [0, 0, 0, 500], "position": [0, 1, 1, 1], "token_cosine": [0.2, 0.995, 0.985, 0.1],
                           "run_name": ["p-s0", "p-s0", "p-s1", "p-s0"], "norm": "post", "depth": 24})
    (row,) = init_cosine(layers).itertuples()
    assert row.init_cosine == pytest.approx(0.99)


def test_a_board_of_two_batteries_is_not_ranked():
    """The full battery run under the board's name beside the short one: 500- and 2,000-step runs were pooled as
    four seeds of one cell."""
    runs = pd.DataFrame(grid("pre", 6, {1e-3: (3.1, 3.2), 3e-3: (3.0, 3.1)})
                        + grid("pre", 6, {1e-3: (2.5, 2.6), 3e-3: (2.4, 2.5)}, steps=2000))
    assert mixed_battery(runs) == ["train.steps: 2000, 500"]
    assert unranked(runs) == "its runs are of more than one battery (train.steps: 2000, 500)"
    one = runs[runs["train.steps"] == 500]
    assert mixed_battery(one) == [] and unranked(one) == ""
    assert "stop once trained" in unranked(one.assign(**{"train.stop_when_trained": True}))
    assert unranked(one[one["train.lr"] == 1e-3]) == "one learning rate"


def test_a_setting_beyond_the_budget_is_part_of_the_battery_and_one_only_a_side_records_is_not_compared():
    board_runs = pd.DataFrame(grid("pre", 6, {1e-3: (3.1, 3.2)})).assign(**{"train.eval_every": 50})
    coarser = pd.DataFrame(grid("mine", 6, {1e-3: (3.0, 3.1)})).assign(**{"train.eval_every": 10})
    assert battery_differences(board_runs, coarser) == ["train.eval_every: 10 here, 50 on the board"]
    unrecorded = coarser.drop(columns="train.eval_every").assign(**{"train.compile": True})  # not a battery key
    assert battery_differences(board_runs, unrecorded) == []


def test_a_seed_that_crashed_is_not_one_that_trained():
    """Both 1e-2 seeds crashed and 3e-3 trained: the frontier read 3e-3 "above" the grid."""
    runs = pd.DataFrame(grid("a", 6, {3e-4: (3.3, 3.4), 3e-3: (3.0, 3.1)})
                        + grid("a", 6, {1e-2: (np.nan, np.nan)}, status="failed", trained=False))
    (row,) = frontier_rates(runs).itertuples()
    assert row.frontier == 3e-3 and row.where == ""
    assert failures(runs)["failures"].tolist() == ["2 failed"]
    half = pd.DataFrame(grid("a", 6, {1e-3: (3.0, 3.1)}) + [run("a", 6, 1e-2, 0, 2.9), run("a", 6, 1e-2, 1, np.nan, status="running")])
    (row,) = frontier_rates(half).itertuples()
    assert row.frontier == 1e-3 and failures(half)["failures"].tolist() == ["1 unfinished"]
    crashed = half.assign(status=half["status"].replace("running", "failed"))  # crashed: the cell has ended
    assert board_rows(board(crashed), 6)[["seeds", "best lr", "failures"]].values.tolist() == [[1, "0.01 (high edge)", "1 failed"]]


def test_a_scheme_whose_grid_has_not_ended_is_not_ranked_until_it_has():
    """A sweep stopped between runs: b's best rate read from its one ended rate ranked b first (3.0 against a's
    3.1), though b's other rates, which might be better or might diverge, had not run."""
    a = grid("a", 6, {1e-3: (3.1, 3.1), 3e-3: (3.3, 3.3)})
    b_begun = grid("b", 6, {1e-3: (3.0, 3.0)}) + [run("b", 6, 3e-3, 0, np.nan, status="running")]
    runs = pd.DataFrame(a + b_begun + grid("a", 24, {1e-3: (3.2, 3.2), 3e-3: (3.4, 3.4)}))
    assert waiting_cells(runs) == {("b", 6): (2, 3, 4)}
    assert board(whole_cells(runs))["norm"].tolist() == ["a", "a"]
    assert waiting_line(waiting_cells(runs), 6) == ["Not ranked until its grid has ended: b (2 of 4 runs ended)."]
    assert waiting_line(waiting_cells(runs), 24) == []
    ended = pd.DataFrame(a + grid("b", 6, {1e-3: (3.0, 3.0), 3e-3: (4.0, 4.0)}))
    assert waiting_cells(ended) == {} and board(whole_cells(ended)).set_index("norm").loc["b", "rank"] == 1


def test_a_cells_grid_is_its_pairs_of_rate_and_seed_and_one_schemes_extension_leaves_the_others_whole(tmp_path):
    """Reviewed: a count of ended runs let a run of an unreadable rate stand in for (3e-3, seed 1), and a grid
    taken over the whole board left every cell waiting once one scheme tried one rate more."""
    holed = pd.DataFrame(grid("a", 6, {1e-3: (3.0, 3.1)}) + [run("a", 6, 3e-3, 0, 3.2), run("a", 6, "x", 1, 3.3)])
    assert waiting_cells(holed) == {("a", 6): (3, 3, 4)}
    as_text = pd.DataFrame(grid("a", 6, {1e-3: (3.0, 3.1)})).assign(seed=["0", "1"])  # seeds read back as text
    assert waiting_cells(as_text) == {}
    whole = grid("a", 6, {1e-3: (3.0, 3.1), 3e-3: (3.2, 3.3)}) + grid("a", 24, {1e-3: (3.0, 3.1), 3e-3: (3.2, 3.3)})
    extended = pd.DataFrame(whole + [run("a", 24, 1e-2, 0, 3.5)])  # one more rate, one seed, at one depth
    assert waiting_cells(extended) == {("a", 24): (5, 5, 6)}  # no sweep log: its rates at each of its seeds
    (tmp_path / "multirun.yaml").write_text("hydra:\n  sweeper:\n    params:\n      norm: a\n      depth: 24,6\n"
                                            "      train.lr: 1e-3,3e-3\n      seed: 0,1\n")
    (tmp_path / "sweeps.jsonl").write_text(
        json.dumps({"event": "start", "overrides": ["experiment=board"]}) + "\n"
        + json.dumps({"event": "start", "overrides": ["experiment=board", "depth=24", "train.lr=1e-2", "seed=0"]}) + "\n")
    assert waiting_cells(extended, tmp_path) == {}  # asked for that one run: every cell whole
    first = pd.DataFrame([run("a", 24, 1e-3, 0, 3.0), run("a", 24, 3e-3, 0, 3.1)])  # the sweep's first two runs
    assert waiting_cells(first, tmp_path) == {("a", 6): (0, 0, 4), ("a", 24): (2, 2, 5)}
    assert waiting_line(waiting_cells(first, tmp_path), 6) == ["Not ranked until its grid has ended: not begun: a."]


def test_the_page_and_the_dashboard_refuse_a_mixed_battery_alike_whole_cells_or_not(tmp_path):
    from types import SimpleNamespace
    from deepnorm_exp.analysis.board import board_dashboard, board_section
    from deepnorm_exp.analysis.page import Page

    def both(rows):
        evidence = SimpleNamespace(runs=lambda name: pd.DataFrame(rows), layers=lambda name: pd.DataFrame(),
                                   study_dir=lambda name: tmp_path / name)
        page = Page(tmp_path)
        board_section(page, evidence, "board")
        return "\n".join(page.lines), board_dashboard(evidence, "board")

    a = grid("a", 6, {1e-3: (3.1, 3.2), 3e-3: (3.3, 3.4)})
    for rows in (a + [run("b", 6, 1e-3, 0, 3.0, steps=2000)], [run("b", 6, 1e-3, 0, 3.0, steps=2000), run("b", 6, 3e-3, 0, 3.0)]):
        text, tables = both(rows)
        assert text.startswith("Not ranked: its runs are of more than one battery") and tables == {}
    text, tables = both(a)
    assert "| 1 | a |" in text and set(tables) >= {"board/L6"}


def test_the_frontiers_change_with_depth_is_bounded_where_the_grid_censors_it():
    def rows(*cells):
        return pd.DataFrame([{"norm": "a", "depth": d, "frontier": f, "where": w} for d, f, w in cells])
    assert frontier_change(rows((6, 1e-2, ""), (100, 1e-3, ""))) == "0.1x"
    assert frontier_change(rows((6, 1e-2, "above"), (100, 3e-3, ""))) == "≤ 0.3x"
    assert frontier_change(rows((6, 3e-3, ""), (100, 1e-2, "above"))) == "≥ 3.33x"
    assert frontier_change(rows((6, 1e-2, "above"), (100, 1e-2, "above"))) == ""
    assert frontier_change(rows((6, 1e-2, ""), (100, math.nan, "below"))) == "below the grid at L100"
    assert frontier_change(rows((6, math.nan, "below"), (100, math.nan, "below"))) == ""


def test_the_frontiers_slope_is_fitted_through_each_seeds_bracket_on_the_grid():
    """Each seed's bracket: its largest rate trained, the next above at which it did not (a rate below that
    trained too slowly bounds nothing); the slope through the brackets' geometric midpoints, as np.polyfit."""
    rates = (3e-4, 1e-3, 3e-3, 1e-2)
    top = {6: 3e-3, 24: 1e-3, 100: 3e-4}  # the largest rate each depth trains at
    runs = pd.DataFrame([run("falls", d, lr, s, 3.0 if lr <= top[d] else 4.5, trained=lr <= top[d],
                             kind=None if lr <= top[d] else "stuck_on_plateau")
                         for d in top for lr in rates for s in (0, 1)]
                        + [run("slow", 6, 3e-4, 0, 4.5, trained=False), run("slow", 6, 1e-3, 0, 3.0),
                           run("slow", 6, 3e-3, 0, 4.5, trained=False), run("slow", 6, 1e-2, 0, 4.6, status="diverged",
                                                                            trained=False)])
    brackets = grid_brackets(runs).set_index(["norm", "depth", "seed"])
    assert tuple(brackets.loc[("slow", 6, 0)]) == (1e-3, 3e-3)
    assert tuple(brackets.loc[("falls", 100, 1)]) == (3e-4, 1e-3)
    (falls,) = frontier_slopes(runs[runs["norm"] == "falls"]).itertuples()
    depths = np.log([6, 24, 100])
    midpoints = np.log([math.sqrt(3e-3 * 1e-2), math.sqrt(1e-3 * 3e-3), math.sqrt(3e-4 * 1e-3)])
    assert falls.slope == pytest.approx(np.polyfit(depths, midpoints, 1)[0]) and falls.slope < -0.7
    assert falls.slope_low <= falls.slope <= falls.slope_high and falls.cells == 6 and falls.censored == 0
    stable_everywhere = pd.DataFrame(grid("flat", 6, {1e-3: (3.0, 3.0), 1e-2: (3.0, 3.0)})
                                     + grid("flat", 24, {1e-3: (3.0, 3.0), 1e-2: (3.0, 3.0)}))
    (flat,) = frontier_slopes(stable_everywhere).itertuples()
    assert math.isnan(flat.slope) and flat.censored == 4 and flat.censored_depths == "6, 24"


def test_untrusted_layers_and_losses_do_not_crash_or_rank():
    layers = pd.DataFrame({"step": [0, 0], "position": [1, 1], "token_cosine": ["x", 7.0], "run_name": ["a", "b"],
                           "norm": "a", "depth": 6})
    assert init_cosine(layers).empty  # text, and a cosine beyond 1, are not measurements
    runs = pd.DataFrame(grid("a", 6, {1e-3: (1e200, -1e200)}) + grid("b", 6, {1e-3: (3.0, 3.2)}))
    assert pooled_sd(runs)[6] == pytest.approx(math.sqrt(0.02))  # a's infinite spread left out, b's kept


def test_a_scorecard_of_another_battery_is_refused_and_a_known_scheme_is_scored_apart():
    board_runs = pd.DataFrame(grid("pre", 6, {1e-3: (3.1, 3.2)}))
    same = pd.DataFrame(grid("pre", 6, {1e-3: (3.0, 3.1)}))
    assert battery_differences(board_runs, same) == []
    shorter = pd.DataFrame(grid("mine", 6, {1e-3: (3.0, 3.1)}, steps=200))
    assert battery_differences(board_runs, shorter) == ["train.steps: 200 here, 500 on the board"]
    other_grid = pd.DataFrame(grid("mine", 6, {3e-3: (3.0, 3.1)}))
    assert [d.split(":")[0] for d in battery_differences(board_runs, other_grid)] == ["rates"]
    assert scored(board_runs, same)["norm"].unique().tolist() == ["pre" + MARK]


HALF_BRANCH = '''"""Half branch (a test's scheme, 2026): Pre-LN whose branch joins the stream at half its size.
Written by tests/test_board.py into a copy of the package, as docs/schemes.md's "Adding a scheme" says."""

from torch import nn

from . import register
from .pre import PreNorm


class HalfBranch(nn.Module):
    def __init__(self, sublayer, norm):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm

    def forward(self, x, *args, **kwargs):
        return x + 0.5 * self.sublayer(self.norm(x), *args, **kwargs)


@register("half_branch")
class HalfBranchScheme(PreNorm):
    def residual(self, sublayer, stack, layer):
        return HalfBranch(sublayer, self.norm(sublayer.d_model))
'''


@pytest.mark.slow
def test_a_new_scheme_is_scored_beside_the_board_through_the_real_cli(tmp_path):
    """A scheme added as the guide says (one module, one YAML, in a copy of the package), then a tiny board of two
    schemes and the new one's scorecard under the same battery, each through `python -m deepnorm_exp -m`: the
    scorecard prints its rank among the board's rows per depth; another battery is refused, not ranked."""
    import shutil

    from conftest import REPO, TINY, run_cli

    copy = tmp_path / "repo"
    for part in ("deepnorm_exp", "conf", "hydra_plugins"):
        if (REPO / part).exists():
            shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "deepnorm_exp" / "schemes" / "half_branch.py").write_text(HALF_BRANCH)
    (copy / "conf" / "norm" / "half_branch.yaml").write_text(
        "# Half branch: a test's scheme. deepnorm_exp/schemes/half_branch.py\ndefaults:\n"
        "  - /schemas/norm@_here_: half_branch\n  - _self_\nname: half_branch\n")
    battery = [*TINY, "depth=2,1", "train.lr=1e-3,1e-2", "seed=0,1", "train.steps=12", "train.eval_every=4",
               "metrics.layer_every=12", "hydra.launcher.n_jobs=2", "threads=1", f"paths.runs={tmp_path / 'runs'}"]
    made = run_cli("-m", "experiment=board", "norm=pre,post", *battery, cwd=copy)
    assert made.returncode == 0, made.stderr[-3000:]
    scored_run = run_cli("-m", "experiment=scorecard", "norm=half_branch", *battery, cwd=copy)
    assert scored_run.returncode == 0, scored_run.stderr[-3000:]
    for depth in (1, 2):
        assert f"Depth {depth}: half_branch rank " in scored_run.stdout and " of 3" in scored_run.stdout
    assert "| → half_branch |" in scored_run.stdout
    from deepnorm_exp.analysis.report import build_report

    report = build_report(tmp_path / "runs" / "board")  # report.html gets the board (what it read: escaped)
    assert "<h2>Each scheme at its own best rate</h2>" in report and 'id="board-L2"' in report
    check_the_study_level_wandb_run(tmp_path / "runs" / "board")
    check_the_board_notebook(tmp_path / "runs" / "board", tmp_path)
    check_the_frontier_bisected_inside_the_boards_brackets(tmp_path, copy)
    longer = run_cli("-m", "experiment=scorecard", "norm=pre", *battery, "train.steps=16", cwd=copy)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "Not ranked: pre's battery is not the board's (train.steps: 16 here, 12 on the board)" \
        in longer.stdout
    for depth in (1, 2):  # one scheme of another battery leaves the others ranked
        assert f"Depth {depth}: half_branch rank " in longer.stdout


def test_a_scorecard_twin_of_a_board_run_keeps_its_own_cosine_at_init():
    """A scheme scored again has its board runs' names: each keeps its own last block."""
    layers = pd.DataFrame({"step": 0, "position": [0, 1, 0, 1], "token_cosine": [0.1, 0.5, 0.1, 0.7],
                           "run_name": "pre-L6-s0", "norm": ["pre", "pre", "pre" + MARK, "pre" + MARK], "depth": 6})
    assert init_cosine(layers)["init_cosine"].tolist() == [0.5, 0.7]


def check_the_frontier_bisected_inside_the_boards_brackets(tmp_path, copy):
    """experiment=board_frontier starts each cell inside the bracket the board's grid put around it (no probe at
    a rate the grid tried); a board of another battery is refused in one line before any run."""
    import json

    from conftest import TINY, run_cli

    battery = [*TINY, "depth=2,1", "seed=0,1", "train.steps=12", "train.eval_every=4", "metrics.layer_every=12",
               "hydra.launcher.n_jobs=2", "threads=1", f"paths.runs={tmp_path / 'runs'}", "norm=pre,post"]
    other = run_cli("-m", "experiment=board_frontier", *battery, "train.steps=16", cwd=copy)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    line = other.stderr.strip().splitlines()[-1]  # the path is cut in its middle past 80 characters
    assert line.startswith("deepnorm_exp: error: hydra.sweeper.prior=/") and "/runs/board" in line
    assert line.endswith(" is invalid: its runs are another battery (train.steps: 12 there, 16 here)")
    assert not (tmp_path / "runs" / "board_frontier").exists()
    made = run_cli("-m", "experiment=board_frontier", *battery, cwd=copy)
    assert made.returncode == 0, made.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "board_frontier" / "frontier.json").read_text())
    assert report["prior"] == str(tmp_path / "runs" / "board") and len(report["cells"]) == 8
    grid = {1e-3, 1e-2}
    for cell in report["cells"]:
        assert cell["prior"] and not grid & {probe["lr"] for probe in cell["probes"]}, cell
        known = [p["lr"] for p in cell["prior"]]
        if len(known) == 2:  # bracketed by the grid: every probe inside
            assert all(known[0] < probe["lr"] < known[1] for probe in cell["probes"]), cell
    assert report["runs_spent"] == sum(cell["runs"] for cell in report["cells"])


def check_the_board_notebook(root, tmp_path):
    """notebooks/board.ipynb on the tiny board: each depth's rows, the loss against rate drawn, no error."""
    from conftest import REPO
    from deepnorm_exp.analysis.notebooks import execute

    executed = execute(REPO / "notebooks" / "board.ipynb", {"runs_root": str(root)}, tmp_path / "board.ipynb")
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    shown = "".join(o.get("data", {}).get("text/plain", "") + o.get("text", "") for o in outputs)
    assert "depth 1" in shown and "depth 2" in shown and "within noise of" in shown and "slope" in shown


def check_the_study_level_wandb_run(root):
    """The board's study-level W&B run, read back from its offline file: grouped with the study, tagged, with a
    table per depth whose rows are the board's, and the loss-against-rate charts' tables."""
    import json

    from deepnorm_exp.analysis.dashboard import log_study
    from wandb_records import read_run

    directory = log_study(root)
    (wandb_file,) = directory.glob("*.wandb")
    run = read_run(wandb_file)
    assert (run["run"].run_group, run["run"].job_type, set(run["run"].tags)) == ("board", "study", {"study", "study:board"})
    assert {"board/L1/path", "board/L2/path", "loss_vs_lr/L2/chart_table/path", "frontier_vs_depth/path"} <= run["history_keys"]
    (table_file,) = directory.glob("files/media/table/board/L2_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:2] == ["rank", "norm"] and sorted(row[1] for row in table["data"]) == ["post", "pre"]


def test_the_page_names_the_rows_still_waiting_under_each_depth_and_ranks_only_whole_ones(tmp_path):
    """A board stopped mid-sweep: depth 100 holds a's whole grid and b's first run; depth 24 only a's first run.
    The page ranked b from one run and read "No run has ended yet" where no cell was whole."""
    from types import SimpleNamespace
    from deepnorm_exp.analysis.board import board_section
    from deepnorm_exp.analysis.page import Page

    study = tmp_path / "board"
    study.mkdir()
    (study / "multirun.yaml").write_text("hydra:\n  sweeper:\n    params:\n      train.lr: 1e-3,3e-3\n      seed: 0,1\n")

    def section(rows):
        page = Page(tmp_path)
        board_section(page, SimpleNamespace(runs=lambda name: pd.DataFrame(rows), layers=lambda name: pd.DataFrame(),
                                            study_dir=lambda name: tmp_path / name), "board")
        return "\n".join(page.lines)

    a = grid("a", 100, {1e-3: (3.1, 3.2), 3e-3: (3.3, 3.4)})
    text = section(a + [run("b", 100, 1e-3, 0, 2.0), run("a", 24, 1e-3, 0, 3.0)])
    assert "### Depth 100" in text and "| 1 | a |" in text and "| b |" not in text
    assert "Not ranked until its grid has ended: b (1 of 4 runs ended)." in text
    assert "### Depth 24" in text and "Not ranked until its grid has ended: a (1 of 4 runs ended)." in text
    assert "| a | 1" not in text.split("### Depth 24")[1]
    # the sweep's first two runs: their own rates and seed look like a whole grid; the preset's axes say not
    waiting_only = section([run("b", 100, 1e-3, 0, 2.0), run("b", 100, 3e-3, 0, 2.1)])
    assert "No run has ended yet" not in waiting_only and "b (2 of 4 runs ended)" in waiting_only
    assert "| b |" not in waiting_only


def test_a_scorecard_part_way_through_its_grid_waits_rather_than_being_refused(tmp_path, monkeypatch):
    """Reviewed: a scorecard stopped after seed 0 read "its battery is not the board's (seeds: 0 here, 0, 1 on the
    board)"; and a depth it had not ended printed an empty placement."""
    from types import SimpleNamespace
    import deepnorm_exp.analysis.scorecard as scorecard

    rates = {1e-3: (3.1, 3.2), 3e-3: (3.3, 3.4)}
    board_runs = pd.DataFrame(grid("pre", 6, rates) + grid("pre", 24, rates))
    mine = pd.DataFrame(grid("mine", 6, {1e-3: (3.0, 3.05), 3e-3: (3.2, 3.25)}) + [run("mine", 24, 1e-3, 0, 3.0)])
    (tmp_path / "scorecard").mkdir()
    (tmp_path / "scorecard" / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    params:\n      depth: 24,6\n      train.lr: 1e-3,3e-3\n      seed: 0,1\n")
    monkeypatch.setattr(scorecard, "load_runs", lambda path: mine)
    monkeypatch.setattr(scorecard, "load_layer_records", lambda runs: pd.DataFrame())
    monkeypatch.setattr(scorecard, "Evidence", lambda root: SimpleNamespace(
        runs=lambda name: board_runs, layers=lambda name: pd.DataFrame(), study_dir=lambda name: tmp_path / name))
    text = scorecard.scorecard_text(tmp_path)
    assert "battery is not the board's" not in text
    assert "Not ranked until its grid has ended: mine at depth 24 (1 of 4 runs ended)." in text
    assert "Depth 6: mine rank 1 of 2" in text and "Depth 24: no scorecard row has ended here" in text


def test_a_running_cell_is_begun_a_range_axis_asks_for_the_runs_grid_and_odd_records_stay_whole(tmp_path):
    """Reviewed again: a cell whose only run was still going read "not begun"; a seed axis given as range() asked
    for nothing, so two ended runs made a whole cell; a repeated index doubled the runs kept; a run of a
    fractional depth hid its neighbour's cell; a scorecard whose grid held the board's and one rate more was
    refused though the page promised extensions leave the battery alone."""
    running = {("pre", 48): waiting_cells(pd.DataFrame([run("pre", 48, 1e-3, 0, np.nan, status="running")]))[("pre", 48)]}
    assert waiting_line(running, 48) == ["Not ranked until its grid has ended: pre (0 of 1 runs ended)."]
    (tmp_path / "sweeps.jsonl").write_text(json.dumps({"event": "start", "overrides": ["norm=mine", "depth=6",
                                                       "train.lr=1e-3,3e-3", "seed=range(0,3)"]}) + "\n")
    two = pd.DataFrame([run("mine", 6, 1e-3, 0, 3.0), run("mine", 6, 3e-3, 1, 3.1)])
    assert waiting_cells(two, tmp_path) == {("mine", 6): (2, 2, 4)}  # the runs' rates at the runs' seeds, at least
    whole = pd.DataFrame(grid("a", 6, {1e-3: (3.0, 3.1), 3e-3: (3.2, 3.3)}))
    assert len(whole_cells(whole.set_index(pd.Index([0, 1, 0, 1])))) == 4
    assert len(whole_cells(pd.concat([whole, pd.DataFrame([run("a", 6.5, 1e-3, 0, 3.0)])]))) == 4
    (tmp_path / "sweeps.jsonl").unlink()
    (tmp_path / "sweeps.jsonl").mkdir()  # unreadable as a log: none
    assert waiting_cells(two, tmp_path) == {("mine", 6): (2, 2, 4)}
    rates = (3e-4, 1e-3, 3e-3, 1e-2)
    board_runs = pd.DataFrame([run(n, d, lr, s, 3.0) for n in ("pre", "post") for d in (6, 24) for lr in rates for s in (0, 1)])
    extended = pd.DataFrame([run("mine", d, lr, s, 3.0) for d in (6, 24) for lr in (*rates, 3e-2) for s in (0, 1)])
    assert battery_differences(board_runs, extended) == []
    assert [d.split(":")[0] for d in battery_differences(board_runs, extended[extended["train.lr"] != 3e-4])] == ["rates"]
    tie = pd.DataFrame([run("pre", 6, lr, s, 3.0) for lr in rates for s in (0, 1)]
                       + [run("pre", 24, lr, s, 3.0) for lr in (*rates, 3e-2) for s in (0, 1)])
    assert common_grid(tie) == (rates, (0, 1))  # a tie: the smaller grid


def test_the_full_battery_scorecard_is_ranked_among_the_full_boards_rows(tmp_path, monkeypatch):
    """experiment=scorecard_full: the full battery's settings over the reduced one's, its runs under their own
    name, and its rows read beside runs/board_full/ (a scorecard of 2,000 steps against the 500-step board would
    only be refused)."""
    from types import SimpleNamespace

    import deepnorm_exp.analysis.scorecard as scorecard
    from deepnorm_exp.compose import compose_with_hydra

    cfg = compose_with_hydra(["experiment=scorecard_full", "norm=pre"])
    params = cfg.hydra.sweeper.params
    assert (cfg.experiment_name, cfg.train.steps, params["train.lr"], params["seed"]) == (
        "scorecard_full", 2000, "1e-4,3e-4,1e-3,3e-3,1e-2", "0,1,2")
    assert cfg.hydra.callbacks.comparison_table.board == "board_full"
    assert compose_with_hydra(["experiment=board_full"]).experiment_name == "board_full"
    assert compose_with_hydra(["experiment=scorecard", "norm=pre"]).hydra.callbacks.comparison_table.board == "board"

    read = []
    rates = {1e-3: (3.1, 3.2), 3e-3: (3.3, 3.4)}
    monkeypatch.setattr(scorecard, "load_runs", lambda path: read.append(path.name) or pd.DataFrame(
        grid("mine", 6, {1e-3: (3.0, 3.05), 3e-3: (3.2, 3.25)})))
    monkeypatch.setattr(scorecard, "load_layer_records", lambda runs: pd.DataFrame())
    monkeypatch.setattr(scorecard, "Evidence", lambda root: SimpleNamespace(
        runs=lambda name: read.append(name) or pd.DataFrame(grid("pre", 6, rates)),
        layers=lambda name: pd.DataFrame(), study_dir=lambda name: tmp_path / name))
    (tmp_path / "scorecard_full").mkdir()
    text = scorecard.scorecard_text(tmp_path, "scorecard_full", "board_full")
    assert read[:2] == ["scorecard_full", "board_full"] and "Depth 6: mine rank 1 of 2" in text
    shown = []
    monkeypatch.setattr(scorecard, "scorecard_text", lambda *args: shown.append(args) or "")
    monkeypatch.setattr(scorecard.ComparisonTable, "on_multirun_end", lambda self, config, **kwargs: None)
    scorecard.Scorecard(board="board_full").on_multirun_end(
        SimpleNamespace(paths=SimpleNamespace(runs=str(tmp_path)), experiment_name="scorecard_full"))
    assert shown == [(str(tmp_path), "scorecard_full", "board_full")]
