"""DyT, Dynamic Tanh (Zhu, Chen, He, LeCun and Liu 2025, "Transformers without Normalization", arXiv
2503.10622; code: github.com/jiachenzhu/DyT): Pre-LN with every LayerNorm, the final one included,
replaced by an element-wise squashing that computes no statistic:

    DyT(x) = weight * tanh(alpha x) + bias,   alpha one learned scalar per layer from alpha_0,
                                               weight (d) from 1, bias (d) from 0

The official module (dynamic_tanh.py, commit aab5dde) has one alpha_0 (0.5) for every layer. Its LLaMA
experiments (other_tasks/LLaMA) drop the bias and give three: before attention, before the FFN and the final
norm, which follow the width, not the depth (7B, d 4096: 0.8, 0.2, 0.2; 13B, d 5120: 0.6, 0.15, 0.15;
34B and 70B, d 8192: 0.2, 0.05, 0.05). `norm.alpha_attn`, `alpha_ffn`, `alpha_final` and `norm.bias` set
them; the defaults are the official module's. Cross-attention takes the attention's alpha_0 (the paper has
no encoder-decoder). Weights as the zoo's other Pre-LN variants (Xavier-normal, gain 1): DyT has no init
rule of its own. Not ported: the LLaMA code's learnable scalar on the embedding (from sqrt(d), the harness's
fixed embedding scale) and its SwiGLU FFN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import Rule, setting
from . import register
from .base import SchemeConfig
from .pre import PreNorm, PreNormResidual


SLOPE = Rule(lambda v: v > 0, "must be a positive number (the tanh's initial slope)")


@dataclass
class DyTConfig(SchemeConfig):
    alpha_attn: float = setting(0.5, check=SLOPE)  # alpha_0 of the DyT before each attention (self and cross)
    alpha_ffn: float = setting(0.5, check=SLOPE)  # alpha_0 of the DyT before each FFN
    alpha_final: float = setting(0.5, check=SLOPE)  # alpha_0 of the DyT on each stack's output
    bias: bool = True  # the official module's bias; false: the LLaMA experiments' form


class DynamicTanh(nn.Module):
    """weight * tanh(alpha x) + bias over the last dimension, alpha a learned scalar."""

    def __init__(self, d_model: int, alpha0: float, bias: bool = True):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * torch.tanh(self.alpha * x)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha0={self.alpha.item():.4g}, bias={self.bias is not None}"


@register("dyt")
class DyT(PreNorm):
    Config = DyTConfig

    def pointwise(self, d_model: int, alpha0: float) -> nn.Module:
        """The element-wise function that stands where each LayerNorm was (Derf subclasses with its own)."""
        return DynamicTanh(d_model, alpha0, self.cfg.bias)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        alpha0 = self.cfg.alpha_ffn if sublayer.kind == "ffn" else self.cfg.alpha_attn
        return PreNormResidual(sublayer, self.pointwise(sublayer.d_model, alpha0))

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return self.pointwise(d_model, self.cfg.alpha_final)
