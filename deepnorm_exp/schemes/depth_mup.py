"""Depth-muP (Yang et al., 2023, "Tensor Programs VI: Feature Learning in Infinite-Depth Neural Networks";
Bordelon et al., 2023): CompleteP's rule at alpha = 1/2 (schemes/completep.py), on Pre-LN:
x_{l+1} = x_l + G(LN(x_l)) / sqrt(L / base_depth). Its learning-rate rule (block lr x sqrt(base_depth / L))
and CompleteP's epsilon rule are off by default here, on with `norm.lr_rule` / `norm.eps_rule`."""

from __future__ import annotations

from dataclasses import dataclass

from . import register
from .completep import CompleteP, CompletePConfig


@dataclass
class DepthMuPConfig(CompletePConfig):
    name: str = "depth_mup"
    depth_alpha: float = 0.5  # the branch multiplier is (L / base_depth)^-depth_alpha
    lr_rule: bool = False  # residual blocks' learning rate x (L / base_depth)^(depth_alpha - 1)
    eps_rule: bool = False  # residual blocks' Adam epsilon x (L / base_depth)^-depth_alpha


@register("depth_mup")
class DepthMuP(CompleteP):
    Config = DepthMuPConfig
