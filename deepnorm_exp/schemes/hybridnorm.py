"""HybridNorm (Zhuo et al. 2025, "HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid
Normalization", arXiv 2503.04598; code: github.com/BryceZhuo/HybridNorm, dense_model/olmo/model.py at
f0dd605): attention with normalised q, k and v and no norm on its input, then the FFN Post-Norm style,
its residual taken from the normalised stream:

    x' = x + Attn(x),   q, k, v each normalised per head (head_dim wide, one gain shared by the heads)
    h = N(x'),  x_{l+1} = h + FFN(h)
    a final norm before the head

HybridNorm* (`norm.pre_first=true`) makes block 0 Pre-Norm for both sublayers, its q, k, v norms kept (the
README's `norm_pos_special_config` for layer 0). The cross-attention of an encoder-decoder is treated as the
self-attention (the paper's models are decoders). `model.qk_norm` puts its norms where this scheme's q and k
norms sit: with it set, q and k take the mitigation's kind.

Init: the zoo's Xavier-normal by default, as every scheme without an init of its own. `norm.init=megatron`
is the authors' training recipe (configs/exps/1.2B-dense-HybriedNorm.yaml: OLMo's `full_megatron`, init_std
0.013975 = sqrt(2 / (5 d)) at d = 2048, cutoff 3): every projection N(0, sqrt(2 / (5 d))) truncated at 3 std,
out and fc2 divided by sqrt(2 L); the embedding keeps the project's N(0, 1/d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import register
from ..config import setting
from .base import NormedConfig, Sublayer
from .branch import PlainResidual
from .pre import PreNorm, PreNormResidual

INITS = ("xavier", "megatron")
CUTOFF = 3.0  # OLMo's init_cutoff_factor in the authors' config


@dataclass
class HybridNormConfig(NormedConfig):
    pre_first: bool = False  # true: HybridNorm*, block 0 Pre-Norm in both sublayers (its q, k, v norms kept)
    # (absent: a run stored before the key trained Xavier)
    init: str = setting("xavier", choices=INITS, absent="xavier")  # xavier | megatron (the authors' recipe)


class NormedStreamResidual(nn.Module):
    """h + G(h) with h = N(x): the stream is normalised, and the residual carries the normalised value."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm

    def forward(self, x, *args, **kwargs):
        h = self.norm(x)
        return h + self.sublayer(h, *args, **kwargs)


@register("hybridnorm")
class HybridNorm(PreNorm):
    Config = HybridNormConfig

    def residual(self, sublayer: Sublayer, stack: str, layer: int) -> nn.Module:
        if sublayer.kind != "ffn":
            self._normalise_qkv(sublayer)
        if self.cfg.pre_first and layer == 0:
            return PreNormResidual(sublayer, self.norm(sublayer.d_model))
        if sublayer.kind == "ffn":
            return NormedStreamResidual(sublayer, self.norm(sublayer.d_model))
        return PlainResidual(sublayer)

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        if self.cfg.init == "xavier":
            return super().init_sublayer(sublayer, stack, layer)
        base = math.sqrt(2 / (5 * sublayer.d_model))
        for role, weight, bias in sublayer.projections():
            std = base / math.sqrt(2 * self.depths[stack]) if role in ("out", "fc2") else base
            nn.init.trunc_normal_(weight, std=std, a=-CUTOFF * std, b=CUTOFF * std)
            if bias is not None:
                bias.zero_()

    def _normalise_qkv(self, attention: nn.Module) -> None:
        head_dim = attention.d_model // attention.n_heads
        if isinstance(attention.q_norm, nn.Identity):  # else model.qk_norm put its norms in the same place: kept
            attention.q_norm, attention.k_norm = self.norm(head_dim), self.norm(head_dim)
        attention.v_norm = self.norm(head_dim)
