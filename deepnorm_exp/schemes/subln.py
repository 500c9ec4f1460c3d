"""Sub-LN, as in Magneto (Wang et al., 2022, "Foundation Transformers", arXiv 2210.06423): Pre-LN plus a
LayerNorm inside each sublayer (attention: before the output projection; FFN: after the activation, before
fc2), and fc1, fc2, v, out drawn with Xavier gain gamma (q, k: gain 1):

    decoder-only / encoder-only (N layers)   gamma = sqrt(log 2N)
    encoder-decoder (N encoder, M decoder)   encoder sqrt(log(3M) log(2N) / 3), decoder sqrt(log 3M)

The decoder's cross-attention gets neither the inner LayerNorm nor gamma (Xavier gain 1 on q, k, v, out), as
in the official code (torchscale 0.3.0 builds `inner_attn_ln` for self-attention only and its Sub-LN init
skips `encoder_attn`) and as Magneto's authors say of their model (borisdayma/dalle-mini PR #311, pointing to
the end of the paper's section 2).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import register
from .base import Sublayer
from .deepnorm import BETA_ROLES
from .pre import PreNorm


@register("subln")
class SubLN(PreNorm):
    def init_gain(self, stack: str) -> float:  # of fc1, fc2, v, out
        n, m = self.depths.get("encoder"), self.depths.get("decoder")
        if n is not None and m is not None:
            return math.sqrt(math.log(3 * m) * math.log(2 * n) / 3) if stack == "encoder" else math.sqrt(math.log(3 * m))
        return math.sqrt(math.log(2 * self.depths[stack]))

    def gain(self, role: str, stack: str, layer: int) -> float:
        return self.init_gain(stack) if role in BETA_ROLES else 1.0

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        if sublayer.kind != "cross_attention":
            return super().init_sublayer(sublayer, stack, layer)
        for _, weight, bias in sublayer.projections():
            nn.init.xavier_normal_(weight)
            if bias is not None:
                bias.zero_()

    def wrap(self, sublayer: Sublayer, stack: str, layer: int) -> nn.Module:
        if sublayer.kind != "cross_attention":
            sublayer.inner_norm = self.norm(sublayer.inner_width)
        return super().wrap(sublayer, stack, layer)
