"""Instrumentation: callbacks beside the training loop that measure what the DeepNet paper's analysis uses.

One module per instrument, registered with its own `metrics.*` keys (a dataclass: defaults and, in
comments, their meaning) and a builder that returns its callback, or None when its keys turn it off. The
`metrics` section's schema is assembled from the registered keys (`metrics_schema`), so adding an
instrument is its module plus its line in conf/metrics/default.yaml: the registry finds the module, the
checks, the run name and the configuration page follow. Names of everything recorded: docs/records.md.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..config import SECTION_SCHEMAS, parse_section
from ..errors import ConfigError
from ..registry import Registry
from ..train.trainer import Callback
from .blocks import BlockIndex, ParamBlocks
from .probe import Probe


@dataclass
class SharedConfig:
    """Keys the instruments share (`metrics=off` sets `enabled: false`)."""

    enabled: bool = True  # false: no instrument is installed; only the loop's own scalars and events
    layer_every: int = 50  # steps between per-layer vectors (also at step 0 and the last step); 0: none
    probe_batch: int = 2  # held-out examples F(x) is measured on (the first of the eval split)

    def __post_init__(self):
        if self.layer_every < 0:
            raise ConfigError("layer_every", self.layer_every, "must be >= 0")
        if self.probe_batch <= 0:
            raise ConfigError("probe_batch", self.probe_batch, "must be a positive integer")


class Context:
    """What instruments build from, and share: the model's block index, its parameters by block and the
    probe batch, each made when an instrument first asks for it (a run that measures nothing makes none)."""

    def __init__(self, cfg: Any, log_every: int, model: nn.Module, eval_tensors: dict[str, torch.Tensor],
                 device: torch.device, routed=None):
        self.cfg, self.log_every, self.model, self.device = cfg, log_every, model, device
        self.eval_tensors, self.routed = eval_tensors, routed or model

    @functools.cached_property
    def index(self) -> BlockIndex:
        return BlockIndex.of(self.model)

    @functools.cached_property
    def blocks(self) -> ParamBlocks:
        return ParamBlocks(self.model, self.index)

    @functools.cached_property
    def probe(self) -> Probe:
        return Probe(self.eval_tensors, self.cfg.probe_batch, self.device)

    def layer_every(self, wanted: bool) -> int:
        """The per-layer interval for an instrument whose key says `wanted` (0: off)."""
        return self.cfg.layer_every if wanted else 0


@dataclass(frozen=True)
class Instrument:
    Config: type  # its `metrics.*` keys: a dataclass whose every field has a default and a comment
    build: Callable[[Any, Context], Optional[Callback]]  # its callback for the `metrics` section, or None
    order: int  # where its callback sits among the instruments' (the order their hooks run in a step)
    weight_copies: Callable[[Any], bool] = lambda cfg: False  # holds a parameter-sized copy (memory estimate)


INSTRUMENTS: Registry[Instrument] = Registry("metrics", __name__)


def instrument(name: str, config: type, order: int, weight_copies: Callable[[Any], bool] | None = None):
    """Register the decorated builder as the instrument `name` with its keys `config`."""
    def decorate(build):
        INSTRUMENTS.register(name)(Instrument(config, build, order, weight_copies or (lambda cfg: False)))
        return build

    return decorate


def instruments_in_order() -> list[Instrument]:
    return sorted((INSTRUMENTS.get(name) for name in INSTRUMENTS.names()), key=lambda i: i.order)


@functools.cache
def metrics_schema() -> type:
    """The `metrics` section's dataclass: the shared keys and every registered instrument's."""
    seen: dict[str, str] = {f.name: "shared" for f in dataclasses.fields(SharedConfig)}
    for name in INSTRUMENTS.names():
        for f in dataclasses.fields(INSTRUMENTS.get(name).Config):
            if f.name in seen:
                raise RuntimeError(f"metrics.{f.name} is declared by both {seen[f.name]} and {name}")
            seen[f.name] = name
    # A dataclass takes its bases' fields from the last base to the first: the shared keys come first.
    bases = tuple(reversed([SharedConfig, *(i.Config for i in instruments_in_order())]))

    def __post_init__(self):  # every base's own checks: inheritance alone would run only the first one found
        for base in bases:
            if "__post_init__" in vars(base):
                vars(base)["__post_init__"](self)

    schema = dataclasses.make_dataclass("MetricsConfig", [], bases=bases, namespace={"__post_init__": __post_init__})
    schema.__doc__ = ("Instrumentation (deepnorm_exp/metrics/, one module an instrument): the keys they share, then "
                      "each instrument's. Scalars every train.log_every steps, per-layer vectors every layer_every.")
    return schema


SECTION_SCHEMAS["metrics"] = metrics_schema  # its keys, for the run-name exclusions (config.py)


def parse_metrics(node: Any) -> Any:
    """The `metrics` section checked against the schema (unknown keys, types, ranges), with its defaults."""
    return parse_section(metrics_schema(), node, "metrics")


def holds_weight_copy(cfg: Any) -> bool:
    """Whether the instruments `cfg` (the `metrics` section, checked) turns on copy the weights each step."""
    return bool(cfg.enabled) and any(i.weight_copies(cfg) for i in instruments_in_order())


def build_instruments(cfg, log_every: int, model: nn.Module, eval_tensors: dict[str, torch.Tensor],
                      device: torch.device, routed=None) -> tuple[list[Callback], BlockIndex]:
    """The instrument callbacks `cfg` (the `metrics` section) turns on, and the model's block index.
    Build them after the model is wrapped for parallel training (FSDP replaces its parameters); `routed`:
    the model through its wrapped objective (train/parallel.py: Routed), for the first probe forward."""
    context = Context(cfg, log_every, model, eval_tensors, device, routed)
    built = [i.build(cfg, context) for i in instruments_in_order()] if cfg.enabled else []
    return [callback for callback in built if callback is not None], context.index


__all__ = ["build_instruments", "metrics_schema", "parse_metrics", "holds_weight_copy", "instrument",
           "INSTRUMENTS", "SharedConfig", "Context", "BlockIndex", "ParamBlocks", "Probe"]
