"""The DeepNet paper's model update: how far the model's output on a fixed input has moved (figures 4-5)."""

from __future__ import annotations

from dataclasses import dataclass

from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument
from .probe import Probe, rms_distance


@dataclass
class ModelUpdateConfig:
    model_update: bool = True  # scalars model_update, model_update_step on the probe batch (two probe forwards)


class ModelUpdate(Callback):
    """Every `every` steps, on the probe batch (see `rms_distance` for the normalisation):

    * `model_update`      = ||F(x, theta_t) - F(x, theta_0)||, theta_0 the weights before the first step;
    * `model_update_step` = ||F(x, theta_t) - F(x, theta_{t-1})||, the move of this one step.

    Costs two forwards of the probe batch per logged step (one before the update, one after), none between.
    """

    def __init__(self, probe: Probe, every: int, model):
        """`model` must hold theta_0: it is built before a checkpoint is restored, so a resumed run that
        switches this metric on measures from the same reference as a run that had it on from the start."""
        self.probe, self.every = probe, every
        self.initial = probe.features(model)
        self.previous = None

    def state_dict(self) -> dict:
        return {"initial": self.initial}

    def load_state_dict(self, state: dict) -> None:
        # Beside the outputs it is compared with (the checkpoint comes back on the CPU; on a GPU, a resumed
        # run failed at its first logged step when this stayed there).
        self.initial = state["initial"].to(self.initial.device)

    def after_backward(self, trainer: Trainer, out: StepOutput) -> None:
        if is_due(out.step, self.every, trainer.steps):
            self.previous = self.probe.features(trainer.routed)  # theta_{t-1}: the optimizer has not stepped

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if self.previous is None:
            return
        current = self.probe.features(trainer.routed)
        trainer.record.update(model_update=rms_distance(current, self.initial),
                              model_update_step=rms_distance(current, self.previous))
        self.previous = None


@instrument("model_update", ModelUpdateConfig, order=30)
def build(cfg, context: Context) -> ModelUpdate | None:
    return ModelUpdate(context.probe, context.log_every, context.routed) if cfg.model_update else None
