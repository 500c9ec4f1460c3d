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
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from ..constant_roles import LEGACY_NAMES, ROLES

# The names that are shown on pages and joined into file paths: a run's directory name (rundir.py writes
# [A-Za-z0-9_.=+-] and "~"), a scheme's, a diagnosis kind, a device ("cuda:0"). None holds a character
# that HTML would read as syntax, or a path separator; "~~" and a word-edge "_" are Markdown's (strikethrough,
# emphasis), so a name composed into Markdown still goes through escape.md_text.
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
    return _finding(value) or fields_problem(value, {"also": list_of(_finding), "not_measured": list_of(text_problem),
                                                     "rules": integer(1)})


def read_by(check: Check | None, default: Any = None) -> Any:
    """A summary field whose value a reader accepts where `check` finds no problem (None: never read back)."""
    return field(default=default, metadata={"check": check})


LOSS = number(finite=False)  # non-finite where a run diverged
CROSS_ENTROPY = number(0.0, finite=False)  # a loss that cannot be negative: one that is would rank first
COUNT = integer()
AMOUNT = number(0.0)


@dataclass(slots=True)
class RunSummary:
    """summary.json: every field a run's summary has, in the order it is written (docs/records.md says what
    each means), with the rule a reader checks it by. A run fills it in as it goes (slots: a misspelt
    field is an error, not a new key); `record()` is what is written."""

    status: str = read_by(_status, "failed")  # until the run says otherwise
    trained: Optional[bool] = read_by(boolean_problem)
    learned_fraction: Optional[float] = read_by(LOSS)
    trained_at_step: Optional[int] = read_by(COUNT)
    steps: Optional[int] = read_by(COUNT)
    steps_completed: int = read_by(COUNT, 0)
    resumed_from_step: Optional[int] = read_by(COUNT)
    final_loss: Optional[float] = read_by(CROSS_ENTROPY)
    eval_loss: Optional[float] = read_by(CROSS_ENTROPY)
    eval_step: Optional[int] = read_by(COUNT)
    eval_weights: Optional[str] = read_by(text_problem)
    initial_eval_loss: Optional[float] = read_by(CROSS_ENTROPY)
    optimal_loss: Optional[float] = read_by(AMOUNT)
    unigram_loss: Optional[float] = read_by(AMOUNT)
    excess_loss: Optional[float] = read_by(LOSS)
    diverged_at_step: Optional[int] = read_by(COUNT)
    divergence_reason: Optional[str] = read_by(text_problem)
    divergence: Optional[dict] = read_by(None)  # the event as events.jsonl has it
    diagnosis: Optional[dict] = read_by(_diagnosis)
    norm: Optional[str] = read_by(name_problem)
    model: Optional[str] = read_by(name_problem)
    depth: Optional[int] = read_by(integer(1))
    seed: Optional[int] = read_by(integer(-2**63))
    constants: dict = field(default_factory=dict, metadata={"check": None})  # the scheme's: written as its own keys
    params: Optional[int] = read_by(COUNT)
    memory_estimate_gib: Optional[float] = read_by(AMOUNT)
    tokens_per_s: Optional[float] = read_by(AMOUNT)
    flops_per_token: Optional[float] = read_by(AMOUNT)
    mfu: Optional[float] = read_by(AMOUNT)
    peak_memory_gib: Optional[float] = read_by(AMOUNT)
    wall_s: Optional[float] = read_by(AMOUNT)
    started_at: Optional[str] = read_by(timestamp_problem)
    finished_at: Optional[str] = read_by(timestamp_problem)
    loss_scale: Optional[float] = read_by(AMOUNT)
    skipped_steps: Optional[int] = read_by(COUNT)
    experiment: Optional[str] = read_by(text_problem)
    run_name: Optional[str] = read_by(name_problem)
    run_dir: Optional[str] = read_by(text_problem)
    device: Optional[str] = read_by(name_problem)
    world_size: Optional[int] = read_by(integer(1))
    parallel: Optional[str] = read_by(name_problem)
    exact_match: Optional[float] = read_by(AMOUNT)
    error: Optional[str] = read_by(text_problem)

    def update(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)

    def record(self) -> dict:
        """The summary as summary.json holds it: the fields in order, the scheme's constants (by role, per
        stack: constant_roles.ROLES) in place of `constants`."""
        out: dict = {}
        for item in fields(self):
            if item.name == "constants":
                out.update(self.constants)
            else:
                out[item.name] = getattr(self, item.name)
        return out


# NormScheme.constants()' keys, and the names records written before them used (still read: constant_roles)
CONSTANTS: dict[str, Check] = {name: _per_stack for name in (*ROLES, *LEGACY_NAMES)}
LOSSES = ("final_loss", "eval_loss", "excess_loss", "learned_fraction")  # finite in a completed run (the first two)
SUMMARY: dict[str, Check] = {item.name: item.metadata["check"] for item in fields(RunSummary)
                             if item.metadata["check"] is not None} | CONSTANTS
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
