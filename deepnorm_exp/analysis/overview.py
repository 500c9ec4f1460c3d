"""The results page's opening, read across every study's records: how to read it (the scale, what "trained"
means), the code that ran each study, the claims' verdicts, and each preset's command and time."""

from __future__ import annotations

import pandas as pd

from .claims import judge
from .escape import md_code, md_text
from .evidence import Evidence
from .page import markdown_table
from .runs import config_by_run, config_column
from .studies import STUDIES
from .timing import preset_time
from ..lifecycle.summary import TRAINED_FRACTION


def records_span(evidence: Evidence) -> str:
    """", made between <first start> and <last finish> (UTC)": read from the records, so that the page
    regenerated later is the same page."""
    times = [t for study in STUDIES for column in ("started_at", "finished_at")
             for t in evidence.runs(study.name).get(column, pd.Series(dtype=object)).dropna()]
    if not times:
        return ""
    first, last = min(times)[:10], max(times)[:10]
    return f", made on {first}" if first == last else f", made from {first} to {last}"


LONG_BUDGET = 1000  # steps: the budgets that let a run train (steps_to_train's 3,000, the real text's 3,000)


def setting_text(evidence: Evidence) -> str:
    """The scale the verdicts are drawn at and what "trained" means, read from the records."""
    studies = [evidence.runs(s.name) for s in STUDIES if not evidence.runs(s.name).empty]
    if not studies:
        return "No study has records yet."
    runs = pd.concat(studies, ignore_index=True)
    widths = sorted({int(w) for w in pd.to_numeric(config_by_run(runs, "model.d_model"), errors="coerce").dropna()})
    devices = sorted(set(runs["device"].dropna().astype(str).str.split(":").str[0])) if "device" in runs else []
    diverged = int((runs["status"] == "diverged").sum())
    untrained = (runs["status"] == "completed") & ~runs["trained"].fillna(False).astype(bool)
    steps = pd.to_numeric(runs.get("steps", pd.Series(index=runs.index, dtype=float)), errors="coerce")
    long = steps >= LONG_BUDGET
    short = steps[untrained & ~long].dropna()  # the untrained runs of short budgets (none recorded: in neither)
    spans = (f" of {int(short.min()):,}" + (f"-{int(short.max()):,}" if short.max() > short.min() else "")
             + " steps") if len(short) else ""
    unknown = int(runs["optimal_loss"].isna().sum()) if "optimal_loss" in runs else 0
    data = (" on the synthetic language, whose optimal loss is known (docs/models-and-data.md)" if not unknown else
            f": {len(runs) - unknown} on the synthetic language, whose optimal loss is known (docs/models-and-data.md), "
            f"{unknown} on real text, whose optimum is not known (there the gap runs down to 0 nats)")
    return (f"**How to read it.** The {len(runs)} runs behind this page are small models (d_model "
            f"{', '.join(map(str, widths))}; {md_text(', '.join(devices)) or 'device not recorded'}){data}. A run "
            f"*trained* when it closed at least {TRAINED_FRACTION:.0%} of the gap from the unigram loss (token "
            "frequencies only) to that optimum; "
            "a scheme that \"fails\" or is \"unstable\" here did not train or diverged: of these runs "
            f"{int(untrained.sum())} completed without training ({int((untrained & long).sum())} of the "
            f"{int(long.sum())} with a budget of {LONG_BUDGET:,} steps or more; the rest are shorter runs{spans}, the "
            "mechanism studies' early windows and the sweeps too short to tell a slow run from a failing one) and "
            f"{diverged} diverged. Each study's width, depths, steps and rate are in its preset (docs/configuration.md, "
            "Presets).")


CODE_COLUMNS = ["study", "runs", "records", "code", "subnormals", "commands"]


def code_table(evidence: Evidence) -> pd.DataFrame:
    """Per study that has runs: the code commits that ran it (from its published records' manifest, each with
    where the commit was read) and how it was run."""
    rows = []
    for study in STUDIES:
        if evidence.runs(study.name).empty:
            continue
        published = evidence.published(study.name)
        manifest = published.manifest if published else {}
        shas = "; ".join(f"{c['commit']} ({c['source']})" for c in manifest.get("commits", [])) or "not recorded"
        rows.append({"study": f"`{study.name}`", "runs": len(evidence.runs(study.name)),
                     "records": f"`runs/{study.name}/published/`" if published else "raw (not published)",
                     "code": shas, "subnormals": subnormals(evidence.runs(study.name)),
                     "commands": "; ".join(map(md_code, manifest.get("commands", [])))})
    return pd.DataFrame(rows, columns=CODE_COLUMNS)


def subnormals(runs: pd.DataFrame) -> str:
    """Whether the runs flushed subnormal floats to zero (`train.flush_denormal`; a config from before the
    key existed did not): it changes only values below 1.2e-38, and deep Post-LN's speed on a CPU."""
    flushed = config_column(runs, "train.flush_denormal").map(lambda v: v is True or v == 1.0)
    return "flushed" if flushed.all() else "kept (before train.flush_denormal)" if not flushed.any() else "mixed"


def claims_table(evidence: Evidence) -> str:
    # the claims' own text, composed in claims.py from numbers and names the records' schema admits
    rows = [{"the paper": c.paper, "where the paper measured it": c.setting, "study": f"`{c.study}`", "rule": c.rule,
             "here": f"**{v.outcome}**", "numbers": v.numbers} for c, v in judge(evidence)]
    return markdown_table(pd.DataFrame(rows), index=False, markdown=(
        "the paper", "where the paper measured it", "study", "rule", "here", "numbers"))


def times_table(evidence: Evidence) -> str:
    rows = []
    for study in STUDIES:
        runs = evidence.runs(study.name)
        time = preset_time(evidence.study_dir(study.name), runs).describe() if not runs.empty else "not run yet"
        rows.append({"preset": f"`{study.name}`", "command": f"`{study.command}`", "budget": budget_rule(runs),
                     "time here": time})
    return markdown_table(pd.DataFrame(rows), index=False, markdown=("preset", "command", "time here"))


def budget_rule(runs: pd.DataFrame) -> str:
    """"300 steps, warm-up 100 = 2 / (1 - beta2)": each run's steps and warm-up as its config says, and
    whether the warm-up is the rule's (Ma and Yarats 2021) or the preset's own."""
    if runs.empty or "train.steps" not in runs:
        return ""
    parts = []
    keys = [k for k in ("train.steps", "train.warmup_steps", "train.betas") if k in runs]
    for values, _ in runs.groupby(runs[keys].astype(str).apply(tuple, axis=1), sort=True):
        steps, warmup, betas = (list(values) + [None] * 3)[:3]
        text = f"{steps} steps"
        if warmup is not None:
            beta2 = float(str(betas).strip("[]").split(",")[-1]) if betas else None
            rule = beta2 is not None and int(warmup) == round(2 / (1 - beta2))
            text += f", warm-up {warmup}" + (" = 2 / (1 - beta2)" if rule else " (the preset's, not the rule's)")
        parts.append(text)
    return "; ".join(parts)
