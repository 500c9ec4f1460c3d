"""The disk a run's records take, known before it starts, and the pre-flight's refusal of what will not fit.

Each record writer's bytes per record (the constants below, measured on real runs; tests/test_resources.py runs
one through the command line and holds every part of the estimate against the bytes it wrote), counted at the
run's intervals over `train.steps`: metrics.jsonl and events.jsonl, the per-layer Parquet files (172 kB each
at 1,000 layers of random values: the incompressible case), W&B's offline copy (its log and one heatmap PNG per
metric and stack at every per-layer step after step 0; 165-186 kB an image at 1,000 layers over 100 steps, the
most of all the records at depth), the checkpoint (two exist for a moment: the new one is written beside the
old; a finished run deletes it unless `train.keep_checkpoint`), and the run's small files.

A sweep's runs are summed per file system; each run holds its checkpoint pair while it trains, so the
launcher's concurrent runs (joblib's n_jobs) add theirs. A run that already finished writes nothing more. A
sweeper that picks values as it goes (the frontier's probes) is counted as one run per planned job.
Not counted: the data cache (`paths.cache`), Hydra's `multirun.yaml` and `sweeps.jsonl` (a few kB).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from omegaconf import DictConfig

from ..errors import ConfigError
from ..rundir import RunDir
from .memory import GIB, Shape

MB = 10**6
METRICS_LINE_BYTES = 512  # a metrics.jsonl line with every scalar on: 400-440 measured
EVENT_BYTES_PER_STEP = 2  # a ~200-byte event allowed every 100 steps
LAYER_FILE_BYTES = 5_632  # a per-layer Parquet file's schema, footer and row-group metadata
LAYER_ROW_BYTES = 90  # a row: 14 float32 metrics, step, stack, layer, sublayer, position (84-89 measured)
LAYER_COLUMNS = 19  # the columns LAYER_ROW_BYTES was measured with (tests/test_resources.py checks a real file)
LAYER_METRICS = LAYER_COLUMNS - 5  # the per-layer metrics: one W&B heatmap each
WANDB_BASE_BYTES = 64_000  # W&B's run header, debug logs, requirements.txt, run id
WANDB_LINE_BYTES = 800  # a scalar record in the .wandb log
WANDB_LAYER_BYTES = 2_000  # per metric and stack at a per-layer step: five summary scalars and an image's entry
IMAGE_BYTES = 26_000  # a heatmap PNG's axes, labels and colour bar
IMAGE_CELL_BYTES = 4  # per distinct depth x step cell it shows
IMAGE_ROWS, IMAGE_COLUMNS = 280, 120  # the most layers and steps a panel resolves at 80 dpi
PARAM_CHECKPOINT_BYTES = 12  # fp32 weight and Adam's exp_avg and exp_avg_sq
TENSOR_CHECKPOINT_BYTES = 300  # a tensor's zip record and pickle entry (x4 a parameter: weight, two moments, step)
CHECKPOINT_BASE_BYTES = 64_000  # random states, the batch order, the scheduler, the config, the callbacks
RUN_BASE_BYTES = 16_000  # config.yaml, summary.json, the lock


def due_count(steps: int, *everies: int) -> int:
    """The steps in 1..steps due for any of `everies` (0: never) or being the last, as `trainer.is_due`."""
    every = [e for e in everies if e > 0]
    if not every or steps <= 0:
        return 0
    count = 0
    for size in range(1, len(every) + 1):  # inclusion-exclusion over the intervals' multiples
        for combination in combinations(every, size):
            count += (-1) ** (size + 1) * (steps // math.lcm(*combination))
    return count + (0 if any(steps % e == 0 for e in every) else 1)


def layer_steps(steps: int, every: int) -> int:
    """Per-layer records: at step 0, every `every` steps and at the last step."""
    return 0 if every <= 0 else 1 + due_count(steps, every)


@dataclass
class DiskEstimate:
    parts: dict[str, int]  # record -> bytes the finished run keeps
    transient: int  # bytes only while it runs: the checkpoint and the new one written beside it
    keys: dict[str, tuple[str, object]] = field(default_factory=dict)  # record -> (key, value) sizing it

    @property
    def records(self) -> int:
        return sum(self.parts.values())

    @property
    def peak(self) -> int:
        return self.records + self.transient


def estimate(cfg: DictConfig, positions: int, model_shape: Shape, depths: dict[str, int]) -> DiskEstimate:
    """The records of a run of `cfg`, checked by build.check_config (`cfg.metrics` holds every key;
    `positions`: build.CheckedConfig.positions, the probe's sequence length; `model_shape`: memory.shape's for
    the model's stacks, `depths`)."""
    train, metrics = cfg.train, cfg.metrics
    steps = int(train.steps)
    lines = due_count(steps, int(train.log_every), int(train.eval_every))
    per_layer = layer_steps(steps, int(metrics.layer_every)) if metrics.enabled else 0
    parts = {RunDir.METRICS: lines * METRICS_LINE_BYTES, RunDir.EVENTS: steps * EVENT_BYTES_PER_STEP,
             f"{RunDir.LAYERS}/": per_layer * (LAYER_FILE_BYTES + model_shape.residual_blocks(depths) * LAYER_ROW_BYTES),
             "config and summary": RUN_BASE_BYTES}
    keys = {RunDir.METRICS: ("train.log_every", train.log_every),
            f"{RunDir.LAYERS}/": ("metrics.layer_every", metrics.layer_every)}
    if cfg.logger.backend == "wandb" and cfg.logger.mode != "disabled":
        panels = max(len(kinds) for kinds in model_shape.blocks.values())
        layers = max(depths.values())
        images = images_bytes(panels, layers, per_layer)
        parts[f"{RunDir.WANDB}/"] = (WANDB_BASE_BYTES + lines * WANDB_LINE_BYTES
                           + len(depths) * LAYER_METRICS * (per_layer * WANDB_LAYER_BYTES + images))
        keys[f"{RunDir.WANDB}/"] = ("logger", cfg.logger.backend)
    checkpoint = 0
    if 0 < int(train.ckpt_every) < steps:
        reference = 4 * int(metrics.probe_batch) * positions * int(cfg.model.d_model) if metrics.enabled else 0
        checkpoint = (PARAM_CHECKPOINT_BYTES * model_shape.params(depths)
                      + 4 * TENSOR_CHECKPOINT_BYTES * model_shape.param_tensors(depths)
                      + CHECKPOINT_BASE_BYTES + reference + parts[RunDir.METRICS] + parts[RunDir.EVENTS])
    keys["checkpoints while running"] = ("train.ckpt_every", train.ckpt_every)
    if train.keep_checkpoint and checkpoint:
        parts[RunDir.CHECKPOINT] = checkpoint
        keys[RunDir.CHECKPOINT] = ("train.keep_checkpoint", True)
    return DiskEstimate(parts, transient=checkpoint if train.keep_checkpoint else 2 * checkpoint, keys=keys)


def images_bytes(panels: int, layers: int, per_layer: int) -> int:
    """The heatmaps of one metric and stack over a run's `per_layer` per-layer steps: none at step 0 (its
    column joins the next image), then the k-th image shows k + 1 steps."""
    if per_layer < 2:
        return 0
    images = per_layer - 1
    growing = min(per_layer, IMAGE_COLUMNS)  # columns 2..growing, then IMAGE_COLUMNS for the rest
    columns = (growing * (growing + 1) // 2 - 1) + (per_layer - growing) * IMAGE_COLUMNS
    return images * IMAGE_BYTES + IMAGE_CELL_BYTES * panels * min(layers, IMAGE_ROWS) * columns


def existing_ancestor(path: str | os.PathLike) -> Path:
    """The deepest part of `path` that exists (the runs root may not exist yet: its disk is its parent's)."""
    existing = Path(path).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    return existing


def fmt(size: float) -> str:
    return f"{size / GIB:,.1f} GiB" if size >= GIB else f"{size / MB:,.1f} MB"


@dataclass
class Planned:
    """The records a command's runs will write on one disk."""

    root: Path  # where the first of them is written (`paths.runs`, or its deepest existing part)
    runs: int
    records: int  # the finished runs' records
    transient: int  # the most their checkpoints hold at once while they run
    free: int

    def describe(self) -> str:
        runs = "1 run" if self.runs == 1 else f"{self.runs} runs"
        while_running = f" (+{fmt(self.transient)} of checkpoints while running)" if self.transient else ""
        return f"records of {runs}: ~{fmt(self.records)}{while_running} in {self.root}, {fmt(self.free)} free"


def plan(jobs: list[tuple[DictConfig, DiskEstimate]], concurrent: int = 1) -> list[Planned]:
    """The runs' records grouped by the disk (file system) their `paths.runs` lies on; ConfigError naming
    the keys to change when they would not fit in its free space. `concurrent`: how many runs the launcher
    trains at once (each holds its checkpoint pair while it runs)."""
    disks: dict[int, list[tuple[DictConfig, DiskEstimate, Path]]] = {}
    for cfg, guess in jobs:
        root = existing_ancestor(cfg.paths.runs)
        disks.setdefault(os.stat(root).st_dev, []).append((cfg, guess, root))
    planned = []
    for entries in disks.values():
        root = entries[0][2]
        records = sum(guess.records for _, guess, _ in entries)
        transient = sum(sorted((guess.transient for _, guess, _ in entries), reverse=True)[:max(concurrent, 1)])
        free = shutil.disk_usage(root).free
        if records + transient > free:
            raise refusal(entries, records + transient, free, root)
        planned.append(Planned(Path(entries[0][0].paths.runs), len(entries), records, transient, free))
    return planned


ADVICE = {f"{RunDir.LAYERS}/": "raise metrics.layer_every", RunDir.METRICS: "raise train.log_every",
          f"{RunDir.WANDB}/": "logger=none (or raise metrics.layer_every: W&B draws a heatmap per metric at each)",
          RunDir.CHECKPOINT: "train.keep_checkpoint=false",
          "checkpoints while running": "train.ckpt_every=0 (no checkpoint: a killed run starts over)"}


def refusal(entries, need: int, free: int, root: Path) -> ConfigError:
    """Names the largest record's key (with the value of the run that writes the most of it) and what to
    change."""
    totals: dict[str, int] = {}
    for _, guess, _ in entries:
        for part, size in guess.parts.items():
            totals[part] = totals.get(part, 0) + size
    transient = max(guess.transient for _, guess, _ in entries)
    if transient:
        totals["checkpoints while running"] = transient
    largest = max(totals, key=totals.get)
    cfg, guess, _ = max(entries, key=lambda entry: entry[1].parts.get(largest, entry[1].transient))
    key, value = guess.keys.get(largest, ("train.steps", cfg.train.steps))
    runs = "the run's" if len(entries) == 1 else f"the {len(entries)} runs'"
    shares = ", ".join(f"{part} {fmt(size)}" for part, size in sorted(totals.items(), key=lambda item: -item[1])
                       if size >= need / 100)
    advice = ADVICE.get(largest, "a smaller model")
    return ConfigError(key, value, f"{runs} records would take ~{fmt(need)} ({shares}) over train.steps="
                       f"{cfg.train.steps} and {root} has {fmt(free)} free: {advice}, lower train.steps, or "
                       f"set paths.runs on a larger disk")
