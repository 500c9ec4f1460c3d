"""Checkpoints of a run trained by several processes: torch.distributed.checkpoint (DCP), which reshards.

`checkpoint.dcp/` in the run directory holds the model and optimizer as DCP writes them (each rank its
shards under FSDP; one copy of what DDP replicates) and `trainer.pt`, the rest of the trainer's state as in a
one-process checkpoint (step, scheduler, batch position, loss scaler, callbacks by name, config), with every
rank's random-number states. Written into `.checkpoint.dcp.tmp/` by all ranks together, then renamed by the
main process after a barrier: a kill at any moment leaves the previous checkpoint or the new one.

Loading goes through torch's distributed state-dict API (`get_state_dict` / `set_state_dict`), which maps
the saved shards onto whatever layout the resumed run has: the same ranks, fewer (down to one process,
without a process group), or another parallelism.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..runtime import Runtime

SHARDED = "checkpoint.dcp"
TRAINER_STATE = "trainer.pt"


def temporary_dir(directory: Path) -> Path:
    return directory.parent / f".{directory.name}.tmp"


def previous_dir(directory: Path) -> Path:
    return directory.parent / f".{directory.name}.old"


def save(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict,
         runtime: Runtime, write_trainer_state) -> None:
    """Collective: every rank calls it at the same step. `trainer_state`: this rank's state without model
    and optimizer (its "rng" is gathered from every rank); `write_trainer_state(path, state)` writes it (the
    one-process checkpoint's verified writer)."""
    temporary = temporary_dir(directory)
    if runtime.is_main and temporary.exists():
        shutil.rmtree(temporary)  # left by a kill
    runtime.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(temporary))
    rngs = runtime.gather(trainer_state["rng"])
    if runtime.is_main:
        write_trainer_state(temporary / TRAINER_STATE, {**trainer_state, "rng": rngs[0], "rngs": rngs})
        old = previous_dir(directory)
        shutil.rmtree(old, ignore_errors=True)  # left by a kill between the renames below and its removal
        if directory.exists():
            directory.rename(old)
        temporary.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    runtime.barrier()


def locate(directory: Path) -> Path | None:
    """The complete sharded checkpoint, if any: `directory`, or the previous one that a kill during the
    rename left under its old name."""
    for candidate in (directory, previous_dir(directory)):
        if (candidate / TRAINER_STATE).exists():
            return candidate
    return None


def load_model_and_optimizer(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore a freshly built model and optimizer (any world size, any parallelism) from `directory`."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_full(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Restore a one-process checkpoint (full tensors; the optimizer's state keyed by parameter position)
    into a run on several processes, whatever its parallelism (FSDP shards the full tensors as it loads)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # The same config builds the same parameter groups in the same order: position -> parameter name.
    names = {param: name for name, param in model.named_parameters()}
    order = [names[param] for group in optimizer.param_groups for param in group["params"]]
    by_name = {"state": {order[i]: value for i, value in optimizer_state["state"].items()},
               "param_groups": [{**group, "params": [order[i] for i in group["params"]]}
                                for group in optimizer_state["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=by_name,
                   options=StateDictOptions(full_state_dict=True))


def remove(directory: Path) -> None:
    for path in (directory, temporary_dir(directory), previous_dir(directory)):
        shutil.rmtree(path, ignore_errors=True)
