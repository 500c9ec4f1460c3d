"""Value residual learning, ResFormer (Zhou et al. 2024, "Value Residual Learning For Alleviating Attention
Concentration In Transformers", arXiv 2410.17897): Pre-LN where every self-attention after a stack's first
attends to a mix of its own values and the first layer's,

    V'_n = l_1 V_1 + l_2 V_n    (n >= 2; V the value projection's output, before the heads attend)

l_1 = l_2 = 0.5 (`norm.first_share`, `norm.own_share`), as the official ResFormer (Zcchill/Value-Residual-
Learning 95652f6, src/modeling/modeling_llama_resformer.py: `0.5*formal_layer_values[0] + 0.5*value_states`);
the paper also tries other and learned shares, not offered here. The first layer's values ride beside the
stream: the state packs [x | V_1] (`state_width` 2), the stack's first self-attention block writes V_1 there
and the later ones read it, so activation checkpointing recomputes what a block read and the gradient reaches
the first layer's v through every later layer. Cross-attention is left as it is (the paper's models are
decoders); an encoder-decoder's two stacks each have their own first layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import NormedConfig
from .pre import PreNorm


@dataclass
class ValueResidualConfig(NormedConfig):
    first_share: float = setting(0.5, check="fraction")  # l_1: the first layer's values in every later layer's
    own_share: float = setting(0.5, check="fraction")  # l_2: the layer's own values


class ValuesEntry(nn.Module):
    """x -> [x | 0]: no values yet; the stack's first self-attention writes them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.zeros_like(x)], dim=-1)


class ValuesExit(nn.Module):
    """The stack's final norm on the stream, the values left behind."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.norm(state.chunk(2, dim=-1)[0])


class ValueMix(nn.Module):
    """A self-attention's `v_mix`, on its values (batch, heads, seq, d_head): keeps them as `seen`, and where the
    block around it has set `first` (V_1, laid out alike) returns l_1 V_1 + l_2 V instead."""

    def __init__(self, first_share: float, own_share: float):
        super().__init__()
        self.first_share, self.own_share = first_share, own_share
        self.first: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        self.seen = v
        return v if self.first is None else self.first_share * self.first + self.own_share * v


class ValueResidual(nn.Module):
    """x + G(LN(x)) on the stream half of [x | V_1]; a self-attention's block hands V_1 to its `ValueMix` (or,
    the stack's first, takes its values as V_1)."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, mix: ValueMix | None, writes_first: bool):
        super().__init__()
        self.sublayer, self.norm, self.mix, self.writes_first = sublayer, norm, mix, writes_first

    def forward(self, state, *args, **kwargs):
        x, first = state.chunk(2, dim=-1)
        if self.mix is None:
            return torch.cat([x + self.sublayer(self.norm(x), *args, **kwargs), first], dim=-1)
        heads = self.sublayer.n_heads
        self.mix.first = None if self.writes_first else first.unflatten(-1, (heads, -1)).transpose(1, 2)
        try:
            out = self.sublayer(self.norm(x), *args, **kwargs)
            if self.writes_first:
                first = self.mix.seen.transpose(1, 2).flatten(-2)
        finally:
            self.mix.first = self.mix.seen = None  # no tensor outlives the call
        return torch.cat([x + out, first], dim=-1)

    def hidden_state(self, state: torch.Tensor) -> torch.Tensor:
        """What per-block measures read: the stream, without the values beside it."""
        return state.chunk(2, dim=-1)[0]


@register("value_residual")
class ValueResidualScheme(PreNorm):
    Config = ValueResidualConfig
    cfg: ValueResidualConfig
    state_width = 2

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        return ValuesEntry()

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        mix = None
        if sublayer.kind == "attention":
            mix = sublayer.v_mix = ValueMix(self.cfg.first_share, self.cfg.own_share)
        return ValueResidual(sublayer, self.norm(sublayer.d_model), mix, writes_first=layer == 0)

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return ValuesExit(self.norm(d_model))
