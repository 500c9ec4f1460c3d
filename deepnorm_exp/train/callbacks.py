"""Callbacks that observe training: scalar metrics, evaluation, divergence, progress, record flushing,
the run's wall clock."""

from __future__ import annotations

import math
import sys
import time
from typing import Callable

import numpy as np

from .trainer import Callback, StepOutput, Trainer, is_due


class ScalarMetrics(Callback):
    """Every `every` steps: loss (mean over the interval), lr, grad_norm, tokens_per_s; under fp16 also
    loss_scale and skipped_steps (steps whose gradients overflowed, so the scaler skipped the update; their
    loss is left out of the mean, as fairseq does)."""

    def __init__(self, every: int):
        self.every = every
        self._reset()
        self.last_loss: float | None = None  # mean loss of the latest interval: the run's "final loss"
        self.tokens_per_s: float | None = None
        self.total_tokens, self.total_seconds = 0, 0.0
        self.skipped_steps = 0

    def _reset(self):
        self.loss_sum, self.count, self.tokens, self.seconds = 0.0, 0, 0, 0.0

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if out.overflow:
            self.skipped_steps += 1
        else:
            self.loss_sum += out.loss
            self.count += 1
        self.tokens += out.tokens
        self.seconds += out.seconds
        self.total_tokens += out.tokens
        self.total_seconds += out.seconds
        if is_due(out.step, self.every, trainer.steps):
            self.last_loss = self.loss_sum / self.count if self.count else math.nan
            self.tokens_per_s = self.tokens / max(self.seconds, 1e-9)
            trainer.record.update(loss=self.last_loss, lr=out.lr, grad_norm=out.grad_norm,
                                  tokens_per_s=self.tokens_per_s)
            if out.loss_scale is not None:
                trainer.record.update(loss_scale=out.loss_scale, skipped_steps=self.skipped_steps)
            self._reset()

    def state_dict(self) -> dict:
        return {key: value for key, value in vars(self).items() if key != "every"}  # a resume may change it

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)

    @property
    def mean_tokens_per_s(self) -> float | None:
        return self.total_tokens / self.total_seconds if self.total_seconds else None


class Evaluation(Callback):
    """Held-out loss every `every` steps and after the last one, and of the initial weights (`initial`: the
    loss at initialisation, which LR sensitivity counts a failed rate as; Wortsman et al. 2023)."""

    def __init__(self, every: int, evaluate: Callable[[], float]):
        self.every, self.evaluate = every, evaluate
        self.last: float | None = None
        self.last_step = 0
        self.initial: float | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.step == 0:  # a resumed run has its initial loss from the checkpoint
            self.initial = self.evaluate()

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if is_due(out.step, self.every, trainer.steps):
            self.last, self.last_step = self.evaluate(), out.step
            trainer.record["eval_loss"] = self.last

    def state_dict(self) -> dict:
        return {"last": self.last, "last_step": self.last_step, "initial": self.initial}

    def load_state_dict(self, state: dict) -> None:
        self.last, self.last_step = state["last"], state["last_step"]
        self.initial = state.get("initial")  # a checkpoint from before it was kept: unknown


class TrainedAt(Callback):
    """The first evaluation at which the run had trained (`trained(eval_loss)`: it learned the share of the
    gap the summary's rule asks), its steps-to-train; with `stop`, the run ends there, so that a study of how
    long each scheme takes to train spends nothing after. Install it after Evaluation."""

    def __init__(self, trained: Callable[[float], bool], stop: bool):
        self.trained, self.stop = trained, stop
        self.step: int | None = None

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        loss = trainer.record.get("eval_loss")
        if self.step is None and loss is not None and self.trained(loss):
            self.step = out.step
            if self.stop:
                trainer.request_stop(f"trained at step {out.step} (train.stop_when_trained)")

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


class DivergenceDetector(Callback):
    """Stops the run at a non-finite loss or gradient, or a loss stuck above factor x its minimum.

    Checked on every step (the paper's divergences happen in the first few hundred), before the optimizer
    applies the step, so a run that diverged keeps its last healthy weights.

    Under fp16 loss scaling a step whose gradients overflow is not a divergence: the scaler skips it and
    halves the scale (that is how dynamic loss scaling finds its scale). A run diverges there when the
    scale falls below `min_loss_scale` (fairseq's "minimum loss scale reached"): fp16 overflows whatever the
    scale, one of the ways deep Post-LN runs fail.
    """

    def __init__(self, spike_factor: float, spike_patience: int, min_loss_scale: float = 0.0):
        self.factor, self.patience, self.min_loss_scale = spike_factor, spike_patience, min_loss_scale
        self.best = math.inf
        self.above = 0
        self.event: dict | None = None
        self.last_healthy: dict | None = None  # loss, grad_norm, lr of the last step that passed
        self.last_logged: dict | None = None  # the last scalar record before the divergence

    def after_backward(self, trainer: Trainer, out: StepOutput) -> None:
        if out.overflow:
            return  # fp16: the scaler skips this step (see on_step_end for a scale that collapses)
        reason = None
        if not math.isfinite(out.loss):
            reason = "non-finite loss"
        elif not math.isfinite(out.grad_norm):
            reason = "non-finite gradient norm"
        else:
            self.best = min(self.best, out.loss)
            self.above = self.above + 1 if out.loss > self.factor * self.best else 0
            if self.above >= self.patience:
                reason = (f"loss above {self.factor:g}x its minimum ({self.best:.4g}) "
                          f"for {self.patience} steps")
        if reason is None:
            self.last_healthy = {"step": out.step, "loss": out.loss, "grad_norm": out.grad_norm, "lr": out.lr}
            return
        self._diverge(trainer, out, reason)

    def _diverge(self, trainer: Trainer, out: StepOutput, reason: str) -> None:
        self.event = {"event": "divergence", "step": out.step, "reason": reason, "loss": out.loss,
                      "grad_norm": out.grad_norm, "last_healthy": self.last_healthy,
                      "last_logged": self.last_logged}
        trainer.events.append(self.event)
        trainer.record.update(diverged=1.0)
        trainer.request_stop(reason)

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if trainer.scaler is not None and trainer.scaler.get_scale() < self.min_loss_scale:
            self._diverge(trainer, out, f"loss scale collapsed below {self.min_loss_scale:g} "
                                        f"(fp16 gradients overflowed at every scale)")
        if trainer.record:  # installed after the callbacks that gather, before the flusher
            self.last_logged = {"step": out.step, **trainer.record}

    def weights_evaluated(self, step: int) -> str:
        """Which weights a run that stopped after `step` optimizer steps holds (what its eval_loss measured)."""
        if self.event is None:
            return f"the final weights (step {step})"
        if self.event["reason"].startswith("non-finite"):
            return f"the last healthy weights (step {step}; the non-finite step {self.event['step']} was not applied)"
        if self.event["reason"].startswith("loss scale"):
            return f"the weights after step {step} (the steps whose fp16 gradients overflowed were not applied)"
        return (f"the weights after step {step}: they include the updates of the {self.patience - 1} step(s) whose "
                f"loss was already above {self.factor:g}x its minimum before the spike rule stopped the run")

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in ("best", "above", "event", "last_healthy", "last_logged")}

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)


class ProgressBar(Callback):
    """tqdm bar with step, loss and tokens/s; silent when stderr is not a terminal."""

    def __init__(self, description: str, enabled: bool | None = None):
        self.description = description
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None

    def on_train_start(self, trainer: Trainer) -> None:
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=trainer.steps, initial=trainer.step, desc=self.description,
                            dynamic_ncols=True, leave=False)

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if "loss" in trainer.record:
                self.bar.set_postfix(loss=f"{trainer.record['loss']:.3f}",
                                     tok_s=f"{trainer.record['tokens_per_s']:.0f}", refresh=False)

    def on_train_end(self, trainer: Trainer) -> None:
        if self.bar is not None:
            self.bar.close()


class RecordFlusher(Callback):
    """Sends the step's gathered records to every sink; install it after the callbacks that gather.

    `layer_index`: the columns naming each residual block (stack, layer, sublayer, position), prepended
    to the per-layer vectors.
    """

    def __init__(self, sinks, layer_index: dict[str, np.ndarray] | None = None):
        self.sinks, self.layer_index = sinks, layer_index or {}

    def _flush(self, trainer: Trainer, step: int) -> None:
        for event in trainer.events:
            for sink in self.sinks:
                sink.event(event)
        trainer.events.clear()
        if trainer.record:
            record = {"step": step, **trainer.record}
            for sink in self.sinks:
                sink.log(record)
        if trainer.layer_record:
            table = {**self.layer_index, **trainer.layer_record}
            for sink in self.sinks:
                sink.log_layers(step, table)

    def on_train_start(self, trainer: Trainer) -> None:
        self._flush(trainer, trainer.step)  # measurements of the initial weights, as step 0 (none if resumed)
        trainer.layer_record.clear()

    def state_dict(self) -> dict:
        """Each sink's records so far, by sink name, so a resumed run continues exactly from there."""
        return {"sinks": {sink.name: sink.state_dict() for sink in self.sinks}}

    def load_state_dict(self, state: dict) -> None:
        for sink in self.sinks:
            if sink.name in state["sinks"]:
                sink.load_state_dict(state["sinks"][sink.name])

    def after_backward(self, trainer: Trainer, out: StepOutput) -> None:
        if trainer.stop_reason is not None:  # the divergence record: written the moment it happens
            trainer.record.update(loss=out.loss, grad_norm=out.grad_norm, lr=out.lr)
            self._flush(trainer, out.step)

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        self._flush(trainer, out.step)


class WallClock(Callback):
    """The run's wall time across resumes: what earlier processes spent up to their last checkpoint (restored
    from it) plus this process's time since `started` (a `time.perf_counter()` reading taken before set-up).
    Work an interruption threw away after the last checkpoint is not counted: it is redone, and counted then."""

    def __init__(self, started: float):
        self.started, self.before = started, 0.0

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.started

    def state_dict(self) -> dict:
        return {"elapsed_s": self.elapsed()}

    def load_state_dict(self, state: dict) -> None:
        self.before = state["elapsed_s"]
