"""Derf, Dynamic erf (Chen, Lu, Zhu, Sun and Liu 2025, "Stronger Normalization-Free Transformers", arXiv
2512.10938; code: github.com/zlab-princeton/Derf), DyT's successor from the same group: Pre-LN with every
LayerNorm, the final one included, replaced by

    Derf(x) = weight * erf(alpha x + shift) + bias,   alpha and shift one learned scalar each per layer
                                                      (from alpha_0 and shift_0), weight (d) from 1, bias from 0

The official module (dynamic_erf.py, commit 6e1d81c; the same in its ViT, DiT, DNA and GPT-2 code) starts
alpha at 0.5 and the shift at 0, one alpha_0 for every layer; its GPT-2 patch takes three, before attention,
before the FFN and the final norm (`norm.alpha_attn`, `alpha_ffn`, `alpha_final`, as DyT here), defaulting
to 1.0 there and set per run. The defaults here are the module's. x-transformers' `use_derf` (2.31) computes
the same function with the same parameters. Not ported, as for DyT: the GPT-2 patch's learned scalar on the
embedding (from sqrt(d)), where the harness's embedding scale is fixed. Weights as the zoo's other Pre-LN
variants (Xavier-normal, gain 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import register
from .dyt import DyT, DyTConfig


@dataclass
class DerfConfig(DyTConfig):
    shift: float = 0.0  # shift_0: where each erf's learned shift starts (the official 0)


class DynamicErf(nn.Module):
    """weight * erf(alpha x + shift) + bias over the last dimension, alpha and shift learned scalars."""

    def __init__(self, d_model: int, alpha0: float, shift0: float = 0.0, bias: bool = True):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.shift = nn.Parameter(torch.full((1,), float(shift0)))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * torch.erf(self.alpha * x + self.shift)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, alpha0={self.alpha.item():.4g}, shift0={self.shift.item():.4g}, "
                f"bias={self.bias is not None}")


@register("derf")
class Derf(DyT):
    Config = DerfConfig

    def pointwise(self, d_model: int, alpha0: float) -> nn.Module:
        return DynamicErf(d_model, alpha0, self.cfg.shift, self.cfg.bias)
