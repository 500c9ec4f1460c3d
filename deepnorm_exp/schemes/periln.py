"""Peri-LN (Kim et al., 2025, "Peri-LN: Revisiting Layer Normalization in the Transformer Architecture"):
x_{l+1} = x_l + LN_out(G(LN_in(x_l))), a norm on both the input and the output of every sublayer, the
residual stream itself never normalized; a final LN as in Pre-LN.

The paper released no code; OLMo-core's PeriNormTransformerBlock (at fa6c501) is the reference
tests/test_oracles_zoo.py holds it to (RMSNorm, eps 1e-6). Two departures: there the output norm comes before
the sublayer's dropout, drop(LN_out(G)), here after it, LN_out(drop(G)) (equal without dropout, the studies'
setting); its init is a truncated normal (std 0.02), here the zoo's Xavier. Its runs also normalise q and k over
the full width; `model.qk_norm` normalises per head."""

from __future__ import annotations

from torch import nn

from . import register
from .pre import PreNorm


class PeriNormResidual(nn.Module):
    def __init__(self, sublayer: nn.Module, norm: nn.Module, out_norm: nn.Module):
        super().__init__()
        self.sublayer, self.norm, self.out_norm = sublayer, norm, out_norm  # `norm`: the input one

    def forward(self, x, *args, **kwargs):
        return x + self.out_norm(self.sublayer(self.norm(x), *args, **kwargs))


@register("periln")
class PeriLN(PreNorm):
    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return PeriNormResidual(sublayer, self.norm(sublayer.d_model), self.norm(sublayer.d_model))
