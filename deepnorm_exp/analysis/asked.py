"""What a study's sweeps were asked for: per invocation in its sweep log (sweeps.jsonl), each axis of the grid as
that command line set it, else as the preset did (multirun.yaml's hydra.sweeper.params). A board runs over many
invocations, some narrowed (`norm=keel`) or extended (`train.lr=3e-2` for one scheme), so the grid a (scheme,
depth) cell must cover is what the invocations that reached it asked (board.py's `waiting_cells`). Records are
untrusted input: an axis that cannot be read is not known (None), never a crash."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from .. import records
from ..rundir import StudyDir
from .timing import sweeper_setting

LR = "train.lr"
AXES = ("norm", "depth", LR, "seed")
Invocation = dict[str, Optional[tuple[str, ...]]]  # axis -> its values; None: not known (any value)


def plain_list(axis: object) -> Optional[tuple[str, ...]]:
    """"1e-3,3e-3" -> ("1e-3", "3e-3"); None for no axis, or one Hydra expands (range(), [..], interval())."""
    if axis is None or isinstance(axis, (dict, list)) or any(c in str(axis) for c in "()[]{}"):
        return None
    return tuple(value.strip() for value in str(axis).split(",") if value.strip()) or None


def invocations(study: Optional[Path]) -> list[Invocation]:
    """Each invocation's axes (AXES); one for the preset alone where no sweep log was kept; none where neither
    the log nor the preset's axes can be read."""
    if study is None:
        return []
    try:
        params = sweeper_setting(study, "params", None)
    except (ValueError, OSError):  # a damaged multirun.yaml: the preset's axes are not known
        params = None
    preset = params if isinstance(params, dict) else {}
    try:
        log = records.read_jsonl(study / StudyDir.SWEEP_LOG)
    except OSError:  # a directory, an unreadable file: no log
        log = []
    starts = [line for line in log if isinstance(line, dict) and line.get("event") == "start"]
    if not starts and not preset:
        return []
    asked = []
    for start in starts or [{}]:
        given = command_line(start)
        asked.append({axis: plain_list(given.get(axis, preset.get(axis))) for axis in AXES})
    return asked


def command_line(start: dict) -> dict[str, str]:
    """A sweep log's start line's overrides as key -> value (none where they cannot be read)."""
    overrides = start.get("overrides") if isinstance(start.get("overrides"), list) else []
    return dict(o.lstrip("+~").split("=", 1) for o in overrides if isinstance(o, str) and "=" in o)


def numbers(values: Optional[tuple[str, ...]]) -> set[float]:
    """The values that read as finite numbers (none where the axis is not known)."""
    out = set()
    for value in values or ():
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            out.add(number)
    return out


def covers(invocation: Invocation, norm: str, depth: float) -> bool:
    """Whether the invocation asked for runs of `norm` at `depth` (an axis not known covers every value)."""
    norms, depths = invocation["norm"], invocation["depth"]
    return (norms is None or norm in norms) and (depths is None or depth in numbers(depths))


def asked_pairs(asked: list[Invocation], norm: str, depth: float,
                held: set[tuple[float, float]]) -> set[tuple[float, float]]:
    """The (rate, seed) pairs the invocations that reached the cell asked for; where one's rate or seed axis is
    not known (range(), a damaged record), every rate the cell's runs (`held` pairs) hold at every seed they do."""
    pairs = set(held)
    for invocation in asked:
        if covers(invocation, norm, depth):
            rates, seeds = numbers(invocation[LR]), numbers(invocation["seed"])
            if invocation[LR] is None or invocation["seed"] is None:
                rates |= {rate for rate, _ in held}
                seeds |= {seed for _, seed in held}
            pairs |= {(rate, seed) for rate in rates for seed in seeds}
    return pairs


def asked_values(asked: list[Invocation], key: str, norm: Optional[str] = None) -> set[float]:
    """Every number asked for on axis `key` (by the invocations that reached `norm`, where given)."""
    return {value for invocation in asked if norm is None or invocation["norm"] is None or norm in invocation["norm"]
            for value in numbers(invocation[key])}
