"""OLMo 2's norm placement (OLMo et al. 2024/2025, "2 OLMo 2 Furious", arXiv 2501.00656; code: allenai/OLMo,
`norm_after: true`, and OLMo-core's reordered-norm block): x_{l+1} = x_l + N(G(x_l)), a norm on each
sublayer's output only, none on its input, the residual stream never normalized; a final norm before the
head, as in Pre-LN. Peri-LN (`norm=periln`) normalises the sublayer's input as well.

Not part of this scheme: OLMo 2 also normalises q and k, over the full width before the heads are split (not
per head): `model.qk_norm=rmsnorm` composes with it but normalises per head. OLMo 2 uses RMSNorm
(`norm.layer=rmsnorm`) and a truncated normal init (std 0.02, no depth scaling); here the zoo's Xavier-normal.
Its output norm comes before the sublayer's dropout, here after it (equal without dropout). The placement is
held to OLMo-core's ReorderedNormTransformerBlock in tests/test_oracles_zoo.py.
"""

from __future__ import annotations

from torch import nn

from . import register
from .pre import PreNorm


class OutputNormResidual(nn.Module):
    def __init__(self, sublayer: nn.Module, out_norm: nn.Module):
        super().__init__()
        self.sublayer, self.out_norm = sublayer, out_norm

    def forward(self, x, *args, **kwargs):
        return x + self.out_norm(self.sublayer(x, *args, **kwargs))


@register("olmo2")
class OLMo2(PreNorm):
    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return OutputNormResidual(sublayer, self.norm(sublayer.d_model))
