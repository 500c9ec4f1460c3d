"""`python -m deepnorm_exp [overrides]`: check every job the command would launch, then hand it to Hydra."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .errors import ConfigError

log = logging.getLogger("deepnorm_exp")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def train(cfg: DictConfig) -> dict | None:
    from .run import run_experiment

    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    hydra_cfg = HydraConfig.get()
    if cfg.threads is None:
        cfg.threads = worker_threads(hydra_cfg.launcher)
    try:
        return run_experiment(cfg, override_dirname=hydra_cfg.job.override_dirname)
    except ConfigError as e:
        print(f"deepnorm_exp: error: {e}", file=sys.stderr)
        if hydra_cfg.mode == RunMode.RUN:
            sys.exit(2)
    except Exception as e:  # noqa: BLE001 - in a sweep one failed job is a result; the rest go on
        if hydra_cfg.mode == RunMode.RUN:
            raise
        log.exception("run failed: %s", e)
    return None


def worker_threads(launcher: DictConfig) -> int | None:
    """Torch threads for a joblib worker: the machine's cores shared among the jobs running at once
    (loky alone leaves each worker 1 thread). None (torch's default) for every other launcher."""
    if "JoblibLauncher" not in str(launcher.get("_target_", "")):
        return None
    cores = os.cpu_count() or 1
    n_jobs = launcher.get("n_jobs") or 1
    return max(1, cores // (cores if n_jobs < 0 else n_jobs))


def all_finished(jobs) -> bool:
    """Whether every job of a sweep already has a final summary, so launching would only skip them all."""
    from .rundir import run_dir, run_name
    from .run import FINAL
    from .summary import read_summary

    for job in jobs:
        summary = read_summary(run_dir(job.cfg, run_name(job.cfg, job.override_dirname)) / "summary.json")
        if not (job.fixed and job.cfg.resume and summary is not None and summary.get("status") in FINAL):
            return False
    return True


def main(argv: list[str] | None = None) -> None:
    from hydra._internal.utils import get_args_parser

    from .compose import preflight

    argv = sys.argv[1:] if argv is None else argv
    args = get_args_parser().parse_args(argv)
    wants_info = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
    if not wants_info:
        try:
            jobs = preflight(args.overrides, args.multirun)
        except ConfigError as e:
            print(f"deepnorm_exp: error: {e}", file=sys.stderr)
            sys.exit(2)
        if args.multirun and all_finished(jobs):  # a re-run of a finished sweep launches nothing
            from .summary import format_table, load_summaries

            roots = sorted({Path(job.cfg.paths.runs) / str(job.cfg.experiment_name) for job in jobs})
            print(f"all {len(jobs)} runs already finished (resume=false runs them again)")
            for root in roots:
                print(f"\n{root}\n{format_table(load_summaries(root))}")
            return
    sys.argv = [sys.argv[0], *argv]
    train()


if __name__ == "__main__":
    main()
