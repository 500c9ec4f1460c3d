"""Sub-LN, as in Magneto (Wang et al., 2022, "Foundation Transformers", arXiv 2210.06423): Pre-LN plus a
LayerNorm inside each sublayer (attention: before the output projection; FFN: after the activation, before
fc2), and fc1, fc2, v, out drawn with Xavier gain gamma (q, k: gain 1):

    decoder-only / encoder-only (N layers)   gamma = sqrt(log 2N)
    encoder-decoder (N encoder, M decoder)   encoder sqrt(log(3M) log(2N) / 3), decoder sqrt(log 3M)
"""

from __future__ import annotations

import math

from torch import nn

from . import register
from .deepnorm import BETA_ROLES
from .pre import PreNorm


@register("subln")
class SubLN(PreNorm):
    def beta(self, stack: str) -> float:  # reported as beta: the init gain of fc1, fc2, v, out
        n, m = self.depths.get("encoder"), self.depths.get("decoder")
        if n is not None and m is not None:
            return math.sqrt(math.log(3 * m) * math.log(2 * n) / 3) if stack == "encoder" else math.sqrt(math.log(3 * m))
        return math.sqrt(math.log(2 * self.depths[stack]))

    def gain(self, role: str, stack: str, layer: int) -> float:
        return self.beta(stack) if role in BETA_ROLES else 1.0

    def wrap(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        sublayer.inner_norm = self.norm(sublayer.inner_width)
        return super().wrap(sublayer, stack, layer)
