"""Optimizer and learning-rate schedule, from torch's own classes."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler, SequentialLR

from ..config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, scheme=None) -> torch.optim.Optimizer:
    """AdamW (Adam when weight_decay is 0, the paper's setting: betas 0.9, 0.98). With the model's
    normalization `scheme`: its parameter groups (their own learning rates and epsilons, else one group), and
    its `after_optimizer_step` run after every step that changed the weights (torch's step post-hook)."""
    groups = scheme.param_groups(model, cfg.lr, cfg.adam_eps) if scheme is not None else None
    optimizer = torch.optim.AdamW(groups or model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay, foreach=True)
    if scheme is not None:
        optimizer.register_step_post_hook(lambda *_: scheme.after_optimizer_step(model))
    return optimizer


def inverse_sqrt(warmup_steps: int):
    """fairseq's schedule: linear warm-up to the peak, then lr * sqrt(warmup / step)."""
    warmup = max(warmup_steps, 1)

    def factor(step: int) -> float:  # step counts optimizer steps taken, from 0
        s = step + 1
        return s / warmup if s < warmup else math.sqrt(warmup / s)

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LRScheduler:
    if cfg.schedule == "inverse_sqrt":
        return LambdaLR(optimizer, inverse_sqrt(cfg.warmup_steps))
    warmup = min(cfg.warmup_steps, cfg.steps)
    after = cfg.steps - warmup
    if cfg.schedule == "cosine":
        rest = CosineAnnealingLR(optimizer, T_max=max(after, 1))
    else:  # constant
        rest = LambdaLR(optimizer, lambda _: 1.0)
    if warmup == 0:
        return rest
    ramp = LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup - 1 or 1)
    return SequentialLR(optimizer, [ramp, rest], milestones=[warmup])
