"""summary.json: what a run ended as, and the one-screen text printed at its end."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Optional

from ..constant_roles import by_role
from ..records import read_json, utc_now, write_json
from ..rundir import RunDir
from .schema import REQUIRED, RunSummary, summary_problem

log = logging.getLogger("deepnorm_exp")


def learned_fraction(eval_loss: Optional[float], unigram: float, optimal: Optional[float]) -> Optional[float]:
    """Share of the learnable gap (unigram loss -> optimal loss) the model closed: 0 = learned only token
    frequencies, 1 = Bayes-optimal. Without a known optimum the gap runs down to 0 nats."""
    if eval_loss is None or not math.isfinite(eval_loss):
        return None
    floor = optimal if optimal is not None else 0.0
    return (unigram - eval_loss) / (unigram - floor)


# A run that ended: a re-run skips it, and analysis reads only these (anything else resumes or starts over)
FINAL = ("completed", "diverged")


def has_ended(summary: dict | None) -> bool:
    """Whether a run's summary (None: it left none) says the run ended: completed or diverged. The one test
    of it: a re-run skips such a run, the sweep counts it as done, the analysis reads it."""
    return isinstance(summary, dict) and summary.get("status") in FINAL
TRAINED_FRACTION = 0.1  # below this share of the learnable gap a run counts as `trained: false`


def is_trained(fraction: Optional[float]) -> bool:
    """The rule behind `trained`: the run closed at least TRAINED_FRACTION of the learnable gap."""
    return fraction is not None and fraction >= TRAINED_FRACTION


def new_summary(plan: Any, runtime: Any, parallel: str) -> RunSummary:
    """The summary of a run that has just started (`plan`: plan.RunPlan): what is known before training,
    null for the rest; it says `failed` until the run says otherwise."""
    cfg = plan.cfg
    return RunSummary(steps=cfg.train.steps, norm=cfg.norm.name, model=cfg.model.kind, depth=cfg.depth, seed=cfg.seed,
                      constants=plan.scheme.constants(), memory_estimate_gib=plan.memory_gib, started_at=utc_now(),
                      experiment=cfg.experiment_name, run_name=plan.name, run_dir=str(plan.directory),
                      device=str(runtime.device), world_size=runtime.world_size, parallel=parallel)


def write_summary(path: Path, summary: dict) -> None:
    write_json(path, summary)  # strict JSON: a NaN loss is "nan" (records.encode), read back as a float


def read_summary(path: Path, required: tuple[str, ...] = ()) -> dict | None:
    """The summary a run left, or None (no file; a damaged one, one with a field of the wrong type or range
    (schema.py), or one without a field in `required`, is named in a warning with the field)."""
    summary = read_json(path)
    if summary is not None and (why := summary_problem(summary, required)):
        log.warning("%s is damaged and was skipped (%s)", path, why)
        return None
    return summary


def summary_of(run_dir: Path, required: tuple[str, ...] = ()) -> dict | None:
    """`read_summary` of a run directory's summary file."""
    return read_summary(RunDir(run_dir).summary, required)


def has_finished(run_dir: Path) -> bool:
    """Whether the run in `run_dir` has ended (completed or diverged): its summary says so."""
    return has_ended(summary_of(run_dir))


def _fmt(value: Any, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def describe_diagnosis(diagnosis: Optional[dict]) -> str:
    """One line: `kind at step N: evidence`, and the other findings' kinds."""
    if not diagnosis:
        return "-"
    also = f" (also: {', '.join(f['kind'] + ' @' + str(f['step']) for f in diagnosis['also'])})" if diagnosis["also"] else ""
    return f"{diagnosis['kind']} at step {diagnosis['step']}: {diagnosis['evidence']}{also}"


def format_summary(s: dict) -> str:
    state = s["status"]
    if s["status"] == "completed":
        state += " (trained)" if s.get("trained") else " (trained: false, no better than token frequencies)"
    elif s["status"] == "diverged":
        state += f" at step {s['diverged_at_step']}: {s['divergence_reason']}"
    elif s.get("error"):
        state += f": {s['error']}"
    roles = by_role(s)
    stacks = next(iter(roles.values()), {})
    constants = "  ".join(f"{stack}: " + ", ".join(f"{role.replace('_', ' ')} {values[stack]:.4g}"
                                                 for role, values in roles.items() if stack in values)
                          for stack in stacks)
    lines = [
        f"{s['norm']} L{s['depth']} seed {s['seed']}  ->  {s['run_dir']}",
        f"  status      {state}",
        f"  steps       {s['steps_completed']}/{s['steps']} in {_fmt(s['wall_s'], '.1f')} s, "
        f"{_fmt(s['tokens_per_s'], ',.0f')} tokens/s on {s['device']}",
        f"  loss        final {_fmt(s['final_loss'])}  eval {_fmt(s['eval_loss'])}  "
        f"optimal {_fmt(s['optimal_loss'])}  excess {_fmt(s['excess_loss'])}  unigram {_fmt(s['unigram_loss'])}",
        f"  diagnosis   {describe_diagnosis(s.get('diagnosis'))}",
        f"  constants   {constants or '-'}",
        f"  params      {_fmt(s['params'], ',')}",
    ]
    return "\n".join(lines)


def load_summaries(root: Path) -> tuple[list[dict], list[Path]]:
    """The readable summaries of the runs under `root`, and the summary files that could not be read."""
    summaries, damaged = [], []
    for path in sorted(Path(root).glob(f"*/{RunDir.SUMMARY}")):
        summary = read_summary(path, REQUIRED)
        if summary is None:
            damaged.append(path)
        else:
            summaries.append(summary)
    return summaries, damaged


def format_table(summaries: list[dict], damaged: list[Path] = ()) -> str:
    """norm x depth table of a sweep: final loss, eval loss, excess loss, status; then the unreadable
    summaries, by path (a damaged record is reported, never silently left out)."""
    unreadable = [f"unreadable: {path} (damaged summary.json; re-run that run with resume=false)" for path in damaged]
    if not summaries:
        return "\n".join(["(no runs)", *unreadable])
    rows = sorted(summaries, key=lambda s: (s["depth"], s["norm"], s["run_name"]))
    width = max(len(s["run_name"]) for s in rows)
    header = (f"{'run':<{width}} {'norm':<10} {'depth':>5} {'final':>7} {'eval':>7} {'excess':>7} {'learned':>7}  "
              f"{'diagnosis':<23} status")
    lines = [header, "-" * len(header)]
    for s in rows:
        status = s["status"] + ("" if s["status"] != "completed" or s.get("trained") else " (untrained)")
        if s["status"] == "diverged":
            status += f" @{s.get('diverged_at_step')}"
        lines.append(f"{s['run_name']:<{width}} {s['norm']:<10} {s['depth']:>5} {_fmt(s.get('final_loss'), '7.3f')} "
                     f"{_fmt(s.get('eval_loss'), '7.3f')} {_fmt(s.get('excess_loss'), '7.3f')} {_fmt(s.get('learned_fraction'), '7.0%')}"
                     f"  {(s.get('diagnosis') or {}).get('kind', '-'):<23} {status}")
    optimal = {s["optimal_loss"] for s in rows if s.get("optimal_loss") is not None}
    unigram = {round(s["unigram_loss"], 3) for s in rows if s.get("unigram_loss") is not None}
    if len(optimal) == 1 and len(unigram) == 1:
        lines.append(f"optimal loss {optimal.pop():.3f}, unigram (token frequencies only) {unigram.pop():.3f}; "
                     "learned = share of the gap between them that the run closed")
    return "\n".join([*lines, *unreadable])
