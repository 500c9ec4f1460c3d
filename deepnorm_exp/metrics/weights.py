"""How large each block's weights are, with the attention's q and k weights apart: their product sets the
scale of the attention logits (the growth QK-norm is against), and a scheme's init sets where they start."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument
from .blocks import BlockIndex, ParamBlocks, squared_norms


@dataclass
class WeightsConfig:
    weight_norms: bool = True  # per-layer param_norm, and wq_norm, wk_norm of the attention blocks


class WeightNorms(Callback):
    """Every `every` steps (after the update) and at step 0, per residual block: `param_norm`, the L2 norm
    of all its weights; `wq_norm` and `wk_norm`, the Frobenius norms of its q and k projection weights
    (biases left out; NaN for blocks without attention, and under FSDP, whose shards split the fused q, k, v
    weight across ranks)."""

    def __init__(self, index: BlockIndex, blocks: ParamBlocks, every: int):
        self.blocks, self.every = blocks, every
        self.attention = [(i, block.sublayer) for i, block in enumerate(index.blocks)
                          if {"q", "k"} <= {role for role, _, _ in getattr(block.sublayer, "projections", list)()}]

    def _qk(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(block, q weight, k weight), as views of the weights now (a sharded weight has none)."""
        out = []
        for i, sublayer in self.attention:
            roles = {role: weight for role, weight, _ in sublayer.projections()}
            if not hasattr(roles["q"], "device_mesh"):
                out.append((i, roles["q"], roles["k"]))
        return out

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.step == 0:
            self.measure(trainer)

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if is_due(out.step, self.every, trainer.steps):
            self.measure(trainer)

    @torch.no_grad()
    def measure(self, trainer: Trainer) -> None:
        trainer.layer_record["param_norm"] = self.blocks.per_block(squared_norms(
            [p.detach() for p in self.blocks.params])).numpy()
        q = torch.full((self.blocks.n_blocks,), math.nan)
        k = q.clone()
        qk = self._qk()
        if qk:
            norms = squared_norms([w.detach() for _, wq, wk in qk for w in (wq, wk)]).sqrt().cpu()
            where = torch.tensor([i for i, _, _ in qk])
            q[where], k[where] = norms[0::2], norms[1::2]
        trainer.layer_record["wq_norm"], trainer.layer_record["wk_norm"] = q.numpy(), k.numpy()


@instrument("weights", WeightsConfig, order=26)
def build(cfg, context: Context) -> WeightNorms | None:
    every = context.layer_every(cfg.weight_norms)
    return WeightNorms(context.index, context.blocks, every) if every else None
