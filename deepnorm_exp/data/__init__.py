"""Data sources: each is a module here plus `conf/data/<name>.yaml`, registered by name.

A source turns its config into `TaskData` for the task the model trains on (a language-model stream or
translation pairs), with the reference losses that make a run's eval loss readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from ..config import parse_section, rules_hold
from ..errors import choice_error
from ..registry import Registry


@dataclass
class TaskData:
    """What a data source hands the trainer. `train`/`eval` map names to tensors with one row per example
    (`train` may hold any rows indexable by an index tensor, e.g. memory-mapped `TokenBlocks`):
    task "lm": {"tokens": (n, seq_len + 1)}; task "translation": {"src": (n, S), "tgt": (n, T)} padded with 0,
    and in `eval` also "reference": the noiseless target (for exact-match accuracy)."""

    task: str
    train: dict[str, torch.Tensor]
    eval: dict[str, torch.Tensor]
    vocab_size: int
    optimal_loss: Optional[float]  # Bayes-optimal mean NLL on the eval targets, where the source knows it
    unigram_loss: float  # eval NLL of the training set's token frequencies: what "learned nothing" scores

    @property
    def train_size(self) -> int:
        return len(next(iter(self.train.values())))


class DataSource(Protocol):
    Config: type
    tasks: tuple[str, ...]  # the tasks ("lm", "translation") this source can serve

    def __init__(self, cfg: Any, cache_dir: Path): ...

    def load(self, task: str) -> TaskData: ...

    @staticmethod
    def positions(cfg: Any, task: str) -> int:
        """The longest sequence a model will be fed for `task` (checked against model.max_seq_len)."""
        ...

    @staticmethod
    def host_bytes(cfg: Any, task: str) -> "HostBytes":
        """The host memory `load(task)` takes, from the config alone (nothing built or allocated). Optional:
        a source without it is counted as taking none (`host_bytes` below)."""
        ...


@dataclass(frozen=True)
class HostBytes:
    """Host memory a data source takes, computed from its config (the memory estimate adds it).

    `peak`: the most it holds at once while loading, building an uncached dataset included (the model is
    built after it); `held`: what stays while the run trains (the tensors handed to the trainer); `parts`:
    the share of `peak` each `data.*` key sizes (key without the prefix -> bytes), what a refusal names."""

    peak: int
    held: int
    parts: dict[str, int] = field(default_factory=dict)


SOURCES: Registry[type[DataSource]] = Registry("data", __name__)
register = SOURCES.register


def _source(data_cfg: Any, task: str) -> type[DataSource]:
    cls = SOURCES.get(data_cfg["name"])
    if task not in cls.tasks:
        serving = [name for name in SOURCES.names() if task in SOURCES.get(name).tasks]
        raise choice_error("data", data_cfg["name"], serving, f"the model needs {task} data; ")
    return cls


def load_data(data_cfg: Any, cache_dir: str | Path, task: str = "lm") -> TaskData:
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()  # the harness has its own progress bar; datasets' would print one per split
    cls = _source(data_cfg, task)
    return cls(parse_section(cls.Config, data_cfg, "data"), Path(cache_dir)).load(task)


def parse_data(data_cfg: Any, task: str = "lm") -> Any:
    """The `data` section checked against its source's dataclass, without loading anything, with every key
    at its default where the section leaves it out."""
    return parse_section(_source(data_cfg, task).Config, data_cfg, "data")


def check_data_config(data_cfg: Any, task: str = "lm") -> int:
    """Validate the data section without loading anything (used before any compute); returns the longest
    sequence the model will see."""
    return _source(data_cfg, task).positions(parse_data(data_cfg, task), task)


def host_bytes(data_cfg: Any, task: str = "lm") -> HostBytes:
    """What the data section's source says it takes in host memory (its `host_bytes`), without loading
    anything; a source that does not say is counted as taking none."""
    cls = _source(data_cfg, task)
    measure = getattr(cls, "host_bytes", None)
    if measure is None:
        return HostBytes(0, 0)
    try:  # a section check_config has checked: its dataclass directly (parse_section's merge costs ~10 ms)
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(data_cfg, resolve=True) if OmegaConf.is_config(data_cfg) else dict(data_cfg)
        cfg = cls.Config(**values)
        if not rules_hold(cfg):  # constructing it checked no key's rule: parse_section names the key
            raise ValueError
    except (TypeError, ValueError):  # not checked yet: the section's own errors, naming its keys
        cfg = parse_section(cls.Config, data_cfg, "data")
    return measure(cfg, task)


def unigram_loss(train_targets: torch.Tensor, eval_targets: torch.Tensor, vocab_size: int, pad: int | None = None) -> float:
    """Cross-entropy on eval targets of add-one-smoothed training-target frequencies (`pad` tokens ignored)."""
    train_targets = train_targets.reshape(-1)
    if pad is not None:
        train_targets = train_targets[train_targets != pad]
    return unigram_loss_from_counts(torch.bincount(train_targets, minlength=vocab_size), eval_targets, pad)


def unigram_loss_from_counts(counts: torch.Tensor, eval_targets: torch.Tensor, pad: int | None = None) -> float:
    eval_targets = eval_targets.reshape(-1)
    if pad is not None:
        eval_targets = eval_targets[eval_targets != pad]
    log_p = ((counts.double() + 1.0) / (counts.double() + 1.0).sum()).log()
    return float(-log_p[eval_targets].mean())
