"""ResiDual (Xie, Zhang, Zhu, Ma, Wang, ... 2023, "ResiDual: Transformer with Dual Residual Connections",
arXiv 2304.14802; code: github.com/microsoft/ResiDual at 8682f75, a fairseq 0.12.2 plugin): two residual streams,
a Post-LN one that feeds every sublayer and a Pre-LN-like one that only accumulates, joined at the output.
Per sublayer i of a stack, e the embedding:

    a_0 = e,  d_0 = s e
    h_i = G_i(a_{i-1})
    a_i = LN_i(a_{i-1} + h_i),  d_i = d_{i-1} + s h_i
    output = a_M + LN_f(d_M)

s (`norm.dual_scale`) changes nothing in exact arithmetic (LN_f(s d) = LN_f(d) up to eps): the official code
sets 0.05 for its fp16 run so the unnormalised stream stays in range. The state between blocks holds both
streams, (..., 2 d_model): a, then d; blocks offer `hidden_state` (a + LN(d)) to what measures them. Every sublayer of
both stacks, cross-attention included, as in the code. Where it differs here: the official init is fairseq's
(q, k, v Xavier-uniform gain 1/sqrt(2); fc1, fc2 PyTorch's default), here the zoo's Xavier-normal; LN_f's eps
is 1e-7 there, `model.norm_eps` here; its output weight on a_M (`alpha`, 1 in every config) is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import setting
from . import register
from .base import NormedConfig, NormScheme


@dataclass
class ResiDualConfig(NormedConfig):
    name: str = "resi_dual"
    dual_scale: float = setting(1.0, check="positive_number")  # s: the accumulating stream carries s e + s sum h_i (official fp16 run: 0.05)



class DualStreamEntry(nn.Module):
    """e -> (a_0, d_0) = (e, s e), side by side on the last dimension."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.scale * x], dim=-1)


class DualStreamResidual(nn.Module):
    """(a, d) -> (LN(a + h), d + s h), h = G(a)."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, scale: float):
        super().__init__()
        self.sublayer, self.norm, self.scale = sublayer, norm, scale

    def forward(self, state, *args, **kwargs):
        a, d = state.chunk(2, dim=-1)
        h = self.sublayer(a, *args, **kwargs)
        return torch.cat([self.norm(a + h), d + self.scale * h], dim=-1)

    def hidden_state(self, state: torch.Tensor) -> torch.Tensor:
        """What per-block measures read: a + N(d), what the head would see were the stack to end here (N the
        stack's kind of norm, without LN_f's gain and bias, which belong to the stack's exit). The Post-LN
        stream alone can collapse at init while the output does not: a measure of a would misread the model."""
        a, d = state.chunk(2, dim=-1)
        normalise = F.rms_norm if isinstance(self.norm, nn.RMSNorm) else F.layer_norm
        return a + normalise(d, d.shape[-1:], eps=self.norm.eps)


class DualStreamExit(nn.Module):
    """(a, d) -> a + LN_f(d)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        a, d = state.chunk(2, dim=-1)
        return a + self.norm(d)


@register("resi_dual")
class ResiDual(NormScheme):
    Config = ResiDualConfig
    state_width = 2
    cfg: ResiDualConfig

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        return DualStreamEntry(self.cfg.dual_scale)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return DualStreamResidual(sublayer, self.norm(sublayer.d_model), self.cfg.dual_scale)

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return DualStreamExit(self.norm(d_model))
