"""One training run: claim its directory, assemble it from the config, train, summarise, write the records."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from ..build import check_config, check_runtime, make_scheme
from ..errors import one_line
from ..records import atomic_path, utc_now
from ..rundir import RunDir
from ..rundir import run_dir as make_run_dir
from ..rundir import run_name as make_run_name
from ..runtime import Runtime, close_runtime, init_runtime, launch_environment
from ..train import checkpoint
from ..train.memory import GIB
from ..train.numerics import deterministic_kernels, subnormals_flushed
from ..train.parallel import Routed, one_process_note, resolve_parallel
from ..train.trainer import Callback
from .assemble import RunParts, assemble
from .claim import check_same_training, plan_run
from .preemption import PreemptionGuard
from .summary import format_summary, has_ended, is_trained, learned_fraction, new_summary, write_summary

log = logging.getLogger("deepnorm_exp")


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
    lock = RunDir(out_dir).lock()
    # The main process claims the run directory and decides; the other ranks of a distributed run follow.
    plan = plan_run(cfg, out_dir, lock) if runtime.is_main else None
    plan = runtime.broadcast(plan)
    if plan[0] != "train":
        lock.release()
        if plan[0] == "error":
            raise plan[1]
        return plan[1]
    guard = PreemptionGuard()
    try:
        if runtime.is_main:
            with atomic_path(RunDir(out_dir).config) as temporary:
                OmegaConf.save(cfg, temporary, resolve=True)
        with guard, deterministic_kernels(cfg.train.deterministic), subnormals_flushed(cfg.train.flush_denormal):
            summary = _train(cfg, runtime, name, out_dir, plan[1], progress, callbacks, guard, memory, positions)
    finally:
        lock.release()
    guard.forward()  # after the records are written: a preemption's signal goes on (submitit requeues)
    return summary


def _train(cfg: DictConfig, runtime: Runtime, name: str, out_dir: Path, resuming: bool,
           progress: bool | None, callbacks: Sequence[Callback], guard: PreemptionGuard, memory,
           positions: int) -> dict:
    """Assemble, fit, summarise; the summary is written however the run ends (failed, interrupted)."""
    started, parts = time.perf_counter(), RunParts()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    scheme = make_scheme(cfg)
    parallel = resolve_parallel(cfg.train.parallel, runtime.world_size)
    summary = new_summary(cfg, name, out_dir, runtime, parallel, scheme.constants(), memory.total_bytes / GIB)
    if runtime.is_main:
        log.info("%s L%d on %s%s: %s", cfg.norm.name, cfg.depth, runtime.device,
                 f" x {runtime.world_size} ({parallel})" if runtime.distributed else "", memory.describe())
        if note := one_process_note(cfg.train.parallel, runtime.world_size):
            log.warning(note)
    try:
        state = checkpoint.load_run(out_dir) if resuming else None
        if state is not None:
            check_same_training(state["config"], cfg, out_dir)
            summary["resumed_from_step"] = state["step"]
            if runtime.is_main:
                log.info("%s: resuming from step %d", out_dir, state["step"])
        assemble(parts, cfg, runtime, scheme, parallel, out_dir, name, summary, started, guard.stop_reason,
                 progress, callbacks, positions)
        if state is not None:
            checkpoint.restore(parts.trainer, state)
            del state
        parts.trainer.fit()
        summarise(parts, cfg, runtime, guard, summary)
    except KeyboardInterrupt:  # a second Ctrl-C (the first stops at the next step boundary, like SIGTERM)
        summary.update(status="interrupted", error="interrupted by SIGINT before a checkpoint")
        raise
    except BaseException as e:
        summary["error"] = one_line(e)
        raise
    finally:
        written = close_records(parts, runtime, out_dir, summary, started)
    # Last: the checkpoint outlives the summary and the sinks. A kill before this point (in the diagnosis,
    # which reads every layer file, or in W&B's finish) leaves a run without a summary, which the next
    # attempt resumes from here instead of training it again from step 0.
    if written and has_ended(summary) and not cfg.train.keep_checkpoint:
        checkpoint.remove(out_dir)  # finished: nothing left to resume
    return summary


def summarise(parts: RunParts, cfg: DictConfig, runtime: Runtime, guard: PreemptionGuard, summary: dict) -> None:
    """What the loop ended with, into the summary: interrupted (no evaluation: a preempted job has seconds
    left; the resumed run finishes it), else the final evaluation, and completed or diverged."""
    trainer, metrics, evaluation, divergence, data = (parts.trainer, parts.metrics, parts.evaluation,
                                                      parts.divergence, parts.data)
    summary.update(initial_eval_loss=evaluation.initial, final_loss=metrics.last_loss,
                   tokens_per_s=metrics.mean_tokens_per_s, mfu=parts.throughput.mfu(metrics.mean_tokens_per_s))
    if runtime.device.type == "cuda":  # what the allocator held at most (this process's device)
        summary["peak_memory_gib"] = torch.cuda.max_memory_allocated(runtime.device) / GIB
    if trainer.scaler is not None:
        summary.update(loss_scale=trainer.scaler.get_scale(), skipped_steps=metrics.skipped_steps)
    # Agreed: a rank without the signal must not go on to evaluate (a collective) while the others return.
    interrupted = runtime.agree(guard.stop_reason()) if divergence.event is None else None
    if interrupted is not None:
        summary.update(status="interrupted", error=interrupted, eval_loss=evaluation.last,
                       eval_step=evaluation.last_step or None)
        return
    if evaluation.last_step != trainer.step or evaluation.last is None:
        evaluation.last = parts.eval_loss()  # a diverged run: evaluate the weights it stopped with
    summary.update(eval_loss=evaluation.last, eval_step=trainer.step,
                   eval_weights=divergence.weights_evaluated(trainer.step))
    if data.optimal_loss is not None and math.isfinite(evaluation.last):
        summary["excess_loss"] = evaluation.last - data.optimal_loss
    fraction = learned_fraction(evaluation.last, data.unigram_loss, data.optimal_loss)
    summary.update(learned_fraction=fraction, trained=is_trained(fraction), trained_at_step=parts.trained_at.step)
    if divergence.event is not None:
        summary.update(status="diverged", diverged_at_step=divergence.event["step"],
                       divergence_reason=divergence.event["reason"], divergence=divergence.event)
    else:
        summary["status"] = "completed"
    if data.task == "translation":
        from ..metrics.exact_match import exact_match

        summary["exact_match"] = exact_match(Routed(parts.objective), data, cfg.data.eval_decode,
                                             cfg.train.batch_size, runtime.device)


def close_records(parts: RunParts, runtime: Runtime, out_dir: Path, summary: dict, started: float) -> bool:
    """The summary's last entries, then every sink closed with them, then summary.json (main process only):
    a run's summary is the last record it writes, so a run that has one has all of them (W&B's copy
    included; a kill before it and the next attempt resumes, finishing them). Whether summary.json was
    written (False on the other ranks)."""
    if parts.trainer is not None:
        summary["steps_completed"] = parts.trainer.step
    # Across resumes (WallClock), once the checkpoint's clock is restored; set-up alone before that.
    summary["wall_s"] = parts.clock.elapsed() if parts.clock is not None else time.perf_counter() - started
    summary["finished_at"] = utc_now()
    if runtime.is_main:
        if has_ended(summary):  # the records are on disk by now: the sinks write as they receive
            from .diagnosis import diagnose_run_dir  # pandas: only once training is over

            summary["diagnosis"] = diagnose_run_dir(out_dir, summary)
        for sink in parts.sinks:
            sink.finish(summary)
        try:
            write_summary(RunDir(out_dir).summary, summary)
        except OSError as e:  # a full disk: say so, and let the run's own error be the one raised
            log.error("could not write %s: %s", RunDir(out_dir).summary, one_line(e))
            return False
        log.info(format_summary(summary))
        return True
    return False
