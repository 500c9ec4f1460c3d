"""The pre-flight check of a command line: every job it would launch, composed by Hydra itself, checked
before any run directory or compute exists.

One source of truth: the check builds Hydra from the command line exactly as `@hydra.main` does (the same
search path, `--config-dir`, `--config-path`, `--config-name`, `hydra.searchpath`), asks Hydra for the mode
(`-m` or `hydra.mode=MULTIRUN`), composes the sweep's master config, instantiates the sweeper the user
selected and expands the sweep the way that sweeper will (Hydra's basic sweeper: its own parser, with the
config loader for glob(), and its own `split_arguments`; a sweeper of ours: its `planned_jobs`). Each job's
config is what the launcher will compose (`load_sweep_config`), only faster (JobComposer). A sweeper that
chooses its jobs as it goes (Optuna, Nevergrad) cannot be expanded in advance: the settings its jobs share
are checked here, and each job checks itself when it starts, before it computes.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, InstantiationException, MissingConfigException, SearchPathException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from .build import check_config, check_runtime
from .compose import composition_error, missing_option, unreadable_override
from .config import CONF_DIR
from .errors import ConfigError, HarnessError, first_line

DEFAULT_CONFIG = "config"
# The override lists of the jobs this process's pre-flight composed and checked, where the sweep is Hydra's
# basic sweeper: the command launches them with hydra/sweeper=checked, the same sweeper without its second
# composition of each job (hydra_plugins/deepnorm_exp_frontier/checked_sweeper.py).
_checked: set[tuple[str, ...]] = set()


def was_checked(overrides: Sequence[str]) -> bool:
    return tuple(overrides) in _checked


def checked_sweeper_override(jobs: Sequence[Job]) -> list[str]:
    """["hydra/sweeper=checked"] where every job of the sweep was checked for Hydra's basic sweeper itself
    (not a subclass of it, nor a sweeper the user or a preset chose), else []."""
    return ["hydra/sweeper=checked"] if jobs and all(was_checked(job.overrides) for job in jobs) else []


@dataclass
class Job:
    overrides: list[str]  # what the sweeper passes to the launcher
    cfg: DictConfig  # checked, without the hydra node
    override_dirname: str  # Hydra's, what the run directory is named from
    fixed: bool  # launched exactly as composed (the basic sweeper); false when a sweeper picks values
    memory: object = None  # train.memory.MemoryEstimate where the job trains on this machine
    disk: object = None  # train.disk.DiskEstimate: the records it writes

    @property
    def run_dir(self) -> Path:
        from .rundir import run_dir, run_name

        return run_dir(self.cfg, run_name(self.cfg, self.override_dirname))


@dataclass
class Command:
    """A command line as Hydra reads it: its Hydra instance (with the command's search path), the primary
    config's name, the overrides and the mode."""

    hydra: object  # Hydra's instance (_hydra_internals.main_hydra)
    config_name: str
    overrides: list[str]
    multirun: bool

    @property
    def config_loader(self):
        return self.hydra.config_loader

    def compose(self, overrides: Sequence[str], run_mode: RunMode) -> DictConfig:
        with refusals(overrides, self.config_name):
            return self.hydra.compose_config(self.config_name, list(overrides), run_mode=run_mode)


@contextmanager
def hydra_command(args: argparse.Namespace, task_function: Callable) -> Iterator[Command]:
    """Hydra as `@hydra.main(config_path=CONF_DIR, config_name="config")` builds it for `args` (Hydra's own
    argument parser's result); Hydra's global state is cleared on exit so that the app can run next."""
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import main_hydra, main_search_path

    search_path, task_name = main_search_path(task_function, args.config_path or str(CONF_DIR))
    if args.config_dir is not None:
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir):
            raise ConfigError("--config-dir", args.config_dir, f"{config_dir} is not a directory")
        search_path.prepend(provider="command-line", path=f"file://{config_dir}",
                            anchor=SearchPathQuery(provider="schema"))
    try:
        hydra = main_hydra(task_name, search_path)
        config_name = args.config_name or DEFAULT_CONFIG
        with refusals(args.overrides, config_name):
            mode = hydra.get_mode(config_name=config_name, overrides=list(args.overrides))
        # As Hydra's _run_app decides: -m, or hydra.mode=MULTIRUN from the command or a config.
        multirun = bool(args.multirun) or mode == RunMode.MULTIRUN
        yield Command(hydra, config_name, list(args.overrides), multirun)
    except SearchPathException as e:
        raise ConfigError("--config-path" if args.config_path else "hydra.searchpath", args.config_path or "?",
                          first_line(e)) from None
    finally:
        GlobalHydra.instance().clear()


@contextmanager
def refusals(overrides: Sequence[str], config_name: str) -> Iterator[None]:
    """Hydra's composition errors as one-line ConfigErrors naming the key (or the override) at fault."""
    try:
        yield
    except MissingConfigException as e:
        if (e.missing_cfg_file or "").strip("/") == config_name:
            raise ConfigError("--config-name", config_name, first_line(e)) from None
        raise missing_option(e) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise composition_error(e, overrides) from None
    except HarnessError:
        raise
    except (OSError, ValueError) as e:
        raise unreadable_override(e, overrides) from None


@dataclass
class ComposedJob:
    cfg: DictConfig  # the task's config, without the hydra node (what the task function receives)
    override_dirname: str  # hydra.job.override_dirname
    launcher: str  # hydra.launcher._target_
    world_size: int  # the processes that will train it (planned_world_size)


def planned_world_size(launcher: DictConfig) -> int:
    """How many processes will train each job: a submitit job's tasks (tasks_per_node x nodes, each task a
    rank), else as many as this process was started among (torchrun's WORLD_SIZE; one)."""
    if "submitit" in str(launcher.get("_target_", "")):
        return int(launcher.get("tasks_per_node") or 1) * int(launcher.get("nodes") or 1)
    from .runtime import launch_environment

    return launch_environment()[1]


def composed(cfg: DictConfig, hydra_node: DictConfig, override_dirname: str, launched: bool = True) -> ComposedJob:
    """`launched`: the job goes through the launcher (a sweep's); a single run trains in this process."""
    from .runtime import launch_environment

    world_size = planned_world_size(hydra_node.launcher) if launched else launch_environment()[1]
    return ComposedJob(cfg, override_dirname, str(hydra_node.launcher.get("_target_", "")), world_size)


class JobComposer:
    """The config of one job of a sweep, equal to what the launcher composes with Hydra's
    `config_loader.load_sweep_config(master, overrides)` (tests/test_preflight.py compares the two), at a
    fraction of the cost for a large sweep.

    Hydra composes a job in two stages: the defaults list (which config of each group; it depends only on
    the group overrides, e.g. norm=post, and on the hydra.* overrides) is merged into a config, and then
    the plain value overrides (depth=24, seed=1) are applied to it. The first stage is most of the cost
    and a sweep has few distinct defaults lists, so it is composed once per distinct set of group and
    hydra overrides, by Hydra; the second is done on a copy of the task's part, by Hydra's own function,
    and `hydra.job.override_dirname` is computed as Hydra computes it.
    """

    def __init__(self, command: Command, master: DictConfig):
        self.command, self.master = command, master
        # As Hydra keeps them: an override such as hydra.sweep.subdir=job${hydra.job.num} is a string, not
        # resolved here (hydra.job.num exists only in a launched job).
        self.hydra_overrides = OmegaConf.to_container(master.hydra.overrides.hydra, resolve=False)
        self.repos: dict[tuple[str, ...], object] = {}  # the config repository per set of hydra overrides
        self.bases: dict[tuple[str, ...], tuple[DictConfig, DictConfig]] = {}  # (task part, hydra node)

    def _classify(self, overrides: list[str]):
        """Hydra's parse of `overrides` and its value overrides (those applied after the defaults list)."""
        from hydra_plugins.deepnorm_exp_frontier._hydra_internals import config_repository, value_overrides

        parsed = OverridesParser.create().parse_overrides(overrides)
        searchpath_key = tuple(o.input_line for o in parsed if o.is_hydra_override())
        if searchpath_key not in self.repos:  # hydra.searchpath changes which groups exist
            self.repos[searchpath_key] = config_repository(self.command.config_loader, self.command.config_name,
                                                           overrides)
        values = value_overrides(self.repos[searchpath_key], parsed)
        return parsed, [o for o in values if not o.is_hydra_override()]

    def __call__(self, job_overrides: Sequence[str]) -> ComposedJob:
        from hydra_plugins.deepnorm_exp_frontier._hydra_internals import apply_value_overrides, overrides_dirname

        job_overrides = list(job_overrides)
        with refusals(job_overrides, self.command.config_name):
            parsed, values = self._classify(self.hydra_overrides + job_overrides)
            structural = tuple(o.input_line for o in parsed[len(self.hydra_overrides):]
                               if not any(o is v for v in values))
            if structural not in self.bases:
                full = self.command.config_loader.load_sweep_config(self.master, list(structural))
                hydra_node = full.hydra
                with open_dict(full):
                    del full["hydra"]
                self.bases[structural] = (full, hydra_node)
            task, hydra_node = self.bases[structural]
            cfg = copy.deepcopy(task)
            apply_value_overrides(values, cfg)
        override_dirname = overrides_dirname([o for o in parsed if not o.is_hydra_override()],
                                             hydra_node.job.config.override_dirname)
        return composed(cfg, hydra_node, override_dirname)


def planned_jobs(command: Command, master: DictConfig, task_function: Callable) -> tuple[list[list[str]], bool]:
    """The override list of every job the sweep launches, as the configured sweeper expands it, and whether
    they are launched as they are (else the sweeper sets more keys on them, e.g. the frontier's lr)."""
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import basic_sweeper, split_sweep, sweep_axes

    class NoCallbacks:  # the sweeper's setup only stores them; the sweep's callbacks run when it launches
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    arguments = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)  # unresolved, as Hydra has them
    with refusals(arguments, command.config_name):
        try:
            sweeper = Plugins.instance().instantiate_sweeper(
                config=master, task_function=task_function,
                hydra_context=HydraContext(config_loader=command.config_loader, callbacks=NoCallbacks()))
        except (InstantiationException, ImportError, RuntimeError) as e:  # bad settings, not a plugin
            cause = e.__cause__ or e  # instantiate's own message only says which target it called
            raise ConfigError("hydra.sweeper", master.hydra.sweeper.get("_target_"), first_line(cause)) from None
        if hasattr(sweeper, "planned_jobs"):  # ours (the frontier): the cells it will probe
            return sweeper.planned_jobs(arguments), False
        if isinstance(sweeper, basic_sweeper()[0]):
            parser = OverridesParser.create(config_loader=command.config_loader)
            return split_sweep(parser.parse_overrides(sweep_axes(sweeper) + arguments)), True
    # A sweeper that picks jobs as it goes: the settings every job shares (its own axes left out).
    parsed = OverridesParser.create(config_loader=command.config_loader).parse_overrides(arguments)
    return [[o.input_line for o in parsed if not o.is_sweep_override()]], False


def check_job(overrides: list[str], job: ComposedJob, fixed: bool) -> Job:
    from .lifecycle.claim import check_claim
    from .train import disk
    from .train.memory import shape

    # A cluster launcher's jobs check their device and memory on their node, when they start.
    config = check_config(job.cfg)
    memory = check_runtime(config, job.world_size, here="Slurm" not in job.launcher)
    model_shape = memory.shape if memory is not None else shape(job.cfg, config.scheme, tuple(config.depths))
    records = disk.estimate(job.cfg, config.positions, model_shape, config.depths)
    checked = Job(overrides, job.cfg, job.override_dirname, fixed, memory, records)
    if fixed:
        check_claim(checked.run_dir, job.cfg)
    return checked


def concurrent_runs(launcher: DictConfig, jobs: int) -> int:
    """How many of a sweep's runs its launcher trains at once: joblib's n_jobs, submitit's array_parallelism,
    else one at a time."""
    for key in ("n_jobs", "array_parallelism"):
        value = launcher.get(key)
        if isinstance(value, int) and value != 0:
            return min(jobs, value if value > 0 else max((os.cpu_count() or 1) + 1 + value, 1))
    return 1


def check_records(jobs: Sequence[Job], concurrent: int = 1) -> str:
    """The disk the runs' records will take against the free space where they go (ConfigError naming the
    keys to change when it is short), and the line the pre-flight prints. A run that already finished
    (resume=true) writes nothing more."""
    from .lifecycle.summary import has_finished
    from .train import disk
    from .train.memory import GIB, describe_data

    writing = [job for job in jobs if not (job.fixed and job.cfg.resume
                                           and has_finished(job.run_dir))]
    planned = disk.plan([(job.cfg, job.disk) for job in writing if job.disk is not None], concurrent)
    said = "; ".join(p.describe() for p in planned) or "every run already finished: no records to write"
    estimates = [job.memory for job in writing if job.memory is not None]
    if estimates:
        most = max(estimates, key=lambda m: m.host_bytes)
        data = f" ({describe_data(most.data)})" if most.data.peak else ""
        said += f"; host memory ~{most.host_bytes / GIB:,.2f} GiB at most a run{data}"
    return f"pre-flight: {len(jobs)} job{'s' if len(jobs) != 1 else ''} checked; {said}"


class UnrestoredRuns(HarnessError):
    """A command would train again runs that its study's published records hold: one line, exit 2."""

    exit_status = 2


def check_published(jobs: Sequence[Job]) -> None:
    """A fresh clone holds a study's published records and none of its run directories: continuing its sweep
    there before restoring them would train every published run again (hours, and the new runs replace the
    published ones). Refused, naming the restore; resume=false asks to train them again."""
    from .analysis.published import ended_run_names, published_dir

    published: dict[Path, set[str]] = {}
    unrestored: dict[Path, int] = {}
    for job in jobs:
        if not (job.fixed and job.cfg.resume) or job.run_dir.exists():
            continue
        study = job.run_dir.parent
        if study not in published:
            published[study] = ended_run_names(study) if study.is_dir() else set()
        if job.run_dir.name in published[study]:
            unrestored[study] = unrestored.get(study, 0) + 1
    for study, count in unrestored.items():  # the first study says it: a sweep writes into one
        raise UnrestoredRuns(f"{study}: {count} of this command's {len(jobs)} runs ended in its published records "
                             f"({published_dir(study)}) and have no run directory here, so they would train again: "
                             f"restore them first, python -m deepnorm_exp.analysis.published --restore {study} "
                             "(or resume=false to train them again)")


def preflight(argv: Sequence[str], task_function: Callable | None = None) -> tuple[list[Job], bool]:
    """Compose and check every job `python -m deepnorm_exp <argv>` would launch (where the jobs run on this
    machine, also its device and memory), and that no job would take over a run directory trained with
    another config. Returns the jobs and whether the command is a multirun, or raises a HarnessError."""
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import BASIC_SWEEPER, args_parser

    if task_function is None:
        from .task import train as task_function
    args = args_parser().parse_args(list(argv))
    _checked.clear()  # what this command checked, not an earlier one in the same process
    with hydra_command(args, task_function) as command:
        if not command.multirun:
            cfg = command.compose(command.overrides, RunMode.RUN)
            hydra_node = cfg.hydra
            with open_dict(cfg):
                del cfg["hydra"]
            try:  # Hydra resolves an override's value in the run directory's name: `${oops:}` fails here
                override_dirname = hydra_node.job.override_dirname
            except OmegaConfBaseException as e:
                check_config(cfg)  # names the key whose value failed, where it is one of the run's
                raise composition_error(e, command.overrides) from None
            job = composed(cfg, hydra_node, override_dirname, launched=False)
            checked = [check_job(command.overrides, job, True)]
            check_published(checked)
            print(check_records(checked), file=sys.stderr, flush=True)
            return checked, False
        master = command.compose(command.overrides, RunMode.MULTIRUN)
        jobs, fixed = planned_jobs(command, master, task_function)
        compose_job = JobComposer(command, master)
        checked = [check_job(job, compose_job(job), fixed) for job in jobs]
        check_published(checked)
        print(check_records(checked, concurrent_runs(master.hydra.launcher, len(checked))), file=sys.stderr, flush=True)
        if master.hydra.sweeper.get("_target_") == BASIC_SWEEPER:
            _checked.update(tuple(job.overrides) for job in checked)
        return checked, True
