"""Config composition outside a Hydra app (notebooks, tests) and the pre-flight check of a command line.

The pre-flight composes every job a command would launch (the sweep expanded the way Hydra's basic
sweeper does) and checks each one, so bad input fails in a second, before any run directory or compute.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

# conf/hydra/launcher/{joblib,submitit_local,submitit_slurm}.yaml share their names with the plugins'
# schemas on purpose (`hydra/launcher=joblib` is what users type), so Hydra validates our YAML against the
# plugin's schema (what we want) and warns, at every composition, that this matching is deprecated.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name",
                        category=UserWarning)

from .build import check_config  # noqa: E402
from .config import CONF_DIR
from .errors import ConfigError, first_line


def _compose(overrides: Sequence[str], hydra_config: bool = False) -> DictConfig:
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=hydra_config)
    except MissingConfigException as e:
        raise _missing_option(e) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise _composition_error(e, overrides) from None


def compose(overrides: Iterable[str] = (), check: bool = True) -> DictConfig:
    """The config `python -m deepnorm_exp <overrides>` would run, checked; e.g. compose(["norm=pre"])."""
    cfg = _compose(list(overrides))
    if check:
        check_config(cfg)
    return cfg


def _missing_option(e: MissingConfigException) -> ConfigError:
    missing = (e.missing_cfg_file or "").strip("/")
    group, _, option = missing.rpartition("/")
    if group and e.options is not None:
        return ConfigError(group, option, f"choose one of: {', '.join(sorted(e.options))}")
    return ConfigError("config", missing or "?", first_line(e))


def _composition_error(e: Exception, overrides: Sequence[str]) -> ConfigError:
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    if key:
        value = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+~").split("=", 1)[0] == key), "?")
        return ConfigError(key, value, first_line(cause))
    # Hydra's own message names the override ("Could not override 'x'. ..."); keep its first sentence.
    return ConfigError("override", " ".join(overrides) or "-", first_line(e))


def expand_jobs(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """The override list of every job the command launches (one job without --multirun)."""
    if not multirun:
        return [list(overrides)]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra

    # With the config loader, as Hydra's own sweepers have it: glob() lists a group's options through it.
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())

    def product(items: Sequence[str]) -> list[list[str]]:
        try:
            return BasicSweeper.split_arguments(parser.parse_overrides(list(items)), None)[0]
        except HydraException as e:
            raise ConfigError("override", " ".join(items), first_line(e)) from None

    jobs = []
    for job in product(overrides):
        # A preset may add sweep axes through hydra.sweeper.params; command-line overrides win, as in Hydra.
        cfg = _compose(job, hydra_config=True)
        params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
        axes = [f"{k}={v}" for k, v in params.items()]
        jobs.extend(product(axes + job) if axes else [job])
    return jobs


@dataclass
class Job:
    cfg: DictConfig  # checked, without the hydra node
    override_dirname: str  # Hydra's, what the run directory is named from
    fixed: bool  # launched exactly as composed (the basic sweeper); false when a sweeper picks values

    @property
    def run_dir(self) -> Path:
        from .rundir import run_dir, run_name

        return run_dir(self.cfg, run_name(self.cfg, self.override_dirname))


def preflight(overrides: Sequence[str], multirun: bool) -> list[Job]:
    """Compose and check every job (where the jobs run on this machine, also its device and memory; a
    cluster launcher's jobs are checked on their node when they start), and that no job would take over a
    run directory trained with another config; returns them, or raises a HarnessError."""
    from .build import check_runtime
    from .run import check_claim

    checked = []
    for job in expand_jobs(overrides, multirun):
        cfg = _compose(job, hydra_config=True)
        override_dirname = cfg.hydra.job.override_dirname
        fixed = str(cfg.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper")
        if str(cfg.hydra.sweeper.get("_target_", "")).endswith("FrontierSweeper"):
            from .frontier import check_owned_keys

            check_owned_keys(cfg.hydra.sweeper.key, job)  # the sweeper's own check, before anything runs
        here = "Slurm" not in str(cfg.hydra.launcher.get("_target_", ""))
        with open_dict(cfg):
            del cfg["hydra"]
        check_config(cfg)
        check_runtime(cfg, here)
        checked.append(Job(cfg, override_dirname, fixed))
        if fixed:
            check_claim(checked[-1].run_dir, cfg)
    return checked
