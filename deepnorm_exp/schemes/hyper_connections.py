"""Hyper-Connections (Zhu, Huang, Zeng, Wu, Min, Qiao and Zhou 2025, "Hyper-Connections", ICLR 2025, arXiv
2409.19606; no official code; the reference here is the `hyper-connections` package, 0.4.11, which follows
the paper's appendix J, algorithm 2): the residual stream becomes n streams H (n x d, `norm.streams`, the
paper's n = 4), and each sublayer (attention, FFN) reads a weighted sum of them and writes back to each:

    h = A_m^T H                                   the sublayer's input (A_m: n x 1)
    H' = A_r^T H + B^T G(LN(h))                   G on a Pre-LN branch (B: 1 x n, A_r: n x n)

static parts plus dynamic ones read from the streams themselves (DHC, the paper's main form; `norm.dynamic=
false`: SHC, the static parts alone):

    A_m(H) = s_a tanh(N(H) W_m) + A_m,  A_r(H) = s_a tanh(N(H) W_r) + A_r,  B(H) = s_b tanh(N(H) W_b)^T + B

N a norm over each stream's d coordinates (the paper's LayerNorm; `norm.layer=rmsnorm` as the package).
Init (the paper's section 3 and the package): the k-th hyper-connection of a stack (counted over its
sublayers, bottom to top) reads stream k mod n (A_m = e_{k mod n}), A_r = I, B = 1, every W = 0, s_a = s_b =
0.01. The embedding enters as n copies; the stack's output is the streams' sum, then the final LN. The state
between blocks packs the n streams on the last dimension (stream s at s d to (s + 1) d); blocks offer
`hidden_state`, the streams' sum, to what measures them. A pitfall the tests guard: one implementation once
never applied A_r (lucidrains/hyper-connections issue 8); here A_r mixes the streams from the first step
once it has left the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import NormedConfig
from .pre import PreNorm

DYNAMIC_SCALE = 0.01  # s_a and s_b at init (the paper's and the package's)


@dataclass
class HyperConnectionsConfig(NormedConfig):
    streams: int = setting(4, check="positive_int")  # n: the residual streams (the paper's 4; 1 is Pre-LN)
    dynamic: bool = True  # DHC: weights that depend on the streams; false: SHC, static weights only


def streams_sum(state: torch.Tensor, streams: int) -> torch.Tensor:
    """(..., n d) -> (..., d): what the stack's exit normalises and per-block measures read."""
    return state.unflatten(-1, (streams, -1)).sum(-2)


class StreamsEntry(nn.Module):
    """e -> n copies of e, side by side on the last dimension."""

    def __init__(self, streams: int):
        super().__init__()
        self.streams = streams

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(*([1] * (x.dim() - 1)), self.streams)


class StreamsExit(nn.Module):
    """The streams' sum, then the stack's final norm."""

    def __init__(self, streams: int, norm: nn.Module):
        super().__init__()
        self.streams, self.norm = streams, norm

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.norm(streams_sum(state, self.streams))


class StreamsConnection(nn.Module):
    """A sublayer's connection over n packed streams (`streams`), read by per-block measures as their sum."""

    streams: int

    def hidden_state(self, state: torch.Tensor) -> torch.Tensor:
        """What per-block measures read: the streams' sum, what the stack's exit would normalise."""
        return streams_sum(state, self.streams)


class HyperConnection(StreamsConnection):
    """One sublayer's hyper-connection: (..., n d) -> (..., n d). `static_alpha` is [A_m | A_r] (n x (1 + n)),
    `static_beta` is B; the dynamic maps read the normed streams (zero at init)."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, streams: int, index: int,
                 stream_norm: nn.Module | None = None):
        """`stream_norm`: N, for the dynamic weights (DHC); None: static weights only (SHC)."""
        super().__init__()
        self.sublayer, self.norm, self.streams = sublayer, norm, streams
        reads = torch.zeros(streams, 1)
        reads[index % streams] = 1.0
        self.static_alpha = nn.Parameter(torch.cat([reads, torch.eye(streams)], dim=1))
        self.static_beta = nn.Parameter(torch.ones(streams))
        self.dynamic = stream_norm is not None
        if self.dynamic:
            d = sublayer.d_model
            self.stream_norm = stream_norm
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(d, 1 + streams))
            # one-element vectors, not scalars: FSDP2's fully_shard refuses a 0-d parameter
            self.dynamic_alpha_scale = nn.Parameter(torch.full((1,), DYNAMIC_SCALE))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(d))
            self.dynamic_beta_scale = nn.Parameter(torch.full((1,), DYNAMIC_SCALE))

    def weights(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[A_m | A_r] (..., n, 1 + n) and B (..., n) for each position."""
        if not self.dynamic:
            return self.static_alpha, self.static_beta
        normed = self.stream_norm(streams)
        alpha = self.dynamic_alpha_scale * torch.tanh(normed @ self.dynamic_alpha_fn) + self.static_alpha
        beta = self.dynamic_beta_scale * torch.tanh(normed @ self.dynamic_beta_fn) + self.static_beta
        return alpha, beta

    def stream_mixing(self, streams: torch.Tensor) -> torch.Tensor:
        """H_res (..., n, n), row t the weights of the streams that make stream t: A_r^T."""
        return self.weights(streams)[0][..., 1:].transpose(-1, -2)

    def forward(self, state, *args, **kwargs):
        streams = state.unflatten(-1, (self.streams, -1))  # (..., n, d)
        alpha, beta = self.weights(streams)
        mixed = torch.einsum("...sk,...sd->...kd", alpha, streams)  # row 0: A_m^T H; rows 1..n: A_r^T H
        out = self.sublayer(self.norm(mixed[..., 0, :]), *args, **kwargs)
        return (mixed[..., 1:, :] + beta.unsqueeze(-1) * out.unsqueeze(-2)).flatten(-2)


@register("hyper_connections")
class HyperConnections(PreNorm):
    Config = HyperConnectionsConfig
    cfg: HyperConnectionsConfig

    @property
    def state_width(self) -> int:
        return self.cfg.streams

    @property
    def activation_factor(self) -> float:
        """Each connection saves its streams, their norm and the mixed rows for the backward: measured per layer
        (autograd's saved floats, d 64, tests/test_preflight.py) Pre-LN 16.1 d, with 1 / 2 / 4 / 8 dynamic
        streams 22.4 / 26.8 / 35.9 / 55.6 d (GELU; SwiGLU 8 d more each), static 4 streams 26.1 d: about
        2.3 n d more per sublayer dynamic, half that static, what these factors on the estimate cover."""
        return 1.0 + (0.2 if self.cfg.dynamic else 0.1) * self.cfg.streams

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        return StreamsEntry(self.cfg.streams)

    def connection_index(self, sublayer: nn.Module, stack: str, layer: int) -> int:
        """k of this sublayer's hyper-connection in its stack, bottom to top: its layer's sublayers come in
        the order attention, cross-attention (an encoder-decoder's decoder), FFN."""
        order = ("attention", "cross_attention", "ffn") if stack == "decoder" and "encoder" in self.depths \
            else ("attention", "ffn")
        return layer * len(order) + order.index(sublayer.kind)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        index, d = self.connection_index(sublayer, stack, layer), sublayer.d_model
        return HyperConnection(sublayer, self.norm(d), self.cfg.streams, index,
                               self.norm(d) if self.cfg.dynamic else None)

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return StreamsExit(self.cfg.streams, self.norm(d_model))
