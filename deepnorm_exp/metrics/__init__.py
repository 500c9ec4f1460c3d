"""Instrumentation: callbacks beside the training loop that measure what the DeepNet paper's analysis uses.

One file per measurement; `build_instruments` installs the ones `metrics.*` turns on, so a metric that is
off costs nothing. Names of everything recorded: docs/records.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..train.trainer import Callback
from .activations import ActivationStats
from .blocks import BlockIndex, ParamBlocks
from .gradients import LayerGradNorms
from .model_update import ModelUpdate
from .probe import Probe
from .updates import ParameterUpdates


def build_instruments(cfg, log_every: int, model: nn.Module, eval_tensors: dict[str, torch.Tensor],
                      device: torch.device, routed=None) -> tuple[list[Callback], BlockIndex]:
    """The instrument callbacks `cfg` (the `metrics` section) asks for, and the model's block index.
    Build them after the model is wrapped for parallel training (FSDP replaces its parameters); `routed`:
    the model through its wrapped objective (train/parallel.py: Routed), for the first probe forward."""
    index = BlockIndex.of(model)
    layer_grads = bool(cfg.layer_every and cfg.layer_grads)
    layer_updates = bool(cfg.layer_every and cfg.layer_updates)
    activations = bool(cfg.layer_every and cfg.activations)
    blocks = ParamBlocks(model, index) if (cfg.update_norm or layer_grads or layer_updates) else None
    probe = Probe(eval_tensors, cfg.probe_batch, device) if (cfg.model_update or activations) else None
    instruments: list[Callback] = []
    if layer_grads:
        instruments.append(LayerGradNorms(blocks, cfg.layer_every))
    if cfg.update_norm or layer_updates:
        instruments.append(ParameterUpdates(blocks, log_every if cfg.update_norm else 0,
                                            cfg.layer_every if layer_updates else 0))
    if cfg.model_update:
        instruments.append(ModelUpdate(probe, log_every, routed or model))
    if activations:
        instruments.append(ActivationStats(index, probe, cfg.layer_every))
    return instruments, index


__all__ = ["build_instruments", "BlockIndex", "ParamBlocks", "Probe", "ActivationStats",
           "LayerGradNorms", "ModelUpdate", "ParameterUpdates"]
