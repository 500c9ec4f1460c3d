"""Checkpoints of a run trained by several processes: torch.distributed.checkpoint (DCP), which reshards.

`checkpoint.dcp/` in the run directory holds the model and optimizer as DCP writes them (each rank its
shards under FSDP; one copy of what DDP replicates) and `trainer.pt`, the rest of the trainer's state as in a
one-process checkpoint (step, scheduler, batch position, loss scaler, callbacks by name, config), with every
rank's random-number states. Written into `.checkpoint.dcp.tmp/` by all ranks together, then renamed by the
main process after a barrier: a kill at any moment leaves the previous checkpoint or the new one. A write that
fails on any rank (a full disk: DCP's shards on one rank, trainer.pt on the main process) fails the save on
every rank alike, the temporary removed before any rank leaves: the run fails in one line naming the
checkpoint, as a one-process save does, and the previous checkpoint stays.

Loading goes through torch's distributed state-dict API (`get_state_dict` / `set_state_dict`), which maps
the saved shards onto whatever layout the resumed run has: the same ranks, fewer (down to one process,
without a process group), or another parallelism.

What DCP does not do, this does. DCP keeps no checksum, so a flipped byte in a shard would resume from
other weights without a word: `trainer.pt` holds the size and SHA-256 of every file DCP wrote (each rank
hashes its own shards), checked before anything is read (`verify`). And DCP unpickles: `.metadata` with
plain `pickle.load`, and each non-tensor value (the optimizer's hyper-parameters) with
`torch.load(weights_only=False)`, so a crafted checkpoint would run its code on every rank. Here the
metadata goes through an unpickler that builds only DCP's own metadata classes (train/dcp_safety.py) and
the values through the weights-only loader (`WeightsOnlyLoadPlanner`); a refused file is a RecordError
naming it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import records
from ..errors import HarnessError, RecordError, first_line
from ..runtime import Runtime
from .damage import damaged

if TYPE_CHECKING:  # torch.distributed.checkpoint takes a second to import: imported where a checkpoint is
    from torch.distributed.checkpoint import CheckpointException  # read or written, not by the pre-flight

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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from .dcp_safety import WriteErrorWriter

    temporary = temporary_dir(directory)
    if runtime.is_main and temporary.exists():
        shutil.rmtree(temporary)  # left by a kill
    runtime.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, storage_writer=WriteErrorWriter(str(temporary)))
    except CheckpointException as e:  # raised on every rank alike: DCP gathers every rank's failure
        _give_up(temporary, runtime)
        raise write_failure(e, directory) from None
    rngs = runtime.gather(trainer_state["rng"])
    files = written_files(temporary, runtime)
    failure = None
    if runtime.is_main:
        try:
            write_trainer_state(temporary / TRAINER_STATE, {**trainer_state, "rng": rngs[0], "rngs": rngs,
                                                            "files": files})
            old = previous_dir(directory)
            shutil.rmtree(old, ignore_errors=True)  # left by a kill between the renames below and its removal
            if directory.exists():
                directory.rename(old)
            temporary.rename(directory)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as e:  # a full disk while writing trainer.pt: every rank is told, and the checkpoint named
            failure = OSError(e.errno, e.strerror, str(directory)) if e.strerror else e
        except HarnessError as e:
            failure = e
    failure = runtime.broadcast(failure)  # also the barrier: no rank goes on before the rename
    if failure is not None:
        _give_up(temporary, runtime)
        raise failure


def _give_up(temporary: Path, runtime: Runtime) -> None:
    """After a save that every rank knows failed: the temporary removed (its space given back, as a failed
    one-process write gives it) before any rank leaves to report the failure. The previous checkpoint stays."""
    if runtime.is_main:
        shutil.rmtree(temporary, ignore_errors=True)
    runtime.barrier()


def write_failure(e: CheckpointException, directory: Path) -> BaseException:
    """What a failed DCP save says: the first rank's OSError (a full disk), naming the checkpoint as the
    one-process save names checkpoint.pt; anything else, which is a bug, as DCP raised it."""
    for _, (failure, _trace) in sorted(e.failures.items()):
        if isinstance(failure, OSError):
            return OSError(failure.errno, failure.strerror, str(directory)) if failure.strerror else failure
    return e


def written_files(directory: Path, runtime: Runtime) -> dict[str, list]:
    """The manifest of what DCP wrote into `directory` (collective): each rank hashes the shards it wrote
    (DCP names them `__<rank>_<n>.distcp`), the main process the rest (`.metadata`)."""
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    mine = [name for name in names if name.startswith(f"__{runtime.rank}_")]
    if runtime.is_main:
        others = {f"__{rank}_" for rank in range(1, runtime.world_size)}
        mine += [name for name in names if not name.startswith(tuple(others)) and name not in mine]
    files: dict[str, list] = {}
    for part in runtime.gather(records.manifest(directory, mine)):
        files.update(part)
    return files


def verify(directory: Path, files: dict | None) -> None:
    """RecordError unless every file DCP wrote into `directory` is as it was written (`files`: the manifest
    that trainer.pt holds)."""
    if not isinstance(files, dict):
        raise damaged(directory, "trainer.pt lists no checksums of the shards (written by an older version)")
    why = records.manifest_damage(directory, files, skip=(TRAINER_STATE,))
    if why is not None:
        raise damaged(directory, why)


def first_refusal(e: CheckpointException, directory: Path) -> RecordError:
    """The first rank's failure inside DCP as one line: our own RecordError as it is, anything else (a
    shard that does not fit the model) as damage to `directory`."""
    for _, (failure, _trace) in sorted(e.failures.items()):
        if isinstance(failure, RecordError):
            return failure
    rank, (failure, _trace) = min(e.failures.items())
    return damaged(directory, f"rank {rank}: {type(failure).__name__}: {first_line(failure)}")


def present(directory: Path) -> bool:
    """Whether a sharded checkpoint (complete or not) is there: `directory`, or the previous one that a
    kill during the rename left under its old name."""
    return directory.is_dir() or previous_dir(directory).is_dir()


def locate(directory: Path) -> Path | None:
    """The complete sharded checkpoint, if any (see `present`); RecordError where one is there without its
    trainer.pt (written last, so only damage removes it: starting over would drop the run's progress)."""
    candidates = (directory, previous_dir(directory))
    for candidate in candidates:
        if (candidate / TRAINER_STATE).is_file():
            return candidate
    for candidate in candidates:
        if candidate.is_dir():
            raise damaged(candidate, f"{TRAINER_STATE} is missing")
    return None


def load_model_and_optimizer(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore a freshly built model and optimizer (any world size, any parallelism) from `directory`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from .dcp_safety import SafeMetadataReader, WeightsOnlyLoadPlanner

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, storage_reader=SafeMetadataReader(str(directory)), planner=WeightsOnlyLoadPlanner())
    except CheckpointException as e:  # a BaseException, whose text is every rank's traceback
        raise first_refusal(e, directory) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_full(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Restore a one-process checkpoint (full tensors; the optimizer's state keyed by parameter position)
    into a run on several processes, whatever its parallelism (FSDP shards the full tensors as it loads)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

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
