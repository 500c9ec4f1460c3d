"""Sinks receive the same records: scalars per logged step, per-layer tables, events, then the summary.

Local files are always written and are what analysis reads; W&B is optional and never allowed to stop a
run (`Guarded`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from ..rundir import RunDir

log = logging.getLogger("deepnorm_exp")


class Sink:
    """Every method is optional: a sink overrides the records it keeps."""

    name = "sink"  # what a checkpoint files its state under: unique among a run's sinks

    def log(self, record: dict) -> None:
        """Scalars of one step: {"step": int, name: float, ...}."""

    def log_layers(self, step: int, table: dict[str, np.ndarray]) -> None:
        """Per-layer vectors of one step as columns: stack, layer, sublayer, position, then one per metric."""

    def event(self, event: dict) -> None:
        """Something that happened (a divergence: step, reason, last healthy values), at the moment it does."""

    def finish(self, summary: dict) -> None:
        """Called exactly once, also when the run diverged or failed."""

    def close(self) -> None:
        """Release what the sink holds without a summary: it is being dropped after an error."""

    def state_dict(self) -> dict:
        """Its position in what it writes, for a checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Resuming from a checkpoint: forget whatever was written after `state` was taken."""


class Guarded(Sink):
    """Runs an optional sink; its first exception is logged as one warning and the sink is dropped
    (closed best-effort, so a W&B run is not left open for the next run of a multirun to collide with)."""

    def __init__(self, name: str, make):
        self.name, self.sink = name, None  # name: the service's, in warnings and checkpoints
        self._call("start", make)

    def _call(self, what: str, fn, *args) -> None:
        try:
            result = fn(*args)
            if what == "start":
                self.sink = result
        except Exception as e:  # noqa: BLE001 - anything the optional service raises
            log.warning("%s %s failed (%s: %s); continuing with the local records only",
                        self.name, what, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            broken, self.sink = self.sink, None
            if broken is not None:
                try:
                    broken.close()
                except Exception:  # noqa: BLE001 - already warned; nothing more to do for it
                    pass

    def log(self, record: dict) -> None:
        if self.sink is not None:
            self._call("log", self.sink.log, record)

    def log_layers(self, step: int, table: dict[str, np.ndarray]) -> None:
        if self.sink is not None:
            self._call("log_layers", self.sink.log_layers, step, table)

    def event(self, event: dict) -> None:
        if self.sink is not None:
            self._call("event", self.sink.event, event)

    def finish(self, summary: dict) -> None:
        if self.sink is not None:
            self._call("finish", self.sink.finish, summary)

    def state_dict(self) -> dict:
        return self.sink.state_dict() if self.sink is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.sink is not None:
            self._call("load_state_dict", self.sink.load_state_dict, state)


def build_sinks(cfg: DictConfig, run_dir: Path, run_name: str) -> list[Sink]:
    from .jsonl import JsonlSink
    from .layers import LayerFileSink

    sinks: list[Sink] = [JsonlSink(run_dir), LayerFileSink(RunDir(run_dir).layers)]  # always written
    if cfg.logger.backend == "wandb" and cfg.logger.mode != "disabled":
        def start_wandb():
            from .wandb import WandbSink  # inside the guard: a missing or broken wandb is one warning

            return WandbSink(cfg, run_dir, run_name)

        sinks.append(Guarded("W&B", start_wandb))
    return sinks
