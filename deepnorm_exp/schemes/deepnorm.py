"""DeepNorm (Wang et al., 2022, "DeepNet", arXiv 2203.00555).

x_{l+1} = LN(alpha * x_l + G(x_l)); at init, fc1, fc2 and the attention v and out projections are
Xavier-normal with gain beta, q and k with gain 1, biases 0. Constants, from the paper's table:

    decoder-only (M layers)       alpha = (2M)^(1/4)                beta = (8M)^(-1/4)
    encoder-only (N layers)       alpha = (2N)^(1/4)                beta = (8N)^(-1/4)
    encoder-decoder, encoder      alpha = 0.81 (N^4 M)^(1/16)       beta = 0.87 (N^4 M)^(-1/16)
    encoder-decoder, decoder      alpha = (3M)^(1/4)                beta = (12M)^(-1/4)

`constants` selects a preset; the paper's is the default:
  paper       the table above, Xavier-normal init.
  torchscale  the official code (torchscale 0.3.0): same alphas, encoder-decoder encoder beta is
              1.15 (N^4 M)^(-1/16), and beta multiplies PyTorch's default nn.Linear init (kaiming-uniform
              weights and biases) instead of a Xavier-normal draw.
  glm130b     GLM-130B (arXiv 2210.02414): alpha = (2N)^(1/2), beta = (2N)^(-1/2), one stack only.
`alpha` / `beta` set explicitly override the preset for every stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..config import setting
from ..errors import ConfigError
from . import register
from .base import NormedConfig
from .post import PostNorm

BETA_ROLES = frozenset({"v", "out", "fc1", "fc2"})  # q and k keep gain 1
PRESETS = ("paper", "torchscale", "glm130b")


@dataclass
class DeepNormConfig(NormedConfig):
    name: str = "deepnorm"
    # paper (Table 1, Xavier-normal draws) | torchscale (the official code's) | glm130b
    constants: str = setting("paper", choices=PRESETS)
    alpha: Optional[float] = setting(None, check="positive_number", null="the preset")  # a number overrides the preset's alpha for every stack
    beta: Optional[float] = setting(None, check="positive_number", null="the preset")  # a number overrides the preset's beta for every stack



def deepnorm_constants(depths: dict[str, int], stack: str, preset: str = "paper") -> tuple[float, float]:
    """(alpha, beta) for one stack, from the number of layers of every stack in the model."""
    n, m = depths.get("encoder"), depths.get("decoder")
    if preset == "glm130b":
        if len(depths) != 1:
            raise ConfigError("norm.constants", preset, "glm130b is defined for a single stack")
        layers = depths[stack]
        return (2 * layers) ** 0.5, (2 * layers) ** -0.5
    if n is not None and m is not None:  # encoder-decoder
        if stack == "encoder":
            beta_factor = 1.15 if preset == "torchscale" else 0.87
            return 0.81 * (n**4 * m) ** (1 / 16), beta_factor * (n**4 * m) ** (-1 / 16)
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    layers = depths[stack]  # encoder-only or decoder-only
    return (2 * layers) ** 0.25, (8 * layers) ** -0.25


@register("deepnorm")
class DeepNorm(PostNorm):
    Config = DeepNormConfig
    cfg: DeepNormConfig

    def residual_multiplier(self, stack: str) -> float:  # the paper's alpha
        if self.cfg.alpha is not None:
            return self.cfg.alpha
        return deepnorm_constants(self.depths, stack, self.cfg.constants)[0]

    def init_gain(self, stack: str) -> float:  # the paper's beta
        if self.cfg.beta is not None:
            return self.cfg.beta
        return deepnorm_constants(self.depths, stack, self.cfg.constants)[1]

    def gain(self, role: str, stack: str, layer: int) -> float:
        return self.init_gain(stack) if role in BETA_ROLES else 1.0

    @torch.no_grad()
    def init_sublayer(self, sublayer, stack: str, layer: int) -> None:
        if self.cfg.constants != "torchscale":
            return super().init_sublayer(sublayer, stack, layer)
        # torchscale keeps nn.Linear's default init and divides the beta roles (weights and biases) by 1/beta.
        for role, weight, bias in sublayer.projections():
            fan_in = weight.shape[1]
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            weight.mul_(self.gain(role, stack, layer))
            if bias is not None:
                bias.uniform_(-(fan_in**-0.5), fan_in**-0.5).mul_(self.gain(role, stack, layer))
