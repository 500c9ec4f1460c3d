"""What the residual stream looks like after each block, and how large the attention logits grow: the
field's instruments for rank collapse, outlier features and attention-logit growth, on the probe batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import Context, instrument
from .probe import PerBlockProbe

MEASURES = ("token_cosine", "act_max", "act_kurtosis", "attn_logit_max")


@dataclass
class RepresentationConfig:
    representation: bool = True  # per-layer token_cosine, act_max, act_kurtosis, attn_logit_max, on the probe batch


def token_cosine(x: torch.Tensor) -> float:
    """Mean cosine similarity between the vectors of different positions of one example, averaged over the
    examples: 1 when every position carries the same direction (rank collapse: Dong et al. 2021, Noci et al.
    2022), near 0 for unrelated directions. (batch, seq, d) -> a number; NaN for a single position."""
    unit = nn.functional.normalize(x.detach().float(), dim=-1)
    seq = unit.shape[1]
    if seq < 2:
        return math.nan
    gram = unit @ unit.transpose(1, 2)  # (batch, seq, seq), ones on the diagonal
    return float((gram.sum((1, 2)) - seq).mean() / (seq * (seq - 1)))


def kurtosis(x: torch.Tensor) -> float:
    """E[(x - mean)^4] / var^2 over every coordinate of every position: 3 for a Gaussian, large when a few
    channels carry outliers (Bondarenko et al. 2023)."""
    x = x.detach().double().flatten()
    centred = x - x.mean()
    return float(centred.pow(4).mean() / centred.pow(2).mean().square())


class RepresentationStats(PerBlockProbe):
    """Every `every` steps, per residual block, on the probe batch (eval mode, no gradients), and once before
    training (step 0):

    * `token_cosine`: mean cosine similarity between positions of the block's output (`token_cosine`);
    * `act_max`: the largest |coordinate| of the block's output; `act_kurtosis`: its kurtosis (`kurtosis`);
    * `attn_logit_max`: the largest |q.k| / sqrt(d_head) over heads and allowed (query, key) pairs, the
      logit growth QK-LayerNorm was introduced against (Dehghani et al. 2023, Wortsman et al. 2023); NaN for
      FFN blocks, and where the logits are not finite (a diverged model).
    """

    MEASURES = MEASURES

    def hooks(self, values: dict) -> list:
        handles = []
        for i, block in enumerate(self.index.blocks):
            handles.append(block.register_forward_hook(self._block_hook(values, i)))
            handles.append(block.sublayer.register_forward_hook(self._logit_hook(values, i), with_kwargs=True))
        return handles

    @staticmethod
    def _block_hook(values: dict, i: int):
        def hook(module, args, output):
            output = getattr(module, "hidden_state", lambda state: state)(output)  # ResiDual: a + LN(d)
            values["token_cosine"][i] = token_cosine(output)
            values["act_max"][i] = float(output.detach().abs().max())
            values["act_kurtosis"][i] = kurtosis(output)
        return hook

    @staticmethod
    def _logit_hook(values: dict, i: int):
        def hook(module, args, kwargs, output):
            if hasattr(module, "attention_logits"):
                logits = module.attention_logits(*args, **kwargs)
                allowed = logits[logits.isfinite()]  # masked keys are -inf; NaN where the logits are not finite
                finite = not logits.isnan().any() and allowed.numel()
                values["attn_logit_max"][i] = float(allowed.abs().max()) if finite else math.nan
        return hook


@instrument("representation", RepresentationConfig, order=45)
def build(cfg, context: Context) -> RepresentationStats | None:
    every = context.layer_every(cfg.representation)
    return RepresentationStats(context.index, context.probe, every) if every else None
