"""From a composed config to objects: the checks every entry point runs first, the scheme, the model.

`check_config` needs nothing but the config; `check_runtime` also looks at this machine (the device, the
directories records go to, the memory training needs). The command line runs both for every job of a
sweep before the first one starts; `run_experiment` runs both again, so a notebook gets the same checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, open_dict
from torch import nn

from .config import validate
from .data import check_data_config
from .errors import ConfigError
from .runtime import resolve_device
from .metrics import holds_weight_copy, parse_metrics
from .models import MODELS
from .schemes import NormScheme, build_scheme


def model_depths(cfg: DictConfig) -> dict[str, int]:
    """Layers per stack, what a scheme derives its constants from."""
    return MODELS.get(cfg.model.kind).stack_depths(cfg)


def make_scheme(cfg: DictConfig) -> NormScheme:
    return build_scheme(cfg.norm, model_depths(cfg), cfg.model.norm_eps)


@dataclass(frozen=True)
class CheckedConfig:
    """A config past every check that needs no compute, with what the checks derived from it."""

    cfg: DictConfig  # with every instrument's default filled in (what every reader of it sees)
    scheme: NormScheme  # built once: its constants and init come from the depths
    depths: dict[str, int]  # layers per stack
    positions: int  # the longest sequence the model is fed


def check_config(cfg: DictConfig) -> CheckedConfig:
    """Every check that needs no compute: types, ranges, the scheme's and the data source's sections."""
    validate(cfg)
    model_cls = MODELS.get(cfg.model.kind)
    if cfg.model.encoder_depth is not None and "encoder" not in model_cls.stack_depths(cfg):
        raise ConfigError("model.encoder_depth", cfg.model.encoder_depth,
                          f"model={cfg.model.kind} has no encoder; use null")
    scheme = make_scheme(cfg)
    if cfg.train.parallel == "fsdp" and scheme.unshardable:
        raise ConfigError("train.parallel", "fsdp", f"norm={cfg.norm.name} {scheme.unshardable}: choose one of: "
                          "auto, none, ddp")
    with open_dict(cfg):  # checked, and with every instrument's default: what every reader of it sees
        cfg.metrics = parse_metrics(cfg.metrics)
    positions = check_data_config(cfg.data, model_cls.task)
    if positions > cfg.model.max_seq_len:
        raise ConfigError("model.max_seq_len", cfg.model.max_seq_len,
                          f"data={cfg.data.name} feeds sequences of {positions} tokens; raise it or shorten the data")
    return CheckedConfig(cfg, scheme, model_depths(cfg), positions)


def build_model(cfg: DictConfig, scheme: NormScheme | None = None) -> nn.Module:
    """The model `cfg` describes, initialised by its normalization scheme (on the CPU)."""
    if scheme is None:
        scheme = check_config(cfg).scheme
    return MODELS.get(cfg.model.kind)(cfg.model, model_depths(cfg), scheme)


def check_writable_dir(key: str, value: str) -> None:
    """`value` is a directory this process can create and write in: every part of it that exists is a
    directory, and the deepest existing one is writable (a read-only file system says no even to root)."""
    path = Path(value).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(key, value, f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(key, value, f"{existing} is not writable (read-only file system or permissions)")


def check_memory(checked: CheckedConfig, device: torch.device):
    """The memory estimate of training the config; ConfigError if it exceeds the device (memory_check=false
    lets it try anyway)."""
    from .train.memory import GIB, check_host_memory, device_memory, estimate

    cfg = checked.cfg
    guess = estimate(cfg, checked.scheme, checked.depths, checked.positions, holds_weight_copy(cfg.metrics))
    check_host_memory(cfg, guess)  # first: data that cannot fit is named by its own keys, not by depth
    available = device_memory(device)
    if cfg.memory_check and guess.total_bytes > available:
        raise ConfigError("depth", cfg.depth, f"training would need ~{guess.total_bytes / GIB:,.1f} GiB "
                          f"({guess.parts()}); {device.type} has {available / GIB:,.1f} GiB: make the model "
                          f"or train.batch_size smaller, or memory_check=false to try anyway")
    return guess


def check_runtime(checked: CheckedConfig, world_size: int, here: bool = True):
    """The checks that need a machine: the batch splits over the `world_size` processes that will train the
    run, records can be written, and (`here`: the jobs run on this machine, not on a cluster's nodes) the
    device exists and training fits in its memory. Returns the memory estimate, or None when not `here`."""
    from .train.parallel import check_layout

    cfg = checked.cfg
    check_layout(cfg.train, world_size)
    check_writable_dir("paths.runs", cfg.paths.runs)
    check_writable_dir("paths.cache", cfg.paths.cache)
    if not here:
        return None
    return check_memory(checked, resolve_device(cfg.device))
