"""Module names that users typed before the package was regrouped (`python -m deepnorm_exp.report`): each
fails in one line naming its new home, instead of Python's bare "No module named"."""

from __future__ import annotations

import importlib.abc
import sys

MOVED = {  # old module -> the module to run now
    "deepnorm_exp.report": "deepnorm_exp.analysis.report",
    "deepnorm_exp.bench": "benchmarks.bench",
    "deepnorm_exp.bench_data": "benchmarks.bench_data",
    "deepnorm_exp.frontier": "deepnorm_exp.sweeps.frontier",
    "deepnorm_exp.hydra_callbacks": "deepnorm_exp.sweeps.hydra_callbacks",
    "deepnorm_exp.run": "deepnorm_exp.lifecycle.run",
    "deepnorm_exp.runlock": "deepnorm_exp.rundir",
    "deepnorm_exp.lifecycle.rundir": "deepnorm_exp.rundir",
    "deepnorm_exp.lifecycle.runlock": "deepnorm_exp.rundir",
    "deepnorm_exp.summary": "deepnorm_exp.lifecycle.summary",
    "deepnorm_exp.preemption": "deepnorm_exp.lifecycle.preemption",
    "deepnorm_exp.translation_eval": "deepnorm_exp.metrics.exact_match",
}


class MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            raise ModuleNotFoundError(f"{name} has moved: python -m {MOVED[name]} (or import {MOVED[name]})",
                                      name=name)
        return None


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())  # last: only names no other finder has
