"""Admin (Liu et al., 2020, "Understanding the Difficulty of Training Transformers", arXiv 2004.08249):
Post-LN with the residual scaled by omega, x_{l+1} = LN(omega_l * x_l + G(x_l)), omega set at init so that
each block's dependency on its residual branch matches what Pre-LN's would be.

  norm.omega=profile (default): one forward pass before training (on a training batch) sets the omegas
      bottom to top, per stack, as the official code's profiling does (LiyuanLucasLiu/Transformer-Clinic,
      fairseq/fairseq/modules/transformer_layer.py at 70f72b7, `adaptive-profiling`): r = 1; for each
      sublayer k, with input x_k, omega_k = r, then r = sqrt(Var[omega_k x_k] + Var[G_k(x_k)]), the
      variances over every element (padding included, the population's), and the pass goes on with omega_k
      applied: r tracks the standard deviation a Pre-LN residual stream would have reached, its input's
      variance counted as measured. The paper writes omega_i = sqrt(sum_{j<i} Var[f_j]), which leaves omega_1
      at 0 and the input out; the code's recursion is the one that runs, so it is the one here.
  norm.omega=closed_form: admin-torch's constant (`calculate_init`, its default 'O(log n)' output change),
      omega = sqrt((n + 1) / log(n + 1) - 1) for n residual sublayers in the stack (2 per decoder-only or
      encoder layer, 3 per encoder-decoder decoder layer). No profiling pass.

  norm.omega_param=vector (default): omega is a D-dimensional vector, trained, as in the paper ("omega_i is a
      D-dimension vector") and Transformer-Clinic (`nn.Parameter(torch.ones(d))` filled with the profiled value);
      =scalar: a fixed scalar buffer, admin-torch's default (`as_module`).

Departures, documented: the profiling pass runs in eval mode, so without dropout (the official one runs in
training mode with dropout on; equal at the project's default dropout 0), because a resumed run profiles again
and must reach the same theta_0 exactly; the official model's fused q/k/v init and ReLU are the zoo's Xavier
and GELU. The profiled omegas are in the checkpoint (as parameters or buffers): a resumed run profiles, then
loads them. tests/test_oracles_zoo.py holds the profile, the block and the closed form to the official code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..config import setting
from . import register
from .base import NormedConfig
from .post import PostNorm


@dataclass
class AdminConfig(NormedConfig):
    name: str = "admin"
    omega: str = setting("profile", choices=("profile", "closed_form"))  # profile | closed_form
    # vector: a trained D-dim vector (paper, Transformer-Clinic) | scalar: a fixed buffer
    omega_param: str = setting("vector", choices=("vector", "scalar"))


class AdminResidual(nn.Module):
    """LN(omega * x + G(x)); omega a trained (d,) parameter or a fixed scalar buffer, set by the scheme."""

    def __init__(self, sublayer: nn.Module, norm: nn.Module, omega: float, trained: bool):
        super().__init__()
        self.sublayer, self.norm = sublayer, norm
        if trained:
            self.omega = nn.Parameter(torch.full((sublayer.d_model,), float(omega)))
        else:
            self.register_buffer("omega", torch.tensor(float(omega)))

    def forward(self, x, *args, **kwargs):
        return self.norm(self.omega * x + self.sublayer(x, *args, **kwargs))


def population_variance(t: torch.Tensor) -> float:
    """Over every element, in fp64 (the official code takes numpy's var of the flattened tensor)."""
    return float(t.detach().double().var(correction=0))


@register("admin")
class Admin(PostNorm):
    Config = AdminConfig
    cfg: AdminConfig

    def closed_form(self, stack: str) -> float:
        n = self.residual_adds(stack)
        return math.sqrt((n + 1) / math.log(n + 1) - 1)

    def residual_multiplier(self, stack: str) -> float:  # omega: closed form, or 1 before profiling
        return self.closed_form(stack) if self.cfg.omega == "closed_form" else 1.0

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return AdminResidual(sublayer, self.norm(sublayer.d_model), self.residual_multiplier(stack),
                             trained=self.cfg.omega_param == "vector")

    @torch.no_grad()
    def prepare(self, model: nn.Module, batch: dict) -> None:
        if self.cfg.omega == "profile":
            profile(model, batch)


@torch.no_grad()
def profile(model: nn.Module, batch: dict) -> None:
    """One eval-mode pass of `batch` setting every block's omega as it is reached (see the module docstring)."""
    scale: dict[str, float] = {}  # r per stack: the std a Pre-LN stream would have reached
    input_variance: dict[str, float] = {}

    def entering(stack, block, args):
        block.omega.fill_(scale.get(stack, 1.0))
        input_variance[stack] = population_variance(block.omega * args[0])

    def leaving(stack, sublayer, args, output):
        scale[stack] = math.sqrt(input_variance[stack] + population_variance(output))

    hooks = []
    for stack, _, _, block in model.residual_blocks():
        hooks.append(block.register_forward_pre_hook(lambda b, args, stack=stack: entering(stack, b, args)))
        hooks.append(block.sublayer.register_forward_hook(
            lambda s, args, out, stack=stack: leaving(stack, s, args, out)))
    was_training = model.training
    try:
        model.eval()
        model.loss(batch)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
