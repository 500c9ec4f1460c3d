"""Models: each is a module here plus `conf/model/<name>.yaml`, registered by `model.kind`.

A model class declares the data `task` it trains on ("lm" or "translation"), the layer count of each of
its stacks (what a scheme derives its constants from), and `loss(batch)`; the trainer needs nothing else.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..registry import Registry

MODELS: Registry[type[nn.Module]] = Registry("model.kind", __name__)
register = MODELS.register


class LossOutput(NamedTuple):
    loss: torch.Tensor  # mean cross-entropy over the target tokens
    tokens: int  # target tokens it averaged over (padding excluded)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODELS", "register", "LossOutput", "count_params"]
