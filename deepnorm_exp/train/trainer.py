"""The training loop and nothing else: batches in, optimizer steps out, callbacks told at each step.

Everything that observes training (metrics, evaluation, divergence detection, progress, sinks) is a
`Callback`; a callback that is not installed costs nothing.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import nn

from ..runtime import Runtime
from .batches import sequential_batches
from .numerics import autocast_context
from .parallel import no_gradient_sync, reshard_root


@dataclass
class StepOutput:
    step: int  # number of this optimizer step, from 1
    loss: float
    grad_norm: float  # global L2 norm of the gradients, before clipping
    lr: float  # learning rate this step used
    tokens: int
    seconds: float = 0.0  # wall time of the whole step, filled once the optimizer has stepped
    loss_scale: float | None = None  # fp16: the loss scale of this step's backward (None without a scaler)
    overflow: bool = False  # fp16: the gradients overflowed; the scaler skips the update and lowers the scale
    log_z: torch.Tensor | None = None  # log Z of the output softmax at this rank's target tokens, detached


def is_due(step: int, every: int, last_step: int) -> bool:
    """Whether an every-`every`-steps measurement runs at `step` (always at the last step; never if every=0)."""
    return every > 0 and (step % every == 0 or step == last_step)


class Callback:
    @property
    def name(self) -> str:
        """What a checkpoint files this callback's state under: unique among a trainer's callbacks."""
        return type(self).__name__

    def on_train_start(self, trainer: "Trainer") -> None: ...

    def after_backward(self, trainer: "Trainer", out: StepOutput) -> None:
        """Gradients are ready (not yet clipped), the optimizer has not stepped: the place to measure
        gradients and the weights before the update, or to refuse a bad step."""

    def on_step_end(self, trainer: "Trainer", out: StepOutput) -> None: ...

    def on_train_end(self, trainer: "Trainer") -> None: ...

    def state_dict(self) -> dict:
        """What a checkpoint must hold for this callback to continue as if the run never stopped."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """`state` as `state_dict` returned it, read back onto the CPU (the checkpoint's random-number states
        must be there): a callback puts its own tensors back where it uses them."""


@contextlib.contextmanager
def frozen_gc():
    """Keep Python's cyclic GC off the objects that exist before training.

    Its full collections re-scan every live object: ~370k in a run's process (Hydra, datasets, pandas),
    about 0.2 s per step at depth 300 on a 2-core CPU. Frozen objects are skipped; unfreezing afterwards
    lets a later collection free them, so a sweep of runs in one process does not accumulate garbage.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: t.to(device, non_blocking=True) for name, t in batch.items()}


def micro_batches(batch: dict[str, torch.Tensor], size: int | None) -> list[dict[str, torch.Tensor]]:
    """`batch` in slices of `size` rows (gradient accumulation); the whole batch when size is None."""
    rows = len(next(iter(batch.values())))
    if size is None or size >= rows:
        return [batch]
    return [{name: t[start:start + size] for name, t in batch.items()} for start in range(0, rows, size)]


def global_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all `tensors` together; for FSDP's sharded (DTensor) gradients, of the whole model."""
    norm = torch.nn.utils.get_total_norm(tensors)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@dataclass
class Trainer:
    model: nn.Module  # the model itself (what the instruments measure and checkpoints hold)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batches: Iterator[dict[str, torch.Tensor]]
    steps: int
    device: torch.device
    autocast_dtype: torch.dtype | None = None
    grad_clip: float | None = None
    scaler: torch.amp.GradScaler | None = None  # fp16: dynamic loss scaling (skips the steps that overflow)
    callbacks: Sequence[Callback] = ()
    # What the step calls: the model's loss as a module (train/parallel.py), inside DDP/FSDP when wrapped.
    objective: nn.Module | None = None
    runtime: Runtime = field(default_factory=lambda: Runtime(torch.device("cpu")))
    micro_batch_size: int | None = None  # gradient accumulation: rows per forward (None: the whole batch)
    z_loss: float = 0.0  # train.z_loss: the coefficient on mean (log Z)^2 added to what is backpropagated
    step: int = 0  # optimizer steps completed
    stop_reason: str | None = None
    # What callbacks gather for the current step; a flushing callback hands them to the sinks. Cleared
    # after every step.
    record: dict = field(default_factory=dict)  # scalars
    layer_record: dict = field(default_factory=dict)  # per-layer vectors, one value per residual block
    events: list = field(default_factory=list)  # things that happened (a divergence), written at once

    def __post_init__(self):
        names = [callback.name for callback in self.callbacks]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:  # checkpoints keep callback state by name: two of one name would share it
            raise ValueError(f"callbacks need distinct names (override `name`): {', '.join(duplicates)}")
        if self.objective is None:
            from .parallel import Objective

            self.objective = Objective(self.model)

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    def agree_on_stop(self) -> None:
        """Every rank stops at the same step: if any rank's callbacks asked to stop, all do (with its reason).
        A rank that stopped alone would leave the others waiting in a collective."""
        self.stop_reason = self.runtime.agree(self.stop_reason)

    @property
    def routed(self):
        """The model through its objective, for forwards outside the training step (train/parallel.py)."""
        from .parallel import Routed

        return Routed(self.objective)

    def _emit(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def fit(self) -> None:
        self.objective.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self._emit("on_train_start")
        with frozen_gc():
            self._loop(params)
        self._emit("on_train_end")

    def _objective(self, out) -> torch.Tensor:
        """What is backpropagated: the mean cross-entropy, plus z-loss where train.z_loss asks (PaLM's
        auxiliary loss, which keeps log Z of the output softmax near 0)."""
        return out.loss if not self.z_loss else out.loss + self.z_loss * out.log_z.square().mean()

    def _forward_backward(self, batch: dict[str, torch.Tensor]) -> tuple[float, int, float | None, torch.Tensor]:
        """Gradients of the step's loss in every parameter's .grad (unscaled); (loss, tokens, loss scale, log Z
        at every target token, detached). The loss recorded is the cross-entropy alone, z-loss or not.

        The loss is the mean over every target token of the global batch, whatever the world size and the
        micro-batching: each forward's token-summed loss is backpropagated and the gradients divided by the
        global token count once (DDP and FSDP average over ranks, so times the world size), which gives the
        single-process gradient also when ranks see different token counts (padding). One process without
        micro-batches keeps the plain path, mean loss and backward, exactly as it always computed."""
        loss_scale = self.scaler.get_scale() if self.scaler is not None else None
        pieces = micro_batches(batch, self.micro_batch_size)
        if len(pieces) == 1 and not self.runtime.distributed:
            with autocast_context(self.device, self.autocast_dtype):
                out = self.objective(to_device(batch, self.device))
            objective = self._objective(out)
            (objective if self.scaler is None else self.scaler.scale(objective)).backward()
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # what every callback sees are the true gradients
            return out.loss.item(), out.tokens, loss_scale, out.log_z.detach()
        loss_sum, tokens, log_z = 0.0, 0, []
        for i, piece in enumerate(pieces):
            with no_gradient_sync(self.objective, skip=i < len(pieces) - 1):
                with autocast_context(self.device, self.autocast_dtype):
                    out = self.objective(to_device(piece, self.device))
                summed = self._objective(out) * out.tokens
                (summed if self.scaler is None else self.scaler.scale(summed)).backward()
            loss_sum += (out.loss.detach() * out.tokens).item()
            tokens += out.tokens
            log_z.append(out.log_z.detach())
        loss_sum, total = self.runtime.sum([loss_sum, tokens])
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, self.runtime.world_size / total)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        return loss_sum / total, int(total), loss_scale, torch.cat(log_z)

    def _loop(self, params: list[torch.nn.Parameter]) -> None:
        while self.step < self.steps and self.stop_reason is None:
            started = time.perf_counter()
            loss, tokens, loss_scale, log_z = self._forward_backward(next(self.batches))
            # No list of the grads outlives this line: it would keep last step's gradients alive (a
            # parameter-sized copy of memory) after zero_grad, through the next backward.
            grad_norm = global_norm([p.grad for p in params if p.grad is not None])
            out = StepOutput(step=self.step + 1, loss=loss, grad_norm=grad_norm.item(),
                             lr=self.optimizer.param_groups[0]["lr"], tokens=tokens, loss_scale=loss_scale,
                             log_z=log_z)
            out.overflow = self.scaler is not None and not math.isfinite(out.grad_norm)
            self._emit("after_backward", out)
            self.agree_on_stop()
            if self.stop_reason is not None:
                break  # a refused step: the weights stay as they were before it
            if self.grad_clip is not None and not out.overflow:
                torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, grad_norm)
            if self.scaler is None:
                self.optimizer.step()
            else:
                self.scaler.step(self.optimizer)  # skipped where unscale_ found inf or NaN
                self.scaler.update()
            if not out.overflow:  # the schedule follows the updates applied (as fairseq's does under fp16)
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step = out.step
            out.seconds = time.perf_counter() - started
            self._emit("on_step_end", out)
            self.agree_on_stop()
            self.record.clear()
            self.layer_record.clear()
            self.events.clear()


@torch.no_grad()
def evaluate(objective: nn.Module, tensors: dict[str, torch.Tensor], batch_size: int, device: torch.device,
             autocast_dtype: torch.dtype | None = None) -> float:
    """Mean loss per target token over every example, in eval mode; restores the previous mode.
    `objective`: the model's loss as a module (train/parallel.py). Every rank of a distributed run
    evaluates every example: under FSDP each forward is a collective."""
    was_training = objective.training
    objective.eval()
    total, count = 0.0, 0
    for batch in sequential_batches(tensors, batch_size):
        with autocast_context(device, autocast_dtype):
            out = objective(to_device(batch, device))
        total += out.loss.item() * out.tokens
        count += out.tokens
    objective.train(was_training)
    reshard_root(objective)
    return total / count
