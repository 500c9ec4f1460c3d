"""Hydra callbacks: the comparison table printed when a multirun ends, the log of sweep invocations
(`runs/<experiment>/sweeps.jsonl`) that the results page measures a preset's wall time from, and a stop
signal to a joblib sweep handed on to its workers."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .. import records
from ..rundir import StudyDir
from ..signals import SIGNALS, act_as_before
from ..lifecycle.summary import format_table, load_summaries



def experiment_dir(config: DictConfig) -> Path:
    return Path(config.paths.runs) / str(config.experiment_name)


class ComparisonTable(Callback):
    """Prints every run recorded under runs/<experiment>/ as one norm x depth table."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        root = experiment_dir(config)
        print(f"\n{root}\n{format_table(*load_summaries(root))}", flush=True)


# The signals that stop a run at its next step boundary (lifecycle/preemption.py) but Ctrl-C: a terminal sends
# SIGINT to the whole process group already, and a second one would stop the workers at once.
STOP_SIGNALS = tuple(s for s in SIGNALS if s != signal.SIGINT)


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc; none where it does not exist)."""
    pids = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids += [int(p) for p in children.read_text().split()]
        except OSError:  # the thread ended while being read
            continue
    return pids


class StopReachesWorkers(Callback):
    """A stop signal sent to a joblib sweep's own process (`kill <pid>`, a scheduler's SIGTERM) is handed on
    to its workers, which train the runs: each checkpoints at its next step and records `interrupted`, and
    re-running the command resumes them. Without it they would train on, orphaned, to the end of their runs.
    The sweep's process then acts on the signal as it would have (by default, it ends). Other launchers are
    left alone: the basic launcher trains in this process, and submitit's jobs have their own handlers."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if "Joblib" not in _target(config.hydra.launcher):
            return
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            signal.signal(signum, lambda signum, frame, previous=previous: self._hand_on(signum, previous))

    @staticmethod
    def _hand_on(signum: int, previous) -> None:
        for pid in child_pids(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        signal.signal(signum, previous)
        act_as_before(signum, previous)


class SweepLog(Callback):
    """One line per multirun invocation when it starts (its overrides, launcher and workers, sweeper) and
    one when it ends, both with the invocation's id (two sweeps into one experiment may overlap). A sweep
    that was killed has no end line: its time ends with the last run that finished (`analysis.timing`).
    Appended, never rewritten: a resumed sweep adds its own lines."""

    def __init__(self) -> None:
        self.invocation = uuid.uuid4().hex[:12]

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        hydra = config.hydra
        self._append(config, {"event": "start", "id": self.invocation, "overrides": OmegaConf.to_container(hydra.overrides.task, resolve=False),
                              "launcher": _target(hydra.launcher),
                              "workers": OmegaConf.select(hydra.launcher, "n_jobs", default=None),
                              "sweeper": _target(hydra.sweeper), **code_version()})

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._append(config, {"event": "end", "id": self.invocation})

    @staticmethod
    def _append(config: DictConfig, line: dict) -> None:
        path = experiment_dir(config) / StudyDir.SWEEP_LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:  # one short write: a line is whole or absent
            log.write(records.dumps({"at": records.utc_now(), **line}) + "\n")


CODE_ROOT = Path(__file__).resolve().parents[2]
CODE_PATHS = ("deepnorm_exp", "conf", "hydra_plugins", "pyproject.toml")


def code_version(paths: tuple[str, ...] = CODE_PATHS) -> dict:
    """{"commit": the checkout's HEAD, "modified": whether the code's tracked files (`paths`: the package,
    conf/, the plugins) differ from it}, for the records to name the code that ran them; {} outside a git
    checkout (an installed package) or without git."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=CODE_ROOT, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        modified = bool(git("status", "--porcelain", "--untracked-files=no", "--", *paths))
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "modified": modified}


def _target(node: DictConfig) -> str:
    return str(OmegaConf.select(node, "_target_", default="")).rsplit(".", 1)[-1]
