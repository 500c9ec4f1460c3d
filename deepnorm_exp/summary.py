"""summary.json: what a run ended as, and the one-screen text printed at its end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from .files import atomic_path


def learned_fraction(eval_loss: Optional[float], unigram: float, optimal: Optional[float]) -> Optional[float]:
    """Share of the learnable gap (unigram loss -> optimal loss) the model closed: 0 = learned only token
    frequencies, 1 = Bayes-optimal. Without a known optimum the gap runs down to 0 nats."""
    if eval_loss is None or not math.isfinite(eval_loss):
        return None
    floor = optimal if optimal is not None else 0.0
    return (unigram - eval_loss) / (unigram - floor)


TRAINED_FRACTION = 0.1  # below this share of the learnable gap a run counts as `trained: false`


def finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_summary(path: Path, summary: dict) -> None:
    with atomic_path(Path(path)) as temporary:
        temporary.write_text(json.dumps({k: finite_or_none(v) for k, v in summary.items()}, indent=2) + "\n")


def read_summary(path: Path) -> dict | None:
    """The summary a run left, or None (no file, or one cut short by a crash while written)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _fmt(value: Any, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def format_summary(s: dict) -> str:
    state = s["status"]
    if s["status"] == "completed":
        state += " (trained)" if s.get("trained") else " (trained: false, no better than token frequencies)"
    elif s["status"] == "diverged":
        state += f" at step {s['diverged_at_step']}: {s['divergence_reason']}"
    elif s.get("error"):
        state += f": {s['error']}"
    constants = "  ".join(f"{stack} {s['alpha'][stack]:.4g} / {s['beta'][stack]:.4g}" for stack in s["alpha"])
    lines = [
        f"{s['norm']} L{s['depth']} seed {s['seed']}  ->  {s['run_dir']}",
        f"  status      {state}",
        f"  steps       {s['steps_completed']}/{s['steps']} in {_fmt(s['wall_s'], '.1f')} s, "
        f"{_fmt(s['tokens_per_s'], ',.0f')} tokens/s on {s['device']}",
        f"  loss        final {_fmt(s['final_loss'])}  eval {_fmt(s['eval_loss'])}  "
        f"optimal {_fmt(s['optimal_loss'])}  excess {_fmt(s['excess_loss'])}  unigram {_fmt(s['unigram_loss'])}",
        f"  alpha/beta  {constants}",
        f"  params      {_fmt(s['params'], ',')}",
    ]
    return "\n".join(lines)


def load_summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(root).glob("*/summary.json"))]


def format_table(summaries: list[dict]) -> str:
    """norm x depth table of a sweep: final loss, eval loss, excess loss, status."""
    if not summaries:
        return "(no runs)"
    rows = sorted(summaries, key=lambda s: (s["depth"], s["norm"], s["run_name"]))
    width = max(len(s["run_name"]) for s in rows)
    header = f"{'run':<{width}} {'norm':<10} {'depth':>5} {'final':>7} {'eval':>7} {'excess':>7} {'learned':>7}  status"
    lines = [header, "-" * len(header)]
    for s in rows:
        status = s["status"] + ("" if s["status"] != "completed" or s.get("trained") else " (untrained)")
        if s["status"] == "diverged":
            status += f" @{s['diverged_at_step']}"
        lines.append(f"{s['run_name']:<{width}} {s['norm']:<10} {s['depth']:>5} {_fmt(s['final_loss'], '7.3f')} "
                     f"{_fmt(s['eval_loss'], '7.3f')} {_fmt(s['excess_loss'], '7.3f')} {_fmt(s.get('learned_fraction'), '7.0%')}"
                     f"  {status}")
    optimal = {s["optimal_loss"] for s in rows if s.get("optimal_loss") is not None}
    unigram = {round(s["unigram_loss"], 3) for s in rows if s.get("unigram_loss") is not None}
    if len(optimal) == 1 and len(unigram) == 1:
        lines.append(f"optimal loss {optimal.pop():.3f}, unigram (token frequencies only) {unigram.pop():.3f}; "
                     "learned = share of the gap between them that the run closed")
    return "\n".join(lines)
