"""What a run's records may hold: the type and range of every field the analysis reads.

Records are read back as untrusted input: a summary edited by hand, damaged on disk, or packed into a pull
request. `summary_problem` and `config_problem` name the first field that breaks these rules (None where
there is none), so a reader can leave that run out with one line instead of a traceback in a table, and a
published study can be refused before its page is written. A field a record lacks is not a problem
(records written before the field existed lack it); a field these rules do not know is not read.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any, Callable, Optional

# The names that are shown on pages and joined into file paths: a run's directory name (rundir.py writes
# [A-Za-z0-9_.=+-] and "~"), a scheme's, a diagnosis kind, a device ("cuda:0"). None holds a character
# that Markdown or HTML would read as syntax, or a path separator.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:=+~-]{0,199}")
STATUSES = ("completed", "diverged", "failed", "interrupted")  # what summary.json says (lifecycle/run.py)
MAX_TEXT = 10_000  # characters of a free-text field (an error, a diagnosis's evidence)

Check = Callable[[Any], Optional[str]]  # why a value is refused, or None


def number(low: float = -math.inf, finite: bool = True) -> Check:
    def check(value: Any) -> Optional[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{type(value).__name__}, not a number"
        if finite and not math.isfinite(value):
            return f"{value}, not finite"
        return f"{value}, below {low}" if value < low else None
    return check


def integer(low: int = 0) -> Check:
    def check(value: Any) -> Optional[str]:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{type(value).__name__}, not an integer"
        return f"{value}, below {low}" if value < low else None
    return check


def name_problem(value: Any) -> Optional[str]:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        return f"{str(value)[:40]!r}, not a name ([A-Za-z0-9] then [A-Za-z0-9_.:=+~-], at most 200)"
    return None


def text_problem(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return f"{type(value).__name__}, not text"
    return f"{len(value):,} characters, over {MAX_TEXT:,}" if len(value) > MAX_TEXT else None


def boolean_problem(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f"{type(value).__name__}, not true or false"


def timestamp_problem(value: Any) -> Optional[str]:
    try:
        datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return f"{str(value)[:40]!r}, not an ISO 8601 time"
    return None


def _status(value: Any) -> Optional[str]:
    return None if value in STATUSES else f"{str(value)[:40]!r}, not one of {', '.join(STATUSES)}"


def _per_stack(value: Any) -> Optional[str]:
    if not isinstance(value, dict):
        return f"{type(value).__name__}, not a mapping of stack to number"
    return next((f"{stack}: {why}" for stack, item in value.items()
                 if (why := name_problem(stack) or number()(item))), None)


def _finding(value: Any) -> Optional[str]:
    if not isinstance(value, dict):
        return f"{type(value).__name__}, not a finding"
    return fields_problem(value, {"kind": name_problem, "step": integer(), "evidence": text_problem}, required=("kind",))


def list_of(check: Check) -> Check:
    def of(value: Any) -> Optional[str]:
        if not isinstance(value, list):
            return f"{type(value).__name__}, not a list"
        return next((f"item {i}: {why}" for i, item in enumerate(value) if (why := check(item))), None)
    return of


def _diagnosis(value: Any) -> Optional[str]:
    return _finding(value) or fields_problem(value, {"also": list_of(_finding), "not_measured": list_of(text_problem)})


LOSSES = ("final_loss", "eval_loss", "excess_loss", "learned_fraction")  # non-finite where a run diverged
SUMMARY: dict[str, Check] = {
    "status": _status, "run_name": name_problem, "norm": name_problem, "model": name_problem, "device": name_problem, "parallel": name_problem,
    "experiment": text_problem, "run_dir": text_problem, "error": text_problem, "eval_weights": text_problem, "divergence_reason": text_problem,
    "depth": integer(1), "seed": integer(-2**63), "steps": integer(), "steps_completed": integer(),
    "eval_step": integer(), "resumed_from_step": integer(), "trained_at_step": integer(), "diverged_at_step": integer(),
    "params": integer(), "world_size": integer(1), "skipped_steps": integer(),
    "initial_eval_loss": number(finite=False), "optimal_loss": number(0.0), "unigram_loss": number(0.0),
    "wall_s": number(0.0), "tokens_per_s": number(0.0), "flops_per_token": number(0.0), "mfu": number(0.0),
    "memory_estimate_gib": number(0.0), "peak_memory_gib": number(0.0), "loss_scale": number(0.0),
    "exact_match": number(0.0), "trained": boolean_problem, "started_at": timestamp_problem, "finished_at": timestamp_problem,
    "alpha": _per_stack, "beta": _per_stack, "diagnosis": _diagnosis,
    **{key: number(finite=False) for key in LOSSES},
}
REQUIRED = ("run_name", "norm", "depth", "status")  # what no table of runs can do without

# The config keys the analysis reads (a config lacking one is read as not saying)
CONFIG: dict[str, Check] = {
    "norm.name": name_problem, "depth": integer(1), "seed": integer(-2**63), "experiment_name": text_problem,
    "train.lr": number(0.0), "train.steps": integer(), "train.warmup_steps": integer(),
    "train.betas": list_of(number(0.0)), "train.flush_denormal": boolean_problem, "model.d_model": integer(1),
}


def fields_problem(record: dict, checks: dict[str, Check], required: tuple[str, ...] = ()) -> Optional[str]:
    missing = next((key for key in required if record.get(key) is None), None)
    if missing:
        return f"{missing} is missing"
    for key, check in checks.items():
        value = _dotted(record, key)
        if value is not None and (why := check(value)):
            return f"{key} is {why}"
    return None


def _dotted(record: dict, key: str) -> Any:
    for part in key.split("."):
        record = record.get(part) if isinstance(record, dict) else None
    return record


def summary_problem(summary: Any, required: tuple[str, ...] = REQUIRED) -> Optional[str]:
    """Why `summary` (a summary.json's content) cannot be read as one, or None. `required`: the fields it must
    have (a table of runs needs REQUIRED; a run reading its own summary back, none)."""
    if not isinstance(summary, dict):
        return f"{type(summary).__name__}, not a summary"
    why = fields_problem(summary, SUMMARY, required)
    if why is None and summary.get("status") == "completed":  # finished without diverging: its losses are numbers
        why = next((f"{key} is {summary[key]}, not finite, in a completed run" for key in LOSSES[:2]
                    if isinstance(summary.get(key), float) and not math.isfinite(summary[key])), None)
    return why


def config_problem(config: Any) -> Optional[str]:
    """Why `config` (a config.yaml's content) cannot be read, or None."""
    if not isinstance(config, dict):
        return f"{type(config).__name__}, not a config"
    return fields_problem(config, CONFIG)
