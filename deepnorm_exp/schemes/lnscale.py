"""LayerNorm Scaling (Sun et al., 2025, "The Curse of Depth in Large Language Models"): Pre-LN whose LN output
in layer l (1-based) is multiplied by 1/sqrt(l): x_{l+1} = x_l + G(LN(x_l) / sqrt(l)), the final norm unscaled.

Held to the official code (lmsdss/LayerNorm-Scaling at 5d4dd11, and OLMo-core's LayerNormScaledTransformerBlock)
in tests/test_oracles_zoo.py, with its RMSNorm (`norm.layer=rmsnorm`, `model.norm_eps=1e-6`). Its init is N(0,
0.02); here the zoo's Xavier."""

from __future__ import annotations

import math

from torch import nn

from . import register
from .pre import PreNorm, PreNormResidual


class ScaledNorm(nn.Module):
    def __init__(self, norm: nn.Module, scale: float):
        super().__init__()
        self.norm, self.scale = norm, scale

    def forward(self, x):
        return self.norm(x) * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}"


@register("lnscale")
class LNScale(PreNorm):
    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        # `layer` counts from 0: the paper's layer l = layer + 1
        return PreNormResidual(sublayer, ScaledNorm(self.norm(sublayer.d_model), 1.0 / math.sqrt(layer + 1)))
