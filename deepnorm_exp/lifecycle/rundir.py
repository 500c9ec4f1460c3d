"""Where a run's records live: runs/<experiment>/<norm>-L<depth>[-<overrides>]-s<seed>/, no timestamp,
so the same command always names the same directory."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from omegaconf import DictConfig

from ..errors import ConfigError


MAX_OVERRIDES_CHARS = 160


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
