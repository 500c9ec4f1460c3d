"""What every study's section of the results page is built from: a `Study` (its preset, title, the section
it writes and the README block it keeps, if any), the `Page` it writes into, and the Markdown tables it writes
(every cell escaped: the records are read as untrusted input)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import pandas as pd

from .. import records
from . import plots
from .escape import md_text
from .runs import outcomes
from .tables import diagnosis_table, not_measured

if TYPE_CHECKING:  # the type only: evidence.py's loaders are not the page's to import
    from .evidence import Evidence

FIGURE_DIR = "results"  # beside results.md
DPI = 72  # small files: the page is read on GitHub, the full-size figures are in report.html


class Page:
    """Markdown lines and the figures written beside them."""

    def __init__(self, out: Path):
        self.out, self.lines, self.figures = out, [], set()
        (out / FIGURE_DIR).mkdir(parents=True, exist_ok=True)

    def add(self, *blocks: str) -> None:
        """Paragraphs, tables, headings: each its own block (a table must not touch a paragraph)."""
        for block in blocks:
            self.lines += [block, ""]

    def figure(self, name: str, fig, caption: str) -> None:
        path = self.out / FIGURE_DIR / f"{name}.png"
        records.write_bytes(path, plots.figure_png(fig, dpi=DPI))  # a pyplot-free Figure: nothing to close
        self.figures.add(path.name)
        self.add(f"![{caption}]({FIGURE_DIR}/{path.name})\n*{caption}*")


Section = Callable[[Page, "Evidence", str], None]  # (page, evidence, the study's name): its tables and figures
Block = Callable[["Evidence", str], Optional[str]]  # a README block's text, or None while it must wait
# the study's own tables for its W&B dashboard (dashboard.py), beside every study's: {key: frame}; a frame
# whose attrs["chart"] is (x, y, title) is drawn as a line per scheme
Tables = Callable[["Evidence", str], dict[str, pd.DataFrame]]


@dataclass(frozen=True)
class Study:
    """A preset of conf/experiment/ as the page shows it: `section` writes what its records say, and `block`,
    where the study has one, the README's or the manual's block named `block_name`; `dashboard`, its own
    tables on its W&B dashboard."""

    name: str  # conf/experiment/<name>.yaml and runs/<name>/
    title: str
    about: str
    section: Section
    block_name: str = ""
    block: Optional[Block] = None
    dashboard: Optional[Tables] = None

    @property
    def command(self) -> str:
        return f"python -m deepnorm_exp -m experiment={self.name}"


def charted(frame: pd.DataFrame, x: str, y: str, title: str) -> pd.DataFrame:
    """`frame` (norm, x, y) with its non-finite points left out, marked to be drawn as a line per scheme."""
    frame = frame[pd.to_numeric(frame[y], errors="coerce").map(math.isfinite)].reset_index(drop=True)
    frame.attrs["chart"] = (x, y, title)
    return frame


def markdown_table(frame: pd.DataFrame, index: bool = True, markdown: tuple[str, ...] = ()) -> str:
    """`frame` as a Markdown table; every header and cell is escaped (escape.py) but for the columns named in
    `markdown`, which the code composed as Markdown from escaped parts."""
    frame = frame.reset_index() if index else frame
    trusted = [column in markdown for column in frame.columns]
    lines = ["| " + " | ".join(map(_cell, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(map(_cell, row, trusted)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _cell(value, markdown: bool = False) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if markdown:
        return str(value).replace("|", "\\|")  # the table's own syntax, even in composed Markdown
    return f"{value:.4g}" if isinstance(value, float) else md_text(value)


def by_depth(table: pd.DataFrame) -> pd.DataFrame:
    """A norm x depth table with its depth columns named L6, L18, ... (other columns as they are)."""
    return table.rename(columns=lambda c: f"L{c}" if isinstance(c, (int, np.integer)) else c)


def diagnoses(page: Page, runs: pd.DataFrame, scope: str = "") -> None:
    """The diagnosis table of a study's runs (none where no run has ended)."""
    table = diagnosis_table(runs)
    if not table.empty:
        page.add(f"Why each run ended as it did{' (' + scope + ')' if scope else ''}: how many runs got each "
                 "diagnosis, from their records by the rules of [the diagnosis](stability.md#the-diagnosis-of-a-run):",
                 markdown_table(table) + unmeasured_note(runs))


def unmeasured_note(runs: pd.DataFrame) -> str:
    """What the diagnoses of `runs` could not read, said beneath their labels ("" where they read everything):
    a label depends on the instruments a study had on."""
    counts, ended = not_measured(runs), len(outcomes(runs))
    if not counts:
        return ""
    names = ", ".join(f"`{md_text(name)}`" + ("" if n == ended else f" ({n} of {ended} runs)")
                      for name, n in counts.items())
    return ("\n\nNot measured (instruments off), so the rules that read them did not run: " + names + ". A run that "
            "did not train then reads `stuck_on_plateau` or `still_learning` where, with the instruments on, a rule "
            "may name what came first (a collapse at initialisation, say).")


def single_rate_label(runs: pd.DataFrame) -> str:
    return (f"**Every scheme at one learning rate** ({one_rate(runs)}): a second view, whose order between schemes "
            "may owe to the rate; the comparison at each scheme's own best rate is the board's (every scheme) and the "
            "learning-rate study's (Post-LN, Pre-LN, DeepNorm).")


def one_rate(runs: pd.DataFrame) -> str:
    """"lr 0.0005": the rate every run shares (as at_one_lr leaves them), or "lr unknown"."""
    rates = pd.to_numeric(runs.get("train.lr", pd.Series(dtype=float)), errors="coerce").dropna().unique()
    return f"lr {rates[0]:g}" if len(rates) == 1 else "lr unknown"

