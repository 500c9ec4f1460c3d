"""Checkpoints that let a killed run continue as if it never stopped.

One file, `checkpoint.pt` in the run directory, replaced atomically (written to a temporary name, then
renamed): a kill at any moment leaves either the previous checkpoint or the new one. It holds the model,
optimizer and scheduler, the step, every random number generator the run draws from (torch CPU and CUDA,
Python, NumPy), the batch order's position, and each callback's state by the callback's name (metric
accumulators, the sinks' records so far).

A checkpoint is verified before it is used. torch.load alone would load a file whose tensor bytes were
flipped on disk and train on from wrong weights without a word; the file is a zip archive with a CRC-32 per
record (torch writes them), so `load` checks every record against its CRC first, and a damaged file is one
line naming it (`RecordError`), never a traceback and never silently wrong weights.

A checkpoint is never trusted to be the run's own: run directories are shared on cluster file systems and
copied between people, and unpickling runs whatever code a crafted file names. Everything the state holds is
a tensor, a number, a string, or a list, tuple or dict of those (NumPy's RNG state is stored as a tensor),
so it is read with torch's weights-only loader, which builds nothing else; a file that names anything else
is refused in one line like a damaged one.
"""

from __future__ import annotations

import logging
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..errors import RecordError, first_line
from ..records import atomic_path
from ..rundir import RunDir
from . import sharded
from .damage import damaged, weights_only_refusal
from .trainer import Callback, StepOutput, Trainer

log = logging.getLogger("deepnorm_exp")

def rng_state() -> dict:
    """Every generator's state in forms the weights-only loader reads (Python's is a tuple of ints)."""
    kind, key, position, has_gauss, gauss = np.random.get_state()
    numpy = {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "position": int(position),
             "has_gauss": int(has_gauss), "gauss": float(gauss)}
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy,
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["key"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["gauss"]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainer_state(trainer: Trainer, weights: bool = True) -> dict:
    """Everything a resumed run needs; `weights=False`: without model and optimizer (a sharded checkpoint
    saves those through DCP)."""
    return {
        "step": trainer.step,
        **({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()} if weights else {}),
        "scheduler": trainer.scheduler.state_dict(),
        "batches": trainer.batches.state_dict(),
        "rng": rng_state(),
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "callbacks": {callback.name: callback.state_dict() for callback in trainer.callbacks},
    }


class _KeepWriteError:
    """The file torch.save writes through. torch's zip writer turns a failed write into a RuntimeError
    about stream positions; this keeps the OSError underneath (a full disk must say so)."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def save(path: Path, state: dict) -> None:
    with atomic_path(path) as temporary:
        with open(temporary, "wb") as f:
            writer = _KeepWriteError(f)
            try:
                torch.save(state, writer)
            except RuntimeError:
                if writer.error is None:
                    raise
                raise OSError(writer.error.errno, writer.error.strerror, str(path)) from None


def verify(path: Path) -> None:
    """Raise RecordError unless every record of the checkpoint archive matches its CRC-32."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every record and checks its CRC
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:  # truncated, or not an archive at all
        raise damaged(path, f"{type(e).__name__}: {first_line(e)}") from None
    if bad is not None:
        raise damaged(path, f"record {bad} fails its CRC check")


def load(path: Path) -> dict:
    """The verified checkpoint at `path`, on the CPU: random-number states must be CPU tensors, and the
    model and optimizer states are copied to the device by their `load_state_dict`."""
    verify(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # names something the weights-only loader does not build
        raise damaged(path, f"it holds more than tensors, numbers and strings (a checkpoint of an older version, or "
                      f"a crafted file): {weights_only_refusal(e)}"
                      ) from None
    except Exception as e:  # noqa: BLE001 - whatever unpickling a damaged file raises
        raise damaged(path, f"{type(e).__name__}: {first_line(e)}") from None
    if not isinstance(state, dict) or "step" not in state:
        raise damaged(path, "not a checkpoint of this harness")
    state.pop("sharded", None)  # set by load_run alone: a file must not point the restore at another directory
    return state


def exists(run_dir: Path) -> bool:
    """Whether the run directory holds a checkpoint (one process's file, or a sharded one)."""
    return RunDir(run_dir).checkpoint.exists() or sharded.present(RunDir(run_dir).sharded)


def load_run(run_dir: Path) -> dict:
    """The run's latest checkpoint: `checkpoint.pt`, or a sharded checkpoint's trainer state (its model and
    optimizer are read by `restore`, into the model as this run lays it out). Where a kill between saving
    one kind and deleting the other left both, the later step wins."""
    candidates, files = [], RunDir(run_dir)
    if files.checkpoint.exists():
        candidates.append(load(files.checkpoint))
    directory = sharded.locate(files.sharded)
    if directory is not None:
        state = load(directory / sharded.TRAINER_STATE)
        sharded.verify(directory, state.get("files"))
        candidates.append({**state, "sharded": str(directory)})
    return max(candidates, key=lambda state: state["step"])


def restore(trainer: Trainer, state: dict) -> None:
    """Put a freshly built trainer (same config) where `state` left off. Callbacks are matched by name: one
    that the checkpoint does not know starts fresh (a metric switched on for the resumed run), a saved one
    that this run does not install is dropped (a metric switched off)."""
    if "sharded" in state:
        sharded.load_model_and_optimizer(Path(state["sharded"]), trainer.model, trainer.optimizer)
    elif trainer.runtime.distributed:
        sharded.load_full(trainer.model, trainer.optimizer, state["model"], state["optimizer"])
    else:
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.batches.load_state_dict(state["batches"])
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    saved = state["callbacks"]
    for callback in trainer.callbacks:
        if callback.name in saved:
            callback.load_state_dict(saved[callback.name])
        else:
            log.info("%s: not in the checkpoint, starts fresh at step %d", callback.name, state["step"])
    trainer.step = state["step"]
    rngs = state.get("rngs") or [state["rng"]]  # a sharded checkpoint has every rank's
    set_rng_state(rngs[trainer.runtime.rank] if trainer.runtime.rank < len(rngs) else rngs[0])


class Checkpointer(Callback):
    """Saves every `every` steps (0: never), and at once when `stop_requested()` says the run must stop
    (a preemption signal, on any rank: every rank saves and stops at the same step); install it last so
    every other callback's state is final for the step. One process writes `checkpoint.pt`; several write
    a sharded checkpoint together (train/sharded.py)."""

    def __init__(self, run_dir: Path, every: int, stop_requested=lambda: None, extra: dict | None = None):
        self.files, self.every, self.stop_requested = RunDir(run_dir), every, stop_requested
        self.extra = extra or {}  # saved alongside (the run's config, to refuse resuming a different run)
        self.saved_step: int | None = None

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        reason = trainer.runtime.agree(self.stop_requested())
        due = self.every > 0 and out.step % self.every == 0 and out.step < trainer.steps
        if due or reason:
            self.save(trainer)
            self.saved_step = out.step
        if reason:
            trainer.request_stop(reason)

    def save(self, trainer: Trainer) -> None:
        if not trainer.runtime.distributed:
            save(self.files.checkpoint, {**trainer_state(trainer), **self.extra})
            sharded.remove(self.files.sharded)  # resumed on one process from a sharded one
            return
        sharded.save(self.files.sharded, trainer.model, trainer.optimizer,
                     {**trainer_state(trainer, weights=False), **self.extra}, trainer.runtime, save)
        if trainer.runtime.is_main:
            self.files.checkpoint.unlink(missing_ok=True)


def remove(run_dir: Path) -> None:
    """Delete the run's checkpoints (a finished run has nothing left to resume)."""
    RunDir(run_dir).checkpoint.unlink(missing_ok=True)
    sharded.remove(RunDir(run_dir).sharded)
