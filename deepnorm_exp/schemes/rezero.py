"""ReZero (Bachlechner et al., 2020, arXiv 2003.04887): x_{l+1} = x_l + a_l G(x_l), a_l a learned scalar
initialised to 0, and no LayerNorm anywhere: every block starts as the identity."""

from __future__ import annotations

from torch import nn

from . import register
from .base import NormScheme
from .branch import BranchScaledResidual


@register("rezero")
class ReZero(NormScheme):
    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return BranchScaledResidual(sublayer, nn.Identity(), scale=0.0, learnable=True)
