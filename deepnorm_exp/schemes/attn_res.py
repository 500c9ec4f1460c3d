"""Block Attention Residuals (Kimi Team 2026, "Attention Residuals", arXiv 2603.15031): each sublayer reads a
softmax-weighted mix of earlier representations in place of the residual sum, over depth instead of over
tokens:

    h = sum_i a_i v_i,  a = softmax_i(w . RMSNorm(v_i)),  out = G(LN(h))

w a learned pseudo-query per sublayer (d wide, 0 at init: uniform weights), v_i the sources. Block AttnRes,
the paper's practical form: the stack's layers fall into blocks of k = ceil(L / `norm.blocks`) layers (the
paper's N of about 8); the sources of a sublayer are the completed blocks b_0 .. b_(n-1) (b_0 the embedding,
b_j the sum of block j's sublayer outputs) and the running sum of the current block, to which its output
is then added. With N >= L every layer is its own block.

The reference is the official repository's PyTorch-style pseudocode (MoonshotAI/Attention-Residuals README;
read here from a fork carrying it, hundong2/Attention-Residuals at 995b625, as the official repository is not
reachable; tests/test_oracles_attn_res.py transcribes it), read with layers counted from 0: the sources start
as [embedding], and a block boundary comes before layer l's attention sublayer when l % k == 0, after its
sources are read (so the embedding is block 0 and every block of k layers follows). What the pseudocode does
not show, and this reading: the pseudo-query starts at 0 (the paper's); the stack's output is one more depth
attention over all its blocks with its own query, then the final norm; the sublayer's own norm is the
configured kind (RMSNorm by default, Kimi Linear's), the keys' norm always an RMSNorm with a learned gain.
The per-sublayer form (Full AttnRes, O(L d) state) is not offered: its state at depth 100 would be 201 streams.

The state between blocks packs [running sum | b_0 | b_1 | ...] on the last dimension, zero in block slots
not yet filled (which slots a block reads is fixed by its position); blocks offer `hidden_state`, the sum of
everything (what a plain residual stream of the same outputs would hold), to what measures them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import NORM_LAYERS, NormedConfig
from .pre import PreNorm


@dataclass
class AttnResConfig(NormedConfig):
    layer: str = setting("rmsnorm", choices=NORM_LAYERS)  # layernorm | rmsnorm: the sublayers' norm (Kimi Linear's)
    blocks: int = setting(8, check="positive_int")  # N: a stack's layers fall into blocks of ceil(L / N) layers


def depth_attention(sources: torch.Tensor, query: torch.Tensor, key_norm: nn.Module) -> torch.Tensor:
    """(..., n, d) sources -> (..., d): softmax over the n of query . RMSNorm(source), the sources so weighted."""
    weights = (key_norm(sources) @ query).softmax(-1)
    return torch.einsum("...n,...nd->...d", weights, sources)


def block_layers(depth: int, blocks: int) -> int:
    """k: the layers of one block."""
    return math.ceil(depth / blocks)


def block_slots(depth: int, blocks: int) -> int:
    """Completed blocks at the stack's end, the embedding's included: one per boundary (l = 0, k, 2k, ...)."""
    return math.ceil(depth / block_layers(depth, blocks))


class DepthSources(nn.Module):
    """Reads the packed state (..., (1 + slots) d): the running sum and the block slots."""

    slots: int

    def unpack(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        packed = state.unflatten(-1, (1 + self.slots, -1))
        return packed[..., 0, :], packed[..., 1:, :]

    def hidden_state(self, state: torch.Tensor) -> torch.Tensor:
        """What per-block measures read: the running sum plus every completed block (unfilled slots are 0)."""
        return state.unflatten(-1, (1 + self.slots, -1)).sum(-2)


class BlocksEntry(DepthSources):
    """e -> [e | 0 ...]: the embedding is the running sum until the first boundary makes it block 0."""

    def __init__(self, slots: int):
        super().__init__()
        self.slots = slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x.new_zeros(*x.shape[:-1], self.slots * x.shape[-1])], dim=-1)


class BlockAttentionResidual(DepthSources):
    """One sublayer: h from the `live` completed blocks and the running sum; at a `boundary` (a block's first
    sublayer) the running sum becomes block `live` and the output starts the next; else it adds to the sum."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, slots: int, live: int, boundary: bool, eps: float):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        self.slots, self.live, self.boundary = slots, live, boundary
        self.query = nn.Parameter(torch.zeros(sublayer.d_model))
        self.key_norm = nn.RMSNorm(sublayer.d_model, eps=eps)

    def forward(self, state, *args, **kwargs):
        partial, blocks = self.unpack(state)
        sources = torch.cat([blocks[..., :self.live, :], partial.unsqueeze(-2)], dim=-2)
        out = self.sublayer(self.norm(depth_attention(sources, self.query, self.key_norm)), *args, **kwargs)
        if self.boundary:
            blocks = torch.cat([sources, blocks[..., self.live + 1:, :]], dim=-2)
            partial = out
        else:
            partial = partial + out
        return torch.cat([partial.unsqueeze(-2), blocks], dim=-2).flatten(-2)


class BlocksExit(DepthSources):
    """The stack's output: a depth attention over every block and the last running sum, then the final norm."""

    def __init__(self, norm: nn.Module, d_model: int, slots: int, eps: float):
        super().__init__()
        self.norm, self.slots = norm, slots
        self.query = nn.Parameter(torch.zeros(d_model))
        self.key_norm = nn.RMSNorm(d_model, eps=eps)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        partial, blocks = self.unpack(state)
        sources = torch.cat([blocks, partial.unsqueeze(-2)], dim=-2)
        return self.norm(depth_attention(sources, self.query, self.key_norm))


@register("attn_res")
class AttentionResiduals(PreNorm):
    Config = AttnResConfig
    cfg: AttnResConfig

    def slots(self, stack: str) -> int:
        return block_slots(self.depths[stack], self.cfg.blocks)

    @property
    def state_width(self) -> int:
        """The running sum and the block slots of the deepest stack (what checkpointing keeps per layer)."""
        return 1 + max(self.slots(stack) for stack in self.depths)

    @property
    def block_width(self) -> float:
        """Each sublayer saves its sources (a copy for the weighted sum) and their normed keys, about 3 d a source,
        at most N + 1 of them (N blocks and the running sum), and the mix it normalises: measured per layer
        (autograd's saved floats, tests/test_preflight.py) 14 d over Pre-LN's 16.1 d at N = 1, 35 d at N = 8
        (depths 16 and 32); the estimate bounds a block's sources by N + 1 whatever the depth."""
        return 3.0 * (self.cfg.blocks + 1) + 2.0

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        return BlocksEntry(self.slots(stack))

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        k = block_layers(self.depths[stack], self.cfg.blocks)
        opens_block = sublayer.kind == "attention" and layer % k == 0
        live = math.ceil(layer / k) if sublayer.kind == "attention" else layer // k + 1
        return BlockAttentionResidual(sublayer, self.norm(sublayer.d_model), self.slots(stack), live,
                                      opens_block, self.eps)

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return BlocksExit(self.norm(d_model), d_model, self.slots(stack), self.eps)
