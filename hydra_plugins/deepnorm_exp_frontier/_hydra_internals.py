"""The one module that reads Hydra's internals: what the pre-flight and our sweepers need of Hydra that its
public API does not offer. Hydra 1.3 only (pyproject pins `hydra-core>=1.3,<1.4`; tests/test_hydra_internals.py
fails on another version and checks each name below still has the signature used here).

Why each is needed:
- the command line as `@hydra.main` reads it (its argument parser, its search path, its Hydra instance), so that
  the pre-flight composes exactly what the app will, before the app creates any directory;
- the basic sweeper, which a sweeper plugin of ours extends (plugins must live in `hydra_plugins/`, which is why
  this module lives here: importing it costs a Hydra app that scans plugins nothing but Hydra);
- the steps of Hydra's per-job composition (which overrides are values, applying them, the run directory's
  name), so that a sweep's jobs are composed once per distinct defaults list instead of once per job.

The pre-flight could not move into a sweeper's `validate_batch_is_legal`: Hydra's basic sweeper creates the
sweep directory and writes multirun.yaml before it validates, validates batch by batch (`max_batch_size`)
after earlier batches have run, and a single run has no sweeper.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins import basic_sweeper as basic_sweeper_module
from hydra._internal.defaults_list import Overrides
from hydra._internal.hydra import Hydra
from hydra._internal.utils import (create_automatic_config_search_path,
                                   detect_calling_file_or_module_from_task_function, detect_task_name,
                                   get_args_parser)
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

SUPPORTED_HYDRA = "1.3"  # the minor version these names were read from
BASIC_SWEEPER = f"{basic_sweeper_module.__name__}.BasicSweeper"  # its _target_ in a sweep's config

__all__ = ["BASIC_SWEEPER", "ConfigLoaderImpl", "SUPPORTED_HYDRA", "apply_value_overrides", "args_parser",
           "basic_sweeper", "config_repository", "main_hydra", "main_search_path", "overrides_dirname",
           "sweep_axes", "split_sweep", "value_overrides"]


def basic_sweeper() -> tuple[type, type]:
    """Hydra's basic sweeper class and its config dataclass, as their module holds them now. Hydra's first
    plugin scan re-executes basic_sweeper.py in place, and the class's __init__ calls
    `super(BasicSweeper, self)` through the module's name: a subclass must extend the class of the moment
    (a reference kept from before the scan makes the subclass fail to construct)."""
    return basic_sweeper_module.BasicSweeper, basic_sweeper_module.BasicSweeperConf


def args_parser() -> argparse.ArgumentParser:
    """Hydra's own command-line parser (-m, --config-dir, --cfg, ...)."""
    return get_args_parser()


def main_search_path(task_function: Callable, config_path: str) -> tuple[ConfigSearchPath, str]:
    """The config search path and task name `@hydra.main(config_path=...)` builds for `task_function`."""
    task_function = getattr(task_function, "__wrapped__", task_function)
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task_function)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_path)
    return search_path, detect_task_name(calling_file, calling_module)


def main_hydra(task_name: str, search_path: ConfigSearchPath) -> Any:
    """Hydra's instance as `@hydra.main` creates it (it sets Hydra's global state: clear it after use)."""
    return Hydra.create_main_hydra2(task_name=task_name, config_search_path=search_path)


def config_repository(config_loader: Any, config_name: str, overrides: list[str]) -> Any:
    """The config repository Hydra composes from, with the search path the hydra.* overrides give."""
    return config_loader._parse_overrides_and_create_caching_repo(config_name, overrides)[1]


def value_overrides(repository: Any, parsed: list[Override]) -> list[Override]:
    """Of `parsed`, the overrides Hydra applies after the defaults list (values, not group choices)."""
    return Overrides(repository, parsed).config_overrides


def apply_value_overrides(values: list[Override], cfg: DictConfig) -> None:
    """Hydra's own application of value overrides to a composed config, in place."""
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)


def overrides_dirname(overrides: list[Override], dirname: DictConfig) -> str:
    """`hydra.job.override_dirname` as Hydra computes it, from `hydra.job.config.override_dirname`."""
    return get_overrides_dirname(overrides=overrides, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep,
                                 exclude_keys=dirname.exclude_keys)


def sweep_axes(sweeper: Any) -> list[str]:
    """The basic sweeper's `hydra.sweeper.params`, as override strings."""
    return sweeper._parse_config()


def split_sweep(axes: Sequence[Override]) -> list[list[str]]:
    """The override list of every job of a grid, in the basic sweeper's order."""
    return basic_sweeper()[0].split_arguments(list(axes), None)[0]
