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
  GELU; scaled_dot_product_attention keeps no seq x seq matrix), halved under bf16 autocast, and with
  activation checkpointing only each layer's input plus one layer's activations; plus the logits.
  Fixed costs (the data, the allocator's slack) are not counted: at small sizes the estimate is low.

`make bench` (section `memory`) compares the estimate with the peak memory a run measures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

GIB = 2**30
STATE_BYTES = 20  # fp32 weight + gradient + Adam exp_avg + exp_avg_sq + the foreach update's temporary
ACTIVATION_FLOATS = {"attn": lambda d, f: 10 * d, "cross": lambda d, f: 10 * d, "ffn": lambda d, f: 3 * d + 3 * f}


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


def _meta_model(cfg: DictConfig, scheme, depths: dict[str, int]):
    from ..models import MODELS

    with torch.device("meta"):
        return MODELS.get(cfg.model.kind)(cfg.model, depths, scheme)


def _blocks_per_layer(model) -> dict[str, list[str]]:
    """stack -> the sublayer kinds of one layer (e.g. decoder: ["attn", "ffn"])."""
    kinds: dict[str, list[str]] = {}
    for stack, layer, sublayer, _ in model.residual_blocks():
        if layer == 0:
            kinds.setdefault(stack, []).append(sublayer)
    return kinds


def estimate(cfg: DictConfig, scheme, depths: dict[str, int], positions: int) -> MemoryEstimate:
    """`depths`: layers per stack (what the scheme was made for); `positions`: the longest sequence fed."""
    from ..models import count_params

    ones = {stack: 1 for stack in depths}
    base_model = _meta_model(cfg, scheme, ones)
    base = count_params(base_model)
    params = base
    for stack, depth in depths.items():
        per_layer = count_params(_meta_model(cfg, scheme, {**ones, stack: 2})) - base
        params += per_layer * (depth - 1)

    metrics = cfg.metrics
    copies = 4 if (metrics.update_norm or (metrics.layer_every and metrics.layer_updates)) else 0
    d, f = cfg.model.d_model, cfg.model.d_ff
    tokens = cfg.train.batch_size * positions
    float_bytes = 2 if (cfg.train.precision in ("bf16", "fp16") or (cfg.train.precision == "auto" and cfg.device != "cpu"
                                                          and torch.cuda.is_available())) else 4
    per_layer_floats = {stack: sum(ACTIVATION_FLOATS[kind](d, f) for kind in kinds)
                        for stack, kinds in _blocks_per_layer(base_model).items()}
    if cfg.model.activation_checkpointing:
        kept = sum(d * depths[stack] for stack in per_layer_floats) + max(per_layer_floats.values())
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
