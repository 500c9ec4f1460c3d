"""A study's comparison where researchers look: one study-level W&B run (offline by default; `wandb sync`
uploads it) beside the study's training runs, grouped with them (`group`: the study) and tagged `study`, holding
the board's tables and the charts W&B's run charts cannot draw, a config value on the x-axis (wandb/wandb issue
4658): final loss against learning rate per depth, one line per scheme, and the frontier against depth.

    python -m deepnorm_exp.analysis.dashboard runs/board      # writes runs/board/wandb/, prints its directory

Every value comes from the study's records (its published records where it has them), read by board.py.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from .board import board, board_rows
from .evidence import Evidence
from .lr_study import lr_curves


def study_tables(evidence: Evidence, study: str) -> dict[str, pd.DataFrame]:
    """{key: table}: the board per depth (`board/L<depth>`), the loss against rate (`loss_vs_lr/L<depth>`: norm,
    lr, mean capped loss) and the frontier against depth (`frontier_vs_depth`: norm, depth, frontier)."""
    runs = evidence.runs(study)
    table = board(runs, evidence.layers(study))
    if table.empty:
        return {}
    curves = lr_curves(runs)
    out = {}
    for depth in sorted(table["depth"].unique()):
        out[f"board/L{depth}"] = board_rows(table, int(depth)).astype(str)
        curve = curves[curves["depth"] == depth][["norm", "lr", "mean"]].rename(columns={"mean": "loss"})
        out[f"loss_vs_lr/L{depth}"] = curve[curve["loss"].map(math.isfinite)].reset_index(drop=True)
    frontier = table[["norm", "depth", "frontier"]]
    out["frontier_vs_depth"] = frontier[frontier["frontier"].map(math.isfinite)].reset_index(drop=True)
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
        table = wandb.Table(dataframe=frame)
        logged[key] = table
        if key.startswith("loss_vs_lr/"):
            logged[key + "/chart"] = wandb.plot.line(table, "lr", "loss", stroke="norm",
                                                     title=f"final eval loss against learning rate, {key.split('/')[1]}")
        elif key == "frontier_vs_depth":
            logged[key + "/chart"] = wandb.plot.line(table, "depth", "frontier", stroke="norm",
                                                     title="largest stable rate of the grid against depth")
    run.log(logged)
    directory = Path(run.dir).parent
    run.finish()
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deepnorm_exp.analysis.dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="runs/<study>, e.g. runs/board")
    parser.add_argument("--mode", default="offline", choices=("offline", "online"))
    args = parser.parse_args(argv)
    print(f"dashboard: {log_study(args.root, mode=args.mode)} (wandb sync uploads it)")


if __name__ == "__main__":
    main()
