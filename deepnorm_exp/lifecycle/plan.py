"""A run's plan: its config checked, its scheme, memory estimate, name and directory, built once before the
run opens anything; every later step reads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig

from ..build import CheckedConfig, check_config, check_runtime
from ..rundir import run_dir, run_name
from ..runtime import launch_environment
from ..schemes import NormScheme
from ..train.memory import GIB
from ..train.trainer import Callback


@dataclass(frozen=True)
class RunPlan:
    checked: CheckedConfig
    memory: Any  # train.memory.MemoryEstimate on this machine
    name: str  # the run's name, from the command's overrides
    directory: Path
    progress: bool | None = None  # the progress bar: None decides from the terminal
    callbacks: Sequence[Callback] = ()  # extra observers, after the built-in ones

    @property
    def cfg(self) -> DictConfig:
        return self.checked.cfg

    @property
    def scheme(self) -> NormScheme:
        return self.checked.scheme

    @property
    def memory_gib(self) -> float:
        return self.memory.total_bytes / GIB


def plan_run(cfg: DictConfig, override_dirname: str = "", progress: bool | None = None,
             callbacks: Sequence[Callback] = ()) -> RunPlan:
    """Check `cfg` (ConfigError before anything is opened) and plan its run on this machine."""
    checked = check_config(cfg)
    memory = check_runtime(checked, launch_environment()[1])
    name = run_name(cfg, override_dirname)
    return RunPlan(checked, memory, name, run_dir(cfg, name), progress, tuple(callbacks))
