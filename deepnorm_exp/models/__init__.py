"""Models: each is a module here plus `conf/model/<name>.yaml`, registered by `model.kind`.

A model class declares the data `task` it trains on ("lm" or "translation"), the layer count of each of
its stacks (what a scheme derives its constants from), and `loss(batch)`; the trainer needs nothing else.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import Registry

MODELS: Registry[type[nn.Module]] = Registry("model.kind", __name__)
register = MODELS.register


class LossOutput(NamedTuple):
    loss: torch.Tensor  # mean cross-entropy over the target tokens
    tokens: int  # target tokens it averaged over (padding excluded)
    # logsumexp of the output logits at each of those tokens, log Z of the softmax (with its graph: z-loss
    # backpropagates through it; the output-logit instrument reads it detached)
    log_z: Optional[torch.Tensor] = None


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: Optional[int] = None) -> LossOutput:
    """Mean cross-entropy of `logits` (..., vocab) against `targets` (...), in fp32, skipping `ignore_index`
    (padding), with log Z at every target kept."""
    flat, targets = logits.float().flatten(0, -2), targets.flatten()
    if ignore_index is None:
        return LossOutput(F.cross_entropy(flat, targets), targets.numel(), flat.logsumexp(-1))
    kept = targets != ignore_index
    loss = F.cross_entropy(flat, targets, ignore_index=ignore_index)
    return LossOutput(loss, int(kept.sum()), flat[kept].logsumexp(-1))


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODELS", "register", "LossOutput", "next_token_loss", "count_params"]
