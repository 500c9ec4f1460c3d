"""How the residual streams of a multi-stream scheme mix (Hyper-Connections, mHC; Frac-Connections, whose fractions are its streams): each block's stream mixing
H_res (n x n, the matrix that carries the streams past the sublayer) and their product over depth, the
composite mapping whose gain the mHC paper (Xie et al. 2025, section 3.1 and Fig. 3) saw reach about 3,000 in
an unconstrained HC model, and which a doubly stochastic H_res holds at 1."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import Context, instrument
from .probe import PerBlockProbe

MEASURES = ("mix_spectral_norm", "mix_ds_distance", "mix_gain_forward", "mix_gain_backward")


@dataclass
class StreamMixingConfig:
    stream_mixing: bool = True  # per-layer mix_spectral_norm, mix_ds_distance, mix_gain_forward/backward (multi-stream schemes)


def ds_distance(mixing: torch.Tensor) -> torch.Tensor:
    """How far each (..., n, n) matrix is from doubly stochastic: the largest |row sum - 1|, |column sum - 1|
    or negative entry's magnitude; 0 exactly on the Birkhoff polytope."""
    rows = (mixing.sum(-1) - 1).abs().amax(-1)
    columns = (mixing.sum(-2) - 1).abs().amax(-1)
    negative = mixing.clamp(max=0).abs().flatten(-2).amax(-1)
    return torch.stack([rows, columns, negative]).amax(0)


def gains(product: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mHC paper's gain magnitudes of a composite mapping (..., n, n): forward, the largest absolute row
    sum (how much a signal entering the streams can grow); backward, the largest absolute column sum (a
    gradient)."""
    return product.abs().sum(-1).amax(-1), product.abs().sum(-2).amax(-1)


def largest(value: torch.Tensor) -> float:
    """The largest over positions, NaN positions left out (inf kept: a blow-up is recorded as one); NaN only
    where every position is."""
    known = value[~value.isnan()]
    return float(known.amax()) if known.numel() else math.nan


def _spectral_norm(mixing: torch.Tensor) -> torch.Tensor:
    """Per position; NaN where a matrix is not finite (the SVD cannot take it)."""
    finite = mixing.isfinite().flatten(-2).all(-1)
    norms = torch.linalg.matrix_norm(torch.where(finite[..., None, None], mixing, 0), ord=2)
    return torch.where(finite, norms, math.nan)


class StreamMixing(PerBlockProbe):
    """Every `every` steps and at step 0, per residual block that mixes streams (a block with `stream_mixing`;
    NaN for the others), on the probe batch, each the largest over the probe's positions (a dynamic H_res
    differs from token to token; the largest is where a signal could grow; an infinite one is recorded as inf,
    NaN only where every position is NaN). The probe runs in full precision, but under FSDP's mixed precision
    the connection computes H_res in its bf16 (FSDP casts the block's input and parameters first):

    * `mix_spectral_norm`: the spectral norm of the block's H_res (at most 1 when doubly stochastic);
    * `mix_ds_distance`: its distance from doubly stochastic (`ds_distance`);
    * `mix_gain_forward`, `mix_gain_backward`: the gains (`gains`) of the product of H_res from the stack's
      first block through this one, each position's own product (the composite mapping of the paper's Eq. 4).
    """

    MEASURES = MEASURES

    def hooks(self, values: dict) -> list:
        products: dict[str, torch.Tensor] = {}  # the running composite mapping of each stack
        return [block.register_forward_pre_hook(self._hook(values, i, products, stack))
                for i, (block, stack) in enumerate(zip(self.index.blocks, self.index.stacks))
                if hasattr(block, "stream_mixing")]

    @staticmethod
    def _hook(values: dict, i: int, products: dict, stack: str):
        def hook(module, args):
            state = args[0].detach()
            mixing = module.stream_mixing(state.unflatten(-1, (module.streams, -1)))  # in the model's dtype
            mixing = mixing.double().expand(*state.shape[:-1], module.streams, module.streams)
            product = mixing @ products[stack] if stack in products else mixing
            products[stack] = product
            forward, backward = gains(product)
            for name, value in (("mix_spectral_norm", _spectral_norm(mixing)), ("mix_ds_distance", ds_distance(mixing)),
                                ("mix_gain_forward", forward), ("mix_gain_backward", backward)):
                values[name][i] = largest(value)
        return hook


@instrument("stream_mixing", StreamMixingConfig, order=46)
def build(cfg, context: Context) -> StreamMixing | None:
    every = context.layer_every(cfg.stream_mixing)
    if not every or not any(hasattr(block, "stream_mixing") for block in context.index.blocks):
        return None
    return StreamMixing(context.index, context.probe, every)
