"""SkipInit (De & Smith, 2020, arXiv 2002.10444) on a Pre-LN Transformer: x_{l+1} = x_l + a_l G(LN(x_l)),
a_l a learned scalar that starts small (`norm.branch_init`, default 0, the paper's choice; it also allows a
small constant). Unlike ReZero, the LayerNorms stay.

No official Transformer code exists to check it against: the paper's experiments are residual networks
without normalization, and DeepMind's one implementation (deepmind-research, nfnets/skipinit_resnet.py) is a
normalization-free ResNet with one zero-initialised gain per block. The rule here is the paper's, on Pre-LN as
the issue that added it asked, and tested against that formula (tests/test_zoo.py)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..config import setting
from . import register
from .base import NormedConfig
from .branch import BranchScaledResidual
from .pre import PreNorm


@dataclass
class SkipInitConfig(NormedConfig):
    name: str = "skipinit"
    branch_init: float = setting(0.0, check="finite")  # a_l at init



@register("skipinit")
class SkipInit(PreNorm):
    Config = SkipInitConfig
    cfg: SkipInitConfig

    def branch_multiplier(self, stack: str) -> float:  # a_l, learned: its value at init
        return self.cfg.branch_init

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return BranchScaledResidual(sublayer, self.norm(sublayer.d_model), self.branch_multiplier(stack),
                                    learnable=True)
