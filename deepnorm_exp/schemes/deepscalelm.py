"""DeepScaleLM (Kedia, Zaidi, Khyalia, Jung, Goka, Lee, 2024, "Transformers Get Stable: An End-to-End Signal
Propagation Theory for Language Models", ICML 2024; code: github.com/akhilkedia/TranformersGetStable at 7f48e64):
every residual add keeps the stream's second moment at 1, and the init makes every branch output's moment 1.

    Pre-LN  (`norm.base=pre`, default)   x <- lambda x + beta G(LN(x)), a final LN
    Post-LN (`norm.base=post`)           x <- LN(lambda x + beta G(x))
    lambda^2 + beta^2 = 1,  beta^2 = k / N,  N the residual adds of the stack (2 per decoder-only layer, 3 per
    encoder-decoder decoder layer), k = `norm.k` (2: beta^2 = 1 / L in a decoder, what the official code's
    defaults give at its 192 layers: beta^2 = 0.005)

Init, each draw N(0, std^2) with biases 0, d = d_model, p = the sublayer's dropout (fc2: times the hidden
activation's keep rate, `model.activation_dropout`, in 1 - p):
    q, k         std = d^-1/2                      (unit-variance queries and keys)
    v, out       std = ((1 - p)^1/2 / (r^1/2 d))^1/2 each, r = `norm.token_correlation`
    fc1          std = d^-1/2                      (unit-variance pre-activations)
    fc2          std = ((1 - p) / (mu2 d_ff))^1/2, mu2 = E[gelu(z)^2] = 0.4252 for z ~ N(0, 1)
                 (`model.ffn=swiglu`: E[silu(z)^2] = 0.3558)
    embeddings   second moment 1/2 per coordinate after the sqrt(d) scale: with the sinusoidal table's 1/2
                 their sum enters the first block with moment 1 (learned positions, unscaled, add about 0)
Where this departs from the official code (a Megatron BERT built to plot signal propagation) and why:
- beta^2 there is two command-line constants (0.995, 0.005), not computed from depth; here k / N.
- Its FFN is ReLU, with the moment split evenly between fc1 and fc2 (std ((1 - p) / 2)^1/4 / d^1/2 each for
  d_ff = 4d); the project's FFN is GELU, whose second moment depends on its input's scale, so fc1 keeps the
  input's unit variance and fc2 carries the GELU factor (the authors' simulations/gelu.py gives the moment).
- Its r, the correlation between the tokens attention averages, is predicted per layer by a recursion that
  starts from a statistic of its corpus (0.221 for BERT's Wikipedia); here one constant r for every layer,
  default 1 (the fully correlated bound: the smallest v, out draws).
- Its tied output head is a dense map, ReLU and LayerNorm, then times 1/sqrt(0.3 d), plus a bias on the logits;
  here the head is the project's (unit-moment hidden states give logits of moment about 1/2 with these
  embeddings).
- Its Post-LN (Megatron's `--apply-residual-connection-post-layernorm`) normalises each layer's input and takes
  the residual from that output, so the embedding passes through a LayerNorm before block 0 (2L + 1 norms); the
  paper's LN(lambda x + beta G(x)) has none there. `norm.embedding_norm=true` (with `norm.base=post`) adds it:
  tests/test_oracles_zoo.py holds both bases to that layer's forward, the norm on or off.
- Its embeddings are three tables (words, learned positions, token types) of moment (1 - p) / 3 each, unscaled,
  the (1 - p) undoing the embedding dropout; here tokens and sinusoids give 1/2 each, not compensated.
- Its dropout p is the one `hidden_dropout` everywhere; here each sublayer's own output dropout (fc2's also the
  hidden activation's). Its query and key share one per-head interleaved weight (a layout, not a rule).
- Its encoder-decoder path adds cross-attention without lambda and beta (and with an init that is not applied);
  the 3 residual adds per encoder-decoder decoder layer here have no official counterpart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..config import Rule, setting
from ..errors import ConfigError
from . import register
from .base import Sublayer
from .branch import BranchScaledResidual
from .post import PostNormResidual
from .post_or_pre import PostOrPre, PostOrPreConfig

# The FFN activation's second moment on unit-variance input (tests/test_zoo.py integrates them): gelu's
# E[gelu(z)^2]; swiglu's E[u^2 silu(v)^2] = E[silu(z)^2], u and v independent
ACTIVATION_SECOND_MOMENT = {"gelu": 0.4252, "swiglu": 0.3558}


POSITIVE_K = Rule(lambda v: math.isfinite(v) and v > 0, "must be a positive number (beta^2 = k / N)")
CORRELATION = Rule(lambda v: 0 < v <= 1, "must lie in (0, 1]")


@dataclass
class DeepScaleLMConfig(PostOrPreConfig):
    name: str = "deepscalelm"
    k: float = setting(2.0, check=POSITIVE_K)  # beta^2 = k / N, N the stack's residual adds
    token_correlation: float = setting(1.0, check=CORRELATION)  # r, the correlation of the tokens attention averages (v and out draws)
    # base=post: a LayerNorm on the embedding before block 0, as the official code
    embedding_norm: bool = setting(False, absent=False)

    def __post_init__(self):
        super().__post_init__()
        if self.embedding_norm and self.base != "post":
            raise ConfigError("embedding_norm", self.embedding_norm, "only with norm.base=post (the official Post-LN's)")


class ScaledPostNormResidual(PostNormResidual):
    """LN(lambda x + beta G(x))."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, alpha: float, beta: float):
        super().__init__(sublayer, norm, alpha)
        self.beta = beta

    def forward(self, x, *args, **kwargs):
        return self.norm(self.alpha * x + self.beta * self.sublayer(x, *args, **kwargs))


class ScaledPreNormResidual(BranchScaledResidual):
    """lambda x + beta G(LN(x))."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, alpha: float, beta: float):
        super().__init__(sublayer, norm, beta, learnable=False)
        self.alpha = alpha

    def forward(self, x, *args, **kwargs):
        return self.alpha * x + self.scale * self.sublayer(self.norm(x), *args, **kwargs)


@register("deepscalelm")
class DeepScaleLM(PostOrPre):
    Config = DeepScaleLMConfig
    cfg: DeepScaleLMConfig

    def branch_multiplier(self, stack: str) -> float:  # the paper's beta
        return math.sqrt(self.cfg.k / self.residual_adds(stack))

    def residual_multiplier(self, stack: str) -> float:  # the paper's lambda
        return math.sqrt(1 - self.branch_multiplier(stack) ** 2)

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        return self.norm(d_model) if self.cfg.embedding_norm else nn.Identity()

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        cls = ScaledPostNormResidual if self.cfg.base == "post" else ScaledPreNormResidual
        return cls(sublayer, self.norm(sublayer.d_model), self.residual_multiplier(stack),
                   self.branch_multiplier(stack))

    def role_std(self, role: str, sublayer: Sublayer) -> float:
        d, keep = sublayer.d_model, 1 - sublayer.drop.p
        if role in ("q", "k", "fc1"):
            return d ** -0.5
        if role in ("v", "out"):
            return (math.sqrt(keep / self.cfg.token_correlation) / d) ** 0.5
        keep *= 1 - sublayer.activation_drop.p  # the hidden activation's dropout scales its moment too
        return (keep / (ACTIVATION_SECOND_MOMENT[sublayer.activation_kind] * sublayer.inner_width)) ** 0.5  # fc2

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        for role, weight, bias in sublayer.projections():
            nn.init.normal_(weight, std=self.role_std(role, sublayer))
            if bias is not None:
                bias.zero_()

    @torch.no_grad()
    def init_embedding(self, weight: torch.Tensor, stack: str, role: str) -> None:
        nn.init.normal_(weight, std=(2 * weight.shape[1]) ** -0.5)
