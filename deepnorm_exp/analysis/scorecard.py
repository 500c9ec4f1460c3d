"""The scorecard: one scheme, built-in or new, run under the board's battery and ranked among the board's rows
by the board's rules (board.py), read from the board's records: nothing of the board runs again.

    python -m deepnorm_exp -m experiment=scorecard norm=<name>     # runs it, then prints its rows
    python -m deepnorm_exp.analysis.scorecard runs                 # prints them again from the records
    python -m deepnorm_exp -m experiment=scorecard_full norm=<name>  # the full battery, beside board_full's rows

A scheme the board already has is scored under its own name plus " (scorecard)". A scheme whose scorecard
battery is not the board's (another setting, grid, seeds or depths) is not ranked: the differences are printed
instead, and the other schemes scored are ranked. The seeds' spread is pooled over the board's cells and the
scorecard's together, so the board's own rows may rank a little differently here than on its page.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from .board import battery_differences, board, board_rows, unranked, waiting_cells, whole_cells
from .evidence import Evidence
from .runs import load_layer_records, load_runs
from ..sweeps.hydra_callbacks import ComparisonTable

BOARD, SCORECARD = "board", "scorecard"
MARK = " (scorecard)"


def scored(board_runs: pd.DataFrame, candidate: pd.DataFrame) -> pd.DataFrame:
    """The candidate's runs named apart from the board's where the board has the scheme too."""
    taken = set(board_runs["norm"]) if "norm" in board_runs else set()
    return candidate.assign(norm=[n + MARK if n in taken else n for n in candidate["norm"]])


def scorecard_text(root: str | Path, scorecard: str = SCORECARD, board_name: str = BOARD) -> str:
    """The scorecard of every scheme under <root>/<scorecard>/, per depth beside the board under
    <root>/<board_name>/ (or alone, where the board has no records yet), as Markdown tables."""
    root = Path(root)
    candidate = load_runs(root / scorecard) if (root / scorecard).is_dir() else pd.DataFrame()
    if candidate.empty:
        return f"No scorecard runs under {root / scorecard}: python -m deepnorm_exp -m experiment={scorecard} norm=<name>"
    evidence = Evidence(root)
    board_runs = evidence.runs(board_name)
    board_whole = whole_cells(board_runs, evidence.study_dir(board_name))
    waiting = waiting_cells(candidate, root / scorecard)
    candidate = whole_cells(candidate, root / scorecard)
    lines = []
    if board_whole.empty:
        lines.append(f"No board row has ended under {root / board_name} (python -m deepnorm_exp -m "
                     f"experiment={board_name}): the scorecard's rows alone.")
    elif unranked(board_runs, board_whole):
        return f"Not ranked: the board's records are no board: {unranked(board_runs, board_whole)}."
    else:  # each scheme apart: one scored at another battery leaves the others ranked
        refused = {norm: battery_differences(board_whole, runs) for norm, runs in candidate.groupby("norm")}
        refused = {norm: differences for norm, differences in refused.items() if differences}
        lines += [f"Not ranked: {norm}'s battery is not the board's ({'; '.join(differences)})."
                  for norm, differences in sorted(refused.items())]
        candidate = candidate[~candidate["norm"].isin(refused)]
    lines += [f"Not ranked until its grid has ended: {norm} at depth {depth} ({ended} of {grid} runs ended)."
              for (norm, depth), (ended, _, grid) in sorted(waiting.items())]
    if candidate.empty:
        return "\n".join(lines + ([] if lines else ["No scorecard run has ended yet."]))
    candidate = scored(board_whole, candidate)
    names = set(candidate["norm"])
    runs = pd.concat([board_whole, candidate], ignore_index=True)
    layers = pd.concat([evidence.layers(board_name), load_layer_records(candidate)], ignore_index=True)
    table = board(runs, layers)
    from .page import markdown_table

    for depth in sorted(table["depth"].unique()):
        rows = board_rows(table, int(depth))
        rows["norm"] = ["→ " + n if n in names else n for n in rows["norm"]]
        ranks = table[(table["depth"] == depth) & table["norm"].isin(names)]
        placed = ", ".join(f"{r.norm} rank {r.rank} of {int((table['depth'] == depth).sum())}" for r in ranks.itertuples())
        lines += ["", f"Depth {depth}: {placed or 'no scorecard row has ended here'}", markdown_table(rows, index=False)]
    return "\n".join(lines).strip()


class Scorecard(ComparisonTable):
    """experiment=scorecard's comparison table: its runs' table, then its rows beside those of `board` (the
    board's experiment name: board, or board_full for the full battery), last."""

    def __init__(self, board: str = BOARD) -> None:
        self.board = board

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        super().on_multirun_end(config, **kwargs)
        print("\n" + scorecard_text(config.paths.runs, config.experiment_name, self.board), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deepnorm_exp.analysis.scorecard", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", default="runs", help="the runs root holding board/ and scorecard/")
    parser.add_argument("--scorecard", default=SCORECARD, help="the scorecard's experiment name (scorecard_full: the "
                        "full battery)")
    parser.add_argument("--board", default=BOARD, help="the board's experiment name (board_full: the full battery)")
    args = parser.parse_args(argv)
    print(scorecard_text(args.runs, args.scorecard, args.board))


if __name__ == "__main__":
    main()
