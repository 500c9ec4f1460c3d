"""How far each optimizer step moves the weights: globally and per residual block."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument
from .blocks import ParamBlocks, squared_norms


@dataclass
class UpdatesConfig:
    update_norm: bool = True  # scalars update_norm, update_ratio: ||delta theta|| of the step (a weight copy)
    layer_updates: bool = True  # per-layer update_ratio of every residual block, every metrics.layer_every steps


class ParameterUpdates(Callback):
    """||delta theta|| of one optimizer step, measured by copying the weights before it.

    * every `every` steps: `update_norm` = ||delta theta|| over all trainable weights, and `update_ratio`
      = ||delta theta|| / ||theta_{t-1}||;
    * every `layer_every` steps: the per-block vector `update_ratio` (the block's weights only).

    The copy is one parameter-sized buffer, alive only between the backward and the end of a measured step;
    other steps cost nothing. Either interval may be 0 (off).
    """

    def __init__(self, blocks: ParamBlocks, every: int, layer_every: int):
        self.blocks, self.every, self.layer_every = blocks, every, layer_every
        self.before: list[torch.Tensor] | None = None
        self.before_sq: torch.Tensor | None = None

    def after_backward(self, trainer: Trainer, out: StepOutput) -> None:
        if is_due(out.step, self.every, trainer.steps) or is_due(out.step, self.layer_every, trainer.steps):
            params = [p.detach() for p in self.blocks.params]
            self.before = [p.clone() for p in params]  # 6x faster on CPU than torch._foreach_mul(params, 1)
            self.before_sq = squared_norms(params)

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if self.before is None:
            return
        torch._foreach_sub_(self.before, [p.detach() for p in self.blocks.params])  # now -delta, in place
        delta_sq = squared_norms(self.before)
        self.before = None
        if is_due(out.step, self.every, trainer.steps):
            update = float(delta_sq.sum().sqrt())
            trainer.record.update(update_norm=update, update_ratio=update / float(self.before_sq.sum().sqrt()))
        if is_due(out.step, self.layer_every, trainer.steps):
            ratio = self.blocks.per_block(delta_sq) / self.blocks.per_block(self.before_sq)
            trainer.layer_record["update_ratio"] = ratio.numpy()


def copies_weights(cfg) -> bool:
    return bool(cfg.update_norm or (cfg.layer_every and cfg.layer_updates))


@instrument("updates", UpdatesConfig, order=20, weight_copies=copies_weights)
def build(cfg, context: Context) -> ParameterUpdates | None:
    every, layer_every = context.log_every if cfg.update_norm else 0, context.layer_every(cfg.layer_updates)
    return ParameterUpdates(context.blocks, every, layer_every) if (every or layer_every) else None
