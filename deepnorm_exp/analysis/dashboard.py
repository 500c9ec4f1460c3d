"""A study's comparison where researchers look: one study-level W&B run (offline by default; `wandb sync`
uploads it) beside the study's training runs, grouped with them (`group`: the study) and tagged `study`, holding
the study's tables and the charts W&B's run charts cannot draw, a config value on the x-axis (wandb/wandb issue
4658).

    python -m deepnorm_exp.analysis.dashboard runs/board runs/steps_to_train   # one run each, under runs/<study>/wandb/
    python -m deepnorm_exp.analysis.dashboard --all runs                     # every study with records

Every study gets its runs (one row each), its diagnoses, and either the loss against the rate per depth (a study
with a grid of rates) or its comparison and the loss against depth (one rate, two depths or more), unless its
runs are a bisection's probes, stop once trained (`train.stop_when_trained`: their last losses are no final
ones) or are of more than one battery; a study adds its own tables by its
`Study.dashboard` (the board per depth, the frontier, steps-to-train). A frame's `attrs["chart"]`, (x, y, title),
draws it as a line per scheme. Every value comes from the study's records (its published records where it has
them), read as untrusted: text columns are written as text, number columns as numbers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from .board import mixed_battery, stops_once_trained
from .evidence import Evidence
from .page import charted
from .lr_study import LR, lr_curves
from .runs import is_missing, outcomes
from .studies import STUDIES
from .tables import comparison_table, diagnosis_table

RUN_COLUMNS = ["run_name", "norm", "depth", "model.encoder_depth", LR, "seed", "status", "trained", "trained_at_step",
               "initial_eval_loss", "eval_loss", "steps", "diagnosis.kind"]
AXIS_PREFIXES = ("model.", "data.", "train.")  # a scheme's own settings vary with it: the norm column says them


def sweep_axes(runs: pd.DataFrame) -> list[str]:
    """The settings the study's runs differ in beyond RUN_COLUMNS (a mitigation's keys, a grid's): each run's
    cell, as the runs table shows it."""
    return [c for c in runs.columns if str(c).startswith(AXIS_PREFIXES) and c not in RUN_COLUMNS
            and runs[c].map(repr).nunique() > 1]


def every_study_tables(runs: pd.DataFrame, bisection: bool = False) -> dict[str, pd.DataFrame]:
    """What every study shows: its runs and diagnoses, and the loss against rate (a grid of rates) or its
    comparison and the loss against depth (one rate); neither for a bisection's probes (`bisection`: each cell
    tried its own rates), runs that stop once trained, or runs of more than one battery."""
    out = {"runs": runs[[c for c in RUN_COLUMNS if c in runs] + sweep_axes(runs)].reset_index(drop=True)}
    diagnoses = diagnosis_table(runs)
    if not diagnoses.empty:
        out["diagnoses"] = diagnoses.reset_index()
    if bisection or stops_once_trained(runs) or mixed_battery(runs):
        return out  # no grid; no final losses (a run stopped once trained); or other protocols pooled
    rates = pd.to_numeric(runs[LR], errors="coerce").dropna().unique() if LR in runs else []
    if len(rates) > 1:
        curves = lr_curves(runs)
        for depth in sorted(curves["depth"].unique()):
            curve = curves[curves["depth"] == depth][["norm", "lr", "mean"]].rename(columns={"mean": "loss"})
            out[f"loss_vs_lr/L{depth}"] = charted(curve, "lr", "loss", f"final eval loss (capped) against rate, L{depth}")
        return out
    out["comparison"] = comparison_table(runs, untrained=True).reset_index()
    completed = outcomes(runs)
    completed = completed[completed["status"].eq("completed")]
    if completed["depth"].nunique() > 1:
        loss = (completed.assign(eval_loss=pd.to_numeric(completed["eval_loss"], errors="coerce"),
                                 depth=completed["depth"].astype(int))
                .groupby(["norm", "depth"], as_index=False)["eval_loss"].mean())
        out["loss_vs_depth"] = charted(loss, "depth", "eval_loss", "final eval loss against depth (mean over seeds)")
    return out


def study_tables(evidence: Evidence, study: str) -> dict[str, pd.DataFrame]:
    """{key: table} of runs/<study>: every study's tables and the study's own ({} where no run has ended)."""
    runs = evidence.runs(study)
    if runs.empty or outcomes(runs).empty:
        return {}
    tables = every_study_tables(runs, bisection=not evidence.frontier(study).empty)
    for known in STUDIES:
        if known.name == study and known.dashboard is not None:
            tables.update(known.dashboard(evidence, study))
    return tables


def wandb_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns W&B's table accepts whatever the records hold: numbers as floats, anything else as text (a
    column of mixed types is refused by its type check)."""
    out = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        values = frame[column]
        numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
        out[str(column)] = values.astype(float) if numeric else values.map(lambda v: "" if is_missing(v) else str(v))
    return out


def log_study(root: str | Path, project: str = "deepnorm_exp", mode: str = "offline") -> Path:
    """The study-level run of runs/<study> (`root`), written under root/wandb/; returns its run directory."""
    import wandb

    root = Path(root)
    study = root.name
    tables = study_tables(Evidence(root.parent), study)
    if not tables:
        raise SystemExit(f"deepnorm_exp.analysis.dashboard: no ended run of {study} under {root}")
    run = wandb.init(project=project, mode=mode, dir=str(root), name=f"{study} (study)", group=study,
                     job_type="study", tags=["study", f"study:{study}"], config={"study": study},
                     reinit="finish_previous", settings=wandb.Settings(console="off", silent=True))
    logged = {}
    for key, frame in tables.items():
        table = wandb.Table(dataframe=wandb_frame(frame))
        logged[key] = table
        if "chart" in frame.attrs:
            x, y, title = frame.attrs["chart"]
            logged[key + "/chart"] = wandb.plot.line(table, x, y, stroke="norm", title=title)
    run.log(logged)
    directory = Path(run.dir).parent
    run.finish()
    return directory


def study_roots(runs_root: Path) -> list[Path]:
    """runs/<study> of every study whose records are there, in the page's order."""
    evidence = Evidence(runs_root)
    return [runs_root / s.name for s in STUDIES if not evidence.runs(s.name).empty]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deepnorm_exp.analysis.dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", help="runs/<study>, e.g. runs/board")
    parser.add_argument("--all", metavar="RUNS", help="every study with records under RUNS, e.g. runs")
    parser.add_argument("--mode", default="offline", choices=("offline", "online"))
    args = parser.parse_args(argv)
    roots = [Path(r) for r in args.roots] + (study_roots(Path(args.all)) if args.all else [])
    if not roots:
        parser.error("name runs/<study> or --all runs")
    for root in roots:
        if args.all and not study_tables(Evidence(root.parent), root.name):
            print(f"dashboard: {root}: no run has ended yet, skipped")  # a sweep under way must not stop the rest
            continue
        print(f"dashboard: {log_study(root, mode=args.mode)} (wandb sync uploads it)")


if __name__ == "__main__":
    main()
