"""`python -m deepnorm_exp [overrides]`: check every job the command would launch, then hand it to Hydra."""

from __future__ import annotations

import logging
import sys

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


def main(argv: list[str] | None = None) -> None:
    from hydra._internal.utils import get_args_parser

    from .compose import preflight

    argv = sys.argv[1:] if argv is None else argv
    args = get_args_parser().parse_args(argv)
    wants_info = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
    if not wants_info:
        try:
            preflight(args.overrides, args.multirun)
        except ConfigError as e:
            print(f"deepnorm_exp: error: {e}", file=sys.stderr)
            sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    train()


if __name__ == "__main__":
    main()
