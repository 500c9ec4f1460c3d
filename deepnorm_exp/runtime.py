"""Where a run executes: its rank among the processes training it, their number, its device, and whether
it writes the records. Made once per run from torch.distributed's environment (torchrun's variables, or a
SLURM / submitit job's through submitit), and handed to what needs it; nothing else reads the environment.

One process (the default, and every joblib worker) is world size 1: no process group, and every
collective below is the identity, so the single-process path computes exactly what it always did.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import ConfigError

log = logging.getLogger("deepnorm_exp")

# A rank that fails stops the others at their next collective within this time instead of never.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=float(os.environ.get("DEEPNORM_COLLECTIVE_TIMEOUT_MIN", 10)))


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """The one process that writes the run's records (runs/, W&B) and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks (float64), e.g. token counts and loss sums."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """Whether any rank says True: a decision every rank then takes together (stop, checkpoint)."""
        return flag if not self.distributed else self.sum([float(flag)])[0] > 0

    def agree(self, value):
        """The first rank's non-None `value` (a reason to stop), on every rank; None if no rank has one."""
        if not self.distributed:
            return value
        return next((v for v in self.gather(value) if v is not None), None) if self.any(value is not None) else None

    def broadcast(self, obj):
        """The main process's `obj`, on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def launch_environment() -> tuple[int, int, int]:
    """(rank, world size, local rank) of this process: torchrun's RANK/WORLD_SIZE/LOCAL_RANK, else a
    submitit job's tasks (SLURM or submitit_local with tasks_per_node > 1, exported as torchrun's
    variables so that init_process_group's env:// finds them), else one process."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if int(os.environ.get("SUBMITIT_LOCAL_NTASKS", os.environ.get("SLURM_NTASKS", 1))) > 1 and (
            "SUBMITIT_LOCAL_JOB_ID" in os.environ or "SUBMITIT_EXECUTOR" in os.environ
            or "SLURM_JOB_ID" in os.environ):
        from submitit.helpers import TorchDistributedEnvironment

        env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return env.rank, env.world_size, env.local_rank
    return 0, 1, 0


def resolve_device(name: str) -> torch.device:
    """The device `device=` names (auto: CUDA where there is one); ConfigError for one this machine lacks."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", name, "CUDA is not available here; use device=cpu or auto")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ConfigError("device", name, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


def init_runtime(device_name: str) -> Runtime:
    """The Runtime of this process; joins (or creates) the default process group when there are several
    (gloo on CPU, nccl on CUDA, each rank on the GPU of its local rank)."""
    rank, world_size, local_rank = launch_environment()
    device = resolve_device(device_name)
    if world_size == 1:
        return Runtime(device)
    if device.type == "cuda" and device_name in ("auto", "cuda"):
        device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT,
                                device_id=device if device.type == "cuda" else None)
        log.info("rank %d of %d on %s", rank, world_size, device)
    return Runtime(device, rank, world_size, local_rank)


def close_runtime(runtime: Runtime) -> None:
    """Leave the process group when the run is over (every collective is done by now). The run's objects
    are collected first: FSDP's modules and states are reference cycles that hold the group and its
    finished work, and left to the interpreter's exit they are freed after the group is gone."""
    if runtime.distributed and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
