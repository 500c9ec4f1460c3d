"""The Hydra task function: what each job of a command runs (one training run), with Hydra's config.

Apart from the command line (`__main__.py`) so that the pre-flight check, which needs the task function to
build Hydra as `@hydra.main` does, imports it without importing the command that calls the pre-flight."""

from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import CONF_DIR
from .errors import HarnessError, one_line

log = logging.getLogger("deepnorm_exp")


# An absolute path: Hydra reads a relative one against the calling module, which depends on how the command
# was started (`python -m deepnorm_exp`, the console script, the pre-flight importing this module).
@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def train(cfg: DictConfig) -> dict | None:
    from .lifecycle.run import run_experiment

    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    hydra_cfg = HydraConfig.get()
    if cfg.threads is None:
        cfg.threads = worker_threads(hydra_cfg.launcher)
    try:
        return run_experiment(cfg, override_dirname=hydra_cfg.job.override_dirname)
    except (HarnessError, OSError) as e:  # said in one line: bad input, a damaged record, a full disk
        print(f"deepnorm_exp: error: {one_line(e)}", file=sys.stderr, flush=True)
        if hydra_cfg.mode == RunMode.RUN:
            sys.exit(e.exit_status if isinstance(e, HarnessError) else 1)
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
