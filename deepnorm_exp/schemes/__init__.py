"""Normalization schemes. Each is one module here plus `conf/norm/<name>.yaml`; see `base.NormScheme`."""

from __future__ import annotations

from typing import Any, Mapping

from ..config import parse_section
from ..registry import Registry
from .base import NormScheme

SCHEMES: Registry[type[NormScheme]] = Registry("norm", __name__)
register = SCHEMES.register


def parse_norm(norm_cfg: Any) -> Any:
    """The `norm` section checked against its scheme's dataclass, with every key at its default where the
    section leaves it out (conf/norm/<name>.yaml holds only what differs)."""
    return parse_section(SCHEMES.get(norm_cfg["name"]).Config, norm_cfg, "norm")


def build_scheme(norm_cfg: Any, depths: Mapping[str, int], eps: float) -> NormScheme:
    """The scheme named by `norm.name`, with its section checked against its own dataclass."""
    return SCHEMES.get(norm_cfg["name"])(parse_norm(norm_cfg), depths=depths, eps=eps)


__all__ = ["NormScheme", "SCHEMES", "register", "build_scheme", "parse_norm"]
