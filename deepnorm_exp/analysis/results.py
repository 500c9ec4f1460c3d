"""`make results` (`python -m deepnorm_exp.analysis.results runs --out docs`): the results page.

Writes `docs/results.md` and its figures (small PNGs in `docs/results/`) from the run records under `runs/`,
one section per study (a preset of `conf/experiment/`), and the paper's claims judged by `claims.py`. A study
that has not run says so and gives its command. Nothing on the page is typed in: every number is read from
the records by this module, and `--readme README.md` rewrites the README's generated blocks (between
`<!-- results:NAME -->` and `<!-- /results:NAME -->`) from the same records, leaving a block whose study has
no runs, or (for a study's table) whose sweep has not finished, as it is.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd

from . import comparison_table, plots
from .tables import shared_value
from .claims import NOT_RUN, Evidence, judge
from .frontier_law import bracket_table, brackets_so_far
from .timing import preset_time
from ..lifecycle.summary import format_table, load_summaries

FIGURE_DIR = "results"  # beside results.md
DPI = 72  # small files: the page is read on GitHub, the full-size figures are in report.html


@dataclass(frozen=True)
class Study:
    name: str  # conf/experiment/<name>.yaml and runs/<name>/
    title: str
    about: str

    @property
    def command(self) -> str:
        return f"python -m deepnorm_exp -m experiment={self.name}"


STUDIES = [
    Study("paper_depth_sweep", "Depth sweep, decoder-only",
          "Post-LN, Pre-LN and DeepNorm at depths 6-200, three seeds, the paper's optimizer scaled down "
          "(conf/experiment/paper_depth_sweep.yaml)."),
    Study("paper_depth_sweep_encdec", "Depth sweep, encoder-decoder",
          "The same on N-N encoder-decoder models and the synthetic translation task, N = 6-100."),
    Study("frontier_depth", "Stability frontier across depth",
          "Per scheme, depth and seed, the largest learning rate that trains, found by bisection "
          "(hydra/sweeper=frontier), and the law log(max lr) = a + b log(depth) fitted per scheme."),
    Study("model_update", "Model update, LayerNorm inputs and per-layer gradients (the paper's figures 3-5)",
          "The first 100 steps at depths 6 to 1,000, every scalar every step, per-layer vectors every 10."),
    Study("quickstart", "Quick start", "`make run`: three schemes at depths 6 and 48, one seed."),
    Study("zoo_depth_sweep", "The zoo", "Every scheme at depths 6, 24 and 100, one seed, the quick start's training."),
]


def markdown_table(frame: pd.DataFrame, index: bool = True) -> str:
    frame = frame.reset_index() if index else frame
    cell = lambda v: "" if v is None or (isinstance(v, float) and pd.isna(v)) else (  # noqa: E731
        f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "\\|"))
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


class Page:
    """Markdown lines and the figures written beside them."""

    def __init__(self, out: Path):
        self.out, self.lines = out, []
        (out / FIGURE_DIR).mkdir(parents=True, exist_ok=True)

    def add(self, *blocks: str) -> None:
        """Paragraphs, tables, headings: each its own block (a table must not touch a paragraph)."""
        for block in blocks:
            self.lines += [block, ""]

    def figure(self, name: str, fig, caption: str) -> None:
        path = self.out / FIGURE_DIR / f"{name}.png"
        path.write_bytes(plots.figure_png(fig, dpi=DPI))  # a pyplot-free Figure: nothing to close
        self.add(f"![{caption}]({FIGURE_DIR}/{path.name})\n*{caption}*")


def sweeper_setting(study: Path, key: str, default):
    """A setting of the sweeper that ran `study`, from the multirun.yaml Hydra leaves in the sweep directory."""
    from omegaconf import OmegaConf

    path = study / "multirun.yaml"
    if not path.exists():
        return default
    return OmegaConf.select(OmegaConf.load(path), f"hydra.sweeper.{key}", default=default)


def _sections(evidence: Evidence) -> dict[str, Callable[[Page], None]]:
    def depth_sweep(name: str) -> Callable[[Page], None]:
        def write(page: Page) -> None:
            runs = evidence.at_one_lr(name)  # a preset's runs share one; a stray probe at another is not averaged in
            page.add("Eval loss, mean ± std over the seeds that completed; (k/n diverged), (k/n untrained: "
                     "completed without learning 10% of the gap from the unigram to the optimal loss), (k/n failed "
                     "or unfinished: stopped, running or crashed, left out).",
                     markdown_table(comparison_table(runs, untrained=True)))
            page.figure(f"{name}_depth_stability", plots.depth_stability(runs),
                        "Loss against depth per scheme (x: a depth where seeds diverged).")
        return write

    def frontier(page: Page) -> None:
        cells = evidence.frontier("frontier_depth")
        if cells.empty:
            # the study's own line above already says whether the sweep has finished
            page.add("No `frontier.json` yet: it, and the law, come when every cell is settled.")
            runs = evidence.runs("frontier_depth")
            if not runs.empty:
                stable_if = sweeper_setting(evidence.root / "frontier_depth", "stable_if", "trained")
                page.add(f"The brackets so far, from the {len(runs)} probe runs made (stable: {stable_if}, the "
                         "sweep's `stable_if`; an empty end: no probe on that side yet):",
                         markdown_table(brackets_so_far(runs, stable_if).sort_values(["norm", "depth", "seed"]),
                                        index=False))
            return
        fit = evidence.frontier_law("frontier_depth")
        law = fit.copy()
        law["depths"] = law["depths"].map(lambda ds: ", ".join(map(str, ds)))
        law["censored_depths"] = law["censored_depths"].map(lambda ds: ", ".join(map(str, ds)))
        page.add(frontier_brackets_text(cells))
        page.add("The law per scheme (slope: 95% interval over the brackets and the seeds; censored cells, whose "
                 "frontier lies outside the searched range, are left out of the fit and listed):",
                 markdown_table(law[["norm", "slope", "slope_low", "slope_high", "intercept", "cells", "censored",
                                     "censored_depths", "errors", "depths"]], index=False))
        page.figure("frontier_law", plots.frontier_law(cells, fit),
                    "Largest learning rate that trains against depth (bars: the bisection's bracket).")
        columns = [c for c in ("norm", "depth", "seed", "max_stable_lr", "min_unstable_lr", "runs") if c in cells]
        # frontier.json keeps the overrides' text: "6", not 6
        cells = cells.assign(**{c: cells[c].astype(int) for c in ("depth", "seed") if c in cells})
        sweeps = cells.drop_duplicates("sweep_dir")
        page.add(f"Every cell ({int(sweeps['runs_spent'].sum())} probe runs; a grid at the same resolution "
                 f"would have taken {int(sweeps['grid_runs'].sum())}):",
                 markdown_table(cells[columns].sort_values([c for c in ("norm", "depth", "seed") if c in columns]),
                                index=False))

    def model_update(page: Page) -> None:
        runs = evidence.at_one_lr("model_update")
        page.figure("model_update", plots.model_update(evidence.scalars("model_update")),
                    "||F(x,θt) − F(x,θ0)|| over the first steps, per scheme, one line per depth (figures 4-5).")
        page.figure("ln_input_norm", plots.ln_input_norm(evidence.layers("model_update"), runs),
                    "LayerNorm input ||x|| / sqrt(d) by position in the stack, at the last per-layer step (figure 3).")
        page.figure("layer_grad_norm", plots.layer_profile(evidence.layers("model_update"), "grad_norm"),
                    "Per-layer gradient norm by position in the stack, at the last per-layer step.")

    def one_seed_table(name: str) -> Callable[[Page], None]:
        def write(page: Page) -> None:
            page.add("Eval loss; (1/1 untrained): completed without learning 10% of the gap.",
                     markdown_table(comparison_table(evidence.runs(name), untrained=True)))
        return write

    return {"paper_depth_sweep": depth_sweep("paper_depth_sweep"),
            "paper_depth_sweep_encdec": depth_sweep("paper_depth_sweep_encdec"),
            "frontier_depth": frontier, "model_update": model_update,
            "quickstart": one_seed_table("quickstart"), "zoo_depth_sweep": one_seed_table("zoo_depth_sweep")}


def frontier_brackets_text(cells: pd.DataFrame) -> str:
    return ("Largest learning rate that trains, per scheme and depth: the bisection's bracket (the frontier lies "
            "between; `<`: unstable even at the range's lowest rate; `>`: stable at its highest; seeds that differ "
            "are listed in seed order, `/`-separated):\n\n" + markdown_table(bracket_table(cells)))


def frontier_law_text(fit: pd.DataFrame) -> str:
    """One line per scheme of `fit_frontier_law`'s rows: the slope with its interval, or why there is none."""
    lines = []
    for _, row in fit.iterrows():
        censored = f"; censored at L{', L'.join(map(str, row['censored_depths']))}" if row["censored"] else ""
        if np.isfinite(row["slope"]):
            lines.append(f"- {row['norm']}: slope {row['slope']:.2f}, 95% interval [{row['slope_low']:.2f}, "
                         f"{row['slope_high']:.2f}], from {row['cells']} cells at L{', L'.join(map(str, row['depths']))}"
                         + censored)
        else:
            lines.append(f"- {row['norm']}: no slope (uncensored cells at fewer than two depths{censored})")
    return "\n".join(lines)


def claims_table(evidence: Evidence) -> str:
    rows = [{"the paper": c.paper, "study": f"`{c.study}`", "rule": c.rule, "here": f"**{v.outcome}**",
             "numbers": v.numbers} for c, v in judge(evidence)]
    return markdown_table(pd.DataFrame(rows), index=False)


def times_table(evidence: Evidence, root: Path) -> str:
    rows = []
    for study in STUDIES:
        runs = evidence.runs(study.name)
        time = preset_time(root / study.name, runs).describe() if not runs.empty else "not run yet"
        rows.append({"preset": f"`{study.name}`", "command": f"`{study.command}`", "time here": time})
    return markdown_table(pd.DataFrame(rows), index=False)


def build_results(root: str | Path, out: str | Path, evidence: Optional[Evidence] = None) -> Path:
    """`evidence`: the records of `root` already loaded (main shares them with the README's blocks)."""
    root, out = Path(root), Path(out)
    evidence, page = evidence or Evidence(root), Page(out)
    page.add("# Results", f"Generated by `make results` from the run records under `{root}/` on "
             f"{datetime.date.today().isoformat()}{_commit()}: every number and figure below is read from those "
             "records (`deepnorm_exp/analysis/results.py`). The studies are small versions of the paper's (its "
             "presets in `conf/experiment/` say how small), so each claim is judged at this scale, by the rule "
             "beside it (`deepnorm_exp/analysis/claims.py`).")
    page.add("## The paper's claims", claims_table(evidence))
    page.add("## Presets: commands and times", "Elapsed: the sweeps' wall time on the machine that ran them (the "
             "launcher and its workers follow); run time: the runs' own wall time added up.",
             times_table(evidence, root))
    sections = _sections(evidence)
    for study in STUDIES:
        page.add(f"## {study.title}", f"{study.about} `{study.command}`",
                 f"<!-- study:{study.name} runs={len(evidence.runs(study.name))} -->")
        if evidence.runs(study.name).empty:
            page.add("Not run yet.")
            continue
        if not evidence.finished(study.name):
            page.add(f"**The sweep has not finished** ({len(evidence.runs(study.name))} runs so far; the same command "
                     "continues it): what follows is partial, and the claims it tests wait for the rest.")
        sections[study.name](page)
    path = out / "results.md"
    path.write_text("\n".join(page.lines).rstrip() + "\n", encoding="utf-8")
    return path


STUDY_MARK = re.compile(r"<!-- study:(\w+) runs=(\d+) -->")


def published_runs(page: str) -> dict[str, Optional[int]]:
    """The studies a results page shows runs of, with their run counts (None: a page written before the
    counts were marked, whose section does not say "Not run yet.")."""
    marked = {name: int(n) for name, n in STUDY_MARK.findall(page)}
    if marked:
        return {name: n for name, n in marked.items() if n > 0}
    shown = {}
    for study in STUDIES:
        section = page.partition(f"\n## {study.title}\n")[2].split("\n## ", 1)[0]
        if section and "\nNot run yet." not in section:
            shown[study.name] = None
    return shown


def records_missing(page_path: Path, evidence: Evidence) -> list[str]:
    """What regenerating the page at `page_path` from `evidence` would lose: each study it shows runs of
    for which the records now hold fewer (none, on a fresh clone without the records)."""
    if not page_path.is_file():
        return []
    lost = []
    for name, published in published_runs(page_path.read_text(encoding="utf-8")).items():
        have = len(evidence.runs(name))
        if have == 0 or (published is not None and have < published):
            lost.append(f"{name} ({have} of {published} runs here)" if published is not None else f"{name} (no runs here)")
    return lost


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" (code at commit {sha})" if sha else ""


# -- the README's generated blocks -------------------------------------------------------------------
def readme_blocks(root: Path, evidence: Optional[Evidence] = None, every_study: bool = True) -> dict[str, str]:
    """NAME -> the block's new text, for the studies that have runs: `quickstart` and `zoo` (the table and the
    time, once the sweep has finished), `frontier` (each cell's bracket and the law, once frontier.json is
    written), and, where the records hold every study the page shows (`every_study`), `presets` (every
    preset's command and time here) and `claims` (the verdicts' tally), which summarize them all."""
    evidence, blocks = evidence or Evidence(root), {}
    # A table's block waits for its whole sweep: a sweep in progress would replace it with a few rows.
    if evidence.finished("quickstart"):
        summaries, damaged = load_summaries(root / "quickstart")
        time = preset_time(root / "quickstart", evidence.runs("quickstart")).describe()
        blocks["quickstart"] = f"```\n{format_table(summaries, damaged)}\n```\n\nMeasured: {time}."
    frontier = evidence.frontier("frontier_depth")
    if not frontier.empty:
        runs = evidence.runs("frontier_depth")
        time = preset_time(root / "frontier_depth", runs).describe()
        seeds = frontier["seed"].nunique() if "seed" in frontier else 1
        blocks["frontier"] = (f"**Measured** (`python -m deepnorm_exp -m experiment=frontier_depth`, {seeds} seed"
                              f"{'s' * (seeds > 1)}; {time}). "
                              + frontier_brackets_text(frontier) + "\n\nThe law, log(max stable lr) against "
                              "log(depth):\n\n" + frontier_law_text(evidence.frontier_law("frontier_depth")))
    if evidence.finished("zoo_depth_sweep"):
        blocks["zoo"] = loss_table_block(evidence, root, "zoo_depth_sweep")
    if not every_study:
        return blocks
    if any(not evidence.runs(study.name).empty for study in STUDIES):
        blocks["presets"] = times_table(evidence, root)
    verdicts = judge(evidence)
    if any(v.outcome != NOT_RUN and not c.needs for c, v in verdicts):  # some study here has run
        counts = pd.Series([v.outcome for _, v in verdicts]).value_counts()
        blocks["claims"] = (f"Of the paper's {len(verdicts)} claims checked in [docs/results.md](docs/results.md): "
                            + ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + ".")
    return blocks


def loss_table_block(evidence: Evidence, root: Path, name: str) -> str:
    """A study's norm x depth eval-loss table with what it ran, how long it took and the data's reference
    levels, for a README block."""
    runs = evidence.runs(name)
    steps = ", ".join(str(int(n)) for n in sorted(runs["steps"].dropna().unique()))
    seeds = runs["seed"].nunique()
    time = preset_time(root / name, runs).describe()
    return (f"**Measured** (`python -m deepnorm_exp -m experiment={name}`, {seeds} seed{'s' * (seeds > 1)}; {time}): "
            f"eval loss after {steps} steps (unigram {shared_value(runs, 'unigram_loss')} = learned nothing; "
            f"optimal {shared_value(runs, 'optimal_loss')}); `(k/n untrained)`: completed without learning 10% of "
            "the gap (`trained: false`).\n\n" + markdown_table(comparison_table(runs, untrained=True)))


def update_readme(path: Path, blocks: dict[str, str]) -> list[str]:
    """Replace each `<!-- results:NAME -->...<!-- /results:NAME -->` block that `blocks` has; the names done."""
    text, done = path.read_text(encoding="utf-8"), []
    for name, body in blocks.items():
        # `.*?` may be empty: a block added before its study has run holds nothing between its markers
        pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
        text, n = pattern.subn(lambda m: m.group(1) + body + "\n" + m.group(2), text)
        if n:
            done.append(name)
    path.write_text(text, encoding="utf-8")
    return done


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="deepnorm_exp.analysis.results", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default="runs", help="the directory above the experiments (runs/)")
    parser.add_argument("--out", default="docs", help="where results.md and results/ go (default docs/)")
    parser.add_argument("--readme", help="a README whose generated blocks to rewrite from the same records")
    parser.add_argument("--allow-missing", action="store_true",
                        help="rewrite the page even where the records hold fewer runs of a study than it shows")
    args = parser.parse_args(argv)
    if not Path(args.root).is_dir():
        parser.error(f"{args.root} is not a directory (the runs root: runs/)")
    if args.readme and not Path(args.readme).is_file():
        parser.error(f"--readme {args.readme}: no such file")
    evidence = Evidence(args.root)  # every record read once, for the page and the README alike
    lost = [] if args.allow_missing else records_missing(Path(args.out) / "results.md", evidence)
    if not lost:
        print(f"results: {build_results(args.root, args.out, evidence).resolve()}")
    if args.readme:  # the blocks of the studies here; those that summarize every study wait for the page
        done = update_readme(Path(args.readme), readme_blocks(Path(args.root), evidence, every_study=not lost))
        print(f"{args.readme}: rewrote {', '.join(done) or 'no block (no study it shows has runs)'}")
    if lost:
        parser.exit(2, f"{parser.prog}: error: {Path(args.out) / 'results.md'} shows runs that {args.root}/ does "
                       f"not hold: {'; '.join(lost)}; writing it would replace their results, so it is left as it "
                       "is (and the README's presets and claims blocks). Bring the records back (or run the "
                       "studies), or --allow-missing to write it anyway\n")


if __name__ == "__main__":
    main()
