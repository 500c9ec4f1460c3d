"""DS-Init (Zhang, Titov & Sennrich, 2019, "Improving Deep Transformer with Depth-Scaled Initialization and
Merged Attention"): every projection of layer l (1-based) starts with its Xavier draw scaled by 1/sqrt(l),
on a Post-LN (the paper's setting, `norm.base=post`) or Pre-LN (`norm.base=pre`) Transformer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import register
from .post_or_pre import PostOrPre, PostOrPreConfig


@dataclass
class DSInitConfig(PostOrPreConfig):
    name: str = "dsinit"
    base: str = "post"  # the paper's setting


@register("dsinit")
class DSInit(PostOrPre):
    Config = DSInitConfig

    def gain(self, role: str, stack: str, layer: int) -> float:
        return 1.0 / math.sqrt(layer + 1)  # `layer` counts from 0
