"""`python -m deepnorm_exp [overrides]`: check every job the command would launch, then hand it to Hydra."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

from .errors import HarnessError
from .task import train


def all_finished(jobs) -> bool:
    """Whether every job of a sweep already has a final summary, so launching would only skip them all."""
    from .lifecycle.summary import has_finished

    for job in jobs:
        if not (job.fixed and job.cfg.resume and has_finished(job.run_dir)):
            return False
    return True


def failed_runs(jobs) -> list[str]:
    """The jobs of a finished sweep whose run failed or left no record (a diverged run is a result; a run
    that another process holds, e.g. a second sweep launched at once, is that process's to report)."""
    from .lifecycle.summary import has_ended, summary_of
    from .rundir import RunDir

    failed = []
    for job in jobs:
        summary = summary_of(job.run_dir) or {}
        if has_ended(summary):
            continue
        if summary.get("status") != "failed" and RunDir(job.run_dir).held_elsewhere():
            continue  # running in another process
        failed.append(f"{job.run_dir.name}: {summary.get('error') or summary.get('status') or 'no ' + RunDir.SUMMARY}")
    return failed


def main(argv: list[str] | None = None) -> None:
    if not launched_as_rank():
        return command(argv)
    # A rank of a torchrun job leaves without the interpreter's teardown: gloo's worker threads can still
    # hold finished work whose tensors reference Python objects, and freeing those while the interpreter
    # is being torn down aborts the process ("terminate called without an active exception", SIGABRT)
    # after a run that completed and wrote its records. Seen in CI about once in 12 two-rank runs.
    status = 1
    try:
        command(argv)
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        status = 130
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the same exit
        traceback.print_exc()
    finally:
        try:
            if "wandb" in sys.modules:
                sys.modules["wandb"].teardown()  # what its exit handler would do (runs are finished by now)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def launched_as_rank() -> bool:
    """Whether torchrun (or another launcher setting its variables) started this process as one of several:
    the variables `runtime.launch_environment` reads first."""
    try:
        return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def command(argv: list[str] | None) -> None:
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import args_parser

    from .preflight import preflight

    argv = sys.argv[1:] if argv is None else argv
    args = args_parser().parse_args(argv)
    wants_info = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
    jobs, multirun = [], False
    if not wants_info:
        try:
            jobs, multirun = preflight(argv, train)
        except HarnessError as e:
            print(f"deepnorm_exp: error: {e}", file=sys.stderr)
            sys.exit(e.exit_status)
        if multirun and all_finished(jobs):  # a re-run of a finished sweep launches nothing
            from .lifecycle.summary import format_table, load_summaries

            roots = sorted({Path(job.cfg.paths.runs) / str(job.cfg.experiment_name) for job in jobs})
            print(f"all {len(jobs)} runs already finished (resume=false runs them again)")
            for root in roots:
                print(f"\n{root}\n{format_table(*load_summaries(root))}")
            return
    if any(job.cfg.train.deterministic for job in jobs):
        from .train.numerics import DETERMINISTIC_CUBLAS

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS)  # cuBLAS reads it once
    from .preflight import checked_sweeper_override

    sys.argv = [sys.argv[0], *argv, *checked_sweeper_override(jobs)]
    try:
        train()
    except KeyboardInterrupt:  # the runs wrote their records (interrupted) before this reached here
        print("deepnorm_exp: interrupted", file=sys.stderr)
        sys.exit(130)
    fixed = [job for job in jobs if job.fixed]
    failed = failed_runs(fixed) if multirun else []
    if failed:
        print(f"deepnorm_exp: error: {len(failed)} of {len(fixed)} runs failed: " + "; ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
