"""Weights & Biases: offline by default, writing under the run's own directory (`wandb sync` uploads).

Scalars go in as they are. Per-layer vectors would be thousands of keys at depth 1,000, so each
(metric, stack) becomes five summary scalars (`layers/<metric>/<stack>/min|median|max|first|last`, first
and last = the bottom and top block) and one depth-by-step heatmap image (`layers/<metric>/<stack>/heatmap`,
one panel per sublayer kind), re-drawn at every per-layer step after step 0. The full vectors are in
`layers/`.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ..records import write_text
from ..rundir import RunDir
from . import Sink

LOG_SCALE = ("grad_norm", "update_ratio", "ln_input_norm", "out_norm")  # positive, spanning decades
INDEX_COLUMNS = ("stack", "layer", "sublayer", "position")


class WandbSink(Sink):
    def __init__(self, cfg: DictConfig, run_dir: Path, run_name: str):
        import wandb

        self.wandb = wandb
        # A resumed run continues its W&B run: the id lives beside it (a fresh start deletes wandb/).
        id_file = RunDir(run_dir).wandb / "run_id"
        resuming = id_file.exists()
        self.run = wandb.init(
            id=id_file.read_text().strip() if resuming else None,  # None: W&B draws a new id
            resume="allow" if resuming else None,
            project=cfg.logger.project,
            entity=cfg.logger.entity,
            mode=cfg.logger.mode,
            dir=str(run_dir),
            name=run_name,
            group=cfg.experiment_name,
            job_type=cfg.norm.name,
            tags=[f"norm:{cfg.norm.name}", f"depth:{cfg.depth}", f"model:{cfg.model.kind}"],
            config=OmegaConf.to_container(cfg, resolve=True),
            reinit="finish_previous",  # a multirun in one process never reuses a run
            settings=wandb.Settings(console="off", silent=True),
        )
        write_text(id_file, self.run.id + "\n")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")  # every chart shares the optimizer-step axis
        self.history: dict[tuple[str, str], list[tuple[int, np.ndarray]]] = defaultdict(list)

    def log(self, record: dict) -> None:
        self.run.log(dict(record))

    def log_layers(self, step: int, table: dict[str, np.ndarray]) -> None:
        record: dict = {"step": step}
        stacks = table["stack"]
        for metric in (name for name in table if name not in INDEX_COLUMNS):
            for stack in dict.fromkeys(stacks):
                values = table[metric][stacks == stack]
                finite = values[np.isfinite(values)]
                if finite.size == 0:
                    continue
                key = f"layers/{metric}/{stack}"
                record.update({f"{key}/min": float(finite.min()), f"{key}/median": float(np.median(finite)),
                               f"{key}/max": float(finite.max()), f"{key}/first": float(values[0]),
                               f"{key}/last": float(values[-1])})
                self.history[metric, stack].append((step, values))
                if step > 0:  # step 0 joins the next one's image: no plotting before the first step
                    record[f"{key}/heatmap"] = self._heatmap(metric, stack, table, stacks == stack)
        self.run.log(record)

    def _heatmap(self, metric: str, stack: str, table: dict, rows: np.ndarray):
        # matplotlib's object API with its Agg canvas: no pyplot, so a notebook's backend is left alone.
        from matplotlib.figure import Figure
        from PIL import Image

        steps = [s for s, _ in self.history[metric, stack]]
        matrix = np.stack([v for _, v in self.history[metric, stack]], axis=1)  # blocks x steps
        kinds = table["sublayer"][rows]
        panels = [k for k in dict.fromkeys(kinds) if np.isfinite(matrix[kinds == k]).any()]
        fig = Figure(figsize=(3 * len(panels) + 1, 4), layout="tight")
        for ax, kind in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
            values = matrix[kinds == kind]
            if metric in LOG_SCALE:
                values = np.log10(np.where(values > 0, values, np.nan))
            image = ax.imshow(values, aspect="auto", origin="lower", interpolation="nearest",
                              extent=(-0.5, len(steps) - 0.5, -0.5, values.shape[0] - 0.5))
            ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 6)).round().astype(int))
            ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
            ax.set_title(kind)
            ax.set_xlabel("step")
            ax.set_ylabel("layer")
            fig.colorbar(image, ax=ax, label=f"log10 {metric}" if metric in LOG_SCALE else metric)
        fig.suptitle(f"{metric}, {stack}")
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80)
        png.seek(0)
        return self.wandb.Image(Image.open(png))

    def event(self, event: dict) -> None:
        self.run.summary[event["event"]] = event

    def finish(self, summary: dict) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str, bool)) and not (isinstance(value, float) and math.isnan(value)):
                self.run.summary[key] = value
        if isinstance(summary.get("diagnosis"), dict):  # a run table's column: the kind, its step and evidence
            for part in ("kind", "step", "evidence"):
                self.run.summary[f"diagnosis_{part}"] = summary["diagnosis"][part]
        self.run.finish(exit_code=0 if summary.get("status") != "failed" else 1)

    def close(self) -> None:
        """After a failure (W&B's service died, a disk filled): end what can be ended, quietly. The service
        connection is torn down here too, or W&B's own exit hook would try again at exit and print the same
        failure as a traceback."""
        for end in (lambda: self.run.finish(exit_code=1), self.wandb.teardown):
            try:
                end()
            except Exception:  # noqa: BLE001 - already reported once by Guarded
                pass
