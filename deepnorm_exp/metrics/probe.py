"""The fixed probe batch the model-level measurements run on, and a forward pass that leaves training alone."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..train.trainer import Callback, StepOutput, Trainer, is_due


class Probe:
    """A few held-out examples, chosen once before training (the first `size` of the eval split).

    `features(model)` (a model, or Trainer.routed under data parallelism) runs F(x) on them in eval mode (no dropout), without gradients, in full precision
    (bf16 noise would swamp the small updates being measured) and inside `fork_rng`, so measuring never
    changes what training computes or the random numbers it draws.
    """

    def __init__(self, eval_tensors: dict[str, torch.Tensor], size: int, device: torch.device):
        self.batch = {name: t[:size].to(device) for name, t in eval_tensors.items()}
        self.device = device

    @torch.no_grad()
    def features(self, model: nn.Module) -> torch.Tensor:
        was_training = model.training
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            model.eval()
            try:
                return model.features(self.batch).float()
            finally:
                model.train(was_training)


def rms_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||_F / sqrt(positions): the L2 distance of the hidden vectors, root-mean-squared over positions.

    A LayerNorm output has norm sqrt(d_model) per position, so this reads on that scale at any batch size.
    """
    return float((a - b).flatten(0, -2).norm(dim=-1).square().mean().sqrt())


class PerBlockProbe(Callback):
    """A per-layer measurement on the probe batch: every `every` steps and once before training (step 0,
    not again when resuming), one probe forward with hooks that fill one value per residual block of each
    name in `MEASURES` (NaN where a block has none). Hooks live only during that forward."""

    MEASURES: tuple[str, ...] = ()

    def __init__(self, index, probe: Probe, every: int):
        self.index, self.probe, self.every = index, probe, every

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.step == 0:
            trainer.layer_record.update(self.measure(trainer.routed))

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if is_due(out.step, self.every, trainer.steps):
            trainer.layer_record.update(self.measure(trainer.routed))

    def hooks(self, values: dict[str, list[float]]) -> list:
        """Register the forward hooks that fill `values[name][block]`; return their handles."""
        raise NotImplementedError

    def measure(self, model: nn.Module) -> dict:
        values = {name: [math.nan] * len(self.index) for name in self.MEASURES}
        handles = self.hooks(values)
        try:
            self.probe.features(model)
        finally:
            for handle in handles:
                handle.remove()
        return {name: torch.tensor(v, dtype=torch.float32).numpy() for name, v in values.items()}
