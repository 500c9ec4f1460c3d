"""sigma-Reparam (Zhai et al., 2023, "Stabilizing Transformer Training by Preventing Attention Entropy
Collapse", arXiv 2303.06296): every linear map of every sublayer uses W_hat = (gamma / sigma(W)) W, sigma(W)
its spectral norm estimated by one power-iteration step per forward in training mode (the singular vector
is a buffer, carried across steps; eval mode reuses it), gamma a learned scalar initialised to sigma(W) at
init (so W_hat = W at the start; the first sigma and vector come from an SVD). q, k and v share one fused
weight here but are reparametrized as three matrices, each with its own sigma and gamma. On Pre-LN
(`norm.base=pre`, default) or Post-LN (`norm.base=post`). Implemented as a torch parametrization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from . import register
from .post_or_pre import PostOrPre, PostOrPreConfig


class SigmaReparam(nn.Module):
    """Parametrization of a (groups * rows, cols) weight as `groups` stacked matrices, each gamma/sigma * W."""

    def __init__(self, weight: torch.Tensor, groups: int):
        super().__init__()
        self.groups = groups
        mats = weight.detach().reshape(groups, -1, weight.shape[1])
        _, s, vh = torch.linalg.svd(mats, full_matrices=False)
        self.register_buffer("u", vh[:, 0].clone())  # right singular vector per matrix, (groups, cols)
        self.gamma = nn.Parameter(s[:, 0].clone())

    def sigma(self, mats: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            v = F.normalize(torch.einsum("grc,gc->gr", mats, self.u), dim=1)
            if self.training:  # one power-iteration step per forward
                self.u.copy_(F.normalize(torch.einsum("grc,gr->gc", mats, v), dim=1))
        return torch.einsum("gr,grc,gc->g", v, mats, self.u)  # gradient flows through W, not the vectors

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        mats = weight.reshape(self.groups, -1, weight.shape[1])
        return ((self.gamma / self.sigma(mats))[:, None, None] * mats).reshape(weight.shape)


def reparametrize(sublayer: nn.Module) -> None:
    """sigma-Reparam on every nn.Linear of `sublayer`: fused projections count their matrices by role."""
    roles: dict[int, int] = {}
    for _, weight, _ in sublayer.projections():
        base = weight._base if weight._base is not None else weight
        roles[id(base)] = roles.get(id(base), 0) + 1
    for module in list(sublayer.modules()):
        if isinstance(module, nn.Linear):
            groups = roles.get(id(module.weight), 1)
            parametrize.register_parametrization(module, "weight", SigmaReparam(module.weight, groups))


@dataclass
class SigmaReparamConfig(PostOrPreConfig):
    name: str = "sigma_reparam"


@register("sigma_reparam")
class SigmaReparamScheme(PostOrPre):
    Config = SigmaReparamConfig
    activation_factor = 1.75  # each reparametrised weight's power iteration and division save more (tests/test_preflight.py)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        reparametrize(sublayer)  # after init_sublayer: gamma starts at each matrix's sigma, so W_hat = W
        return super().residual(sublayer, stack, layer)
