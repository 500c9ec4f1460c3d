"""Checkpoints that let a killed run continue as if it never stopped.

One file, `checkpoint.pt` in the run directory, replaced atomically (written to a temporary name, then
renamed): a kill at any moment leaves either the previous checkpoint or the new one. It holds the model,
optimizer and scheduler, the step, every random number generator the run draws from (torch CPU and CUDA,
Python, NumPy), the batch order's position, and each callback's state (metric accumulators, the model
update's reference output, the sinks' positions in their files).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from ..files import atomic_path
from .trainer import Callback, StepOutput, Trainer

CHECKPOINT = "checkpoint.pt"


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainer_state(trainer: Trainer) -> dict:
    return {
        "step": trainer.step,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "batches": trainer.batches.state_dict(),
        "rng": rng_state(),
        "callbacks": [callback.state_dict() for callback in trainer.callbacks],
    }


def save(path: Path, state: dict) -> None:
    with atomic_path(path) as temporary:
        torch.save(state, temporary)


def load(path: Path, device: torch.device) -> dict:
    # weights_only=False: the state holds Python RNG tuples and NumPy arrays; the file is the run's own.
    return torch.load(path, map_location=device, weights_only=False)


def restore(trainer: Trainer, state: dict) -> None:
    """Put a freshly built trainer (same config, same callbacks in the same order) where `state` left off."""
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.batches.load_state_dict(state["batches"])
    if len(state["callbacks"]) != len(trainer.callbacks):
        raise RuntimeError("checkpoint callbacks do not match this run's; start over with resume=false")
    for callback, callback_state in zip(trainer.callbacks, state["callbacks"]):
        callback.load_state_dict(callback_state)
    trainer.step = state["step"]
    set_rng_state(state["rng"])


class Checkpointer(Callback):
    """Saves every `every` steps (0: never), and at once when `stop_requested()` says the run must stop
    (a preemption signal); install it last so every other callback's state is final for the step."""

    def __init__(self, path: Path, every: int, stop_requested=lambda: None, extra: dict | None = None):
        self.path, self.every, self.stop_requested = path, every, stop_requested
        self.extra = extra or {}  # saved alongside (the run's config, to refuse resuming a different run)
        self.saved_step: int | None = None

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        reason = self.stop_requested()
        due = self.every > 0 and out.step % self.every == 0 and out.step < trainer.steps
        if due or reason:
            save(self.path, {**trainer_state(trainer), **self.extra})
            self.saved_step = out.step
        if reason:
            trainer.request_stop(reason)
