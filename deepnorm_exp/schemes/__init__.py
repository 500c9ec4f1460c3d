"""Normalization schemes. Each is one module here plus `conf/norm/<name>.yaml`; see `base.NormScheme`."""

from __future__ import annotations

from typing import Any, Mapping

from ..config import parse_section
from ..registry import Registry
from .base import NormScheme

SCHEMES: Registry[type[NormScheme]] = Registry("norm", __name__)
register = SCHEMES.register


def build_scheme(norm_cfg: Any, depths: Mapping[str, int], eps: float) -> NormScheme:
    """The scheme named by `norm.name`, with its section checked against its own dataclass."""
    cls = SCHEMES.get(norm_cfg["name"])
    return cls(parse_section(cls.Config, norm_cfg, "norm"), depths=depths, eps=eps)


__all__ = ["NormScheme", "SCHEMES", "register", "build_scheme"]
