"""Every scheme at one learning rate across depth: the paper's depth sweeps (decoder, encoder-decoder, the
paper's width on a GPU), the quick start and the zoo. One rate for every scheme is a second view: the order
between schemes may owe to the rate (the learning-rate study compares each at its own best)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd

from . import plots
from .escape import md_fence
from .page import Page, Study, by_depth, diagnoses, markdown_table, single_rate_label
from .tables import comparison_table, shared_value
from .timing import preset_time
from ..lifecycle.diagnosis import stream_gains
from ..lifecycle.summary import TRAINED_FRACTION, format_table

if TYPE_CHECKING:
    from .evidence import Evidence


def depth_sweep_section(page: Page, evidence: Evidence, name: str) -> None:
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


def one_seed_section(page: Page, evidence: Evidence, name: str) -> None:
    page.add(single_rate_label(evidence.runs(name)),
             f"Eval loss; (1/1 untrained): completed without learning {TRAINED_FRACTION:.0%} of the gap.",
             markdown_table(comparison_table(evidence.runs(name), untrained=True)))
    diagnoses(page, evidence.runs(name))


def stream_gain_table(layers: pd.DataFrame) -> pd.DataFrame:
    """norm x depth, for the runs that recorded stream mixing (multi-stream schemes): the largest composite gain,
    forward or backward, over every block and measured step, and in brackets the largest distance of one H_res
    from doubly stochastic. Empty where no run recorded them."""
    gain = stream_gains(layers)["gain"]  # coerced: records are read as untrusted input
    ds = pd.to_numeric(layers["mix_ds_distance"], errors="coerce") if "mix_ds_distance" in layers else np.nan
    rows = layers.assign(gain=gain, ds=ds)[gain.notna()]
    if rows.empty:
        return pd.DataFrame()
    per_run = rows.groupby(["norm", "depth"]).agg(gain=("gain", "max"), ds=("ds", "max"))
    cells = per_run.apply(lambda r: f"{r.gain:.4g} ({r.ds:.2g})", axis=1).unstack("depth")
    return by_depth(cells.rename_axis(columns=None))


def zoo_section(page: Page, evidence: Evidence, name: str) -> None:
    one_seed_section(page, evidence, name)
    table = stream_gain_table(evidence.layers(name))
    if not table.empty:
        page.add("Multi-stream schemes (`metrics.stream_mixing`): the largest composite gain of the stream mixings "
                 "(the product of H_res through a stack, forward or backward: `mix_gain_*`) over every block and "
                 "measured step, and in brackets the largest distance of one H_res from doubly stochastic "
                 "(`mix_ds_distance`). A doubly stochastic mixing holds them at 1 and 0, as mHC's Sinkhorn does; "
                 "the mHC paper saw an unconstrained HC model's gain reach about 3,000.", markdown_table(table))


def quickstart_block(evidence: Evidence, name: str) -> Optional[str]:
    """The README's table as `make run` prints it, once the sweep has finished (a sweep in progress would
    replace it with a few rows)."""
    if not evidence.finished(name):
        return None
    summaries, damaged = evidence.summaries(name)
    time = preset_time(evidence.study_dir(name), evidence.runs(name)).describe()
    return f"{md_fence(format_table(summaries, damaged))}\n\nMeasured: {time}."


def loss_table_block(evidence: Evidence, name: str) -> Optional[str]:
    """A finished study's norm x depth eval-loss table with what it ran, how long it took and the data's
    reference levels."""
    if not evidence.finished(name):
        return None
    runs = evidence.runs(name)
    steps = ", ".join(str(int(n)) for n in sorted(runs["steps"].dropna().unique()))
    seeds = runs["seed"].nunique()
    time = preset_time(evidence.study_dir(name), runs).describe()
    return (f"**Measured** (`python -m deepnorm_exp -m experiment={name}`, {seeds} seed{'s' * (seeds > 1)}; {time}): "
            f"eval loss after {steps} steps (unigram {shared_value(runs, 'unigram_loss')} = learned nothing; "
            f"optimal {shared_value(runs, 'optimal_loss')}); `(k/n untrained)`: completed without learning "
            f"{TRAINED_FRACTION:.0%} of the gap (`trained: false`).\n\n" + markdown_table(comparison_table(runs, untrained=True)))


DECODER = Study("paper_depth_sweep", "Depth sweep, decoder-only",
                "Post-LN, Pre-LN and DeepNorm at depths 6-200, three seeds, the paper's optimizer scaled down "
                "(conf/experiment/paper_depth_sweep.yaml).", depth_sweep_section)
ENCDEC = Study("paper_depth_sweep_encdec", "Depth sweep, encoder-decoder (a second view, not judged)",
               "The same on N-N encoder-decoder models and the synthetic translation task, N = 6-100, 300 steps: the "
               "encoder-decoder claims read steps_to_train_encdec, where a plateau is not read as a failure.",
               depth_sweep_section)
GPU = Study("gpu_depth", "At the paper's width, on one GPU",
            "Post-LN, Pre-LN and DeepNorm at depths 6, 18 and 50, hidden 512, FFN 2048, 8 heads, sequences of 256, "
            "batch 32, bf16, lr 5e-4, 2,000 steps, one seed (`make gpu-study`; it needs a CUDA GPU: none has been "
            "lent to this project's sessions long enough to run it until it says otherwise here).",
            depth_sweep_section)
QUICKSTART = Study("quickstart", "Quick start", "`make run`: three schemes at depths 6 and 48, one seed.",
                   one_seed_section, "quickstart", quickstart_block)
ZOO = Study("zoo_depth_sweep", "The zoo", "Every scheme at depths 6, 24 and 100, one seed, the quick start's "
            "training. The rows of admin, rezero, dsinit, sigma_reparam and depth_mup ran again once their rules "
            "were matched to their official code (the profiled omegas and a trained omega vector; one alpha per "
            "layer; the paper's uniform draw; the eval-mode power step; the Adam rules on: docs/schemes.md).",
            zoo_section, "zoo", loss_table_block)
