"""What an earlier study's runs say of each cell of a frontier search (`hydra.sweeper.prior`): per cell, the
(rate, stable) of its runs, read from the study's records (published or raw) as untrusted input. The runs must
share the search's battery (board.battery: every model, data and training setting), or their brackets would
be another protocol's; checked before any probe, as one line naming the first setting that differs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from ..errors import ConfigError
from ..sweeps.frontier import finished_stable
from .board import GRID, battery
from .evidence import Evidence
from .runs import outcomes

KEY = "hydra.sweeper.prior"


def same(recorded: Any, override: str) -> bool:
    """A recorded value against an override's text: as numbers where both are ("100" and 100, "1e-3" and
    0.001), else as text."""
    try:
        return math.isclose(float(recorded), float(override), rel_tol=1e-12)
    except (TypeError, ValueError):
        return str(recorded) == override


def battery_difference(runs: pd.DataFrame, config: Any) -> str:
    """"train.steps: 500 there, 200 here": the first battery setting the runs share that the search's config
    sets otherwise ("" where none)."""
    for key, values in battery(runs).items():
        here = OmegaConf.select(config, key, default=None) if key not in GRID else None
        if here is None or len(values) != 1:
            continue
        if not same(values[0], str(here)):
            return f"{key}: {values[0]} there, {here} here"
    return ""


def prior_outcomes(root: Path, cells: list[tuple], key: str, stable_if: str, config: Any) -> dict[tuple, list]:
    """{cell: [(lr, stable)]}: the runs under `root` (runs/<study>) whose values match each cell's varying
    overrides, stable by `stable_if` (the sweeper's rule); runs that crashed or are unfinished say nothing."""
    runs = Evidence(root.parent).runs(root.name)
    if runs.empty:
        raise ConfigError(KEY, root, "no run records there")
    if key not in runs:
        raise ConfigError(KEY, root, f"its runs do not record {key}")
    difference = battery_difference(runs, config)
    if difference:
        raise ConfigError(KEY, root, f"its runs are another battery ({difference})")
    overrides = [dict(o.split("=", 1) for o in cell) for cell in cells]
    axes = sorted({k for o in overrides for k in o if len({p.get(k) for p in overrides}) > 1})
    missing = [k for k in axes if k not in runs]
    if missing:
        raise ConfigError(KEY, root, f"its runs do not record {', '.join(missing)}, an axis of this sweep")
    ended = outcomes(runs)
    trained = ended.get("trained", pd.Series(False, index=ended.index)).eq(True)
    rates = pd.to_numeric(ended[key], errors="coerce")
    out = {}
    for cell, values in zip(cells, overrides):
        match = pd.Series(True, index=ended.index) & rates.notna()
        for axis in axes:
            match &= ended[axis].map(lambda v, want=values[axis]: same(v, want))
        out[cell] = [(float(lr), finished_stable(status, ok, stable_if))
                     for lr, status, ok in zip(rates[match], ended.loc[match, "status"], trained[match])]
    return out
