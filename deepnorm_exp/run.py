"""One training run: build everything from the config, train, write the run's records."""

from __future__ import annotations

import logging
import math
import shutil
import time
from typing import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from .build import build_model, check_config, make_scheme
from .models import MODELS, count_params
from .data import load_data
from .errors import ConfigError
from .metrics import build_instruments
from .rundir import run_dir as make_run_dir
from .rundir import run_name as make_run_name
from .sinks import build_sinks
from .summary import TRAINED_FRACTION, format_summary, learned_fraction, write_summary
from .train.batches import random_batches
from .train.callbacks import DivergenceDetector, Evaluation, ProgressBar, RecordFlusher, ScalarMetrics
from .train.optim import build_optimizer, build_scheduler
from .train.trainer import Callback, Trainer, evaluate

log = logging.getLogger("deepnorm_exp")

RECORD_FILES = ("config.yaml", "metrics.jsonl", "events.jsonl", "layers", "summary.json", "wandb")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", name, "CUDA is not available here; use device=cpu or auto")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def run_experiment(cfg: DictConfig, override_dirname: str = "", progress: bool | None = None,
                   callbacks: Sequence[Callback] = ()) -> dict:
    """Train one model as `cfg` says; returns the summary also written to `summary.json`.

    `callbacks`: extra observers (a notebook's, a benchmark's clock), run after the built-in ones.
    """
    check_config(cfg)
    device = resolve_device(cfg.device)
    name = make_run_name(cfg, override_dirname)
    out_dir = make_run_dir(cfg, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in RECORD_FILES:  # a re-run of the same command replaces the earlier records
        path = out_dir / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    OmegaConf.save(cfg, out_dir / "config.yaml", resolve=True)

    started = time.perf_counter()
    scheme = make_scheme(cfg)
    summary = {
        "status": "failed", "trained": None, "learned_fraction": None,
        "steps": cfg.train.steps, "steps_completed": 0,
        "final_loss": None, "eval_loss": None, "optimal_loss": None, "unigram_loss": None, "excess_loss": None,
        "diverged_at_step": None, "divergence_reason": None, "divergence": None,
        "norm": cfg.norm.name, "model": cfg.model.kind, "depth": cfg.depth, "seed": cfg.seed,
        **scheme.constants(), "params": None, "tokens_per_s": None, "wall_s": None,
        "experiment": cfg.experiment_name, "run_name": name, "run_dir": str(out_dir), "device": str(device),
        "exact_match": None, "error": None,
    }
    sinks = []
    try:
        data = load_data(cfg.data, cfg.paths.cache, MODELS.get(cfg.model.kind).task)
        if cfg.train.batch_size > data.train_size:
            raise ConfigError("train.batch_size", cfg.train.batch_size,
                              f"must be <= the {data.train_size} training examples")
        summary.update(optimal_loss=data.optimal_loss, unigram_loss=data.unigram_loss)
        torch.manual_seed(cfg.seed)
        model = build_model(cfg, scheme).to(device)
        summary["params"] = count_params(model)
        sinks = build_sinks(cfg, out_dir, name)
        dtype = autocast_dtype(cfg.train.precision, device)

        def eval_loss() -> float:
            return evaluate(model, data.eval, cfg.train.batch_size, device, dtype)

        metrics = ScalarMetrics(cfg.train.log_every)
        evaluation = Evaluation(cfg.train.eval_every, eval_loss)
        divergence = DivergenceDetector(cfg.train.divergence.spike_factor, cfg.train.divergence.spike_patience)
        instruments, blocks = build_instruments(cfg.metrics, cfg.train.log_every, model, data.eval, device)
        optimizer = build_optimizer(model, cfg.train)
        trainer = Trainer(
            model=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, cfg.train),
            batches=random_batches(data.train, cfg.train.batch_size, cfg.seed), steps=cfg.train.steps,
            device=device, autocast_dtype=dtype, grad_clip=cfg.train.grad_clip,
            # Gatherers first, then the divergence check (it keeps the last record), the bar and the flusher.
            callbacks=[metrics, evaluation, *instruments, divergence,
                       ProgressBar(f"{cfg.norm.name} L{cfg.depth}", progress),
                       RecordFlusher(sinks, blocks.columns()), *callbacks],
        )
        trainer.fit()

        if evaluation.last_step != trainer.step or evaluation.last is None:
            evaluation.last = eval_loss()  # a diverged run: evaluate its last healthy weights
        summary.update(steps_completed=trainer.step, final_loss=metrics.last_loss, eval_loss=evaluation.last,
                       tokens_per_s=metrics.mean_tokens_per_s)
        if data.optimal_loss is not None and math.isfinite(evaluation.last):
            summary["excess_loss"] = evaluation.last - data.optimal_loss
        fraction = learned_fraction(evaluation.last, data.unigram_loss, data.optimal_loss)
        summary.update(learned_fraction=fraction, trained=fraction is not None and fraction >= TRAINED_FRACTION)
        if divergence.event is not None:
            summary.update(status="diverged", diverged_at_step=divergence.event["step"],
                           divergence_reason=divergence.event["reason"], divergence=divergence.event)
        else:
            summary["status"] = "completed"
        if data.task == "translation":
            from .translation_eval import exact_match

            summary["exact_match"] = exact_match(model, data, cfg.data.eval_decode, cfg.train.batch_size, device)
    except BaseException as e:
        summary["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        summary["wall_s"] = time.perf_counter() - started
        write_summary(out_dir / "summary.json", summary)
        for sink in sinks:
            sink.finish(summary)
        log.info(format_summary(summary))
    return summary
