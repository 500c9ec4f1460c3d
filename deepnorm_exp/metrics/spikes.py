"""Loss spikes, counted apart from the divergence rule: a step whose loss sits far above its recent past
(Dehghani et al. 2023 and OLMo 2 report spike counts; the divergence rule in train/callbacks.py stops a run
only when the loss stays high)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..config import Rule, setting
from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument

MAD_TO_SIGMA = 1.4826  # the median absolute deviation of a Gaussian is 0.6745 sigma


@dataclass
class SpikesConfig:
    spikes: bool = True  # scalar loss_spikes (spikes so far) and a loss_spike event per spike
    # A spike: a loss more than spike_k robust deviations (1.4826 x the median absolute deviation: sigma for a
    # Gaussian) above the median of the spike_window steps before it; none is counted before the window fills.
    spike_window: int = setting(100, check=Rule(lambda v: v >= 3, "must be >= 3 (a median and a deviation)"))
    spike_k: float = setting(6.0, check="above_zero")



def is_spike(loss: float, past: list[float], k: float) -> tuple[bool, float, float]:
    """(a spike?, the median of `past`, its robust deviation). A flat past (deviation 0) has no spikes:
    any change would be infinitely many deviations."""
    median = float(np.median(past))
    deviation = MAD_TO_SIGMA * float(np.median(np.abs(np.asarray(past) - median)))
    return deviation > 0 and loss > median + k * deviation, median, deviation


class LossSpikes(Callback):
    """Each step's loss against the `window` steps before it; `loss_spikes` every `every` steps. A
    non-finite loss is the divergence rule's, not a spike, and does not enter the window."""

    def __init__(self, window: int, k: float, every: int):
        self.k, self.every = k, every
        self.past: deque[float] = deque(maxlen=window)
        self.count = 0

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if math.isfinite(out.loss):
            if len(self.past) == self.past.maxlen:
                spike, median, deviation = is_spike(out.loss, list(self.past), self.k)
                if spike:
                    self.count += 1
                    trainer.events.append({"event": "loss_spike", "step": out.step, "loss": out.loss,
                                           "median": median, "deviation": deviation, "k": self.k})
            self.past.append(out.loss)
        if is_due(out.step, self.every, trainer.steps):
            trainer.record.update(loss_spikes=self.count)

    def state_dict(self) -> dict:
        return {"past": [float(loss) for loss in self.past], "count": self.count}  # plain floats: weights-only loads

    def load_state_dict(self, state: dict) -> None:
        self.past.clear()
        self.past.extend(float(loss) for loss in state["past"])
        self.count = int(state["count"])


@instrument("spikes", SpikesConfig, order=60)
def build(cfg, context: Context) -> LossSpikes | None:
    return LossSpikes(cfg.spike_window, cfg.spike_k, context.log_every) if cfg.spikes else None
