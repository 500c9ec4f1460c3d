"""One training run: build everything from the config, train, write the run's records."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from ..build import build_model, check_config, check_runtime, make_scheme
from ..config import TRAINED_KEYS, UNTRAINED_KEYS, Config
from ..models import MODELS, count_params
from ..data import load_data
from ..errors import ConfigError, RecordError, one_line
from ..metrics import build_instruments
from .rundir import run_dir as make_run_dir
from .rundir import run_name as make_run_name
from ..sinks import build_sinks
from .preemption import PreemptionGuard
from ..runtime import Runtime, close_runtime, init_runtime, launch_environment
from ..records import atomic_path, remove_temporaries, utc_now
from .runlock import RunLock
from .summary import TRAINED_FRACTION, format_summary, has_ended, learned_fraction, read_summary, write_summary
from ..train import checkpoint
from ..train.batches import RandomBatches
from ..train.callbacks import DivergenceDetector, Evaluation, ProgressBar, RecordFlusher, ScalarMetrics, WallClock
from ..train.optim import build_optimizer, build_scheduler
from ..train.parallel import Routed, one_process_note, resolve_parallel, wrap
from ..train.throughput import Throughput, flops_per_token, peak_flops
from ..train.memory import GIB
from ..train.trainer import Callback, Trainer, evaluate, to_device

log = logging.getLogger("deepnorm_exp")

RECORD_FILES = ("config.yaml", "metrics.jsonl", "events.jsonl", "layers", "summary.json", "wandb", "checkpoint.pt",
                "checkpoint.dcp")


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def loss_scaler(train: DictConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's dynamic loss scaling (torch.amp.GradScaler; CUDA, or the CPU's fp16 autocast)."""
    if train.precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, init_scale=train.loss_scale_init,
                                growth_interval=train.loss_scale_window)


DETERMINISTIC_CUBLAS = ":4096:8"  # cuBLAS's documented setting for reproducible results


def run_experiment(cfg: DictConfig, override_dirname: str = "", progress: bool | None = None,
                   callbacks: Sequence[Callback] = ()) -> dict:
    """Train one model as `cfg` says; returns the summary also written to `summary.json`.

    Idempotent: with `resume=true` (the default) a run whose summary says completed or diverged is not
    trained again, and an unfinished one continues from its checkpoint; `resume=false` starts over. A run
    directory belongs to one trained config: resuming or re-using a run trained otherwise is refused.
    `callbacks`: extra observers (a notebook's, a benchmark's clock), run after the built-in ones.
    """
    positions = check_config(cfg)
    memory = check_runtime(cfg, positions, launch_environment()[1])
    runtime = init_runtime(cfg.device)
    try:
        return _run(cfg, runtime, override_dirname, progress, callbacks, memory, positions)
    finally:
        close_runtime(runtime)


def _run(cfg: DictConfig, runtime: Runtime, override_dirname: str, progress: bool | None,
         callbacks: Sequence[Callback], memory, positions) -> dict:
    if not runtime.is_main:
        log.setLevel(logging.WARNING)  # the main process speaks for the run
    name = make_run_name(cfg, override_dirname)
    out_dir = make_run_dir(cfg, name)
    lock = RunLock(out_dir)
    # The main process claims the run directory and decides; the other ranks of a distributed run follow.
    plan = _plan(cfg, out_dir, lock) if runtime.is_main else None
    plan = runtime.broadcast(plan)
    if plan[0] != "train":
        lock.release()
        if plan[0] == "error":
            raise plan[1]
        return plan[1]
    guard = PreemptionGuard()
    try:
        if runtime.is_main:
            with atomic_path(out_dir / "config.yaml") as temporary:
                OmegaConf.save(cfg, temporary, resolve=True)
        with guard, deterministic_kernels(cfg.train.deterministic):
            summary = _train(cfg, runtime, name, out_dir, plan[1], progress, callbacks, guard, memory, positions)
    finally:
        lock.release()
    guard.forward()  # after the records are written: a preemption's signal goes on (submitit requeues)
    return summary


@contextlib.contextmanager
def deterministic_kernels(enabled: bool):
    """torch.use_deterministic_algorithms for the run, then as it was. On CUDA, several kernels (index and
    scatter backward, some attention backward) add with atomics in whatever order threads arrive, so two
    runs of one config, or a run and its resume, can differ in the last bits and then drift; on the CPU the
    harness's runs repeat bit for bit without this. cuBLAS also needs a fixed workspace, which it reads once
    per process: the command line sets it before CUDA starts (`deepnorm_exp.__main__`); a process that used
    CUDA before this run without it (a notebook's earlier run) is told so."""
    if not enabled:
        yield
        return
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        if torch.cuda.is_initialized():
            log.warning("train.deterministic: cuBLAS's workspace was set when this process first used CUDA; "
                        "for bit-identical matrix products set CUBLAS_WORKSPACE_CONFIG=%s before it starts",
                        DETERMINISTIC_CUBLAS)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = DETERMINISTIC_CUBLAS
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _plan(cfg: DictConfig, out_dir: Path, lock: RunLock) -> tuple:
    """The main process's decision for a run directory, under its lock: ("train", resuming), ("skip",
    summary) or ("error", the exception), so that every rank can act on it."""
    try:
        if not lock.acquire(patience=1.0):
            log.warning("%s: another process is running it; leaving it to that one", out_dir)
            return "skip", {"status": "skipped", "reason": "running in another process", "run_dir": str(out_dir)}
        check_claim(out_dir, cfg)
        previous = read_summary(out_dir / "summary.json")
        if cfg.resume and has_ended(previous):
            log.info("%s: already %s, not run again (resume=false starts over)", out_dir, previous["status"])
            return "skip", previous
        for temporary in remove_temporaries(out_dir):  # a write that a kill interrupted
            log.info("removed %s, left by an interrupted write", temporary)
        resuming = cfg.resume and checkpoint.exists(out_dir)
        if not resuming:
            for stale in RECORD_FILES:  # starting over: nothing of an earlier attempt survives
                path = out_dir / stale
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return "train", resuming
    except Exception as e:  # noqa: BLE001 - said on every rank
        return "error", e


def trained_config(container: dict) -> dict:
    """The part of a resolved config that decides what is trained (config.py: TRAINED_KEYS, less the
    UNTRAINED_KEYS inside those sections; metrics, logging, paths do not)."""
    out = {key: copy.deepcopy(container.get(key)) for key in TRAINED_KEYS}
    for key in UNTRAINED_KEYS:
        section, _, name = key.partition(".")
        if name and isinstance(out.get(section), dict):
            out[section].pop(name, None)
    return out


def first_difference(before: Any, now: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    """(dotted key, value before, value now) of the first place two config trees differ, or None."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in list(before) + [k for k in now if k not in before]:
            found = first_difference(before.get(key, "<unset>"), now.get(key, "<unset>"), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if before == now else (prefix.rstrip("."), before, now)


def with_schema_defaults(stored: Any, defaults: Any) -> Any:
    """`stored` with the keys the schema gained after it was written, at their defaults. A key is added with
    the default that keeps what runs did before it existed, so a run stored before it trains the same."""
    if not (isinstance(stored, dict) and isinstance(defaults, dict)):
        return stored
    filled = {key: with_schema_defaults(value, defaults.get(key)) for key, value in stored.items()}
    filled.update({key: value for key, value in defaults.items() if key not in stored and value != "???"})
    return filled


@functools.cache
def schema_defaults() -> dict:
    """The typed config's defaults as plain containers (11 ms to build; the pre-flight checks every job's
    run directory). Read-only: `with_schema_defaults` shares its values, `trained_config` copies them."""
    return OmegaConf.to_container(OmegaConf.structured(Config), resolve=False, throw_on_missing=False)


def check_same_training(stored: dict, cfg: DictConfig, out_dir: Path) -> None:
    """ConfigError unless `stored` (a resolved config) trains what `cfg` asks for."""
    found = first_difference(trained_config(with_schema_defaults(stored, schema_defaults())),
                             trained_config(OmegaConf.to_container(cfg, resolve=True)))
    if found is not None:
        key, before, now = found
        raise ConfigError(key, now, f"{out_dir} holds a run trained with {key}={before}; give this run its own "
                                    f"experiment_name, or resume=false to replace that run")


def check_claim(out_dir: Path, cfg: DictConfig) -> None:
    """A run directory belongs to the one trained config that wrote it: a finished run or a checkpoint
    there is never taken as this config's unless the config it stored (config.yaml) trains the same."""
    if not cfg.resume:
        return  # the old run is replaced
    finished = has_ended(read_summary(out_dir / "summary.json"))
    if not finished and not checkpoint.exists(out_dir):
        return  # nothing to take over: an unfinished run without a checkpoint starts over
    try:
        stored = OmegaConf.to_container(OmegaConf.load(out_dir / "config.yaml"), resolve=False)
    except Exception as e:  # noqa: BLE001 - missing, or whatever YAML raises on a damaged file
        if finished:
            raise RecordError(f"{out_dir / 'config.yaml'} is missing or damaged ({type(e).__name__}), so the "
                              f"finished run there cannot be matched to this config; resume=false replaces it") from None
        return  # the checkpoint carries its own config, checked when it is loaded
    check_same_training(stored, cfg, out_dir)


def _train(cfg: DictConfig, runtime: Runtime, name: str, out_dir: Path, resuming: bool,
           progress: bool | None, callbacks: Sequence[Callback], guard: PreemptionGuard, memory,
           positions: int) -> dict:
    started, clock = time.perf_counter(), None
    device = runtime.device
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    scheme = make_scheme(cfg)
    parallel = resolve_parallel(cfg.train.parallel, runtime.world_size)
    summary = {
        "status": "failed", "trained": None, "learned_fraction": None,
        "steps": cfg.train.steps, "steps_completed": 0, "resumed_from_step": None,
        "final_loss": None, "eval_loss": None, "eval_step": None, "eval_weights": None, "initial_eval_loss": None,
        "optimal_loss": None, "unigram_loss": None, "excess_loss": None,
        "diverged_at_step": None, "divergence_reason": None, "divergence": None,
        "norm": cfg.norm.name, "model": cfg.model.kind, "depth": cfg.depth, "seed": cfg.seed,
        **scheme.constants(), "params": None, "memory_estimate_gib": memory.total_bytes / GIB,
        "tokens_per_s": None, "flops_per_token": None, "mfu": None, "peak_memory_gib": None, "wall_s": None,
        "started_at": utc_now(), "finished_at": None, "loss_scale": None, "skipped_steps": None,
        "experiment": cfg.experiment_name, "run_name": name, "run_dir": str(out_dir), "device": str(device),
        "world_size": runtime.world_size, "parallel": parallel, "exact_match": None, "error": None,
    }
    if runtime.is_main:
        log.info("%s L%d on %s%s: %s", cfg.norm.name, cfg.depth, device,
                 f" x {runtime.world_size} ({parallel})" if runtime.distributed else "", memory.describe())
        note = one_process_note(cfg.train.parallel, runtime.world_size)
        if note:
            log.warning(note)
    sinks, trainer = [], None
    try:
        state = None
        if resuming:
            state = checkpoint.load_run(out_dir)
            check_same_training(state["config"], cfg, out_dir)
            summary["resumed_from_step"] = state["step"]
            if runtime.is_main:
                log.info("%s: resuming from step %d", out_dir, state["step"])
        data = load_data(cfg.data, cfg.paths.cache, MODELS.get(cfg.model.kind).task)
        if cfg.train.batch_size > data.train_size:
            raise ConfigError("train.batch_size", cfg.train.batch_size,
                              f"must be <= the {data.train_size} training examples")
        summary.update(optimal_loss=data.optimal_loss, unigram_loss=data.unigram_loss)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        model = build_model(cfg, scheme).to(device)
        summary["params"] = count_params(model)
        # The scheme's pass before training (Admin's profiling), on the first rows; also when resuming, so the
        # model holds theta_0 exactly until the checkpoint is restored (the model update's reference).
        scheme.prepare(model, to_device({k: v[:cfg.train.batch_size] for k, v in data.train.items()}, device))
        if runtime.rank > 0:  # its own dropout masks for its share of the batch (rank 0 keeps the seed's stream)
            torch.manual_seed(cfg.seed + 1_000_003 * runtime.rank)
        sinks = build_sinks(cfg, out_dir, name) if runtime.is_main else []
        dtype = autocast_dtype(cfg.train.precision, device)
        if parallel == "fsdp":  # FSDP's mixed-precision policy casts the weights itself (fp32 reductions)
            objective, dtype = wrap(model, runtime, parallel, param_dtype=dtype, compile=cfg.train.compile,
                                     checkpointing=cfg.model.activation_checkpointing), None
        else:
            objective = wrap(model, runtime, parallel, param_dtype=None, compile=cfg.train.compile,
                             checkpointing=cfg.model.activation_checkpointing)

        def eval_loss() -> float:
            return evaluate(objective, data.eval, cfg.train.batch_size, device, dtype)

        metrics = ScalarMetrics(cfg.train.log_every)
        summary["flops_per_token"] = flops_per_token(model, positions)
        throughput = Throughput(summary["flops_per_token"], peak_flops(device, cfg.train.peak_tflops),
                                runtime.world_size)
        evaluation = Evaluation(cfg.train.eval_every, eval_loss)
        divergence = DivergenceDetector(cfg.train.divergence.spike_factor, cfg.train.divergence.spike_patience,
                                        cfg.train.min_loss_scale)
        instruments, blocks = build_instruments(cfg.metrics, cfg.train.log_every, model, data.eval, device,
                                                routed=Routed(objective))
        clock = WallClock(started)
        checkpointer = checkpoint.Checkpointer(out_dir, cfg.train.ckpt_every, guard.stop_reason,
                                               extra={"config": OmegaConf.to_container(cfg, resolve=True)})
        optimizer = build_optimizer(model, cfg.train, scheme.param_groups(model, cfg.train.lr))
        trainer = Trainer(
            model=model, objective=objective, runtime=runtime, optimizer=optimizer,
            scheduler=build_scheduler(optimizer, cfg.train), steps=cfg.train.steps,
            batches=RandomBatches(data.train, cfg.train.batch_size, cfg.seed, runtime.rank, runtime.world_size),
            micro_batch_size=cfg.train.micro_batch_size,
            device=device, autocast_dtype=dtype, grad_clip=cfg.train.grad_clip, scaler=loss_scaler(cfg.train, device),
            # Gatherers first, then the divergence check (it keeps the last record), the bar, the flusher;
            # the checkpointer last, once every other callback's state is final for the step.
            callbacks=[metrics, throughput, evaluation, *instruments, divergence,
                       ProgressBar(f"{cfg.norm.name} L{cfg.depth}", progress if runtime.is_main else False),
                       RecordFlusher(sinks, blocks.columns()), *callbacks, clock, checkpointer],
        )
        if state is not None:
            checkpoint.restore(trainer, state)
            del state
        trainer.fit()
        summary.update(initial_eval_loss=evaluation.initial, final_loss=metrics.last_loss, tokens_per_s=metrics.mean_tokens_per_s,
                       mfu=throughput.mfu(metrics.mean_tokens_per_s))
        if device.type == "cuda":  # what the allocator held at most (this process's device)
            summary["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        if trainer.scaler is not None:
            summary.update(loss_scale=trainer.scaler.get_scale(), skipped_steps=metrics.skipped_steps)
        # Agreed: a rank without the signal must not go on to evaluate (a collective) while the others return.
        interrupted = runtime.agree(guard.stop_reason()) if divergence.event is None else None
        if interrupted is not None:
            summary.update(status="interrupted", error=interrupted, eval_loss=evaluation.last,
                           eval_step=evaluation.last_step or None)
            return summary  # no evaluation: a preempted job has seconds left; the resumed run finishes it

        if evaluation.last_step != trainer.step or evaluation.last is None:
            evaluation.last = eval_loss()  # a diverged run: evaluate the weights it stopped with
        summary.update(eval_loss=evaluation.last, eval_step=trainer.step,
                       eval_weights=divergence.weights_evaluated(trainer.step))
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
            from ..metrics.exact_match import exact_match

            summary["exact_match"] = exact_match(Routed(objective), data, cfg.data.eval_decode, cfg.train.batch_size,
                                                 device)
        if not cfg.train.keep_checkpoint and runtime.is_main:  # finished: nothing left to resume
            checkpoint.remove(out_dir)
    except KeyboardInterrupt:  # a second Ctrl-C (the first stops at the next step boundary, like SIGTERM)
        summary.update(status="interrupted", error="interrupted by SIGINT before a checkpoint")
        raise
    except BaseException as e:
        summary["error"] = one_line(e)
        raise
    finally:
        if trainer is not None:
            summary["steps_completed"] = trainer.step
        # Across resumes (WallClock), once the checkpoint's clock is restored; set-up alone before that.
        summary["wall_s"] = clock.elapsed() if clock is not None else time.perf_counter() - started
        summary["finished_at"] = utc_now()
        if runtime.is_main:
            try:
                write_summary(out_dir / "summary.json", summary)
            except OSError as e:  # a full disk: say so, and let the run's own error be the one raised
                log.error("could not write %s: %s", out_dir / "summary.json", one_line(e))
            for sink in sinks:
                sink.finish(summary)
            log.info(format_summary(summary))
    return summary
