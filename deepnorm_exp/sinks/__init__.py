"""Sinks receive the same records: one dict of scalars per logged step, then the run's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from omegaconf import DictConfig


class Sink(Protocol):
    def log(self, record: dict) -> None: ...

    def finish(self, summary: dict) -> None:
        """Called exactly once, also when the run diverged or failed."""


def build_sinks(cfg: DictConfig, run_dir: Path, run_name: str) -> list[Sink]:
    from .jsonl import JsonlSink

    sinks: list[Sink] = [JsonlSink(run_dir / "metrics.jsonl")]  # local files are always written
    if cfg.logger.backend == "wandb" and cfg.logger.mode != "disabled":
        from .wandb import WandbSink

        sinks.append(WandbSink(cfg, run_dir, run_name))
    return sinks
