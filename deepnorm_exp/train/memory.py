"""How many parameters a config builds and how much memory training it takes, known before building it.

`depth=100000` must not spend minutes building a model that cannot fit, then die of a MemoryError (or an
OOM kill, which leaves no record). The parameter count is exact and cheap: the model is built on the meta
device (no storage, no init compute) at one and two layers per stack, and the count is linear in each
stack's depth. Training memory is an estimate, printed at the start of every run:

* state: fp32 weights, gradients, Adam's two moments and the parameter-sized temporary of its foreach
  update (20 bytes a parameter), plus the weight copy the update metrics take on a logged step (4 bytes a
  parameter, `metrics.update_norm` / `layer_updates`);
* activations kept for the backward, per token of the batch: about 10 d_model floats for an attention
  block and 3 d_model + 3 d_ff for a feed-forward block (the saved inputs of LayerNorm, projections and
  GELU; scaled_dot_product_attention keeps no seq x seq matrix; `model.ffn=swiglu`: 3 d_model + 5 d_ff),
  times the scheme's `activation_factor` (what its own operations save: nGPT's normalisations,
  sigma-Reparam's spectral norms), halved under bf16 autocast, and with activation checkpointing only each
  layer's residual state (`state_width` d_model wide: ResiDual's two streams) plus one layer's activations;
  plus the logits. tests/test_preflight.py holds every scheme's estimate against the floats autograd saves.
  Fixed costs (the data, the allocator's slack) are not counted: at small sizes the estimate is low.

`make bench` (section `memory`) compares the estimate with the peak memory a run measures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from omegaconf import DictConfig, OmegaConf

GIB = 2**30
STATE_BYTES = 20  # fp32 weight + gradient + Adam exp_avg + exp_avg_sq + the foreach update's temporary
ACTIVATION_FLOATS = {"attn": lambda d, f, ffn: 10 * d, "cross": lambda d, f, ffn: 10 * d,
                     "ffn": lambda d, f, ffn: 3 * d + (5 if ffn == "swiglu" else 3) * f}


@dataclass
class MemoryEstimate:
    params: int
    state_bytes: int  # weights, gradients, optimizer state, metric copies
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes

    def parts(self) -> str:
        return (f"{self.params / 1e6:,.1f}M parameters: {self.state_bytes / GIB:,.2f} GiB of weights, gradients, "
                f"Adam and metric copies, {self.activation_bytes / GIB:,.2f} GiB of activations")

    def describe(self) -> str:
        return f"~{self.total_bytes / GIB:,.2f} GiB to train ({self.parts()})"


class _SkipInPlace(TorchFunctionMode):
    """In-place ops (the initialisers' normal_, uniform_, mul_ ...) on meta tensors do nothing: there is
    no data. Skipping them also spares the pre-flight torch._dynamo's import (~2.5 s), which torch's
    reference implementations of random initialisers on the meta device trigger."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor", kwargs.get("input"))  # nn.init passes tensor=
        if name.endswith("_") and not name.endswith("__") and getattr(target, "is_meta", False):
            return target
        return func(*args, **kwargs)


def _meta_model(cfg: DictConfig, scheme, depths: dict[str, int]):
    from ..models import MODELS

    with torch.device("meta"), _SkipInPlace():
        return MODELS.get(cfg.model.kind)(cfg.model, depths, scheme)


def _blocks_per_layer(model) -> dict[str, list[str]]:
    """stack -> the sublayer kinds of one layer (e.g. decoder: ["attn", "ffn"])."""
    kinds: dict[str, list[str]] = {}
    for stack, layer, sublayer, _ in model.residual_blocks():
        if layer == 0:
            kinds.setdefault(stack, []).append(sublayer)
    return kinds


@dataclass(frozen=True)
class Shape:
    """What the parameter count and the activations follow, whatever the depth: the parameters of the
    model at one layer per stack, those one more layer adds to each stack, each stack's sublayer kinds."""

    base: int
    per_layer: dict[str, int]
    blocks: dict[str, list[str]]


_SHAPES: dict[tuple, Shape] = {}  # a sweep over depth and seed has a handful of shapes, not one per job


def shape(cfg: DictConfig, scheme, stacks: tuple[str, ...]) -> Shape:
    key = (OmegaConf.to_yaml(cfg.model, resolve=True), OmegaConf.to_yaml(cfg.norm, resolve=True), stacks)
    if key not in _SHAPES:
        from ..models import count_params

        ones = {stack: 1 for stack in stacks}
        base_model = _meta_model(cfg, scheme, ones)
        base = count_params(base_model)
        per_layer = {stack: count_params(_meta_model(cfg, scheme, {**ones, stack: 2})) - base for stack in stacks}
        _SHAPES[key] = Shape(base, per_layer, _blocks_per_layer(base_model))
    return _SHAPES[key]


def estimate(cfg: DictConfig, scheme, depths: dict[str, int], positions: int, weight_copy: bool) -> MemoryEstimate:
    """`depths`: layers per stack (what the scheme was made for); `positions`: the longest sequence fed;
    `weight_copy`: whether an instrument copies the weights each step (metrics.holds_weight_copy)."""
    model_shape = shape(cfg, scheme, tuple(depths))
    params = model_shape.base + sum(model_shape.per_layer[stack] * (depth - 1) for stack, depth in depths.items())

    copies = 4 if weight_copy else 0
    d, f = cfg.model.d_model, cfg.model.d_ff
    tokens = cfg.train.batch_size * positions
    float_bytes = 2 if (cfg.train.precision in ("bf16", "fp16") or (cfg.train.precision == "auto" and cfg.device != "cpu"
                                                          and torch.cuda.is_available())) else 4
    per_layer_floats = {stack: scheme.activation_factor * sum(ACTIVATION_FLOATS[kind](d, f, cfg.model.ffn)
                                                              for kind in kinds)
                        for stack, kinds in model_shape.blocks.items()}
    if cfg.model.activation_checkpointing:
        kept = sum(scheme.state_width * d * depths[stack] for stack in per_layer_floats) + max(per_layer_floats.values())
    else:
        kept = sum(per_layer_floats[stack] * depths[stack] for stack in per_layer_floats)
    logits = 3 * cfg.model.vocab_size  # logits, their softmax and its gradient
    activations = tokens * (kept * float_bytes + logits * 4)
    return MemoryEstimate(params=params, state_bytes=params * (STATE_BYTES + copies), activation_bytes=activations)


def device_memory(device: torch.device) -> int:
    """Bytes the device has: a GPU's total memory, or the machine's physical memory for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
