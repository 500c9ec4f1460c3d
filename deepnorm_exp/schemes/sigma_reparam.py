"""sigma-Reparam (Zhai et al., 2023, "Stabilizing Transformer Training by Preventing Attention Entropy
Collapse", arXiv 2303.06296): every linear map of every sublayer uses W_hat = (gamma / sigma(W)) W, sigma(W)
its spectral norm estimated by power iteration, gamma a learned scalar. On Pre-LN (`norm.base=pre`, default)
or Post-LN (`norm.base=post`). Implemented as a torch parametrization.

As the official code (apple/ml-sigma-reparam, vision/layers.py at fea4e35, which its README says the language
and translation runs used too): the first sigma and singular vector u come from an SVD and gamma starts at that
sigma (W_hat = W at init); every forward, in training and in eval, takes one power-iteration step from the
stored u, v = N(W u), u' = N(W^T v), and divides by sigma = v^T W u' (the gradient flows through W, not the
vectors). Training keeps u'; eval does not. Kept once per optimizer step (`after_optimizer_step`), not when the
forward runs: a forward that runs again before the step (activation checkpointing's recompute, a metric reading
the weights) then computes the same sigma instead of stepping u twice, and an evaluation between steps moves
nothing. The official code keeps u' at every training forward, so with gradient accumulation
(`train.micro_batch_size`) it steps once per micro-batch, here once per optimizer step (the paper's "one step
per training step").

`norm.qkv`: `split` (default) reparametrizes q, k and v, which share one fused weight here, as three matrices,
each with its own sigma and gamma (the paper's W_Q, W_K, W_V); `fused`, as the official code's fused
in-projection, one matrix (3d x d), one sigma, one gamma (likewise cross-attention's k, v). `norm.init`: the
zoo's Xavier (`xavier`) or the official `trunc_normal(std 0.02)` weights with torch's default uniform biases
(`official`). tests/test_oracles_zoo.py holds the step, the eval path and both groupings to the official code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from ..config import setting
from . import register
from .base import Sublayer, linear_default_bias_
from .post_or_pre import PostOrPre, PostOrPreConfig

OFFICIAL_STD = 0.02  # vision/layers.py's SNLinear init: trunc_normal_(std=0.02)


class SigmaReparam(nn.Module):
    """Parametrization of a (groups * rows, cols) weight as `groups` stacked matrices, each gamma/sigma * W."""

    def __init__(self, weight: torch.Tensor, groups: int):
        super().__init__()
        self.groups = groups
        mats = weight.detach().reshape(groups, -1, weight.shape[1])
        _, s, vh = torch.linalg.svd(mats, full_matrices=False)
        self.register_buffer("u", vh[:, 0].clone())  # right singular vector per matrix, (groups, cols)
        # the last training forward's step, kept by `keep_step` (not saved: a checkpoint is taken after a step)
        self.register_buffer("u_next", vh[:, 0].clone(), persistent=False)
        self.gamma = nn.Parameter(s[:, 0].clone())

    def sigma(self, mats: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            v = F.normalize(torch.einsum("grc,gc->gr", mats, self.u), dim=1)
            u = F.normalize(torch.einsum("grc,gr->gc", mats, v), dim=1)
            if self.training:
                self.u_next.copy_(u)
        return torch.einsum("gr,grc,gc->g", v, mats, u)  # gradient flows through W, not the vectors

    @torch.no_grad()
    def keep_step(self) -> None:
        self.u.copy_(self.u_next)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        mats = weight.reshape(self.groups, -1, weight.shape[1])
        return ((self.gamma / self.sigma(mats))[:, None, None] * mats).reshape(weight.shape)


def reparametrize(sublayer: nn.Module, split: bool) -> None:
    """sigma-Reparam on every nn.Linear of `sublayer`; with `split`, fused projections count their matrices
    by role."""
    roles: dict[int, int] = {}
    for _, weight, _ in sublayer.projections():
        base = weight._base if weight._base is not None else weight
        roles[id(base)] = roles.get(id(base), 0) + 1
    for module in list(sublayer.modules()):
        if isinstance(module, nn.Linear):
            groups = roles.get(id(module.weight), 1) if split else 1
            parametrize.register_parametrization(module, "weight", SigmaReparam(module.weight, groups))


@dataclass
class SigmaReparamConfig(PostOrPreConfig):
    name: str = "sigma_reparam"
    # (absent: a run stored before this key and `init` trained split and xavier; its eval-time sigma was the
    # stored vector's, which moves eval loss, not training)
    qkv: str = setting("split", choices=("split", "fused"), absent="split")  # split: q, k, v three matrices | fused: one, as the official code
    # xavier | official: trunc_normal(std 0.02), torch's default biases
    init: str = setting("xavier", choices=("xavier", "official"), absent="xavier")


@register("sigma_reparam")
class SigmaReparamScheme(PostOrPre):
    Config = SigmaReparamConfig
    cfg: SigmaReparamConfig
    activation_factor = 1.75  # each reparametrised weight's power iteration and division save more (tests/test_preflight.py)

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        if self.cfg.init == "xavier":
            return super().init_sublayer(sublayer, stack, layer)
        for module in sublayer.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=OFFICIAL_STD)
                if module.bias is not None:
                    linear_default_bias_(module.bias, module.in_features)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        reparametrize(sublayer, self.cfg.qkv == "split")  # after init_sublayer: gamma starts at each sigma, W_hat = W
        return super().residual(sublayer, stack, layer)

    def after_optimizer_step(self, model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, SigmaReparam):
                module.keep_step()
