"""What an earlier study's runs say of each cell of a frontier search (`hydra.sweeper.prior`): per cell, the
(rate, stable) of its runs, read from the study's records (published or raw) as untrusted input.

A run belongs to a cell where it is the same scheme, depth and seed (the cell's override, else the sweep's
config) and agrees with every other override of the cell that its records hold, but those that say where and
how a run is carried out (paths, logging, threads, measures: NOT_MATCHED). The runs must share the search's
battery (board.battery: every model, data and training setting) where the sweep does not vary it, and be of
one battery themselves, or their brackets would be another protocol's: checked before any probe, as one
line naming the first setting that differs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from ..errors import ConfigError
from ..sweeps.frontier import finished_stable
from .board import GRID, NOT_BATTERY, battery, mixed_battery
from .evidence import Evidence
from .runs import is_missing, outcomes

KEY = "hydra.sweeper.prior"
IDENTITY = {"norm": "norm.name", "depth": "depth", "seed": "seed"}  # a run's column: the config key it records
NOT_MATCHED_PREFIXES = ("paths.", "hydra.", "logger.", "metrics.")
NOT_MATCHED = frozenset({"experiment", "experiment_name", "threads", "resume", "memory_check"}) | NOT_BATTERY


def same(recorded: Any, wanted: Any) -> bool:
    """A recorded value against an override's text or a config's value: as numbers where both are ("100"
    and 100, "1e-3" and 0.001), else as text; None only as None."""
    if is_missing(recorded) or is_missing(wanted):
        return is_missing(recorded) and is_missing(wanted)
    try:
        return math.isclose(float(recorded), float(wanted), rel_tol=1e-12)
    except (TypeError, ValueError):
        return str(recorded) == str(wanted)


def battery_difference(runs: pd.DataFrame, config: Any, axes: set[str]) -> str:
    """"train.steps: 500 there, 200 here": the first battery setting, not an axis of the sweep, that the runs
    do not share or that the search's config sets otherwise ("" where none)."""
    mixed = [line for line in mixed_battery(runs) if line.split(":")[0] not in axes]
    if mixed:
        return f"{mixed[0]} there, runs of more than one battery"
    for key, values in battery(runs).items():
        if key in GRID or key in axes:
            continue
        here = OmegaConf.select(config, key, default=None)
        there = values[0] if values else None
        if not same(there, here):
            return f"{key}: {there} there, {here} here"
    return ""


def cell_values(overrides: dict, config: Any, columns) -> dict:
    """{run column: the value a run of this cell has}: scheme, depth and seed always, and every override the
    runs record but those that are not the run's computation."""
    values = {column: overrides.get(column, OmegaConf.select(config, key, default=None))
              for column, key in IDENTITY.items()}
    values.update({k: v for k, v in overrides.items() if k in columns and k not in NOT_MATCHED
                   and not k.startswith(NOT_MATCHED_PREFIXES)})
    return values


def prior_outcomes(root: Path, cells: list[tuple], key: str, stable_if: str, config: Any) -> dict[tuple, list]:
    """{cell: [(lr, stable)]}: the runs under `root` (runs/<study>) of each cell, stable by `stable_if` (the
    sweeper's rule); runs that crashed or are unfinished say nothing."""
    runs = Evidence(root.parent).runs(root.name)
    if runs.empty:
        raise ConfigError(KEY, root, "no run records there")
    missing = [column for column in (key, *IDENTITY) if column not in runs]
    if missing:
        raise ConfigError(KEY, root, f"its runs do not record {', '.join(missing)}")
    overrides = [dict(o.split("=", 1) for o in cell if "=" in o and not o.startswith("~")) for cell in cells]
    axes = {k for o in overrides for k in o if len({p.get(k) for p in overrides}) > 1}
    difference = battery_difference(runs, config, axes)
    if difference:
        raise ConfigError(KEY, root, f"its runs are another battery ({difference})")
    ended = outcomes(runs)
    trained = ended.get("trained", pd.Series(False, index=ended.index)).eq(True)
    rates = pd.to_numeric(ended[key], errors="coerce")
    out = {}
    for cell, values in zip(cells, overrides):
        match = rates.notna()
        for column, wanted in cell_values(values, config, ended.columns).items():
            match &= ended[column].map(lambda v, w=wanted: same(v, w))
        out[cell] = [(float(lr), finished_stable(status, ok, stable_if))
                     for lr, status, ok in zip(rates[match], ended.loc[match, "status"], trained[match])]
    return out
