"""The one place a run is assembled from its config: data, model (built and initialised by its scheme),
the parallel wrapper, the instruments and the loop's callbacks, the optimizer and the Trainer.

`build.py` below it turns a config into a scheme and a model; this puts them together with everything
else a run trains with. What it builds goes into `RunParts` as it is built, so that a run that fails
half-way still closes what it opened (its sinks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from omegaconf import OmegaConf

from ..build import build_model
from ..data import TaskData, load_data
from ..errors import ConfigError
from ..metrics import build_instruments
from ..models import MODELS, count_params
from ..runtime import Runtime
from ..sinks import build_sinks
from ..train import checkpoint
from ..train.batches import RandomBatches
from ..train.callbacks import (DivergenceDetector, Evaluation, ProgressBar, RecordFlusher, ScalarMetrics, TrainedAt,
                               WallClock)
from ..train.numerics import autocast_dtype, loss_scaler
from ..train.optim import build_optimizer, build_scheduler
from ..train.parallel import Routed, wrap
from ..train.throughput import Throughput, flops_per_token, peak_flops
from ..train.trainer import Trainer, evaluate, to_device
from .plan import RunPlan
from .schema import RunSummary
from .summary import is_trained, learned_fraction


@dataclass
class RunParts:
    """What a run trains with; the callbacks the summary reads after the loop are kept by name."""

    started: float  # time.perf_counter() when the run began (its wall clock counts set-up)
    parallel: str  # none, ddp or fsdp: train.parallel resolved for the processes there are
    sinks: list = field(default_factory=list)
    data: TaskData | None = None
    objective: torch.nn.Module | None = None
    eval_loss: Callable[[], float] | None = None
    metrics: ScalarMetrics | None = None
    throughput: Throughput | None = None
    evaluation: Evaluation | None = None
    trained_at: TrainedAt | None = None
    divergence: DivergenceDetector | None = None
    clock: WallClock | None = None
    trainer: Trainer | None = None


def assemble(parts: RunParts, plan: RunPlan, runtime: Runtime, summary: RunSummary,
             stop_reason: Callable) -> None:
    """Fill `parts` for training the plan; the summary's data- and model-derived entries as they are known."""
    cfg, scheme, parallel, out_dir = plan.cfg, plan.scheme, parts.parallel, plan.directory
    device = runtime.device
    data = parts.data = load_data(cfg.data, cfg.paths.cache, MODELS.get(cfg.model.kind).task)
    if cfg.train.batch_size > data.train_size:
        raise ConfigError("train.batch_size", cfg.train.batch_size, f"must be <= the {data.train_size} training examples")
    summary.update(optimal_loss=data.optimal_loss, unigram_loss=data.unigram_loss)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg, scheme).to(device)
    summary.params = count_params(model)
    # The scheme's pass before training (Admin's profiling), on the first rows; also when resuming, so the
    # model holds theta_0 exactly until the checkpoint is restored (the model update's reference).
    scheme.prepare(model, to_device({k: v[:cfg.train.batch_size] for k, v in data.train.items()}, device))
    if runtime.rank > 0:  # its own dropout masks for its share of the batch (rank 0 keeps the seed's stream)
        torch.manual_seed(cfg.seed + 1_000_003 * runtime.rank)
    parts.sinks = build_sinks(cfg, out_dir, plan.name) if runtime.is_main else []
    dtype = autocast_dtype(cfg.train.precision, device)
    if parallel == "fsdp":  # FSDP's mixed-precision policy casts the weights itself (fp32 reductions)
        objective, dtype = wrap(model, runtime, parallel, param_dtype=dtype, compile=cfg.train.compile,
                                checkpointing=cfg.model.activation_checkpointing), None
    else:
        objective = wrap(model, runtime, parallel, param_dtype=None, compile=cfg.train.compile,
                         checkpointing=cfg.model.activation_checkpointing)
    parts.objective = objective
    parts.eval_loss = lambda: evaluate(objective, data.eval, cfg.train.batch_size, device, dtype)
    parts.metrics = ScalarMetrics(cfg.train.log_every)
    summary.flops_per_token = flops_per_token(model, plan.checked.positions)
    parts.throughput = Throughput(summary.flops_per_token, peak_flops(device, cfg.train.peak_tflops),
                                  runtime.world_size)
    parts.evaluation = Evaluation(cfg.train.eval_every, parts.eval_loss)
    parts.trained_at = TrainedAt(lambda loss: is_trained(learned_fraction(loss, data.unigram_loss, data.optimal_loss)),
                                 cfg.train.stop_when_trained)
    parts.divergence = DivergenceDetector(cfg.train.divergence.spike_factor, cfg.train.divergence.spike_patience,
                                          cfg.train.min_loss_scale)
    instruments, blocks = build_instruments(cfg.metrics, cfg.train.log_every, model, data.eval, device,
                                            routed=Routed(objective))
    parts.clock = WallClock(parts.started)
    checkpointer = checkpoint.Checkpointer(out_dir, cfg.train.ckpt_every, stop_reason,
                                           extra={"config": OmegaConf.to_container(cfg, resolve=True)})
    optimizer = build_optimizer(model, cfg.train, scheme)
    parts.trainer = Trainer(
        model=model, objective=objective, runtime=runtime, optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.train), steps=cfg.train.steps,
        batches=RandomBatches(data.train, cfg.train.batch_size, cfg.seed, runtime.rank, runtime.world_size),
        micro_batch_size=cfg.train.micro_batch_size,
        device=device, autocast_dtype=dtype, grad_clip=cfg.train.grad_clip, z_loss=cfg.train.z_loss,
        scaler=loss_scaler(cfg.train, device),
        # Gatherers first, then the divergence check (it keeps the last record), the bar, the flusher;
        # the checkpointer last, once every other callback's state is final for the step.
        callbacks=[parts.metrics, parts.throughput, parts.evaluation, parts.trained_at, *instruments, parts.divergence,
                   ProgressBar(f"{cfg.norm.name} L{cfg.depth}", plan.progress if runtime.is_main else False),
                   RecordFlusher(parts.sinks, blocks.columns()), *plan.callbacks, parts.clock, checkpointer],
    )
