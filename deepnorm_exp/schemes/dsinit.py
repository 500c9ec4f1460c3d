"""DS-Init (Zhang, Titov & Sennrich, 2019, "Improving Deep Transformer with Depth-Scaled Initialization and
Merged Attention", arXiv 1908.11365): every projection of layer l (1-based, per stack) starts from a Xavier-
uniform draw whose bound is divided by sqrt(l), W ~ U(-gamma a / sqrt(l), gamma a / sqrt(l)), a = sqrt(6 /
(fan_in + fan_out)), gamma = 1 (the paper's equation, as its code's README shows it), biases 0. On a Post-LN
(the paper's setting, `norm.base=post`) or Pre-LN (`norm.base=pre`) Transformer.

`norm.rule=official` draws what the official code draws instead (bzhangGo/zero, models/transformer.py at
d97e2c2: each layer's `variance_scaling_initializer(gain * (layer + 1) ** -0.5, mode="fan_avg",
distribution="uniform")`): there 1/sqrt(l) scales the *variance*, so the bound and std fall as l^(-1/4), and
self-attention's q, k, v are one fused (d, 3d) map, whose fan makes their bound 1/sqrt(2) smaller (its
cross-attention's q, k, v are separate maps, as here). The code's embeddings carry a learned bias the project's
do not have. tests/test_oracles_zoo.py holds both rules, per stack, role and layer, to those formulas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import Sublayer
from .post_or_pre import BASES, PostOrPre, PostOrPreConfig

RULES = ("paper", "official")


def ds_bound(fan_in: int, fan_out: int, l: int, rule: str) -> float:
    """The uniform draw's bound for a (fan_out, fan_in) weight of layer l (1-based)."""
    xavier = math.sqrt(6.0 / (fan_in + fan_out))
    return xavier / math.sqrt(l) if rule == "paper" else xavier * l ** -0.25


@dataclass
class DSInitConfig(PostOrPreConfig):
    name: str = "dsinit"
    base: str = setting("post", choices=BASES)  # the paper's setting
    # paper: the bound / sqrt(l) | official: the variance / sqrt(l), fused self-attention q, k, v
    rule: str = setting("paper", choices=RULES)


@register("dsinit")
class DSInit(PostOrPre):
    Config = DSInitConfig
    cfg: DSInitConfig

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        fused = self.cfg.rule == "official" and sublayer.kind == "attention"
        for role, weight, bias in sublayer.projections():
            fan_out, fan_in = weight.shape
            if fused and role in ("q", "k", "v"):
                fan_out *= 3
            bound = ds_bound(fan_in, fan_out, layer + 1, self.cfg.rule)  # `layer` counts from 0
            nn.init.uniform_(weight, -bound, bound)
            if bias is not None:
                bias.zero_()
