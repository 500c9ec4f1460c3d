"""From a composed config to objects: the check every entry point runs first, the scheme, the model."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from .config import validate
from .data import check_data_config
from .errors import ConfigError
from .models import MODELS
from .schemes import NormScheme, build_scheme


def model_depths(cfg: DictConfig) -> dict[str, int]:
    """Layers per stack, what a scheme derives its constants from."""
    return MODELS.get(cfg.model.kind).stack_depths(cfg)


def make_scheme(cfg: DictConfig) -> NormScheme:
    return build_scheme(cfg.norm, model_depths(cfg), cfg.model.norm_eps)


def check_config(cfg: DictConfig) -> None:
    """Every check that needs no compute: types, ranges, the scheme's and the data source's sections."""
    validate(cfg)
    model_cls = MODELS.get(cfg.model.kind)
    if cfg.model.encoder_depth is not None and "encoder" not in model_cls.stack_depths(cfg):
        raise ConfigError("model.encoder_depth", cfg.model.encoder_depth,
                          f"model={cfg.model.kind} has no encoder; use null")
    make_scheme(cfg)
    positions = check_data_config(cfg.data, model_cls.task)
    if positions > cfg.model.max_seq_len:
        raise ConfigError("model.max_seq_len", cfg.model.max_seq_len,
                          f"data={cfg.data.name} feeds sequences of {positions} tokens; raise it or shorten the data")


def build_model(cfg: DictConfig, scheme: NormScheme | None = None) -> nn.Module:
    """The model `cfg` describes, initialised by its normalization scheme (on the CPU)."""
    if scheme is None:
        check_config(cfg)
        scheme = make_scheme(cfg)
    return MODELS.get(cfg.model.kind)(cfg.model, model_depths(cfg), scheme)
