"""One training run: claim its directory, assemble it from the config, train, summarise, write the records."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from ..errors import one_line
from ..records import atomic_path, utc_now
from ..rundir import RunDir
from ..runtime import Runtime, close_runtime, init_runtime
from ..train import checkpoint
from ..train.memory import GIB
from ..train.numerics import deterministic_kernels, subnormals_flushed
from ..train.parallel import Routed, one_process_note, resolve_parallel
from ..train.trainer import Callback
from .assemble import RunParts, assemble
from .claim import check_same_training, claim_directory
from .plan import RunPlan, plan_run
from .preemption import PreemptionGuard
from .schema import RunSummary
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
    plan = plan_run(cfg, override_dirname, progress, callbacks)
    runtime = init_runtime(cfg.device)
    try:
        return _run(plan, runtime)
    finally:
        close_runtime(runtime)


def _run(plan: RunPlan, runtime: Runtime) -> dict:
    if not runtime.is_main:
        log.setLevel(logging.WARNING)  # the main process speaks for the run
    cfg, out_dir = plan.cfg, plan.directory
    lock = RunDir(out_dir).lock()
    # The main process claims the run directory and decides; the other ranks of a distributed run follow.
    claim = runtime.broadcast(claim_directory(cfg, out_dir, lock) if runtime.is_main else None)
    if claim.action != "train":
        lock.release()
        if claim.error is not None:
            raise claim.error
        return claim.summary
    guard = PreemptionGuard()
    try:
        if runtime.is_main:
            with atomic_path(RunDir(out_dir).config) as temporary:
                OmegaConf.save(cfg, temporary, resolve=True)
        with guard, deterministic_kernels(cfg.train.deterministic), subnormals_flushed(cfg.train.flush_denormal):
            summary = _train(plan, runtime, claim.resuming, guard)
    finally:
        lock.release()
    guard.forward()  # after the records are written: a preemption's signal goes on (submitit requeues)
    return summary


def _train(plan: RunPlan, runtime: Runtime, resuming: bool, guard: PreemptionGuard) -> dict:
    """Assemble, fit, summarise; the summary is written however the run ends (failed, interrupted)."""
    cfg, out_dir = plan.cfg, plan.directory
    parts = RunParts(started=time.perf_counter(), parallel=resolve_parallel(cfg.train.parallel, runtime.world_size))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    summary = new_summary(plan, runtime, parts.parallel)
    if runtime.is_main:
        log.info("%s L%d on %s%s: %s", cfg.norm.name, cfg.depth, runtime.device,
                 f" x {runtime.world_size} ({parts.parallel})" if runtime.distributed else "", plan.memory.describe())
        if note := one_process_note(cfg.train.parallel, runtime.world_size):
            log.warning(note)
    try:
        state = checkpoint.load_run(out_dir) if resuming else None
        if state is not None:
            check_same_training(state["config"], cfg, out_dir)
            summary.resumed_from_step = state["step"]
            if runtime.is_main:
                log.info("%s: resuming from step %d", out_dir, state["step"])
        assemble(parts, plan, runtime, summary, guard.stop_reason)
        if state is not None:
            checkpoint.restore(parts.trainer, state)
            del state
        parts.trainer.fit()
        summarise(parts, cfg, runtime, guard, summary)
    except KeyboardInterrupt:  # a second Ctrl-C (the first stops at the next step boundary, like SIGTERM)
        summary.update(status="interrupted", error="interrupted by SIGINT before a checkpoint")
        raise
    except BaseException as e:
        summary.error = one_line(e)
        raise
    finally:
        written = close_records(parts, runtime, out_dir, summary)
    # Last: the checkpoint outlives the summary and the sinks. A kill before this point (in the diagnosis,
    # which reads every layer file, or in W&B's finish) leaves a run without a summary, which the next
    # attempt resumes from here instead of training it again from step 0.
    record = summary.record()
    if written and has_ended(record) and not cfg.train.keep_checkpoint:
        checkpoint.remove(out_dir)  # finished: nothing left to resume
    return record


def summarise(parts: RunParts, cfg: DictConfig, runtime: Runtime, guard: PreemptionGuard, summary: RunSummary) -> None:
    """What the loop ended with, into the summary: interrupted (no evaluation: a preempted job has seconds
    left; the resumed run finishes it), else the final evaluation, and completed or diverged."""
    trainer, metrics, evaluation, divergence, data = (parts.trainer, parts.metrics, parts.evaluation,
                                                      parts.divergence, parts.data)
    summary.update(initial_eval_loss=evaluation.initial, final_loss=metrics.last_loss,
                   tokens_per_s=metrics.mean_tokens_per_s, mfu=parts.throughput.mfu(metrics.mean_tokens_per_s))
    if runtime.device.type == "cuda":  # what the allocator held at most (this process's device)
        summary.peak_memory_gib = torch.cuda.max_memory_allocated(runtime.device) / GIB
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
        summary.excess_loss = evaluation.last - data.optimal_loss
    fraction = learned_fraction(evaluation.last, data.unigram_loss, data.optimal_loss)
    summary.update(learned_fraction=fraction, trained=is_trained(fraction), trained_at_step=parts.trained_at.step)
    if divergence.event is not None:
        summary.update(status="diverged", diverged_at_step=divergence.event["step"],
                       divergence_reason=divergence.event["reason"], divergence=divergence.event)
    else:
        summary.status = "completed"
    if data.task == "translation":
        from ..metrics.exact_match import exact_match

        summary.exact_match = exact_match(Routed(parts.objective), data, cfg.data.eval_decode,
                                             cfg.train.batch_size, runtime.device)


def close_records(parts: RunParts, runtime: Runtime, out_dir: Path, summary: RunSummary) -> bool:
    """The summary's last entries, then every sink closed with them, then summary.json (main process only):
    a run's summary is the last record it writes, so a run that has one has all of them (W&B's copy
    included; a kill before it and the next attempt resumes, finishing them). Whether summary.json was
    written (False on the other ranks)."""
    if parts.trainer is not None:
        summary.steps_completed = parts.trainer.step
    # Across resumes (WallClock), once the checkpoint's clock is restored; set-up alone before that.
    summary.wall_s = parts.clock.elapsed() if parts.clock is not None else time.perf_counter() - parts.started
    summary.finished_at = utc_now()
    if runtime.is_main:
        record = summary.record()
        if has_ended(record):  # the records are on disk by now: the sinks write as they receive
            from .diagnosis import diagnose_run_dir  # pandas: only once training is over

            summary.diagnosis = diagnose_run_dir(out_dir, record)
            record = summary.record()
        for sink in parts.sinks:
            sink.finish(record)
        try:
            write_summary(RunDir(out_dir).summary, record)
        except OSError as e:  # a full disk: say so, and let the run's own error be the one raised
            log.error("could not write %s: %s", RunDir(out_dir).summary, one_line(e))
            return False
        log.info(format_summary(record))
        return True
    return False
