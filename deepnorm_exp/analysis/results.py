"""`make results` (`python -m deepnorm_exp.analysis.results runs --out docs`): the results page.

Writes `docs/results.md` and its figures (small PNGs in `docs/results/`) from the run records under `runs/`,
one section per study (a preset of `conf/experiment/`), and the paper's claims judged by `claims.py`. A study
that has not run says so and gives its command. Nothing on the page is typed in: every number is read from
the records by this module, and `--blocks README.md docs/*.md` rewrites the generated blocks of those files
(between `<!-- results:NAME -->` and `<!-- /results:NAME -->`: the README's, the manual's) from the same
records. A block whose sweep has not finished is left as it is; one whose study has no records says so, once
the records hold every other study the page shows (else the block is left as it is too).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd

from .. import records
from ..locks import FileLock
from ..rundir import StudyDir
from . import budget, comparison_table, early_window, final_quality, lr_study, mitigations, plots, published, steps_to_train
from .runs import config_by_run, config_column
from .tables import diagnosis_table, shared_value
from .claims import NOT_RUN, Evidence, judge
from .escape import md_code, md_fence, md_text
from .frontier_law import bracket_table, brackets_so_far
from .timing import preset_time
from ..lifecycle.diagnosis import rules_markdown
from ..lifecycle.summary import TRAINED_FRACTION, format_table

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
    Study("steps_to_train", "Slow or unstable: steps to train against depth",
          "Post-LN, Pre-LN and DeepNorm at depths 6-100, four rates, two seeds, each run trained until it has trained "
          "or for 3,000 steps (ten times the other studies' 300); steps-to-train read with censoring (the rules: "
          "deepnorm_exp/analysis/steps_to_train.py)."),
    Study("steps_to_train_encdec", "Slow or unstable, encoder-decoder",
          "The same on N-N encoder-decoders and the synthetic translation task, N = 6, 24, 100, rates 1e-3 and 3e-3, "
          "two seeds, until trained or 3,000 steps."),
    Study("precision_fp16", "Mixed precision, as the paper trained",
          "Post-LN and DeepNorm at depths 18 and 50 in fp16 with dynamic loss scaling, lr 1e-3, two seeds, "
          "steps_to_train's protocol (until trained or 3,000 steps)."),
    Study("lr_study", "Final loss against learning rate (each scheme at its own best rate)",
          "Post-LN, Pre-LN and DeepNorm at depths 6, 18 and 50, two seeds, on a half-decade grid of learning rates "
          "from 1e-4 to 1e-1, 300 steps (Wortsman et al. 2023; the rules: deepnorm_exp/analysis/lr_study.py)."),
    Study("text_lr", "Real text: each scheme's rate tuned at the final budget",
          "Post-LN, Pre-LN and DeepNorm decoders at depths 6, 18 and 50 on Shakespeare's plays (bytes, held-out "
          "plays; data=shakespeare), dropout 0.1, 3,000 steps of a cosine schedule that anneals, rates 3e-4 to 1e-2, "
          "seed 0: the best rate per scheme and depth (conf/tuned_lr/text_lr.yaml) for text_final."),
    Study("text_final", "Real text: final quality at each scheme's own rate",
          "text_lr's training at each cell's best rate, seeds 1-3 (the rules: deepnorm_exp/analysis/final_quality.py)."),
    Study("budget_study", "Training length on the synthetic language (a second view, not judged)",
          "Post-LN, Pre-LN and DeepNorm at depths 6 and 18, two seeds, each at its best rate from the learning-rate "
          "study (conf/tuned_lr/lr_study.yaml), 4,800 steps read at 300, 1,200 and 4,800 (the rules: "
          "deepnorm_exp/analysis/budget.py)."),
    Study("early_update_encdec", "The first steps at the paper's shape (its figures 4 and 5)",
          "64-128-2 encoder-decoders at 6L-6L to 100L-100L, Post-LN, Post-LN-init, DeepNorm and Pre-LN, with the "
          "paper's 4k warm-up and without, two seeds, the first 30 steps at peak rate 5e-4, every scalar every "
          "step, per-layer vectors every 5 (the rules: deepnorm_exp/analysis/early_window.py)."),
    Study("encdec_1000l", "1,000 layers at this width",
          "DeepNorm and Pre-LN 500L-500L encoder-decoders at d_model 64 on the synthetic translation task, one seed "
          "each, the encoder-decoder depth sweep's training, each until it has trained or for 2,000 steps."),
    Study("model_update", "Decoder-only model update, LayerNorm inputs and per-layer gradients (a second view, "
          "not judged)", "The first 200 steps (warm-up 100) at depths 6 to 100, two seeds, lr 1e-3, every scalar "
          "every step, per-layer vectors every 10. The mechanism claims read early_update_encdec, the paper's shape "
          "and window, instead."),
    Study("model_update_low_lr", "The same at a tenth of the rate (a second view, not judged)",
          "model_update's training at lr 1e-4: at 1e-3 every scheme's update reaches about sqrt(2 d) by the peak, as "
          "far as unrelated outputs lie apart."),
    Study("model_update_1000l", "The same at 1,000 layers (an extension, not judged)",
          "model_update's training at depth 1,000, one seed."),
    Study("warmup_contrast_low_lr", "Decoder-only, with and without warm-up (a second view, not judged)",
          "Post-LN and DeepNorm at 18 layers, warm-up 0 and 100 steps, two seeds, lr 1e-4, the model update every "
          "step. The paper's contrast (Post-LN with and without warm-up, and Post-LN-init) is judged on "
          "early_update_encdec."),
    Study("warmup_contrast", "The same at the quick start's rate (a second view, not judged)",
          "warmup_contrast_low_lr's training at lr 1e-3."),
    Study("mitigation_study", "Mitigations where Post-LN fails (an extension, not judged)",
          "Post-LN, Pre-LN and DeepNorm at depth 48 with the quick start's training, with no mitigation and with each "
          "of QK-LayerNorm, z-loss 1e-4, soft-capping (attention 50, output 30) and weight decay 0.1, two seeds (the "
          "rule: deepnorm_exp/analysis/mitigations.py)."),
    Study("frontier_depth", "Stability frontier across depth",
          "Per scheme, depth and seed, the largest learning rate that trains, found by bisection "
          "(hydra/sweeper=frontier), and the law log(max lr) = a + b log(depth) fitted per scheme."),
    Study("paper_depth_sweep", "Depth sweep, decoder-only",
          "Post-LN, Pre-LN and DeepNorm at depths 6-200, three seeds, the paper's optimizer scaled down "
          "(conf/experiment/paper_depth_sweep.yaml)."),
    Study("paper_depth_sweep_encdec", "Depth sweep, encoder-decoder (a second view, not judged)",
          "The same on N-N encoder-decoder models and the synthetic translation task, N = 6-100, 300 steps: the "
          "encoder-decoder claims read steps_to_train_encdec, where a plateau is not read as a failure."),
    Study("gpu_depth", "At the paper's width, on one GPU",
          "Post-LN, Pre-LN and DeepNorm at depths 6, 18 and 50, hidden 512, FFN 2048, 8 heads, sequences of 256, "
          "batch 32, bf16, lr 5e-4, 2,000 steps, one seed (`make gpu-study`; it needs a CUDA GPU: none has been "
          "lent to this project's sessions long enough to run it until it says otherwise here)."),
    Study("quickstart", "Quick start", "`make run`: three schemes at depths 6 and 48, one seed."),
    Study("zoo_depth_sweep", "The zoo", "Every scheme at depths 6, 24 and 100, one seed, the quick start's training. "
          "The rows of admin, rezero, dsinit, sigma_reparam and depth_mup ran again once their rules were matched to "
          "their official code (the profiled omegas and a trained omega vector; one alpha per layer; the paper's "
          "uniform draw; the eval-mode power step; the Adam rules on: docs/schemes.md)."),
]


# Studies whose best rates others read (`train.lr: ${tuned_lr:}`): make results writes conf/tuned_lr/<study>.yaml
TUNING_STUDIES = ("lr_study", "text_lr")


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


def sweeper_setting(study: Path, key: str, default):
    """A setting of the sweeper that ran `study`, from the multirun.yaml Hydra leaves in the sweep directory
    (read as plain YAML: a record is never interpolated)."""
    path = study / StudyDir.MULTIRUN
    if not path.exists():
        return default
    node = records.read_yaml(path)
    for part in ("hydra", "sweeper", key):
        node = node.get(part, default) if isinstance(node, dict) else default
    return node


def _sections(evidence: Evidence) -> dict[str, Callable[[Page], None]]:
    def depth_sweep(name: str) -> Callable[[Page], None]:
        def write(page: Page) -> None:
            runs = evidence.at_one_lr(name)  # a preset's runs share one; a stray probe at another is not averaged in
            page.add(single_rate_label(runs))
            page.add("Eval loss, mean ± std over the seeds that completed; (k/n diverged), (k/n untrained: "
                     f"completed without learning {TRAINED_FRACTION:.0%} of the gap from the unigram to the optimal "
                     "loss), (k/n failed "
                     "or unfinished: stopped, running or crashed, left out).",
                     markdown_table(comparison_table(runs, untrained=True)))
            page.figure(f"{name}_depth_stability", plots.depth_stability(runs),
                        "Loss against depth per scheme (x: a depth where seeds diverged).")
            diagnoses(page, runs)
        return write

    def frontier(page: Page) -> None:
        cells = evidence.frontier("frontier_depth")
        if cells.empty:
            # the study's own line above already says whether the sweep has finished
            page.add("No `frontier.json` yet: it, and the law, come when every cell is settled.")
            runs = evidence.runs("frontier_depth")
            if not runs.empty:
                stable_if = sweeper_setting(evidence.study_dir("frontier_depth"), "stable_if", "trained")
                page.add(f"The brackets so far, from the {len(runs)} probe runs made (stable: {md_text(stable_if)}, the "
                         "sweep's `stable_if`; an empty end: no probe on that side yet):",
                         markdown_table(brackets_so_far(runs, stable_if).sort_values(["norm", "depth", "seed"]),
                                        index=False))
                diagnoses(page, runs, "every probe, at every rate it tried")
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
        diagnoses(page, evidence.runs("frontier_depth"), "every probe, at every rate it tried")

    def model_update(page: Page) -> None:
        runs = evidence.at_one_lr("model_update")
        page.figure("model_update", plots.model_update(evidence.scalars("model_update")),
                    "||F(x,θt) − F(x,θ0)|| over the first steps, per scheme, one line per depth (decoder-only).")
        page.figure("ln_input_norm", plots.ln_input_norm(evidence.layers("model_update"), runs),
                    "LayerNorm input ||x|| / sqrt(d) by position in the stack, at the last per-layer step.")
        page.figure("layer_grad_norm", plots.layer_profile(evidence.layers("model_update"), "grad_norm"),
                    "Per-layer gradient norm by position in the stack, at the last per-layer step.")

    def early_update(page: Page) -> None:
        runs, scalars = evidence.at_one_lr(early_window.STUDY), evidence.scalars(early_window.STUDY)
        warm = config_by_run(runs, "train.warmup_steps").fillna(0) > 0
        for flag, label, name in ((True, "with the 4k warm-up (figure 5's training)", "early_update_warmup"),
                                  (False, "without warm-up (figure 4(a)'s contrast)", "early_update_no_warmup")):
            of = scalars[scalars["run_name"].isin(warm.index[warm == flag])] if not scalars.empty else scalars
            page.figure(name, plots.model_update(of), f"||F(x,θt) − F(x,θ0)|| over the first "
                        f"{early_window.WINDOW} steps {label}, per scheme, one line per depth (N-N).")
        page.add("What the rules read, mean over the seeds (update @k: ||F(x,θk) − F(x,θ0)||; step change: "
                 "||F(x,θt) − F(x,θt−1)||; LN input growth: the mean over blocks at the window's end over step 0; "
                 "decoder bottom / top grad: its bottom-10% over top-10% layers' gradient norm at the window's end):",
                 markdown_table(early_window.window_table(evidence), index=False))

    def learning_rates(name: str) -> Callable[[Page], None]:
        return lambda page: lr_sections(page, evidence.runs(name), name)

    def final_quality_table(page: Page) -> None:
        table = final_quality.final_table(evidence)
        page.add("Final eval loss per scheme and depth, each at its best rate from text_lr: mean ± standard error "
                 "over the seeds (n), capped at the loss at initialisation (a diverged seed counts as that):",
                 markdown_table(table) if not table.empty else "No run of the study has ended yet.")
        diagnoses(page, evidence.runs(final_quality.STUDY))

    def training_length(page: Page) -> None:
        runs, scalars = evidence.runs("budget_study"), evidence.every_runs_scalars("budget_study")
        losses = budget.budget_losses(runs, scalars)
        changes = budget.order_changes(losses)
        page.add("Eval loss (mean ± std over the seeds) at each budget, and the schemes in order of it: the order "
                 + ("changes with the budget at " + ", ".join(f"L{d}" for d, c in changes.items() if c)
                    if any(changes.values()) else "does not change with the budget") + ".",
                 markdown_table(budget.budget_table(losses), index=False))
        page.add("Converged at the longest budget? The eval loss's fall over the last quarter of the steps, in units "
                 f"of the unigram-to-optimal gap, per seed (converged: under {budget.CONVERGED_FALL}):",
                 markdown_table(by_depth(budget.convergence_table(budget.with_convergence(runs, scalars)))))
        page.figure("budget_study", budget.budget_figure(runs, scalars),
                    "Eval loss against steps, a panel per depth, a line per scheme (dotted: the budgets).")

    def low_rate(page: Page) -> None:
        page.figure("model_update_low_lr", plots.model_update(evidence.scalars("model_update_low_lr")),
                    "||F(x,θt) − F(x,θ0)|| at lr 1e-4, per scheme, one line per depth.")

    def thousand_layers(page: Page) -> None:
        page.figure("model_update_1000l", plots.model_update(evidence.scalars("model_update_1000l")),
                    "||F(x,θt) − F(x,θ0)|| at 1,000 layers, per scheme.")

    def warmup(name: str) -> Callable[[Page], None]:
        def write(page: Page) -> None:
            runs, scalars = evidence.at_one_lr(name), evidence.scalars(name)
            page.add("Model update ||F(x,θt) − F(x,θ0)|| at a few steps (mean over the seeds), and how the runs "
                     "ended:", markdown_table(warmup_table(runs, scalars), index=False))
        return write

    def mitigation(page: Page) -> None:
        table = mitigations.mitigation_table(evidence.runs("mitigation_study"))
        if table.empty:
            page.add("No run of the study has ended yet.")
            return
        page.add("Per scheme and mitigation: the seeds that trained, the eval loss (mean ± std over the seeds that "
                 "completed), the diagnoses, and the rule's verdict against the same scheme with no mitigation:",
                 markdown_table(table, index=False))

    def one_seed_table(name: str) -> Callable[[Page], None]:
        def write(page: Page) -> None:
            page.add(single_rate_label(evidence.runs(name)),
                     f"Eval loss; (1/1 untrained): completed without learning {TRAINED_FRACTION:.0%} of the gap.",
                     markdown_table(comparison_table(evidence.runs(name), untrained=True)))
            diagnoses(page, evidence.runs(name))
        return write

    def steps(name: str) -> Callable[[Page], None]:
        return lambda page: steps_table(page, evidence.runs(name))

    return {"steps_to_train": steps("steps_to_train"), early_window.STUDY: early_update,
            "encdec_1000l": steps("encdec_1000l"), "precision_fp16": steps("precision_fp16"),
            "steps_to_train_encdec": steps("steps_to_train_encdec"), "paper_depth_sweep": depth_sweep("paper_depth_sweep"),
            "paper_depth_sweep_encdec": depth_sweep("paper_depth_sweep_encdec"),
            "gpu_depth": depth_sweep("gpu_depth"),
            "frontier_depth": frontier, "model_update": model_update, "lr_study": learning_rates("lr_study"),
            "text_lr": learning_rates("text_lr"), final_quality.STUDY: final_quality_table,
            "budget_study": training_length, "model_update_low_lr": low_rate,
            "model_update_1000l": thousand_layers, "warmup_contrast": warmup("warmup_contrast"),
            "warmup_contrast_low_lr": warmup("warmup_contrast_low_lr"), "mitigation_study": mitigation,
            "quickstart": one_seed_table("quickstart"), "zoo_depth_sweep": one_seed_table("zoo_depth_sweep")}


def lr_sections(page: Page, runs: pd.DataFrame, name: str) -> None:
    """A learning-rate grid's tables and figure (lr_study.py's rules): each scheme at its best rate, LR
    sensitivity, loss against rate, every cell, the diagnoses."""
    summary = lr_study.lr_summary(runs)
    page.add("Each scheme at its own best rate per depth: the mean ± std over the seeds of the final eval loss "
             "(capped at the loss at initialisation; a diverged seed counts as that), and the rate; "
             "`edge`: the best rate is an end of the grid, so the optimum may lie beyond it; `untrained`: seeds "
             f"that learned nothing (under {TRAINED_FRACTION:.0%} of the unigram-to-optimal gap) even at the best rate.",
             markdown_table(by_depth(lr_study.best_rate_table(summary))))
    page.add("LR sensitivity (the mean over the grid of the capped loss minus the best; 0: every rate is as "
             "good as the best, which is also what a scheme that learns at no rate reads: see the table above) "
             "per depth, and how far the best rate moves from the shallowest depth to the deepest (their "
             "ratio):", markdown_table(by_depth(lr_study.sensitivity_table(summary))))
    page.figure(name, lr_study.lr_figure(runs),
                "Final eval loss against learning rate, a panel per scheme, a line per depth (circles: the best "
                "rate).")
    page.add("Every cell (mean capped loss over the seeds; `(k div)`: k seeds diverged):",
             markdown_table(lr_study.curve_table(lr_study.lr_curves(runs))))
    diagnoses(page, runs, "over every rate of the grid")


def steps_table(page: Page, runs: pd.DataFrame) -> None:
    """A steps-to-train study's cells (steps_to_train.py): trained by the old budget and by the run's, the
    censored median, how the rest ended, and each scheme's best rate per depth."""
    cells = steps_to_train.cell_table(steps_to_train.run_outcomes(runs))
    page.add(f"Per scheme, depth and rate: seeds trained by step {steps_to_train.SHORT_BUDGET} (`by_short`) and "
             "by the budget (`by_budget`), the median steps-to-train (the first step by which half the seeds had "
             "trained; empty: fewer than half ever did), and how the others ended (diverged, or their diagnosis):",
             markdown_table(cells, index=False))
    page.add("Each scheme's best rate per depth (the smallest median, then the most seeds trained):",
             markdown_table(steps_to_train.best_rates(cells), index=False))


def diagnoses(page: Page, runs: pd.DataFrame, scope: str = "") -> None:
    """The diagnosis table of a study's runs (none where no run has ended)."""
    table = diagnosis_table(runs)
    if not table.empty:
        page.add(f"Why each run ended as it did{' (' + scope + ')' if scope else ''}: how many runs got each "
                 "diagnosis, from their records by the rules of [the diagnosis](stability.md#the-diagnosis-of-a-run):",
                 markdown_table(table))


WARMUP_STEPS_SHOWN = (1, 10, 100, 200)


def warmup_table(runs: pd.DataFrame, scalars: pd.DataFrame) -> pd.DataFrame:
    """norm, depth, warm-up -> the mean model update at WARMUP_STEPS_SHOWN and the runs' outcomes."""
    if runs.empty or scalars.empty or "model_update" not in scalars:
        return pd.DataFrame()
    warmup = config_by_run(runs, "train.warmup_steps")
    data = scalars[scalars["step"].isin(WARMUP_STEPS_SHOWN)].assign(
        warmup=lambda f: warmup.reindex(f["run_name"]).to_numpy())
    table = data.pivot_table(index=["norm", "depth", "warmup"], columns="step", values="model_update", aggfunc="mean")
    table.columns = [f"step {c}" for c in table.columns]
    ended = runs.assign(warmup=warmup.to_numpy(), ok=runs["status"].eq("completed") & runs["trained"].eq(True))
    outcome = ended.groupby(["norm", "depth", "warmup"]).apply(
        lambda g: f"{int(g['ok'].sum())}/{len(g)} trained" + (f", {int(g['status'].eq('diverged').sum())} diverged"
                                                             if g["status"].eq("diverged").any() else ""))
    table["runs"] = outcome
    table = table.reset_index()
    order = {n: i for i, n in enumerate(plots.norms_in(table))}
    return table.sort_values(["norm", "depth", "warmup"], key=lambda c: c.map(order) if c.name == "norm" else c)


def single_rate_label(runs: pd.DataFrame) -> str:
    return (f"**Every scheme at one learning rate** ({one_rate(runs)}): a second view, whose order between schemes "
            "may owe to the rate; the comparison at each scheme's own best rate is the learning-rate study's.")


def one_rate(runs: pd.DataFrame) -> str:
    """"lr 0.0005": the rate every run shares (as at_one_lr leaves them), or "lr unknown"."""
    rates = pd.to_numeric(runs.get("train.lr", pd.Series(dtype=float)), errors="coerce").dropna().unique()
    return f"lr {rates[0]:g}" if len(rates) == 1 else "lr unknown"


def by_depth(table: pd.DataFrame) -> pd.DataFrame:
    """A norm x depth table with its depth columns named L6, L18, ... (other columns as they are)."""
    return table.rename(columns=lambda c: f"L{c}" if isinstance(c, (int, np.integer)) else c)


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
            lines.append(f"- {md_text(row['norm'])}: slope {row['slope']:.2f}, 95% interval [{row['slope_low']:.2f}, "
                         f"{row['slope_high']:.2f}], from {row['cells']} cells at L{', L'.join(map(str, row['depths']))}"
                         + censored)
        else:
            lines.append(f"- {md_text(row['norm'])}: no slope (uncensored cells at fewer than two depths{censored})")
    return "\n".join(lines)


def claims_table(evidence: Evidence) -> str:
    # the claims' own text, composed in claims.py from numbers and names the records' schema admits
    rows = [{"the paper": c.paper, "where the paper measured it": c.setting, "study": f"`{c.study}`", "rule": c.rule,
             "here": f"**{v.outcome}**", "numbers": v.numbers} for c, v in judge(evidence)]
    return markdown_table(pd.DataFrame(rows), index=False, markdown=(
        "the paper", "where the paper measured it", "study", "rule", "here", "numbers"))


def times_table(evidence: Evidence, root: Path) -> str:
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


def build_results(root: str | Path, out: str | Path, evidence: Optional[Evidence] = None) -> Path:
    """`evidence`: the records of `root` already loaded (main shares them with the README's blocks)."""
    root, out = Path(root), Path(out)
    evidence, page = evidence or Evidence(root), Page(out)
    page.add("# Results", f"Generated by `make results` from the run records under `{root}/` (each study's "
             "published records, `runs/<study>/published/`, where it has them: `deepnorm_exp/analysis/published.py`)"
             f"{records_span(evidence)}: every number and figure below is read from those records "
             "(`deepnorm_exp/analysis/results.py`), and the same command regenerates this page from them byte for "
             "byte. The studies are small versions of the paper's (its presets in `conf/experiment/` say how "
             "small), so each claim is judged at this scale, by the rule beside it "
             "(`deepnorm_exp/analysis/claims.py`). A study \"not run yet\" has not been run under the current "
             "defaults and protocol; earlier versions of this page (in git) showed runs at earlier ones, whose "
             "records were not kept.", setting_text(evidence))
    page.add("## The code that ran the studies",
             markdown_table(code_table(evidence), index=False, markdown=("study", "records", "commands")))
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
            page.add(f"**The sweep has not finished** ({evidence.so_far(study.name)}; in a checkout without "
                     f"its run directories, `python -m deepnorm_exp.analysis.published --restore runs/{study.name}` "
                     "writes them back, and the same command continues it): what follows is partial, and the claims "
                     "it tests wait for the rest.")
        sections[study.name](page)
    path = out / "results.md"
    records.write_text(path, "\n".join(page.lines).rstrip() + "\n")
    for stale in (out / FIGURE_DIR).glob("*.png"):  # a figure of a section the page no longer has
        if stale.name not in page.figures:
            stale.unlink()
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


def records_span(evidence: Evidence) -> str:
    """", made between <first start> and <last finish> (UTC)": read from the records, so that the page
    regenerated later is the same page."""
    times = [t for study in STUDIES for column in ("started_at", "finished_at")
             for t in evidence.runs(study.name).get(column, pd.Series(dtype=object)).dropna()]
    if not times:
        return ""
    first, last = min(times)[:10], max(times)[:10]
    return f", made on {first}" if first == last else f", made from {first} to {last}"


def setting_text(evidence: Evidence) -> str:
    """The scale the verdicts are drawn at and what "trained" means, read from the records."""
    studies = [evidence.runs(s.name) for s in STUDIES if not evidence.runs(s.name).empty]
    if not studies:
        return "No study has records yet."
    runs = pd.concat(studies, ignore_index=True)
    widths = sorted({int(w) for w in pd.to_numeric(config_by_run(runs, "model.d_model"), errors="coerce").dropna()})
    devices = sorted(set(runs["device"].dropna().astype(str).str.split(":").str[0])) if "device" in runs else []
    diverged = int((runs["status"] == "diverged").sum())
    untrained = int(((runs["status"] == "completed") & ~runs["trained"].fillna(False).astype(bool)).sum())
    unknown = int(runs["optimal_loss"].isna().sum()) if "optimal_loss" in runs else 0
    data = (" on the synthetic language, whose optimal loss is known (docs/models-and-data.md)" if not unknown else
            f": {len(runs) - unknown} on the synthetic language, whose optimal loss is known (docs/models-and-data.md), "
            f"{unknown} on real text, whose optimum is not known (there the gap runs down to 0 nats)")
    return (f"**How to read it.** The {len(runs)} runs behind this page are small models (d_model "
            f"{', '.join(map(str, widths))}; {md_text(', '.join(devices)) or 'device not recorded'}){data}. A run "
            f"*trained* when it closed at least {TRAINED_FRACTION:.0%} of the gap from the unigram loss (token "
            "frequencies only) to that optimum; "
            "a scheme that \"fails\" or is \"unstable\" here did not train or diverged: of these runs "
            f"{untrained} completed without training and {diverged} diverged. Each study's width, depths, steps and "
            "rate are in its preset (docs/configuration.md, Presets).")


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


# -- the generated blocks of the README and the manual's pages -------------------------------------------------------------------
BLOCK_STUDIES = {"quickstart": "quickstart", "frontier": "frontier_depth", "zoo": "zoo_depth_sweep",
                 "lr_study": "lr_study"}  # a study's own block -> the study it shows


def generated_blocks(root: Path, evidence: Optional[Evidence] = None, every_study: bool = True) -> dict[str, str]:
    """NAME -> the block's new text: `diagnosis_rules` (the diagnosis kinds, from lifecycle/diagnosis.py), and
    for the studies that have runs: `quickstart`, `zoo` and `lr_study` (the
    tables and the time, once the sweep has finished), `frontier` (each cell's bracket and the law, once frontier.json is
    written), and, where the records hold every study the page shows (`every_study`), `presets` (every
    preset's command and time here) and `claims` (the verdicts' tally), which summarize them all."""
    evidence, blocks = evidence or Evidence(root), {"diagnosis_rules": rules_markdown()}  # the manual's, from the code
    # A table's block waits for its whole sweep: a sweep in progress would replace it with a few rows.
    if evidence.finished("quickstart"):
        summaries, damaged = evidence.summaries("quickstart")
        time = preset_time(evidence.study_dir("quickstart"), evidence.runs("quickstart")).describe()
        blocks["quickstart"] = f"{md_fence(format_table(summaries, damaged))}\n\nMeasured: {time}."
    frontier = evidence.frontier("frontier_depth")
    if not frontier.empty:
        runs = evidence.runs("frontier_depth")
        time = preset_time(evidence.study_dir("frontier_depth"), runs).describe()
        seeds = frontier["seed"].nunique() if "seed" in frontier else 1
        blocks["frontier"] = (f"**Measured** (`python -m deepnorm_exp -m experiment=frontier_depth`, {seeds} seed"
                              f"{'s' * (seeds > 1)}; {time}). "
                              + frontier_brackets_text(frontier) + "\n\nThe law, log(max stable lr) against "
                              "log(depth):\n\n" + frontier_law_text(evidence.frontier_law("frontier_depth")))
    if evidence.finished("zoo_depth_sweep"):
        blocks["zoo"] = loss_table_block(evidence, root, "zoo_depth_sweep")
    if evidence.finished("lr_study"):
        runs = evidence.runs("lr_study")
        summary = lr_study.lr_summary(runs)
        time = preset_time(evidence.study_dir("lr_study"), runs).describe()
        blocks["lr_study"] = (f"**Measured** (`python -m deepnorm_exp -m experiment=lr_study`; {time}): each scheme "
                              "at its own best learning rate per depth, the final eval loss (mean ± std over the "
                              "seeds, capped at the loss at initialisation) and the rate; then LR sensitivity.\n\n"
                              + markdown_table(by_depth(lr_study.best_rate_table(summary))) + "\n\n"
                              + markdown_table(by_depth(lr_study.sensitivity_table(summary))))
    if not every_study:
        return blocks
    for block, study in BLOCK_STUDIES.items():  # the records hold every study the page shows, and not this one
        if block not in blocks and evidence.runs(study).empty:
            blocks[block] = (f"Not run yet under the current defaults and protocol: `python -m deepnorm_exp -m "
                             f"experiment={study}`. Figures from earlier protocols are in this page's git history; "
                             "their records were not kept.")
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
    levels, for a generated block."""
    runs = evidence.runs(name)
    steps = ", ".join(str(int(n)) for n in sorted(runs["steps"].dropna().unique()))
    seeds = runs["seed"].nunique()
    time = preset_time(evidence.study_dir(name), runs).describe()
    return (f"**Measured** (`python -m deepnorm_exp -m experiment={name}`, {seeds} seed{'s' * (seeds > 1)}; {time}): "
            f"eval loss after {steps} steps (unigram {shared_value(runs, 'unigram_loss')} = learned nothing; "
            f"optimal {shared_value(runs, 'optimal_loss')}); `(k/n untrained)`: completed without learning "
            f"{TRAINED_FRACTION:.0%} of the gap (`trained: false`).\n\n" + markdown_table(comparison_table(runs, untrained=True)))


def update_blocks(path: Path, blocks: dict[str, str], tag: str = "results") -> list[str]:
    """Replace each `<!-- TAG:NAME -->...<!-- /TAG:NAME -->` block that `blocks` has; the names done."""
    old = text = path.read_text(encoding="utf-8")
    done = []
    for name, body in blocks.items():
        # `.*?` may be empty: a block added before its study has run holds nothing between its markers
        pattern = re.compile(rf"(<!-- {tag}:{name} -->\n).*?(<!-- /{tag}:{name} -->)", re.S)
        text, n = pattern.subn(lambda m: m.group(1) + body + "\n" + m.group(2), text)
        if n:
            done.append(name)
    if text != old:  # a page without blocks is left untouched, its time stamp included
        records.write_text(path, text)
    return done


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="deepnorm_exp.analysis.results", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default="runs", help="the directory above the experiments (runs/)")
    parser.add_argument("--out", default="docs", help="where results.md and results/ go (default docs/)")
    parser.add_argument("--blocks", "--readme", nargs="+", default=[], metavar="MARKDOWN",
                        help="Markdown files (the README, the manual's pages) whose generated blocks to rewrite "
                        "from the same records")
    parser.add_argument("--conf", help="the config directory whose tuned_lr/lr_study.yaml to write from the "
                        "learning-rate study's records (conf/)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="rewrite the page even where the records hold fewer runs of a study than it shows")
    args = parser.parse_args(argv)
    if not Path(args.root).is_dir():
        parser.error(f"{args.root} is not a directory (the runs root: runs/)")
    for path in args.blocks:
        if not Path(path).is_file():
            parser.error(f"--blocks {path}: no such file")
    try:
        write(args)
    except published.PublishError as e:  # damaged published records, or packing that would lose runs
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def write(args: argparse.Namespace) -> None:
    """The raw runs of each study become its published records (published.py), then the page and the README's
    blocks are written from those. One regeneration at a time (a second `make results` waits), and nothing is
    written before every study's published records have been checked (a record that breaks their schema is
    a PublishError: the page is left as it was)."""
    with FileLock(Path(args.root) / ".results.lock"):
        for study in STUDIES:
            if (Path(args.root) / study.name).is_dir():
                published.pack(Path(args.root) / study.name)
        evidence = Evidence(args.root)  # every record read once, for the page and the README alike
        for study in STUDIES:
            evidence.published(study.name)
        _write(args, evidence)


def _write(args: argparse.Namespace, evidence: Evidence) -> None:
    lost = [] if args.allow_missing else records_missing(Path(args.out) / "results.md", evidence)
    if not lost:
        print(f"results: {build_results(args.root, args.out, evidence).resolve()}")
    for study in TUNING_STUDIES:  # the rates the studies after them run at (conf/tuned_lr/)
        if args.conf and evidence.finished(study):
            path = Path(args.conf) / "tuned_lr" / f"{study}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            records.write_text(path, lr_study.tuned_lr_yaml(lr_study.lr_summary(evidence.runs(study)), study))
            print(f"{path}: the best rate per scheme and depth")
    if args.blocks:  # the blocks of the studies here; those that summarize every study wait for the page
        blocks = generated_blocks(Path(args.root), evidence, every_study=not lost)
        for path in args.blocks:
            if done := update_blocks(Path(path), blocks):
                print(f"{path}: rewrote {', '.join(done)}")
        if not blocks:
            print("generated blocks: none rewritten (no study they show has runs)")
    if lost:
        raise published.PublishError(
            f"{Path(args.out) / 'results.md'} shows runs that {args.root}/ does not hold: {'; '.join(lost)}; writing "
            "it would replace their results, so it is left as it is (and the README's presets and claims blocks). "
            "Bring the records back (or run the studies), or --allow-missing to write it anyway")


if __name__ == "__main__":
    main()
