"""The budget study's rules (analysis/budget.py) on hand-made records with a known answer."""

import pandas as pd
import pytest

from deepnorm_exp.analysis import budget


def runs_and_evals(final: dict, last_quarter_fall: dict, steps: int = 4800):
    """One run per (norm, depth, seed): eval every 300 steps, falling linearly to `final[norm]` and by
    `last_quarter_fall[norm]` (in units of the gap, 2.0 here) over the last quarter."""
    runs, rows = [], []
    for norm in final:
        for depth in (6, 18):
            for seed in (0, 1):
                name = f"{norm}-L{depth}-s{seed}"
                end = final[norm] + 0.01 * seed
                runs.append(dict(norm=norm, depth=depth, seed=seed, run_name=name, status="completed", trained=True,
                                 eval_loss=end, steps=steps, unigram_loss=4.5, optimal_loss=2.5))
                fall = last_quarter_fall[norm] * 2.0
                for step in range(300, steps + 1, 300):
                    # flat before the last quarter's start, then falling by `fall` to `end`
                    start = end + fall
                    value = start if step <= steps * 3 // 4 else start - fall * (step - steps * 3 // 4) / (steps // 4)
                    rows.append(dict(run_name=name, step=step, eval_loss=value, norm=norm, depth=depth))
    return pd.DataFrame(runs), pd.DataFrame(rows)


def test_convergence_is_the_fall_over_the_last_quarter_in_units_of_the_gap():
    runs, scalars = runs_and_evals({"pre": 3.0, "deepnorm": 2.9}, {"pre": 0.01, "deepnorm": 0.05})
    judged = budget.with_convergence(runs, scalars).set_index("run_name")
    assert judged.loc["pre-L6-s0", "fall"] == pytest.approx(0.01) and judged.loc["pre-L6-s0", "converged"]
    assert judged.loc["deepnorm-L18-s1", "fall"] == pytest.approx(0.05) and not judged.loc["deepnorm-L18-s1", "converged"]
    # a run that diverged has no final evaluation: not converged, whatever its curve
    diverged = runs.assign(status="diverged")
    assert not budget.with_convergence(diverged, scalars)["converged"].any()


def test_the_budget_table_reads_each_budget_and_says_when_the_order_changes():
    runs, scalars = runs_and_evals({"pre": 3.0, "deepnorm": 2.9}, {"pre": 0.0, "deepnorm": 0.2})
    losses = budget.budget_losses(runs, scalars)
    table = budget.budget_table(losses).set_index(["depth", "steps"])
    # DeepNorm starts the last quarter 0.4 above its end (3.3): worse than Pre-LN at 300 and 1,200, better at 4,800
    assert table.loc[(6, 300), "order (best first)"] == "pre < deepnorm"
    assert table.loc[(6, 4800), "order (best first)"] == "deepnorm < pre"
    assert table.loc[(6, 4800), "deepnorm"] == "2.905 ± 0.007"
    assert budget.order_changes(losses) == {6: True, 18: True}
    flat = budget.budget_losses(*runs_and_evals({"pre": 3.0, "deepnorm": 2.9}, {"pre": 0.0, "deepnorm": 0.0}))
    assert budget.order_changes(flat) == {6: False, 18: False}
