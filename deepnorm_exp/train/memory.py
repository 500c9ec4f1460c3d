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
  sigma-Reparam's spectral norms) plus its `block_floats` a block (mHC's Sinkhorn rounds) and `block_width` d_model (Block AttnRes's
  sources), halved under bf16 autocast, and with activation checkpointing only each
  layer's residual state (`state_width` d_model wide: ResiDual's two streams) plus one layer's activations;
  plus the logits. tests/test_preflight.py holds every scheme's estimate against the floats autograd saves;
* the data, in host memory: what the data source says its config takes (its `host_bytes`: the synthetic
  language's tables and sequences, a text corpus's tokens), the most while it loads and what it holds while
  the run trains. On the CPU it shares the machine's memory with training (counted in `total_bytes`); on a
  GPU it is checked against the host's memory on its own (`check_host_memory`, by the pre-flight).
  Fixed costs (the allocator's slack, the libraries) are not counted: at small sizes the estimate is low.

`make bench` (section `memory`) compares the estimate with the peak memory a run measures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from omegaconf import DictConfig, OmegaConf

from ..data import HostBytes, host_bytes
from ..errors import ConfigError

GIB = 2**30
STATE_BYTES = 20  # fp32 weight + gradient + Adam exp_avg + exp_avg_sq + the foreach update's temporary
ACTIVATION_FLOATS = {"attn": lambda d, f, ffn: 10 * d, "cross": lambda d, f, ffn: 10 * d,
                     "ffn": lambda d, f, ffn: 3 * d + (5 if ffn == "swiglu" else 3) * f}


@dataclass
class MemoryEstimate:
    params: int
    state_bytes: int  # weights, gradients, optimizer state, metric copies
    activation_bytes: int
    data: HostBytes = field(default_factory=lambda: HostBytes(0, 0))  # the data source's host memory
    data_on_device: bool = False  # training in host memory (the CPU): the data shares the device's memory
    shape: Shape | None = field(default=None, repr=False)  # the model's (what the disk estimate also reads)

    @property
    def training_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes

    @property
    def host_bytes(self) -> int:
        """Host memory at most: the data's load (before the model is built), or what it holds while the run
        trains, with training's own on the CPU."""
        return max(self.data.peak, self.data.held + (self.training_bytes if self.data_on_device else 0))

    @property
    def total_bytes(self) -> int:
        """What the device must hold: training's, and on the CPU the data's too."""
        return self.host_bytes if self.data_on_device else self.training_bytes

    def parts(self) -> str:
        data = f"; {describe_data(self.data)}" if self.data.peak else ""
        return (f"{self.params / 1e6:,.1f}M parameters: {self.state_bytes / GIB:,.2f} GiB of weights, gradients, "
                f"Adam and metric copies, {self.activation_bytes / GIB:,.2f} GiB of activations{data}")

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
    tensors: int = 0  # parameter tensors at one layer per stack (what a checkpoint stores one record each for)
    tensors_per_layer: dict[str, int] = field(default_factory=dict)

    def params(self, depths: dict[str, int]) -> int:
        return self.base + sum(self.per_layer[stack] * (depth - 1) for stack, depth in depths.items())

    def param_tensors(self, depths: dict[str, int]) -> int:
        return self.tensors + sum(self.tensors_per_layer.get(stack, 0) * (depth - 1) for stack, depth in depths.items())

    def residual_blocks(self, depths: dict[str, int]) -> int:
        """The rows of a per-layer record: one per residual block."""
        return sum(len(self.blocks[stack]) * depth for stack, depth in depths.items())


_SHAPES: dict[tuple, Shape] = {}  # a sweep over depth and seed has a handful of shapes, not one per job


def shape(cfg: DictConfig, scheme, stacks: tuple[str, ...]) -> Shape:
    key = (OmegaConf.to_yaml(cfg.model, resolve=True), OmegaConf.to_yaml(cfg.norm, resolve=True), stacks)
    if key not in _SHAPES:
        from ..models import count_params

        ones = {stack: 1 for stack in stacks}
        base_model = _meta_model(cfg, scheme, ones)
        base, tensors = count_params(base_model), len(list(base_model.parameters()))
        per_layer, tensors_per_layer = {}, {}
        for stack in stacks:
            two = _meta_model(cfg, scheme, {**ones, stack: 2})
            per_layer[stack] = count_params(two) - base
            tensors_per_layer[stack] = len(list(two.parameters())) - tensors
        _SHAPES[key] = Shape(base, per_layer, _blocks_per_layer(base_model), tensors, tensors_per_layer)
    return _SHAPES[key]


def estimate(cfg: DictConfig, scheme, depths: dict[str, int], positions: int, weight_copy: bool) -> MemoryEstimate:
    """`depths`: layers per stack (what the scheme was made for); `positions`: the longest sequence fed;
    `weight_copy`: whether an instrument copies the weights each step (metrics.holds_weight_copy)."""
    model_shape = shape(cfg, scheme, tuple(depths))
    params = model_shape.params(depths)

    copies = 4 if weight_copy else 0
    d, f = cfg.model.d_model, cfg.model.d_ff
    tokens = cfg.train.batch_size * positions
    float_bytes = 2 if (cfg.train.precision in ("bf16", "fp16") or (cfg.train.precision == "auto" and cfg.device != "cpu"
                                                          and torch.cuda.is_available())) else 4
    block_floats = scheme.block_floats * 4 / float_bytes  # fp32 under autocast too (mHC: fp32 gates and biases)
    per_layer_floats = {stack: sum(scheme.activation_factor * ACTIVATION_FLOATS[kind](d, f, cfg.model.ffn)
                                   + block_floats + scheme.block_width * d for kind in kinds)
                        for stack, kinds in model_shape.blocks.items()}
    if cfg.model.activation_checkpointing:
        kept = sum(scheme.state_width * d * depths[stack] for stack in per_layer_floats) + max(per_layer_floats.values())
    else:
        kept = sum(per_layer_floats[stack] * depths[stack] for stack in per_layer_floats)
    logits = 3 * cfg.model.vocab_size  # logits, their softmax and its gradient
    activations = tokens * (kept * float_bytes + logits * 4)
    from ..models import MODELS

    return MemoryEstimate(params=params, state_bytes=params * (STATE_BYTES + copies), activation_bytes=activations,
                          data=host_bytes(cfg.data, MODELS.get(cfg.model.kind).task),
                          data_on_device=trains_on_host(cfg), shape=model_shape)


def trains_on_host(cfg: DictConfig) -> bool:
    """Whether the run's device is the CPU (`device=auto` where there is no GPU), whose memory the data shares."""
    return str(cfg.device) == "cpu" or (str(cfg.device) == "auto" and not torch.cuda.is_available())


def host_memory() -> int:
    """The machine's physical memory, where the data lives whatever the device."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_host_memory(cfg: DictConfig, guess: MemoryEstimate) -> None:
    """ConfigError naming the data keys when the data's host memory (with training's, on the CPU) exceeds
    the machine's and the data is the larger share (a model that does not fit is `build.check_memory`'s to
    refuse, naming depth); memory_check=false lets it try anyway."""
    need, available = guess.host_bytes, host_memory()
    if not cfg.memory_check or need <= available or not guess.data.parts:
        return
    if guess.data_on_device and guess.data.peak < guess.training_bytes:
        return
    shares = sorted(guess.data.parts.items(), key=lambda part: -part[1])
    key = shares[0][0]
    training = f" beside training's ~{guess.training_bytes / GIB:,.1f} GiB" if guess.data_on_device else ""
    sized = ", ".join(f"data.{name} {size / GIB:,.1f} GiB" for name, size in shares if size >= guess.data.peak / 100)
    raise ConfigError(f"data.{key}", cfg.data[key], f"the data would take ~{guess.data.peak / GIB:,.1f} GiB of host "
                      f"memory while loading ({sized}) and ~{guess.data.held / GIB:,.1f} GiB while the run trains"
                      f"{training}; this machine has {available / GIB:,.1f} GiB: lower "
                      f"{' or '.join(f'data.{name}' for name, _ in shares)}, or memory_check=false to try anyway")


def device_memory(device: torch.device) -> int:
    """Bytes the device has: a GPU's total memory, or the machine's physical memory for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    return host_memory()


def describe_data(data: HostBytes) -> str:
    return f"{data.peak / GIB:,.2f} GiB of data while loading, {data.held / GIB:,.2f} GiB held"
