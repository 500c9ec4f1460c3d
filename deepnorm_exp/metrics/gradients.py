"""Gradient norm of every residual block (the paper's per-layer gradient comparison)."""

from __future__ import annotations

from dataclasses import dataclass

from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument
from .blocks import ParamBlocks, squared_norms


@dataclass
class LayerGradsConfig:
    layer_grads: bool = True  # per-layer grad_norm of every residual block, every metrics.layer_every steps


class LayerGradNorms(Callback):
    """Every `every` steps, the per-block vector `grad_norm`: the L2 norm of the gradient of the block's
    weights, before clipping. Blocks whose weights got no gradient read 0."""

    def __init__(self, blocks: ParamBlocks, every: int):
        self.blocks, self.every = blocks, every

    def after_backward(self, trainer: Trainer, out: StepOutput) -> None:
        if not is_due(out.step, self.every, trainer.steps):
            return
        grads, present = self.blocks.grads()
        squared = squared_norms(grads).cpu()
        full = squared.new_zeros(len(self.blocks.params)).index_copy_(0, present, squared)
        trainer.layer_record["grad_norm"] = self.blocks.per_block(full).numpy()


@instrument("layer_grads", LayerGradsConfig, order=10)
def build(cfg, context: Context) -> LayerGradNorms | None:
    every = context.layer_every(cfg.layer_grads)
    return LayerGradNorms(context.blocks, every) if every else None
