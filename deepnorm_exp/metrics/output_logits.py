"""Log Z of the output softmax (the logsumexp of the output logits): output-logit divergence, the instability
z-loss holds off (Wortsman et al. 2023; PaLM's z-loss; `train.z_loss`). Read from the training step's own
forward: the loss computes log Z at every target token anyway (models.next_token_loss), so this costs a
reduction, no forward."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument


@dataclass
class OutputLogitsConfig:
    log_z: bool = True  # scalars log_z_mean, log_z_abs_max: log Z of the output softmax over the step's target tokens


class OutputLogZ(Callback):
    """Every `every` steps, over the step's target tokens (every rank's): `log_z_mean`, the mean of log Z,
    and `log_z_abs_max`, the largest |log Z|. A softmax whose logits drift together moves log Z away from 0
    without changing the loss; z-loss penalises (log Z)^2. NaN where log Z is not finite."""

    def __init__(self, every: int):
        self.every = every

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if not is_due(out.step, self.every, trainer.steps) or out.log_z is None:
            return
        log_z = out.log_z.double()
        total, count = trainer.runtime.sum([float(log_z.sum()), float(log_z.numel())])
        local_max = float(log_z.abs().max()) if log_z.numel() else 0.0
        largest = max(trainer.runtime.gather(local_max), key=lambda v: math.inf if math.isnan(v) else v)
        trainer.record.update(log_z_mean=total / count if count else math.nan, log_z_abs_max=largest)


@instrument("output_logits", OutputLogitsConfig, order=50)
def build(cfg, context: Context) -> OutputLogZ | None:
    return OutputLogZ(context.log_every) if cfg.log_z else None
