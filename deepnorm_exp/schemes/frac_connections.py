"""Frac-Connections (Zhu, Huang, Zhou et al. 2025, "Frac-Connections: Fractional Extension of Hyper-Connections",
arXiv 2503.14125): Hyper-Connections (hyper_connections.py) without widening the stream. Its d wide hidden
state is split into m fractions of d / m (H, m x d/m, `norm.fractions`), and each sublayer reads its input
fraction by fraction from mixes of all of them and writes its output's fractions back by learned weights.

The FC paper's own text could not be read here. The rule is its authors' later Generalized Hyper-Connections
(GHC; ByteDance Seed, "Virtual Width Networks", arXiv 2511.11238: section 3.3, Eqs. 5-12, and appendix B,
algorithm 2, its PyTorch-like pseudocode), which that paper says subsumes FC: GHC with as many slots as
fractions (its n = m, no widening) is FC. For each position, with h_i the i-th fraction and z_k the sublayer
output's:

    x_k = sum_i A[i, k] h_i                           the sublayer's input, fraction k   (A: m x m)
    h'_i = sum_k B[i, k] z_k + sum_j R[j, i] h_j      z = G(LN(x)), a Pre-LN branch     (B, R: m x m)
    [A | R | B] = S o tanh(N(h_i) W / sqrt(d / m)) + [A | R | B]_static      row i read from fraction i

N an RMSNorm over a fraction's d / m coordinates (with a gain), W (d/m x 3m) and S (m x 3m) learned
(`norm.dynamic=false`: the static parts alone). Init (VWN's Eqs. 11-12 at n = m, and algorithm 2): A = R = B
= I, W = 0, S = 1, so at step 0 the block is Pre-LN exactly. The `hyper-connections` package's `num_fracs`
differs (docs/schemes.md): its static write weights are one vector broadcast over the branch's fractions and
its init reads fraction 0 into every fraction of the branch input. R mixes the fractions as H_res mixes HC's
streams: blocks offer it as `stream_mixing`, with `streams` the fractions (the state needs no other view:
it is the d wide hidden state itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from ..errors import ConfigError
from . import register
from .base import NormedConfig
from .pre import PreNorm


@dataclass
class FracConnectionsConfig(NormedConfig):
    fractions: int = setting(4, check="positive_int")  # m: the parts d_model is split into (must divide it; 1: Pre-LN with learned per-token residual and branch scales)
    dynamic: bool = True  # weights read from each fraction (GHC's dynamic form); false: the static weights only


class FracConnection(nn.Module):
    """One sublayer's frac-connection, (..., d) -> (..., d). `static` is [A | R | B] (m x 3m), row i the
    weights fraction i gives or takes; `dynamic_map` (W) and `dynamic_scale` (S) exist when dynamic."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, fractions: int, dynamic: bool, eps: float):
        super().__init__()
        self.sublayer, self.norm, self.streams = sublayer, norm, fractions  # `streams`: what the instrument reads
        m, width = fractions, sublayer.d_model // fractions
        self.static = nn.Parameter(torch.eye(m).repeat(1, 3))
        self.dynamic = dynamic
        if dynamic:
            self.fraction_norm = nn.RMSNorm(width, eps=eps)
            self.dynamic_map = nn.Parameter(torch.zeros(width, 3 * m))
            self.dynamic_scale = nn.Parameter(torch.ones(m, 3 * m))
            self.temperature = math.sqrt(width)  # GHC's factor 1 / sqrt(d / m) on the map's output

    def weights(self, fractions: torch.Tensor) -> torch.Tensor:
        """[A | R | B] (..., m, 3m) for fractions (..., m, d/m); the static parts alone when not dynamic."""
        if not self.dynamic:
            return self.static
        read = self.fraction_norm(fractions) @ self.dynamic_map / self.temperature
        return self.dynamic_scale * torch.tanh(read) + self.static

    def stream_mixing(self, fractions: torch.Tensor) -> torch.Tensor:
        """R^T (..., m, m), row t the weights of the fractions that make fraction t's carried part."""
        m = self.streams
        return self.weights(fractions)[..., m:2 * m].transpose(-1, -2)

    def forward(self, state, *args, **kwargs):
        m = self.streams
        fractions = state.unflatten(-1, (m, -1))  # (..., m, d/m)
        reads, carries, writes = self.weights(fractions).split(m, dim=-1)
        x = torch.einsum("...ik,...id->...kd", reads, fractions).flatten(-2)
        out = self.sublayer(self.norm(x), *args, **kwargs).unflatten(-1, (m, -1))
        carried = torch.einsum("...it,...id->...td", carries, fractions)
        return (carried + torch.einsum("...ik,...kd->...id", writes, out)).flatten(-2)


@register("frac_connections")
class FracConnections(PreNorm):
    Config = FracConnectionsConfig
    cfg: FracConnectionsConfig

    @property
    def activation_factor(self) -> float:
        """Each connection saves its fractions, their norms, the mixed input and the carried part for the
        backward: measured per layer (autograd's saved floats, d 64, GELU, tests/test_preflight.py) Pre-LN
        16.1 d, frac-connections 24.4 / 27.3 / 72.6 d at m = 1 / 4 / 16 (static, m = 4: 22.2 d), about 4 d a
        sublayer more (3 d static) plus `block_floats`."""
        return 1.3 if self.cfg.dynamic else 1.2

    @property
    def block_floats(self) -> int:
        """The dynamic weights [A | R | B] are m x 3m for every position, and autograd keeps two such tensors a
        sublayer (the tanh's output, and A, R, B made contiguous for the einsums): 6 m^2 floats, what the
        growth from m = 4 to 16 measures (2.1 x 3 m^2); at m = d_model (64) the estimate is 1.01x autograd's.
        Static weights are shared by every position."""
        return 6 * self.cfg.fractions ** 2 if self.cfg.dynamic else 0

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        if sublayer.d_model % self.cfg.fractions:
            raise ConfigError("norm.fractions", self.cfg.fractions, f"must divide model.d_model={sublayer.d_model}")
        return FracConnection(sublayer, self.norm(sublayer.d_model), self.cfg.fractions, self.cfg.dynamic, self.eps)
