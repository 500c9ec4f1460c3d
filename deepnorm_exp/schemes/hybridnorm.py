"""HybridNorm (Zhuo et al. 2025, "HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid
Normalization", arXiv 2503.04598; code: github.com/BryceZhuo/HybridNorm, dense_model/olmo/model.py at
f0dd605): attention with normalised q, k and v and no norm on its input, then the FFN Post-Norm style,
its residual taken from the normalised stream:

    x' = x + Attn(x),   q, k, v each normalised per head (head_dim wide, one gain shared by the heads)
    h = N(x'),  x_{l+1} = h + FFN(h)
    a final norm before the head

HybridNorm* (`norm.pre_first=true`) makes block 0 Pre-Norm for both sublayers, its q, k, v norms kept (the
README's `norm_pos_special_config` for layer 0). The cross-attention of an encoder-decoder is treated as the
self-attention (the paper's models are decoders). Not ported: its truncated-normal init (std 0.014, out and
fc2 over sqrt(2 L)); here the zoo's Xavier-normal. `model.qk_norm` puts its norms where this scheme's q and k norms sit: with
it set, q and k take the mitigation's kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from . import register
from .base import NormedConfig, Sublayer
from .branch import PlainResidual
from .pre import PreNorm, PreNormResidual


@dataclass
class HybridNormConfig(NormedConfig):
    pre_first: bool = False  # true: HybridNorm*, block 0 Pre-Norm in both sublayers (its q, k, v norms kept)


class NormedStreamResidual(nn.Module):
    """h + G(h) with h = N(x): the stream is normalised, and the residual carries the normalised value."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm

    def forward(self, x, *args, **kwargs):
        h = self.norm(x)
        return h + self.sublayer(h, *args, **kwargs)


@register("hybridnorm")
class HybridNorm(PreNorm):
    Config = HybridNormConfig

    def residual(self, sublayer: Sublayer, stack: str, layer: int) -> nn.Module:
        if sublayer.kind != "ffn":
            self._normalise_qkv(sublayer)
        if self.cfg.pre_first and layer == 0:
            return PreNormResidual(sublayer, self.norm(sublayer.d_model))
        if sublayer.kind == "ffn":
            return NormedStreamResidual(sublayer, self.norm(sublayer.d_model))
        return PlainResidual(sublayer)

    def _normalise_qkv(self, attention: nn.Module) -> None:
        head_dim = attention.d_model // attention.n_heads
        if isinstance(attention.q_norm, nn.Identity):  # else model.qk_norm put its norms in the same place: kept
            attention.q_norm, attention.k_norm = self.norm(head_dim), self.norm(head_dim)
        attention.v_norm = self.norm(head_dim)
