"""From a composed config to objects: the check every entry point runs first, the scheme, the model."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from .config import validate
from .data import check_data_config
from .errors import ConfigError
from .model import DecoderLM
from .schemes import NormScheme, build_scheme

MODELS = {"decoder": DecoderLM}


def model_depths(cfg: DictConfig) -> dict[str, int]:
    """Layers per stack, what a scheme derives its constants from."""
    return {"decoder": cfg.depth}


def make_scheme(cfg: DictConfig) -> NormScheme:
    return build_scheme(cfg.norm, model_depths(cfg), cfg.model.norm_eps)


def check_config(cfg: DictConfig) -> None:
    """Every check that needs no compute: types, ranges, the scheme's and the data source's sections."""
    validate(cfg)
    if cfg.model.kind not in MODELS:
        raise ConfigError("model.kind", cfg.model.kind, f"choose one of: {', '.join(MODELS)}")
    make_scheme(cfg)
    check_data_config(cfg.data)


def build_model(cfg: DictConfig, scheme: NormScheme | None = None) -> nn.Module:
    """The model `cfg` describes, initialised by its normalization scheme (on the CPU)."""
    if scheme is None:
        check_config(cfg)
        scheme = make_scheme(cfg)
    return MODELS[cfg.model.kind](cfg.model, cfg.depth, scheme)
