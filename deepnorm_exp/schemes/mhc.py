"""mHC, manifold-constrained hyper-connections (Xie, Wei et al., DeepSeek-AI 2025, arXiv 2512.24880): the n
streams of Hyper-Connections (hyper_connections.py), each sublayer's three mappings held to manifolds so that
their product over depth can neither grow nor vanish (the paper's Eqs. 3, 7-9):

    x' = H_res x + H_post^T G(LN(H_pre x))                   x: n streams of d (n x d)
    [H~_pre | H~_post | H~_res] = a * (RMSNorm(vec x) phi) + b      vec x: the streams flattened, 1 x n d
    H_pre = sigmoid(H~_pre),  H_post = 2 sigmoid(H~_post),  H_res = Sinkhorn-Knopp(H~_res)

a = (a_pre, a_post, a_res) three learned gates (one for each mapping's n, n and n^2 columns), phi (n d x
(2 n + n^2)) and b learned; Sinkhorn-Knopp starts from exp(H~_res) and normalises columns then rows,
`norm.sinkhorn_rounds` times (the paper's t_max = 20), so H_res is doubly stochastic to the rounds' precision:
its spectral norm is at most 1 and a product of them stays doubly stochastic. `norm.dynamic=false`: the
static mappings b alone. The RMSNorm has no gain (one would only rescale phi's rows).

The paper gives no init; this is the `hyper-connections` package's (0.4.11, the readable reference the
DeepSeek code is not: theirs is fused kernels): phi = 0, a = 0.01, b_pre = e_(k mod n) for the stack's k-th
sublayer, b_post = 1, b_res = I. So at step 0 the k-th sublayer reads sigmoid(1) = 0.73 of stream k and 0.5 of
every other, writes 2 sigmoid(1) = 1.46 of its output to each stream, and H_res = Sinkhorn(exp(I)) already
mixes the streams (0.475 on the diagonal at n = 4, 0.175 elsewhere). The package differs from the paper in two
places, kept here as the paper: it normalises each stream and maps it by its own row (phi block-diagonal),
where the paper's Eq. 7 normalises the n d-wide vector as a whole; and it normalises H_res's rows before its
columns (Eq. 9: columns first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .hyper_connections import HyperConnections, HyperConnectionsConfig, StreamsConnection

GATE_INIT = 0.01  # a_pre, a_post, a_res at init (the package's)


@dataclass
class ManifoldConstrainedConfig(HyperConnectionsConfig):
    sinkhorn_rounds: int = setting(20, check="positive_int")  # Sinkhorn-Knopp's column-then-row rounds (t_max)


def sinkhorn_knopp(logits: torch.Tensor, rounds: int) -> torch.Tensor:
    """exp(logits) (..., n, n) made doubly stochastic: each round divides every column by its sum, then every
    row by its (the paper's Eq. 9, M_t = T_r(T_c(M_(t-1)))). The logits' largest entry is taken off first:
    the result is the same (the normalisations cancel any common factor) and exp cannot overflow."""
    matrix = (logits - logits.amax(dim=(-2, -1), keepdim=True).detach()).exp()
    for _ in range(rounds):
        matrix = matrix / matrix.sum(dim=-2, keepdim=True)
        matrix = matrix / matrix.sum(dim=-1, keepdim=True)
    return matrix


class ManifoldConstrainedConnection(StreamsConnection):
    """One sublayer's mHC connection: (..., n d) -> (..., n d). `bias` is [b_pre | b_post | vec b_res];
    `mapping` (phi) and `gates` (a) exist when the mappings are dynamic."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, index: int, cfg: ManifoldConstrainedConfig, eps: float):
        """`index`: k, the connection's place in its stack; `cfg`: the streams, rounds and whether dynamic."""
        super().__init__()
        self.sublayer, self.norm, self.eps = sublayer, norm, eps
        self.streams, self.rounds, self.dynamic = cfg.streams, cfg.sinkhorn_rounds, cfg.dynamic
        n = self.streams
        reads = torch.zeros(n)
        reads[index % n] = 1.0
        self.bias = nn.Parameter(torch.cat([reads, torch.ones(n), torch.eye(n).flatten()]))
        if self.dynamic:
            self.mapping = nn.Parameter(torch.zeros(n * sublayer.d_model, n * (2 + n)))
            self.gates = nn.Parameter(torch.full((3,), GATE_INIT))

    def logits(self, streams: torch.Tensor) -> torch.Tensor:
        """[H~_pre | H~_post | vec H~_res] (..., 2 n + n^2) for each position (b alone when static)."""
        if not self.dynamic:
            return self.bias
        flat = streams.flatten(-2)
        normed = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + self.eps)
        n = self.streams
        # each gate over its mapping's columns (expand, not repeat_interleave with tensor counts: that syncs
        # with the device and breaks torch.compile's graph at every connection)
        gates = torch.cat([self.gates[0].expand(n), self.gates[1].expand(n), self.gates[2].expand(n * n)])
        return gates * (normed @ self.mapping) + self.bias

    def mappings(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """H_pre (..., n), H_post (..., n) and H_res (..., n, n) for streams (..., n, d)."""
        logits, n = self.logits(streams), self.streams
        pre, post, residual = logits.split([n, n, n * n], dim=-1)
        return torch.sigmoid(pre), 2 * torch.sigmoid(post), sinkhorn_knopp(residual.unflatten(-1, (n, n)),
                                                                           self.rounds)

    def stream_mixing(self, streams: torch.Tensor) -> torch.Tensor:
        """H_res (..., n, n), row t the weights of the streams that make stream t."""
        return self.mappings(streams)[2]

    def forward(self, state, *args, **kwargs):
        streams = state.unflatten(-1, (self.streams, -1))  # (..., n, d)
        pre, post, residual = self.mappings(streams)
        out = self.sublayer(self.norm(torch.einsum("...s,...sd->...d", pre, streams)), *args, **kwargs)
        mixed = torch.einsum("...ts,...sd->...td", residual, streams)
        return (mixed + post.unsqueeze(-1) * out.unsqueeze(-2)).flatten(-2)


@register("mhc")
class ManifoldConstrainedHyperConnections(HyperConnections):
    Config = ManifoldConstrainedConfig
    cfg: ManifoldConstrainedConfig

    @property
    def block_floats(self) -> int:
        """Each Sinkhorn round divides the n x n matrix by its column sums, then by its row sums: autograd keeps
        both matrices and both sums, 2 n (n + 1) floats a position a round (measured exactly: 40 at n = 4,
        tests/test_preflight.py); the static mappings' rounds are the same for every position."""
        n = self.cfg.streams
        return 2 * n * (n + 1) * self.cfg.sinkhorn_rounds if self.cfg.dynamic else 0

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return ManifoldConstrainedConnection(sublayer, self.norm(sublayer.d_model),
                                             self.connection_index(sublayer, stack, layer), self.cfg, self.eps)
