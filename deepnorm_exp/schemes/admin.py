"""Admin (Liu et al., 2020, "Understanding the Difficulty of Training Transformers", arXiv 2004.08249):
Post-LN with the residual scaled by omega, x_{l+1} = LN(omega_l x_l + G(x_l)), omega set at init so that
each block's dependency on its residual branch matches what Pre-LN's would be.

  norm.omega=profile (default): one forward pass at the start of training (on a training batch, no
      dropout, omega = 1) measures Var[G_j] of every sublayer's output; then, per stack, bottom to top,
      omega_i = sqrt(1 + sum_{j<i} Var[G_j]): the variance the residual stream of a Pre-LN model would have
      accumulated before block i, its (normalized) input counting 1.
  norm.omega=closed_form: admin-torch's constant omega = sqrt((n + 1) / log(n + 1) - 1) for n residual
      sublayers in the stack (2 per decoder-only or encoder layer, 3 per encoder-decoder decoder layer),
      the O(log n) output-change setting. No profiling pass.

omega is a buffer of each block, so it is checkpointed: a resumed run never profiles again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import require_choice
from . import register
from .base import NormedConfig
from .post import PostNorm


@dataclass
class AdminConfig(NormedConfig):
    name: str = "admin"
    omega: str = "profile"  # profile | closed_form

    def __post_init__(self):
        super().__post_init__()
        require_choice("omega", self.omega, ("profile", "closed_form"))


class AdminResidual(nn.Module):
    """LN(omega * x + G(x)), omega a (non-trained) buffer set by the scheme."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, omega: float):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        self.register_buffer("omega", torch.tensor(float(omega)))

    def forward(self, x, *args, **kwargs):
        return self.norm(self.omega * x + self.sublayer(x, *args, **kwargs))


def sublayers_per_layer(depths: dict, stack: str) -> int:
    return 3 if stack == "decoder" and "encoder" in depths else 2


@register("admin")
class Admin(PostNorm):
    Config = AdminConfig
    cfg: AdminConfig

    def closed_form(self, stack: str) -> float:
        n = sublayers_per_layer(self.depths, stack) * self.depths[stack]
        return math.sqrt((n + 1) / math.log(n + 1) - 1)

    def alpha(self, stack: str) -> float:  # reported as alpha: closed form, or 1 before profiling
        return self.closed_form(stack) if self.cfg.omega == "closed_form" else 1.0

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return AdminResidual(sublayer, self.norm(sublayer.d_model), self.alpha(stack))

    @torch.no_grad()
    def prepare(self, model: nn.Module, batch: dict) -> None:
        if self.cfg.omega != "profile":
            return
        blocks = list(model.residual_blocks())
        variances: dict[int, float] = {}
        hooks = [block.sublayer.register_forward_hook(
                     lambda module, args, output, i=i: variances.__setitem__(i, float(output.float().var())))
                 for i, (_, _, _, block) in enumerate(blocks)]
        was_training = model.training
        try:
            for _, _, _, block in blocks:
                block.omega.fill_(1.0)
            model.eval()
            model.loss(batch)
        finally:
            model.train(was_training)
            for hook in hooks:
                hook.remove()
        accumulated: dict[str, float] = {}
        for i, (stack, _, _, block) in enumerate(blocks):
            block.omega.fill_(math.sqrt(1.0 + accumulated.get(stack, 0.0)))
            accumulated[stack] = accumulated.get(stack, 0.0) + variances[i]
