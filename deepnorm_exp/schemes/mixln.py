"""Mix-LN (Li et al., 2024, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and
Post-LN", arXiv 2412.13795): Post-LN in the first layers of each stack, Pre-LN in the rest, and a final norm
on every stack's output. `norm.post_layers` sets how many layers are Post-LN; null takes
`norm.post_fraction` (0.25, the paper's best) of the stack, rounded down.

As the official code (pixeli99/MixLN, peft_pretraining/modeling_llama.py at ff45826: the `post_pre` layers
and LlamaModel's final RMSNorm) the final norm is applied even when every layer is Post-LN, so
`norm.post_layers` equal to the depth is Post-LN with one more norm on top (tests/test_oracles_zoo.py holds
the stack to that code). The official code counts the Post-LN layers with an integer (POST_NUM, 1 when unset;
3 of 12 and 6 of 24 in its scripts), which `post_layers` sets; its norms are RMSNorm (`norm.layer=rmsnorm`,
`model.norm_eps=1e-6`), its init N(0, 0.02) where the zoo keeps Xavier, as for every scheme without an init
rule of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from ..config import Rule, setting
from . import register
from .base import NormedConfig, NormScheme
from .post import PostNormResidual
from .pre import PreNormResidual


AT_LEAST_ZERO = Rule(lambda v: v >= 0, "must be >= 0")


@dataclass
class MixLNConfig(NormedConfig):
    name: str = "mixln"
    post_layers: Optional[int] = setting(None, check=AT_LEAST_ZERO, null="post_fraction")  # Post-LN layers at the bottom of each stack (null: post_fraction of it)
    post_fraction: float = setting(0.25, check="unit_interval")  # the share of each stack in Post-LN when post_layers is null



@register("mixln")
class MixLN(NormScheme):
    Config = MixLNConfig
    cfg: MixLNConfig

    def post_layers(self, stack: str) -> int:
        layers = self.depths[stack]
        wanted = self.cfg.post_layers if self.cfg.post_layers is not None else int(self.cfg.post_fraction * layers)
        return min(wanted, layers)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        if layer < self.post_layers(stack):
            return PostNormResidual(sublayer, self.norm(sublayer.d_model))
        return PreNormResidual(sublayer, self.norm(sublayer.d_model))

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        return self.norm(d_model)
