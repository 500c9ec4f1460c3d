"""One training run: build everything from the config, train, write the run's records."""

from __future__ import annotations

import copy
import logging
import math
import shutil
import time
from pathlib import Path
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
from .preemption import PreemptionGuard
from .runlock import RunLock
from .summary import TRAINED_FRACTION, format_summary, learned_fraction, read_summary, write_summary
from .train import checkpoint
from .train.batches import RandomBatches
from .train.callbacks import DivergenceDetector, Evaluation, ProgressBar, RecordFlusher, ScalarMetrics
from .train.optim import build_optimizer, build_scheduler
from .train.trainer import Callback, Trainer, evaluate, to_device

log = logging.getLogger("deepnorm_exp")

RECORD_FILES = ("config.yaml", "metrics.jsonl", "events.jsonl", "layers", "summary.json", "wandb", "checkpoint.pt")


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


FINAL = ("completed", "diverged")  # a re-run skips these; anything else resumes or starts over


def run_experiment(cfg: DictConfig, override_dirname: str = "", progress: bool | None = None,
                   callbacks: Sequence[Callback] = ()) -> dict:
    """Train one model as `cfg` says; returns the summary also written to `summary.json`.

    Idempotent: with `resume=true` (the default) a run whose summary says completed or diverged is not
    trained again, and an unfinished one continues from its checkpoint; `resume=false` starts over.
    `callbacks`: extra observers (a notebook's, a benchmark's clock), run after the built-in ones.
    """
    check_config(cfg)
    device = resolve_device(cfg.device)
    name = make_run_name(cfg, override_dirname)
    out_dir = make_run_dir(cfg, name)
    lock = RunLock(out_dir)
    if not lock.acquire():
        log.warning("%s: another process is running it; leaving it to that one", out_dir)
        return {"status": "skipped", "reason": "running in another process", "run_dir": str(out_dir)}
    try:
        previous = read_summary(out_dir / "summary.json")
        if cfg.resume and previous is not None and previous.get("status") in FINAL:
            log.info("%s: already %s, not run again (resume=false starts over)", out_dir, previous["status"])
            return previous
        state = None
        if cfg.resume and (out_dir / checkpoint.CHECKPOINT).exists():
            state = checkpoint.load(out_dir / checkpoint.CHECKPOINT, device)
            check_resumable(state["config"], cfg)
            log.info("%s: resuming from step %d", out_dir, state["step"])
        else:
            for stale in RECORD_FILES:  # starting over: nothing of an earlier attempt survives
                path = out_dir / stale
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        OmegaConf.save(cfg, out_dir / "config.yaml", resolve=True)
        with PreemptionGuard() as guard:
            summary = _train(cfg, device, name, out_dir, state, progress, callbacks, guard)
    finally:
        lock.release()
    guard.forward()  # after the records are written: a preemption's signal goes on (submitit requeues)
    return summary


def check_resumable(saved: dict, cfg: DictConfig) -> None:
    """A checkpoint only continues the run it came from: the same sections that decide what is trained."""
    before, now = _trained_config(saved), _trained_config(OmegaConf.to_container(cfg, resolve=True))
    for key in RESUME_KEYS:
        if before[key] != now[key]:
            raise ConfigError("resume", "true", f"the run directory's checkpoint was trained with a different "
                                                f"`{key}`; use resume=false to start over")


RESUME_KEYS = ("norm", "model", "data", "train", "metrics", "depth", "seed")
RESUME_FREE = ("log_every", "eval_every", "ckpt_every", "keep_checkpoint")  # train keys a resume may change


def _trained_config(container: dict) -> dict:
    out = {key: copy.deepcopy(container.get(key)) for key in RESUME_KEYS}
    for key in RESUME_FREE:
        out["train"].pop(key, None)
    return out


def _train(cfg: DictConfig, device: torch.device, name: str, out_dir: Path, state: dict | None,
           progress: bool | None, callbacks: Sequence[Callback], guard: PreemptionGuard) -> dict:
    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    scheme = make_scheme(cfg)
    summary = {
        "status": "failed", "trained": None, "learned_fraction": None,
        "steps": cfg.train.steps, "steps_completed": 0, "resumed_from_step": state["step"] if state else None,
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
        if state is None:  # a fresh run: the scheme's pass before training (Admin's profiling), on the first rows
            scheme.prepare(model, to_device({k: v[:cfg.train.batch_size] for k, v in data.train.items()}, device))
        sinks = build_sinks(cfg, out_dir, name)
        dtype = autocast_dtype(cfg.train.precision, device)

        def eval_loss() -> float:
            return evaluate(model, data.eval, cfg.train.batch_size, device, dtype)

        metrics = ScalarMetrics(cfg.train.log_every)
        evaluation = Evaluation(cfg.train.eval_every, eval_loss)
        divergence = DivergenceDetector(cfg.train.divergence.spike_factor, cfg.train.divergence.spike_patience)
        instruments, blocks = build_instruments(cfg.metrics, cfg.train.log_every, model, data.eval, device)
        checkpointer = checkpoint.Checkpointer(out_dir / checkpoint.CHECKPOINT, cfg.train.ckpt_every,
                                               guard.stop_reason,
                                               extra={"config": OmegaConf.to_container(cfg, resolve=True)})
        optimizer = build_optimizer(model, cfg.train, scheme.param_groups(model, cfg.train.lr))
        trainer = Trainer(
            model=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, cfg.train),
            batches=RandomBatches(data.train, cfg.train.batch_size, cfg.seed), steps=cfg.train.steps,
            device=device, autocast_dtype=dtype, grad_clip=cfg.train.grad_clip,
            # Gatherers first, then the divergence check (it keeps the last record), the bar, the flusher;
            # the checkpointer last, once every other callback's state is final for the step.
            callbacks=[metrics, evaluation, *instruments, divergence,
                       ProgressBar(f"{cfg.norm.name} L{cfg.depth}", progress),
                       RecordFlusher(sinks, blocks.columns()), *callbacks, checkpointer],
        )
        if state is not None:
            checkpoint.restore(trainer, state)
            del state
        trainer.fit()
        summary.update(steps_completed=trainer.step, final_loss=metrics.last_loss,
                       tokens_per_s=metrics.mean_tokens_per_s)
        if guard.stop_reason() is not None and divergence.event is None:
            summary.update(status="interrupted", error=guard.stop_reason(), eval_loss=evaluation.last)
            return summary  # no evaluation: a preempted job has seconds left; the resumed run finishes it

        if evaluation.last_step != trainer.step or evaluation.last is None:
            evaluation.last = eval_loss()  # a diverged run: evaluate its last healthy weights
        summary["eval_loss"] = evaluation.last
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
        if not cfg.train.keep_checkpoint:  # finished: nothing left to resume
            (out_dir / checkpoint.CHECKPOINT).unlink(missing_ok=True)
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
