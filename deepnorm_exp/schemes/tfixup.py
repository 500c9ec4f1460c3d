"""T-Fixup (Huang et al., 2020, "Improving Transformer Optimization Through Better Initialization"): no
LayerNorm (x_{l+1} = x_l + G(x_l)), Xavier-normal weights with v, out, fc1, fc2 scaled:

    encoder (N layers)           0.67 N^(-1/4)
    decoder (M layers)           (9M)^(-1/4)     (decoder-only models use this rule with M = L)
    token embeddings             std d^(-1/2) scaled by (9M)^(-1/4), M the decoder's layers

The effective v is Xavier gain 1 times the factor in every attention, as in the official code
(layer6ai-labs/T-Fixup, `fixup_initialization` in fairseq/modules/transformer_layer.py): there v is multiplied
by the factor and by sqrt(2), on top of fairseq's `MultiheadAttention.reset_parameters`, which draws q, k and
v with Xavier gain 1/sqrt(2); the sqrt(2) only undoes that gain. (That same fairseq default leaves the
official q and k at gain 1/sqrt(2); here they keep gain 1, the paper's plain Xavier. The official code also
scales the encoder's embeddings by (9N)^(-1/4) with N its own depth when the embeddings are not shared;
here one rule with the decoder's M serves every embedding.)
"""

from __future__ import annotations

import torch
from torch import nn

from . import register
from .base import NormScheme
from .branch import PlainResidual
from .deepnorm import BETA_ROLES


@register("tfixup")
class TFixup(NormScheme):
    def beta(self, stack: str) -> float:  # reported as beta: the scale of out, fc1, fc2
        layers = self.depths[stack]
        return 0.67 * layers ** -0.25 if stack == "encoder" else (9 * layers) ** -0.25

    def gain(self, role: str, stack: str, layer: int) -> float:
        return self.beta(stack) if role in BETA_ROLES else 1.0

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return PlainResidual(sublayer)

    @torch.no_grad()
    def init_embedding(self, weight: torch.Tensor, stack: str) -> None:
        super().init_embedding(weight, stack)
        weight.mul_((9 * self.depths.get("decoder", self.depths[stack])) ** -0.25)
