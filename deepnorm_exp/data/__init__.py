"""Data sources: each is a module here plus `conf/data/<name>.yaml`, registered by name.

A source turns its config into `TokenData`: fixed-length token sequences for training and evaluation,
and the reference losses that make a run's eval loss readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from ..config import parse_section
from ..registry import Registry


@dataclass
class TokenData:
    train: torch.Tensor  # (sequences, seq_len + 1), int64
    eval: torch.Tensor
    vocab_size: int
    optimal_loss: Optional[float]  # Bayes-optimal mean NLL on the eval targets, where the source knows it
    unigram_loss: float  # eval NLL of the training set's token frequencies: what "learned nothing" scores


class DataSource(Protocol):
    Config: type

    def __init__(self, cfg: Any, cache_dir: Path): ...

    def load(self) -> TokenData: ...


SOURCES: Registry[type[DataSource]] = Registry("data", __name__)
register = SOURCES.register


def load_data(data_cfg: Any, cache_dir: str | Path) -> TokenData:
    cls = SOURCES.get(data_cfg["name"])
    return cls(parse_section(cls.Config, data_cfg, "data"), Path(cache_dir)).load()


def check_data_config(data_cfg: Any) -> None:
    """Validate the data section without loading anything (used before any compute)."""
    cls = SOURCES.get(data_cfg["name"])
    parse_section(cls.Config, data_cfg, "data")


def unigram_loss(train: torch.Tensor, eval_tokens: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy on eval targets of add-one-smoothed training-target frequencies."""
    counts = torch.bincount(train[:, 1:].reshape(-1), minlength=vocab_size).double() + 1.0
    log_p = (counts / counts.sum()).log()
    return float(-log_p[eval_tokens[:, 1:].reshape(-1)].mean())
