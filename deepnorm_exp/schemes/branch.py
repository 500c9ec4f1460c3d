"""Residual blocks shared by several schemes: x + s * G(N(x)), with s fixed or learnable, N a norm or none; and
x + G(x), no norm and no scale."""

from __future__ import annotations

import torch
from torch import nn


class BranchScaledResidual(nn.Module):
    """x + scale * G(norm(x)). `learnable`: scale is a trained scalar (SkipInit), of shape (1,) since FSDP2's
    fully_shard refuses a 0-d parameter; else a constant, kept as a Python float so that it multiplies at the
    model's precision (an fp32 buffer would round it before an fp64 model sees it). A `scale` that is already
    a parameter is used as it is: blocks given the same one share it (ReZero's one scalar per layer)."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, scale: float | nn.Parameter, learnable: bool):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        if isinstance(scale, nn.Parameter):
            self.scale = scale
        else:
            self.scale = nn.Parameter(torch.full((1,), float(scale))) if learnable else float(scale)

    def forward(self, x, *args, **kwargs):
        return x + self.scale * self.sublayer(self.norm(x), *args, **kwargs)

    def extra_repr(self) -> str:
        kind = "learnable" if isinstance(self.scale, nn.Parameter) else "fixed"
        return f"scale={float(self.scale):.6g} ({kind})"


class PlainResidual(nn.Module):
    """x + G(x): no norm, no scale (T-Fixup's blocks; HybridNorm's attention)."""

    def __init__(self, sublayer: nn.Module):
        super().__init__()
        self.sublayer = sublayer

    def forward(self, x, *args, **kwargs):
        return x + self.sublayer(x, *args, **kwargs)
