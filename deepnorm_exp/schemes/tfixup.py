"""T-Fixup (Huang et al., 2020, "Improving Transformer Optimization Through Better Initialization"): no
LayerNorm (x_{l+1} = x_l + G(x_l), no final norm), Xavier weights with v, out, fc1, fc2 scaled:

    encoder (N layers)           0.67 N^(-1/4)
    decoder (M layers)           (9M)^(-1/4)     (decoder-only models use this rule with M = L)
    input token embeddings       std d^(-1/2) scaled by (9M)^(-1/4), M the decoder's layers

as the paper's section 3 says ("Xavier initialization for all parameters excluding input embeddings", which it
draws Gaussian N(0, d^(-1/2)) and scales): learned positions and an untied output head are not input
embeddings and keep the base draw, as in the official code. The paper names one depth for both stacks; with
two depths the shared table here takes the decoder's.

`norm.init=official` draws what the official code draws (layer6ai-labs/T-Fixup, a fairseq fork,
`fixup_initialization` in fairseq/modules/transformer_layer.py and the embeddings in fairseq/models/
transformer.py at cce506a), where the paper leaves it open or the code departs: Xavier-uniform draws; q and k
with fairseq's gain 1/sqrt(2) and v at effective gain 1 (its v is multiplied by the factor and by sqrt(2) on top
of that gain); q, k and v biases kept at nn.Linear's uniform default (out, fc1, fc2's zero); and a shared table
scaled by the encoder's (9N)^(-1/4), which its encoder always applies. By default the q, k, v draws are plain
Xavier (gain 1) with zero biases, normal, as the zoo's. The official code has no decoder-only model.
tests/test_oracles_zoo.py holds `official` to that code role by role.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import QKV_GAIN, NormScheme, SchemeConfig, Sublayer, linear_default_bias_
from .branch import PlainResidual
from .deepnorm import BETA_ROLES


@dataclass
class TFixupConfig(SchemeConfig):
    name: str = "tfixup"
    # (absent: a run stored before the key trained `paper`; learned positions and an untied head were scaled
    # then: a run with either is taken as current, the one departure)
    init: str = setting("paper", choices=("paper", "official"), absent="paper")  # paper: Xavier-normal, gain 1 | official: the official code's draws


@register("tfixup")
class TFixup(NormScheme):
    Config = TFixupConfig
    cfg: TFixupConfig

    def init_gain(self, stack: str) -> float:  # the scale of v, out, fc1, fc2
        layers = self.depths[stack]
        return 0.67 * layers ** -0.25 if stack == "encoder" else (9 * layers) ** -0.25

    def gain(self, role: str, stack: str, layer: int) -> float:
        return self.init_gain(stack) if role in BETA_ROLES else 1.0

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        if self.cfg.init == "paper":
            return super().init_sublayer(sublayer, stack, layer)
        for role, weight, bias in sublayer.projections():
            gain = QKV_GAIN if role in ("q", "k") else self.gain(role, stack, layer)
            nn.init.xavier_uniform_(weight, gain=gain)
            if bias is not None and role in ("q", "k", "v"):  # what a fresh nn.Linear(d, d) draws
                linear_default_bias_(bias, weight.shape[1])
            elif bias is not None:
                bias.zero_()

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return PlainResidual(sublayer)

    @torch.no_grad()
    def init_embedding(self, weight: torch.Tensor, stack: str, role: str) -> None:
        super().init_embedding(weight, stack, role)
        if role == "tokens":
            table_of = "encoder" if self.cfg.init == "official" and "encoder" in self.depths else "decoder"
            weight.mul_((9 * self.depths.get(table_of, self.depths[stack])) ** -0.25)
