"""What flows through each residual block, measured on the probe batch with forward hooks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import Context, instrument
from .probe import PerBlockProbe


@dataclass
class ActivationsConfig:
    activations: bool = True  # per-layer ln_input_norm, out_norm, attn_entropy of every block, on the probe batch


def mean_token_norm(x: torch.Tensor) -> float:
    """Mean over positions of the L2 norm of each d_model vector."""
    return float(x.detach().float().norm(dim=-1).mean())


class ActivationStats(PerBlockProbe):
    """Every `every` steps, per residual block, on the probe batch (eval mode, no gradients):

    * `ln_input_norm`: norm of what enters the block's LayerNorm (Post-LN/DeepNorm: the residual sum
      alpha*x + G(x); Pre-LN: the residual stream x). A LayerNorm's output has norm sqrt(d_model); the
      paper's argument is that ||dLN(x)/dx|| = O(sqrt(d)/||x||). NaN for a block without a norm.
    * `out_norm`: norm of the sublayer's output G(.).
    * `attn_entropy`: entropy (nats) of the attention weights, mean over heads, batch and query positions
      (a causal query i can reach at most log(i+1)); NaN for FFN blocks.

    Also measured once before training (recorded as step 0), the init the paper's figures start from.
    Hooks live only during the one probe forward, so other steps pay nothing.
    """

    MEASURES = ("ln_input_norm", "out_norm", "attn_entropy")

    def hooks(self, values: dict) -> list:
        handles = []
        for i, block in enumerate(self.index.blocks):
            norm = getattr(block, "norm", None)
            if isinstance(norm, nn.Module) and not isinstance(norm, nn.Identity):
                handles.append(norm.register_forward_pre_hook(self._store(values["ln_input_norm"], i)))
            handles.append(block.sublayer.register_forward_hook(self._sublayer_hook(values, i), with_kwargs=True))
        return handles

    @staticmethod
    def _store(into: list, i: int):
        def hook(module, args):
            into[i] = mean_token_norm(args[0])
        return hook

    @staticmethod
    def _sublayer_hook(values: dict, i: int):
        def hook(module, args, kwargs, output):
            values["out_norm"][i] = mean_token_norm(output)
            if hasattr(module, "attention_probs"):
                probs = module.attention_probs(*args, **kwargs)
                entropy = -torch.special.xlogy(probs, probs).sum(-1)  # 0 log 0 = 0 for masked keys
                values["attn_entropy"][i] = float(entropy.mean())
        return hook


@instrument("activations", ActivationsConfig, order=40)
def build(cfg, context: Context) -> ActivationStats | None:
    every = context.layer_every(cfg.activations)
    return ActivationStats(context.index, context.probe, every) if every else None
