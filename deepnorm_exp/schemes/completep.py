"""CompleteP (Dey, Zhang, Noci, Li, Bordelon, Bergsma, Pehlevan, Hanin, Hestness, 2025, "Don't be lazy:
CompleteP enables compute-efficient deep transformers", arXiv 2505.01618), and the depth-muP it generalises.

On Pre-LN, every residual branch scaled by m^-alpha, m = L / L_base the depth multiplier (L the stack's layers,
each an attention and an FFN sublayer, L_base `norm.base_depth`, where the learning rate was tuned):

    x_{l+1} = x_l + m^-alpha G(LN(x_l))          alpha in [1/2, 1] (`norm.depth_alpha`)

alpha = 1 is CompleteP; alpha = 1/2 is depth-muP (Yang et al. 2023; Bordelon et al. 2023; `norm=depth_mup`).
The paper's Adam rules for transfer across depth (its Table 1, width fixed), each a key:
  `lr_rule`   every parameter inside a residual block (weights, biases, LN gains) trains at lr m^(alpha-1);
              embeddings and the final LN keep lr. At alpha = 1 nothing changes.
  `eps_rule`  Adam's epsilon for the residual blocks' parameters is eps m^-alpha (the rest keep eps).
Init has no depth factor (Xavier, as the zoo). Where the official code differs (EleutherAI/nanoGPT-mup, branch
completep, 6f8bc3b): it scales the one global epsilon, embeddings and final LN included (the paper scales the
blocks' only; we follow the paper), and its own default base epsilon is 1e-12 (ours: `train.adam_eps`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..config import Rule, setting
from . import register
from .base import NormedConfig
from .branch import BranchScaledResidual
from .pre import PreNorm


DEPTH_ALPHA = Rule(lambda v: 0.5 <= v <= 1.0, "must lie in [0.5, 1] (1: CompleteP, 0.5: depth-muP)")


@dataclass
class CompletePConfig(NormedConfig):
    name: str = "completep"
    depth_alpha: float = setting(1.0, check=DEPTH_ALPHA)  # the branch multiplier is (L / base_depth)^-depth_alpha; 1: CompleteP, 0.5: depth-muP
    base_depth: int = setting(1, check="positive_int")  # L_base: the depth the learning rate was tuned at
    lr_rule: bool = True  # residual blocks' learning rate x (L / base_depth)^(depth_alpha - 1)
    eps_rule: bool = True  # residual blocks' Adam epsilon x (L / base_depth)^-depth_alpha



@register("completep")
class CompleteP(PreNorm):
    Config = CompletePConfig
    cfg: CompletePConfig

    def depth_multiplier(self, stack: str) -> float:
        return self.depths[stack] / self.cfg.base_depth

    def branch_multiplier(self, stack: str) -> float:  # m^-depth_alpha
        return self.depth_multiplier(stack) ** -self.cfg.depth_alpha

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return BranchScaledResidual(sublayer, self.norm(sublayer.d_model), self.branch_multiplier(stack), learnable=False)

    def block_lr_factor(self, stack: str) -> float:
        return self.depth_multiplier(stack) ** (self.cfg.depth_alpha - 1) if self.cfg.lr_rule else 1.0

    def block_eps_factor(self, stack: str) -> float:
        return self.depth_multiplier(stack) ** -self.cfg.depth_alpha if self.cfg.eps_rule else 1.0

    def param_groups(self, model: nn.Module, lr: float, eps: float) -> list[dict] | None:
        if not (self.cfg.lr_rule or self.cfg.eps_rule):
            return None
        groups, seen = {}, set()
        for stack, _, _, block in model.residual_blocks():
            for p in block.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    groups.setdefault(stack, []).append(p)
        rest = [p for p in model.parameters() if id(p) not in seen]
        return [{"params": rest, "lr": lr, "eps": eps}] + [
            {"params": ps, "lr": lr * self.block_lr_factor(stack), "eps": eps * self.block_eps_factor(stack)}
            for stack, ps in groups.items()]
