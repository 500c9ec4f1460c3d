"""Data parallelism through PyTorch's own engine: DistributedDataParallel, or FSDP2 (`fully_shard`) on every
residual block and the root.

The trainer calls an `Objective`: a module whose forward is the model's loss on a batch. Wrappers (DDP,
FSDP, torch.compile) wrap it, so they sit in the path of every training and evaluation forward; the model
itself (`objective.model`) stays reachable for the instruments and the checkpoint.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, choice_error
from ..runtime import Runtime

PARALLEL = ("auto", "none", "ddp", "fsdp")


class Objective(nn.Module):
    """forward(batch) = model.loss(batch): a LossOutput (mean loss over the batch's target tokens, tokens).
    `method=` runs another of the model's methods through the same forward (see Routed)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, method: str = "loss", **kwargs):
        return getattr(self.model, method)(*args, **kwargs)


class Routed:
    """The model as seen through its (possibly wrapped) Objective: `routed.features(batch)` runs
    `objective(batch, method="features")`. What measures or decodes with the model outside the training
    step uses this, so FSDP gathers the sharded weights (its root gathers its own only in the root's
    forward) and every rank takes part. Every rank must make the same calls under FSDP."""

    def __init__(self, objective: nn.Module):
        self.objective = objective

    @property
    def training(self) -> bool:
        return self.objective.training

    def train(self, mode: bool = True):
        return self.objective.train(mode)

    def eval(self):
        return self.objective.eval()

    def __getattr__(self, method: str):
        def call(*args, **kwargs):
            try:
                # Eager, also where blocks are compiled: the instruments' hooks must fire, and a probe
                # forward (eval mode, no gradients) must not make Dynamo compile another graph.
                with torch.compiler.set_stance("force_eager"):
                    return self.objective(*args, method=method, **kwargs)
            finally:
                reshard_root(self.objective)
        return call


def resolve_parallel(parallel: str, world_size: int) -> str:
    """`auto`: none for one process, ddp for several. On one process ddp and fsdp also train as none: they
    would only add work, and a run checkpointed by several processes resumes on one with its config as it
    was (its checkpoint reshards); the run says so (`one_process_note`)."""
    if parallel == "auto":
        return "ddp" if world_size > 1 else "none"
    return parallel if world_size > 1 else "none"


def one_process_note(parallel: str, world_size: int) -> str | None:
    """The line a run prints where train.parallel asks for ddp or fsdp on one process."""
    if parallel in ("ddp", "fsdp") and world_size == 1:
        return (f"train.parallel={parallel}: one process (not started by torchrun or a multi-task job), so it "
                f"trains without {parallel}; torchrun --nproc_per_node=N -m deepnorm_exp ... runs it on N")
    return None


def check_layout(train: Any, world_size: int) -> None:
    """ConfigError unless the global batch splits evenly over the `world_size` processes and each one's
    share into micro-batches, and the precision suits the parallelism (checked before any run directory)."""
    share, micro = train.batch_size // world_size, train.micro_batch_size
    if train.batch_size % world_size:
        raise ConfigError("train.batch_size", train.batch_size,
                          f"must split evenly over the {world_size} processes training the run")
    if micro is not None and share % micro:
        raise ConfigError("train.micro_batch_size", micro,
                          f"must divide each process's {share} rows (train.batch_size / {world_size})")
    if resolve_parallel(train.parallel, world_size) == "fsdp" and train.precision == "fp16":
        raise ConfigError("train.precision", "fp16", "FSDP here takes bf16 or fp32 (its loss scaling would "
                          "need a sharded scaler); use train.precision=bf16")


def wrap(model: nn.Module, runtime: Runtime, parallel: str, param_dtype: torch.dtype | None,
         compile: bool = False, checkpointing: bool = False) -> nn.Module:
    """The Objective of `model`, wrapped for `parallel` (none | ddp | fsdp, resolved); `compile`: each
    residual block compiled first (torchtitan's order: compile, then shard). `checkpointing`: the model
    recomputes each block's forward in the backward (model.activation_checkpointing)."""
    if compile:
        # With recomputation, one graph for every shape: under automatic dynamic shapes a block first seen
        # at one length runs a static graph, and its recomputation, after other lengths came (the
        # translation task's batches vary), can pick the dynamic graph, which saves other tensors: torch's
        # checkpoint then fails ("Recomputed values ... have different metadata", pytorch#166926; seen on
        # paper_1000l compiled).
        dynamic = True if checkpointing else None
        for _, _, _, block in model.residual_blocks():
            # In place (the module and its parameters stay the same objects). Blocks of one kind share
            # their code, so Dynamo compiles once per kind and reuses it at every depth.
            block.compile(dynamic=dynamic)
    objective = Objective(model)
    if parallel == "none":
        return objective
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        return DistributedDataParallel(objective, device_ids=ids)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # bf16 parameters in compute, gradients reduced in fp32 (the usual FSDP2 recipe, torchtitan's)
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) \
            if param_dtype is not None else MixedPrecisionPolicy()
        for _, _, _, block in model.residual_blocks():
            fully_shard(block, mp_policy=policy)
        fully_shard(objective, mp_policy=policy)
        return objective
    raise choice_error("train.parallel", parallel, PARALLEL)


def reshard_root(objective: nn.Module) -> None:
    """After a forward outside the training step (evaluation, the instruments' probes): FSDP keeps the
    root's weights gathered, and the next training forward would then leave their gradients out of the
    reduction. Shard them again; nothing to do without FSDP."""
    reshard = getattr(objective, "reshard", None)
    if reshard is not None:
        reshard()


@contextlib.contextmanager
def no_gradient_sync(objective: nn.Module, skip: bool):
    """Gradient accumulation: the micro-batches before the last one of a step do not reduce gradients."""
    if not skip:
        yield
    elif hasattr(objective, "no_sync"):  # DDP
        with objective.no_sync():
            yield
    elif hasattr(objective, "set_requires_gradient_sync"):  # FSDP2
        objective.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            objective.set_requires_gradient_sync(True)
    else:
        yield
