"""ReZero (Bachlechner et al., 2020, arXiv 2003.04887): x_{i+1} = x_i + a_i F(x_i), "a single additional
learned parameter per layer" a_i initialised to 0, and no LayerNorm anywhere (no final norm either): every
layer starts as the identity.

A Transformer layer's sublayers share its a_i, as in the official code (majumderb/rezero, rezero/transformer/
rztx.py at ff28a73: RZTXEncoderLayer and RZTXDecoderLayer scale self-attention, cross-attention and the FFN by
one `resweight`), so its gradient is the sum of theirs (tests/test_oracles_zoo.py holds the stack to that code).
`norm.alpha_per=sublayer` learns one per sublayer instead, as many re-implementations do. With one per layer
FSDP2 is refused: it shards each sublayer's block apart, and a parameter two of them share cannot be sharded
with both. Init: the zoo's Xavier, where the official layers keep torch's defaults (and start identical,
deep copies of one layer). The per-block metrics count a shared alpha once, with the layer's last sublayer
(its FFN): at init, when alpha is 0 and only alpha gets a gradient, its attention row reads 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import SchemeConfig, NormScheme
from .branch import BranchScaledResidual


@dataclass
class ReZeroConfig(SchemeConfig):
    name: str = "rezero"
    # (absent: a run stored before the key trained one per sublayer)
    alpha_per: str = setting("layer", choices=("layer", "sublayer"), absent="sublayer")  # layer (the paper's and the official code's) | sublayer


@register("rezero")
class ReZero(NormScheme):
    Config = ReZeroConfig
    cfg: ReZeroConfig

    @property
    def unshardable(self) -> str | None:
        if self.cfg.alpha_per == "layer":
            return "shares one alpha between a layer's sublayers, whose blocks FSDP2 shards apart"
        return None

    def branch_multiplier(self, stack: str) -> float:  # alpha, learned: its value at init
        return 0.0

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        # a layer's first sublayer is its self-attention: it starts the layer's alpha, the others reuse it
        if self.cfg.alpha_per == "sublayer" or sublayer.kind == "attention":
            # shape (1,), as the official torch.Tensor([0]): FSDP2's fully_shard refuses a 0-d parameter
            self._alpha = nn.Parameter(torch.full((1,), self.branch_multiplier(stack)))
        return BranchScaledResidual(sublayer, nn.Identity(), self._alpha, learnable=True)
