"""The stability-frontier search, on planted thresholds."""

import math

import pytest

from deepnorm_exp.frontier import grid_runs, search


def planted(thresholds):
    calls = []

    def probe(batch):
        calls.append(batch)
        return [lr <= thresholds[key] for key, lr in batch]

    return probe, calls


@pytest.mark.parametrize("threshold", [1.3e-4, 7e-4, 3.3e-3, 0.02, 0.09])
def test_bisection_brackets_a_planted_threshold_with_the_expected_probes(threshold):
    lo, hi, resolution = 1e-4, 1e-1, 2 ** 0.25
    probe, _ = planted({"cell": threshold})
    (cell,) = search(["cell"], lo, hi, resolution, probe)
    assert cell.stable <= threshold < cell.unstable
    assert cell.unstable / cell.stable <= resolution
    # hi and lo, then halvings of the log-range until within the resolution
    expected = 2 + math.ceil(math.log2(math.log(hi / lo) / math.log(resolution)))
    assert cell.result()["runs"] == expected == 8
    assert grid_runs(lo, hi, resolution) == 41  # what a grid of the same resolution costs


def test_cells_are_searched_together_and_edge_cases_settle_early():
    probe, calls = planted({"stable everywhere": 1.0, "unstable everywhere": 1e-9, "middle": 3e-3})
    cells = {c.key: c for c in search(["stable everywhere", "unstable everywhere", "middle"], 1e-4, 1e-1,
                                      2 ** 0.25, probe)}
    assert cells["stable everywhere"].result()["runs"] == 1 and cells["stable everywhere"].unstable is None
    assert cells["unstable everywhere"].result()["runs"] == 2 and cells["unstable everywhere"].stable is None
    assert len(calls[0]) == 3 and len(calls[1]) == 2 and all(len(batch) == 1 for batch in calls[2:])


def test_a_failed_probe_stops_its_cell_only():
    def probe(batch):
        return [None if key == "broken" else lr <= 1e-2 for key, lr in batch]

    cells = {c.key: c for c in search(["broken", "fine"], 1e-4, 1e-1, 2.0, probe)}
    assert cells["broken"].error and cells["broken"].result()["runs"] == 0
    assert cells["fine"].stable <= 1e-2 < cells["fine"].unstable
