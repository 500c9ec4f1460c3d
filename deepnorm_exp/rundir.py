"""Where a run's records live: runs/<experiment>/<norm>-L<depth>[-<overrides>]-s<seed>/, no timestamp,
so the same command always names the same directory; and what is in it (`RunDir`).

(flock is reliable on local disks and most cluster file systems; on NFS without lock support, do not
launch the same job twice at once.)"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from pathlib import Path

from omegaconf import DictConfig

from .errors import ConfigError
from .locks import FileLock


MAX_OVERRIDES_CHARS = 160
NAMED_KEYS = ("norm", "depth", "seed", "experiment", "experiment_name")  # in its name or directory: not repeated


def run_name(cfg: DictConfig, override_dirname: str = "") -> str:
    """`override_dirname` is Hydra's `key=value,...` of the command-line overrides, minus the keys that
    `hydra.job.config.override_dirname.exclude_keys` lists (norm, depth, seed, ... are in the name already).

    Characters a file name should not hold become "_", which can make two different commands look alike
    (data.files=corp/a/b.txt and data.files=corp/a_b.txt): whenever a character was replaced, or the text
    cut, a hash of the exact overrides is appended, so different overrides never share a directory."""
    parts = [str(cfg.norm.name), f"L{cfg.depth}"]
    if override_dirname:
        readable = override_dirname.replace(",", "-")
        overrides = re.sub(r"[^A-Za-z0-9_.=+-]", "_", readable)
        if overrides != readable or len(overrides) > MAX_OVERRIDES_CHARS:  # file names stop at 255 bytes
            digest = hashlib.sha256(override_dirname.encode()).hexdigest()[:10]
            overrides = f"{overrides[:MAX_OVERRIDES_CHARS - 11]}~{digest}"
        parts.append(overrides)
    parts.append(f"s{cfg.seed}")
    return "-".join(parts)


def run_dir(cfg: DictConfig, name: str) -> Path:
    """paths.runs/<experiment_name>/<name>; ConfigError if that is not inside paths.runs (a name holding
    "..", or an absolute path: config.check_experiment_name refuses those first, this is the last word)."""
    root = Path(os.path.normpath(Path(cfg.paths.runs).absolute()))
    path = Path(os.path.normpath(root / str(cfg.experiment_name) / name))
    if path.parent.parent != root:
        raise ConfigError("experiment_name", cfg.experiment_name, f"the run directory would be {path}, outside "
                          f"paths.runs={root}; use one directory name")
    return Path(cfg.paths.runs) / str(cfg.experiment_name) / name


class RunDir:
    """One run's directory and the files in it: the only place their names are spelled, and the owner of
    the run's lock. A plain path in, paths out; nothing is read or created until asked."""

    CONFIG = "config.yaml"  # the composed config, written before the first step
    METRICS = "metrics.jsonl"  # one JSON object per logged step
    EVENTS = "events.jsonl"  # loss spikes and a divergence
    LAYERS = "layers"  # per-layer Parquet files, one a logged step
    SUMMARY = "summary.json"  # written last: a run directory with a summary has ended
    WANDB = "wandb"  # the W&B run's files and its id
    CHECKPOINT = "checkpoint.pt"  # one process's checkpoint
    SHARDED = "checkpoint.dcp"  # a sharded (DCP) checkpoint, a directory
    LOCK = ".lock"  # flock'd by the process training the run
    RECORDS = (CONFIG, METRICS, EVENTS, LAYERS, SUMMARY, WANDB, CHECKPOINT, SHARDED)  # what a run leaves
    MARKERS = (SUMMARY, CONFIG)  # a directory holding one of these is a run's

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    config = property(lambda self: self.path / self.CONFIG)
    metrics = property(lambda self: self.path / self.METRICS)
    events = property(lambda self: self.path / self.EVENTS)
    layers = property(lambda self: self.path / self.LAYERS)
    summary = property(lambda self: self.path / self.SUMMARY)
    wandb = property(lambda self: self.path / self.WANDB)
    checkpoint = property(lambda self: self.path / self.CHECKPOINT)
    sharded = property(lambda self: self.path / self.SHARDED)

    def is_run(self) -> bool:
        return any((self.path / marker).is_file() for marker in self.MARKERS)

    def lock(self) -> FileLock:
        """The run's exclusive lock, held for the whole run: two sweeps launched at once into the same root
        compute the same directory for the same job, and the second to arrive leaves it to the first. The
        kernel drops it when its holder dies (even by SIGKILL), so a crashed run never blocks its re-run."""
        return FileLock(self.path / self.LOCK)

    def held_elsewhere(self) -> bool:
        """Whether another open of the run's lock holds it: the run is being trained now (by another process,
        or by this one through another open). Read-only: opens an existing lock file and writes nothing."""
        try:
            fd = os.open(self.path / self.LOCK, os.O_RDONLY)
        except OSError:
            return False  # no lock file: never run by this harness, or not since it was copied
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # conflicts only with the run's exclusive lock
        except BlockingIOError:
            return True
        except OSError:
            return False  # a file system whose locks need write access (NFS): unknown, said as not running
        finally:
            os.close(fd)  # closing releases the lock if this took it
        return False


class StudyDir:
    """A sweep's directory, runs/<experiment_name>/: its run directories, and the sweep's own files, named
    here alone."""

    SWEEP_LOG = "sweeps.jsonl"  # one line per invocation and per run: commits, times, overrides
    MULTIRUN = "multirun.yaml"  # Hydra's record of the sweep's config
    FRONTIER = "frontier.json"  # the frontier sweeper's brackets per cell
    PUBLISHED = "published"  # the packed records behind the page (analysis/published.py)
    PUBLISHING_LOCK = ".published.lock"  # beside published/: held while a pack or a restore writes
    SWEEP_FILES = (SWEEP_LOG, MULTIRUN, FRONTIER)
