"""Keel (Chen and Wei 2026, "Post-LayerNorm Is Back: Stable, ExpressivE, and Deep", arXiv 2601.19895; v2 of
30 Jan 2026 followed): Post-LN whose residual is scaled by a large constant, with a norm on the branch's input,

    x_{l+1} = N_1(alpha x_l + G_l(N_2(x_l))),   alpha = L, the number of sublayers      (eq. 8, section 3)

N an RMS norm with a learned gain and no bias (section 3.1, eq. 9; `norm.layer=layernorm` offers LayerNorm).
The paper's L counts residual connections, attention and FFN alike (its footnote 1): a decoder of M layers has
alpha = 2M. Its footnote 2 lets a small model tune alpha (> 1): `norm.alpha`. An encoder-decoder, which the
paper did not train, takes each stack's own count here (2N in the encoder, 3M in a decoder with
cross-attention): our reading.

The first block (section 3.1, figure 2): the very first attention sublayer has neither the outer norm nor alpha,
x + G(N(x)) as Pre-LN; the first FFN keeps the outer norm with alpha 1, N(x + G(N(x))). The paper's v1
(27 Jan) removed the outer norm from both. A decoder's first cross-attention is treated as its FFN.

Init: the zoo's Xavier-normal by default, as every scheme whose rule is not an init; `norm.init=paper` is the
paper's training recipe (appendix C, table 8: every projection N(0, 0.02^2), biases 0), which at d_model 64
gives the branch about a sixth of Xavier's scale beside alpha x. No final norm: the last sublayer's outer norm
already normalises the stack's output, as in Post-LN (figure 2 draws none). No official code was found
(docs/schemes.md); tests/test_zoo.py holds the blocks to eq. 8 written out independently.

What the instruments read: `ln_input_norm` is the outer norm's input, alpha x + G, about alpha sqrt(d) by design
(the paper's eq. 18: its Jacobian stays near 1, so a large value is not Post-LN's warning here); block 0's
attention, Pre-LN, reads the stream there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..config import setting
from . import register
from .base import NORM_LAYERS, NormedConfig
from .post import PostNorm
from .pre import PreNormResidual


INITS = ("xavier", "paper")
PAPER_STD = 0.02  # appendix C, table 8


@dataclass
class KeelConfig(NormedConfig):
    layer: str = setting("rmsnorm", choices=NORM_LAYERS)  # layernorm | rmsnorm (the paper's: gain, no bias)
    alpha: Optional[float] = setting(None, check="positive_number", null="the stack's number of sublayers")  # the residual's scale (footnote 2: tunable, > 1, on small models)
    # (absent: a run stored before the key trained Xavier)
    init: str = setting("xavier", choices=INITS, absent="xavier")  # xavier | paper: N(0, 0.02^2) (its table 8)


class HighwayPostNormResidual(nn.Module):
    """norm(alpha x + G(branch_norm(x))). `norm` is the outer one, on the residual sum (what the LN-input
    instrument reads, as in Post-LN); `branch_norm` the one on the branch's input."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, branch_norm: nn.Module, alpha: float):
        super().__init__()
        self.sublayer, self.norm, self.branch_norm, self.alpha = sublayer, norm, branch_norm, alpha

    def forward(self, x, *args, **kwargs):
        return self.norm(self.alpha * x + self.sublayer(self.branch_norm(x), *args, **kwargs))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.6g}"


@register("keel")
class Keel(PostNorm):
    Config = KeelConfig
    cfg: KeelConfig

    def residual_multiplier(self, stack: str) -> float:  # the paper's alpha, from the second block on
        return self.cfg.alpha if self.cfg.alpha is not None else float(self.residual_adds(stack))

    def norm(self, d_model: int) -> nn.Module:
        """RMSNorm, or LayerNorm without its bias: the paper's norms have a gain and no bias (section 3.1)."""
        if self.cfg.layer == "layernorm":
            return nn.LayerNorm(d_model, eps=self.eps, bias=False)
        return super().norm(d_model)

    @torch.no_grad()
    def init_sublayer(self, sublayer, stack: str, layer: int) -> None:
        if self.cfg.init == "xavier":
            return super().init_sublayer(sublayer, stack, layer)
        for _, weight, bias in sublayer.projections():
            nn.init.normal_(weight, std=PAPER_STD)
            if bias is not None:
                bias.zero_()

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        d_model = sublayer.d_model
        if layer == 0 and sublayer.kind == "attention":
            return PreNormResidual(sublayer, self.norm(d_model))
        alpha = 1.0 if layer == 0 else self.residual_multiplier(stack)
        return HighwayPostNormResidual(sublayer, self.norm(d_model), self.norm(d_model), alpha)
