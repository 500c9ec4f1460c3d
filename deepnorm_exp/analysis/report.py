"""`python -m deepnorm_exp.analysis.report runs/<experiment>`: one self-contained `report.html` of a sweep.

Figures are PNGs embedded as data URIs, the style and the table-sorting script are inline: the file opens
offline in any browser, from anywhere, and can be mailed. Reads the local run records only.
Click a column header to sort; `report.html#sort=<column>` (or `#sort=<column>:desc`) opens sorted.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import math
from pathlib import Path
from typing import Optional

import pandas as pd

from .. import records
from .escape import html_text

from . import at_one_lr, comparison_table, load_frontier, load_layer_records, load_runs, load_scalars, plots
from .board import board, board_rows, unranked, whole_cells
from .frontier_law import fit_frontier_law
from .tables import diagnosis_table, shared_value

RUN_COLUMNS = ["run_name", "experiment", "norm", "depth", "seed", "train.lr", "status", "trained", "diagnosis.kind", "final_loss",
               "eval_loss", "excess_loss", "unigram_loss", "learned_fraction", "diverged_at_step", "steps_completed",
               "params", "wall_s"]

FIGURES = [  # (title, what the paper found and how to read the figure)
    ("Loss vs depth", "DeepNet: Post-LN becomes unstable as depth grows; Pre-LN trains at every depth but ends "
     "worse than a Post-LN that trains; DeepNorm trains at every depth with Post-LN-like quality. Lower is better; "
     "an x marks a depth where seeds diverged."),
    ("Stability map", "Each run at its depth and learning rate. The paper's claim is a wider stable region for "
     "DeepNorm: its largest stable learning rate should fall least with depth."),
    ("Stability frontier across depth", "The largest stable learning rate per cell (bars: the bisection's bracket, "
     "seeds side by side) against depth, log-log, with the fitted law per scheme and its slope's 95% interval. "
     "If the paper's argument holds, Post-LN's frontier falls with depth and DeepNorm's stays nearly flat."),
    ("Model update", "Figures 4-5 of the paper: Post-LN's model update ||F(x,θt) − F(x,θ0)|| explodes in the first "
     "steps, then almost stops; DeepNorm's stays bounded (of the order of the learning rate) whatever the depth."),
    ("LayerNorm input norm", "The paper's argument: a large ||x|| entering a LayerNorm shrinks the gradient through "
     "it (||∂LN/∂x|| = O(sqrt(d)/||x||)). 1 is ||x|| = sqrt(d); DeepNorm multiplies x by alpha by design."),
    ("Per-layer gradient norm", "Post-LN: the gradient through its LayerNorms vanishes, bottom layers get far less "
     "than top ones; Pre-LN: bottom layers get more than top ones; DeepNorm: close to flat."),
    ("Per-layer update ratio", "||Δθ|| / ||θ|| per layer at the last per-layer step: how much each layer moves."),
    ("Training curves", "Loss of every run; an x marks where a run diverged."),
]

PER_RUN_FIGURES = ("Model update", "LayerNorm input norm", "Per-layer gradient norm", "Per-layer update ratio",
                   "Training curves")

SCRIPT = """
window.addEventListener('error', function (e) {
  document.body.dataset.errors = (document.body.dataset.errors || '') + e.message + '; ';
});
function cellKey(row, col) {
  var cell = row.cells[col], raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent;
  var n = parseFloat(raw);
  return raw !== '' && !isNaN(n) && isFinite(raw) ? n : raw;
}
function sortTable(table, col, descending) {
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  rows.sort(function (a, b) {
    var x = cellKey(a, col), y = cellKey(b, col), c;
    if (x === '' || y === '') { c = (x === '') - (y === ''); return c; }  // blanks last either way
    c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
    return descending ? -c : c;
  });
  rows.forEach(function (r) { body.appendChild(r); });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
    th.dataset.order = i === col ? (descending ? 'desc' : 'asc') : '';
  });
}
document.querySelectorAll('table.sortable').forEach(function (table) {
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    th.addEventListener('click', function () { sortTable(table, col, th.dataset.order === 'asc'); });
  });
});
var wanted = /#sort=([^:&]+)(:desc)?/.exec(decodeURIComponent(location.hash));
if (wanted) {
  document.querySelectorAll('table.sortable').forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      if (th.dataset.key === wanted[1]) { sortTable(table, col, !!wanted[2]); }
    });
  });
}
document.body.dataset.ready = '1';
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; cursor: pointer; } td:first-child, th:first-child { text-align: left; }
th[data-order=asc]::after { content: ' ▲'; } th[data-order=desc]::after { content: ' ▼'; }
tr.diverged td { background: #fde8e8; } tr.failed td { background: #eee; color: #777; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #444; max-width: 70em; }
"""


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td data-value=""></td>'
    if isinstance(value, float):  # numpy floats too; the full value sorts, 4 digits show
        return f'<td data-value="{float(value)!r}">{value:.4g}</td>'
    return f"<td>{html_text(str(value))}</td>"


def runs_table(runs: pd.DataFrame) -> str:
    columns = [c for c in RUN_COLUMNS if c in runs]
    head = "".join(f'<th data-key="{html_text(c)}">{html_text(c)}</th>' for c in columns)
    body = []
    for _, run in runs.sort_values(["norm", "depth", "seed"]).iterrows():
        status = str(run.get("status", ""))
        body.append(f'<tr class="{html_text(status)}">' + "".join(_cell(run[c]) for c in columns) + "</tr>")
    return f'<table class="sortable" id="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def diagnosis_panels(runs: pd.DataFrame) -> str:
    """One folded panel per run that ended: its diagnosis, the evidence, the other findings, what was not measured."""
    if "diagnosis.kind" not in runs:
        return ""
    panels = []
    for _, run in runs.dropna(subset=["diagnosis.kind"]).sort_values(["norm", "depth", "seed"]).iterrows():
        lines = [f"<li>{html_text(run['diagnosis.kind'])} at step {int(run['diagnosis.step'])}: "
                 f"{html_text(str(run['diagnosis.evidence']))}</li>"]
        lines += [f"<li>also {html_text(f['kind'])} at step {f['step']}: {html_text(f['evidence'])}</li>"
                  for f in run.get("diagnosis.also") or []]
        if len(run.get("diagnosis.not_measured") or []):
            lines.append(f"<li>not measured: {html_text(', '.join(run['diagnosis.not_measured']))}</li>")
        panels.append(f"<details><summary>{html_text(run['run_name'])}: {html_text(run['diagnosis.kind'])}"
                      f"</summary><ul>{''.join(lines)}</ul></details>")
    return "".join(panels)


def frame_table(frame: pd.DataFrame, index: bool = True, table_id: str = "") -> str:
    return frame.to_html(index=index, border=0, classes="sortable", table_id=table_id or None, na_rep="",
                         float_format=lambda v: f"{v:.4g}")


def _figure(title: str, caption: str, fig) -> str:
    png = base64.b64encode(plots.figure_png(fig)).decode()
    return (f'<figure><h2>{html_text(title)}</h2><img alt="{html_text(title)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{html_text(caption)}</figcaption></figure>")


def build_report(root: str | Path) -> str:
    root = Path(root)
    runs = load_runs(root)
    if runs.empty:
        restore = (f"; its published records are there: `python -m deepnorm_exp.analysis.published --restore {root}` "
                   "unpacks them" if (root / "published").is_dir() else "")
        raise SystemExit(f"deepnorm_exp.analysis.report: no runs (no */summary.json) under {root}{restore}")
    frontier = load_frontier(root)
    # a bisection's probes are no grid: each cell tried its own rates
    sections = [*_summary_section(root, runs), *(_board_section(runs, root) if frontier.empty else []), *_frontier_section(frontier),
                *_figure_sections(runs, frontier),
                "<h2>Runs</h2>", "<p>Click a header to sort.</p>", runs_table(runs), *_diagnosis_section(runs)]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>deepnorm_exp: '
            f"{html_text(root.name)}</title><style>{STYLE}</style></head><body>{''.join(sections)}"
            f"<script>{SCRIPT}</script></body></html>")


def _summary_section(root: Path, runs: pd.DataFrame) -> list[str]:
    """The title, what the runs are, and the eval loss by norm and depth."""
    counts = runs["status"].value_counts().to_dict()
    sections = [
        f"<h1>deepnorm_exp report: {html_text(root.name)}</h1>",
        f'<p class="meta">{html_text(str(root.resolve()))} · {len(runs)} runs '
        f"({html_text(', '.join(f'{v} {k}' for k, v in counts.items()))}) · written "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>",
        "<h2>Eval loss by norm and depth</h2>",
        "<p>Mean ± standard deviation over the seeds that did not diverge; learned nothing = unigram loss "
        f"{shared_value(runs, 'unigram_loss')}, optimal {shared_value(runs, 'optimal_loss')}.</p>",
        frame_table(comparison_table(runs), table_id="comparison"),
    ]
    unfinished = int(runs["status"].isin(("running", "unfinished")).sum())
    if unfinished:
        sections.insert(2, f'<p class="meta"><strong>{unfinished} run(s) running or unfinished</strong>: their rows and '
                           "curves are what they recorded so far; the tables of final losses leave them out.</p>")
    return sections


def _board_section(runs: pd.DataFrame, root: Path) -> list[str]:
    """Where the runs hold a grid of rates (of one battery, each run to its end: board.unranked): each scheme at
    its own best rate per depth, ranked within the seeds' noise by the board's rules (board.py;
    experiment=board, a scorecard's runs, a learning-rate study), from the cells whose grid has ended."""
    whole = whole_cells(runs, root) if "train.lr" in runs else runs.iloc[:0]
    if whole.empty or unranked(runs, whole):
        return []
    table = board(whole, load_layer_records(at_one_lr(whole)[0]))
    if table.empty:
        return []
    sections = ["<h2>Each scheme at its own best rate</h2>",
                "<p>Ranked per depth by the final eval loss at the best rate of the grid (capped at the loss at "
                "initialisation); a scheme ranks above another only beyond two standard errors of the difference, "
                "the seeds' spread pooled over the depth's trained cells (deepnorm_exp/analysis/board.py).</p>"]
    for depth in sorted(table["depth"].unique()):
        sections += [f"<h3>Depth {int(depth)}</h3>",
                     frame_table(board_rows(table, int(depth)), index=False, table_id=f"board-L{int(depth)}")]
    return sections


def _frontier_section(frontier: pd.DataFrame) -> list[str]:
    """The frontier sweeper's brackets and the frontier law fitted to them (nothing without a frontier)."""
    if not len(frontier):
        return []
    columns = [c for c in ("norm", "depth", "max_stable_lr", "min_unstable_lr", "runs", "runs_spent", "grid_runs")
               if c in frontier]
    sections = ["<h2>Stability frontier</h2>", frame_table(frontier[columns], index=False, table_id="frontier")]
    if {"norm", "depth"} <= set(frontier):
        law = fit_frontier_law(frontier)
        law["depths"] = law["depths"].map(lambda ds: ", ".join(map(str, ds)))
        sections += ["<p>The frontier law, per scheme: log(max stable lr) = intercept + slope log(depth), "
                     "least squares through each cell's bracket midpoint; the interval is the central 95% "
                     "over draws that place every cell's frontier inside its bracket and resample the "
                     "seeds (open brackets are censored: left out, counted).</p>",
                     frame_table(law, index=False, table_id="frontier-law")]
    return sections


def _figure_sections(runs: pd.DataFrame, frontier: pd.DataFrame) -> list[str]:
    """Every figure the runs can draw, in FIGURES' order."""
    lr_axis = "train.lr" in runs and runs["train.lr"].nunique() > 1
    one_lr, lr = at_one_lr(runs)  # curves and profiles average seeds: never across learning rates
    scalars, layers = load_scalars(one_lr), load_layer_records(one_lr)
    figures = {
        "Loss vs depth": plots.depth_stability(runs),
        "Stability map": plots.stability_map(runs, frontier) if lr_axis or len(frontier) else None,
        "Stability frontier across depth": plots.frontier_law(frontier) if len(frontier) else None,
        "Model update": plots.model_update(scalars),
        "LayerNorm input norm": plots.ln_input_norm(layers, one_lr),
        "Per-layer gradient norm": plots.layer_profile(layers, "grad_norm"),
        "Per-layer update ratio": plots.layer_profile(layers, "update_ratio"),
        "Training curves": plots.training_curves(scalars, one_lr),
    }
    sections = []
    for title, caption in FIGURES:
        if figures.get(title) is not None:
            if lr is not None and title in PER_RUN_FIGURES:
                caption += f" Runs at lr {lr:g} only (the most common of the sweep's {runs['train.lr'].nunique()})."
            sections.append(_figure(title, caption, figures[title]))
    return sections


def _diagnosis_section(runs: pd.DataFrame) -> list[str]:
    """Why each run ended as it did (nothing when no run has a diagnosis)."""
    if (diagnoses := diagnosis_table(runs)).empty:
        return []
    return ["<h2>Diagnosis</h2>", "<p>Why each run ended as it did, from its records (docs/stability.md: the "
            "diagnosis of a run); each run's evidence below.</p>", frame_table(diagnoses, table_id="diagnosis"),
            diagnosis_panels(runs)]


def write_report(root: str | Path, out: Optional[str | Path] = None) -> Path:
    path = Path(out) if out else Path(root) / "report.html"
    records.write_text(path, build_report(root))  # atomic: a link there is replaced, never written through
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="runs/<experiment> (or any directory above run directories)")
    parser.add_argument("--out", help="where to write (default: <root>/report.html)")
    args = parser.parse_args()
    print(f"report: {write_report(args.root, args.out).resolve()}")


if __name__ == "__main__":
    main()
