"""Depth-muP (Yang et al., 2023, "Tensor Programs VI: Feature Learning in Infinite-Depth Neural Networks";
Bordelon et al., 2023): CompleteP's rule at alpha = 1/2 (schemes/completep.py), on Pre-LN:
x_{l+1} = x_l + G(LN(x_l)) / sqrt(L / base_depth), with its Adam rules on as the paper's Adam setting and the
official recipe have them (EleutherAI/nanoGPT-mup, completep branch at 6f8bc3b,
completep_examples/.../depth_alpha_05/run.sh: both on, and no switch for one without the other): the blocks'
learning rate x sqrt(base_depth / L) (`norm.lr_rule`), their Adam epsilon x sqrt(base_depth / L)
(`norm.eps_rule`; the official code scales the one global epsilon, see completep.py). Off, each is the
official code's `mup_disable_hidden_lr_scaling` path in part.

Where the official model differs and is not offered: under muP its attention logits are q.k / d_head, not
/ sqrt(d_head) (a width rule; this harness does not scale width), and its init is N(0, 0.02) (the zoo's is
Xavier; neither has a depth factor)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import setting
from . import register
from .completep import DEPTH_ALPHA, CompleteP, CompletePConfig


@dataclass
class DepthMuPConfig(CompletePConfig):
    name: str = "depth_mup"
    depth_alpha: float = setting(0.5, check=DEPTH_ALPHA)  # the branch multiplier is (L / base_depth)^-depth_alpha


@register("depth_mup")
class DepthMuP(CompleteP):
    Config = DepthMuPConfig
