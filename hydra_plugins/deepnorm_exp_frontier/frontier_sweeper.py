"""`hydra/sweeper=frontier`: the largest stable learning rate per grid cell, by log-scale bisection.

    python -m deepnorm_exp -m hydra/sweeper=frontier norm=post,pre,deepnorm depth=6,24,100

The sweep's other axes (here norm x depth) form the cells; in each, learning rates between
`hydra.sweeper.lr_min` and `lr_max` are probed as ordinary runs (each with its own run directory, summary
and records, launched by whatever launcher is configured, one batch per bisection round) until the largest
stable rate and the smallest unstable one are within a factor `resolution`. `frontier.json` in the sweep
directory lists, per cell, the max stable lr, the runs spent, and what a grid of the same resolution would
have cost. `hydra.sweeper.prior=runs/board` starts each cell inside the bracket a grid's runs of it already
put around its frontier (same battery, checked before any probe). The search itself is
deepnorm_exp/sweeps/frontier.py.
"""

# No `from __future__ import annotations`: Hydra's plugin scan imports this module without registering it
# in sys.modules, and dataclasses then cannot resolve string annotations.
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from deepnorm_exp.records import write_json, write_text
from deepnorm_exp.rundir import StudyDir

log = logging.getLogger(__name__)


@dataclass
class FrontierSweeperConf:
    _target_: str = "hydra_plugins.deepnorm_exp_frontier.frontier_sweeper.FrontierSweeper"
    params: Dict[str, str] = field(default_factory=dict)  # grid axes besides the learning rate
    key: str = "train.lr"  # the config key probed
    lr_min: float = 1e-4
    lr_max: float = 3e-2
    resolution: float = 1.5  # stop when (smallest unstable) / (largest stable) <= this
    stable_if: str = "completed"  # completed: not diverged; trained: completed and learned (summary.trained)
    max_batch_size: Optional[int] = None  # probes one launch starts at most (null: a round's all at once)
    # a study's runs (runs/board) whose runs of each cell, at the same battery, bracket its frontier before any
    # probe: the search starts inside that bracket instead of at the range's ends (null: none)
    prior: Optional[str] = None


ConfigStore.instance().store(group="hydra/sweeper", name="frontier", node=FrontierSweeperConf,
                             provider="deepnorm_exp")


class FrontierSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        """`settings`: the fields of FrontierSweeperConf (`hydra.sweeper.*`), as Hydra passes them."""
        conf = FrontierSweeperConf(**settings)
        params, key, lr_min, lr_max = conf.params, conf.key, conf.lr_min, conf.lr_max
        resolution, stable_if, max_batch_size = conf.resolution, conf.stable_if, conf.max_batch_size
        if not 0 < lr_min < lr_max:
            raise ValueError(f"hydra.sweeper: need 0 < lr_min < lr_max, got {lr_min}, {lr_max}")
        if resolution <= 1:
            raise ValueError(f"hydra.sweeper.resolution={resolution}: must be > 1")
        if stable_if not in ("completed", "trained"):
            raise ValueError(f"hydra.sweeper.stable_if={stable_if}: choose completed or trained")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"hydra.sweeper.max_batch_size={max_batch_size}: must be >= 1, or null")
        self.max_batch_size, self.prior = max_batch_size, conf.prior
        self._prior_read: Optional[tuple] = None  # (cells, their prior brackets)
        self.params, self.key = dict(params or {}), key
        self.lr_min, self.lr_max, self.resolution, self.stable_if = lr_min, lr_max, resolution, stable_if
        self.config: Optional[DictConfig] = None
        self.launcher = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def _stable(self, result: JobReturn) -> Union[bool, str]:
        """True/False for a run that ended stable/diverged; for one that failed, its error. A run that was
        interrupted, or that another process is running, stops the sweep (resumable) instead: it failed nothing."""
        from deepnorm_exp.sweeps.frontier import finished_stable

        if result.status != JobStatus.COMPLETED:
            return f"{type(result._return_value).__name__}: {result._return_value}"
        summary = result.return_value
        if not isinstance(summary, dict):
            return "the job ended before its run started (see its log)"
        if summary.get("status") == "interrupted":  # preempted or stopped: says nothing; settling the cell would
            raise RuntimeError(f"{summary.get('run_dir')} was interrupted ({summary.get('error')}): a stopped probe "
                               "says nothing about stability; re-run the same command to resume the sweep")
        if summary.get("status") == "skipped":  # another process (a second sweep of the same preset) holds it
            raise RuntimeError(f"{summary.get('run_dir')} is being run by another process ({summary.get('reason')}): "
                               "one sweep of a frontier at a time; re-run this command once that one ends")
        if summary.get("status") not in ("completed", "diverged"):
            return summary.get("error") or summary.get("reason") or f"status {summary.get('status')}"
        return finished_stable(summary["status"], summary.get("trained"), self.stable_if)

    def planned_jobs(self, arguments: List[str]) -> List[List[str]]:
        """The cells: the grid of the sweep's other axes (glob, range and the rest of Hydra's grammar), each
        probed with `key` set. Also what the pre-flight checks before anything runs."""
        from deepnorm_exp.sweeps.frontier import check_owned_keys

        from ._hydra_internals import split_sweep

        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        axes = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        check_owned_keys(self.key, axes)
        jobs = split_sweep(parser.parse_overrides(axes))
        self._prior([tuple(job) for job in jobs])  # refused here, before any compute, where it cannot be read
        return jobs

    def _prior(self, cells: List[tuple]) -> Dict[tuple, list]:
        """Per cell, the bracket `prior`'s runs of the same cell put around its frontier (sweeps/frontier.py:
        prior_brackets), judged by this sweep's `stable_if`; {} without a prior."""
        if not self.prior:
            return {}
        if self._prior_read is None or self._prior_read[0] != cells:  # read once: the pre-flight's is kept
            from deepnorm_exp.sweeps.frontier import prior_brackets
            from deepnorm_exp.analysis.frontier_prior import prior_outcomes

            self._prior_read = (cells, {cell: prior_brackets(outcomes) for cell, outcomes in prior_outcomes(
                Path(self.prior), cells, self.key, self.stable_if, self.config).items()})
        return self._prior_read[1]

    def sweep(self, arguments: List[str]) -> Any:
        from deepnorm_exp.sweeps.frontier import grid_runs, search

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        cells = [tuple(cell) for cell in self.planned_jobs(arguments)]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text(sweep_dir / StudyDir.MULTIRUN, OmegaConf.to_yaml(self.config))  # atomic, as every record
        launched = 0

        def probe(batch):
            nonlocal launched
            jobs = [[*cell, f"{self.key}={lr!r}"] for cell, lr in batch]  # the exact rate: repr round-trips
            size = self.max_batch_size or len(jobs)
            outcomes = []
            for start in range(0, len(jobs), size):  # one launch per max_batch_size probes
                results = self.launcher.launch(jobs[start:start + size], initial_job_idx=launched)
                launched += len(results)
                outcomes += [self._stable(result) for result in results]
            return outcomes

        found = search(cells, self.lr_min, self.lr_max, self.resolution, probe, self._prior(cells))
        per_cell_grid = grid_runs(self.lr_min, self.lr_max, self.resolution)
        report = {
            "key": self.key, "lr_min": self.lr_min, "lr_max": self.lr_max, "resolution": self.resolution,
            "stable_if": self.stable_if, **({"prior": self.prior} if self.prior else {}),
            "cells": [{**dict(o.split("=", 1) for o in cell.key), "overrides": list(cell.key), **cell.result()}
                      for cell in found],
            "runs_spent": launched, "grid_runs": per_cell_grid * len(found),
        }
        write_json(sweep_dir / StudyDir.FRONTIER, report)
        log.info(format_frontier(report))
        print(format_frontier(report), flush=True)
        return report


def format_frontier(report: dict) -> str:
    lines = [f"stability frontier: largest stable {report['key']} in [{report['lr_min']:g}, {report['lr_max']:g}]"
             f", resolution x{report['resolution']:g} ({report['stable_if']})"]
    for cell in report["cells"]:
        stable = "-" if cell["max_stable_lr"] is None else f"{cell['max_stable_lr']:g}"
        unstable = "-" if cell["min_unstable_lr"] is None else f"{cell['min_unstable_lr']:g}"
        note = f"  ({cell['error']})" if cell["error"] else ""
        lines.append(f"  {' '.join(cell['overrides']):<40} max stable {stable:>8}  first unstable {unstable:>8}"
                     f"  runs {cell['runs']}{note}")
    lines.append(f"runs spent {report['runs_spent']}; a grid of the same resolution: {report['grid_runs']}")
    return "\n".join(lines)
