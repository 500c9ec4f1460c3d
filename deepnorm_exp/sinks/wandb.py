"""Weights & Biases: offline by default, writing under the run's own directory (`wandb sync` uploads)."""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


class WandbSink:
    def __init__(self, cfg: DictConfig, run_dir: Path, run_name: str):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
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
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, record: dict) -> None:
        self.run.log({k: v for k, v in record.items()})

    def finish(self, summary: dict) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str, bool)) and not (isinstance(value, float) and math.isnan(value)):
                self.run.summary[key] = value
        self.run.finish(exit_code=0 if summary.get("status") != "failed" else 1)
