"""nGPT (Loshchilov, Hsieh, Sun, Ginsburg, 2025, "nGPT: Normalized Transformer with Representation Learning on
the Hypersphere", ICLR 2025; code: github.com/NVIDIA/ngpt at ed19eb2): hidden states and every weight matrix
on the unit sphere, each sublayer a step towards its normalised output with learned per-dimension step sizes.
N(x) = x / ||x|| over d_model:

    h_0 = N(embedding)
    h <- N(h + alpha_A (N(Attn(h)) - h)),   h <- N(h + alpha_M (N(FFN(h)) - h))
    attention: q, k each N(.) per head times s_qk, logits sqrt(d_k) q.k (not / sqrt(d_k)); v as is
    FFN: fc1's output times s_uv sqrt(d_model) before the activation (the paper's model: `model.ffn=swiglu`)
    logits times s_z; no final norm, no biases, no LayerNorm

alpha_A, alpha_M (init `norm.alpha_init`, 0.05), s_qk and s_z (init 1) are stored scaled, as the official code
does: a parameter p starts at 1/sqrt(d_model) and acts as p (init / (1/sqrt(d_model))), so Adam's steps on p
are sqrt(d_model) larger on the value used; the alphas act through |.|, as in the code. s_uv is stored at 1.
After every optimizer step (and at init) each matrix is put back on the sphere along its d_model axis: q, k,
v, fc1, the embedding and an untied head by rows; out and fc2 by columns (official train.py,
normalize_matrices); learned positions (`model.positions=learned`, not in the official model) by rows too. Its recipe has no warm-up and no weight decay: `train.warmup_steps=0` (weight decay is
off by default).

Where this differs from the official code: positions are the project's (sinusoidal, added to the embedding
before h_0 = N(.)); the official rotary step is not a rotation (NVIDIA/ngpt#10) and is not ported. The
project's FFN is GELU unless `model.ffn=swiglu`. The official model is decoder-only; here cross-attention
sublayers are treated as self-attention ones. FSDP2 is refused (`unshardable`): the renormalisation reads
whole rows and columns of matrices FSDP2 shards; one process and DDP are fine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import setting
from . import register
from .base import NormScheme, SchemeConfig, Sublayer

ROW_ROLES = frozenset({"q", "k", "v", "fc1"})  # (out, d_model) matrices: each row on the sphere
COLUMN_ROLES = frozenset({"out", "fc2"})  # (d_model, in) matrices: each column on the sphere


@dataclass
class NGPTConfig(SchemeConfig):
    name: str = "ngpt"
    alpha_init: float = setting(0.05, check="positive_number")  # the eigen learning rates alpha_A, alpha_M at init (official: 0.05)



def unit(x: torch.Tensor) -> torch.Tensor:
    """x / ||x|| over the last dimension (the official justnorm; F.normalize's 1e-12 floor only matters at 0)."""
    return F.normalize(x, dim=-1)


class ScaledVector(nn.Module):
    """A learned vector stored at `stored_init` that acts as stored * (init / stored_init): nGPT's way of giving
    a parameter its own effective learning rate under Adam."""

    def __init__(self, size: int, init: float, stored_init: float, absolute: bool = False):
        super().__init__()
        self.param = nn.Parameter(torch.full((size,), float(stored_init)))
        self.factor, self.absolute = init / stored_init, absolute

    def forward(self) -> torch.Tensor:
        value = self.param * self.factor
        return value.abs() if self.absolute else value


class ScaledHeadNorm(nn.Module):
    """q or k: N(.) per head times s_qk, times d_k^1/2 so that attention's division of q.k by d_k^1/2 becomes
    nGPT's multiplication by d_k^1/2. One s_qk for q and k (as the code), (heads * d_k) entries: each head its own."""

    def __init__(self, n_heads: int, head_dim: int, before: nn.Module, s_qk: ScaledVector):
        super().__init__()
        self.before = before  # model.qk_norm's norm where one is set, else an identity
        self.s_qk = s_qk
        self.shape, self.gain = (n_heads, 1, head_dim), head_dim ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, heads, seq, head_dim)
        return unit(self.before(x)) * self.s_qk().view(self.shape) * self.gain


class VectorScale(nn.Module):
    """x * (a learned vector), over the last dimension: s_uv (times sqrt(d_model)) and s_z."""

    def __init__(self, size: int, init: float, stored_init: float, gain: float = 1.0):
        super().__init__()
        self.scale, self.gain = ScaledVector(size, init, stored_init), gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.scale() * self.gain)


class UnitNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unit(x)


class SphereResidual(nn.Module):
    """N(h + |alpha| (N(G(h)) - h)), h re-normalised first as the official code does."""

    def __init__(self, sublayer: nn.Module, alpha_init: float):
        super().__init__()
        self.sublayer = sublayer
        self.alpha = ScaledVector(sublayer.d_model, alpha_init, sublayer.d_model ** -0.5, absolute=True)

    def forward(self, h, *args, **kwargs):
        h_unit = unit(h)
        return unit(h_unit + self.alpha() * (unit(self.sublayer(h, *args, **kwargs)) - h_unit))


@torch.no_grad()
def to_sphere(weight: torch.Tensor, role: str) -> None:
    """Each row (q, k, v, fc1; "table": the embedding, an untied head, learned positions) or each column
    (out, fc2) of `weight` on the unit sphere: the d_model axis of every matrix."""
    if role in ROW_ROLES or role == "table":
        weight.div_(weight.norm(dim=1, keepdim=True))
    elif role in COLUMN_ROLES:
        weight.div_(weight.norm(dim=0, keepdim=True))
    else:
        raise ValueError(f"nGPT has no sphere rule for the role {role!r}")


@register("ngpt")
class NGPT(NormScheme):
    Config = NGPTConfig
    activation_factor = 1.5  # its normalisations save 2.3x what Pre-LN's blocks do (tests/test_preflight.py)
    cfg: NGPTConfig
    unshardable = "renormalises whole weight matrices after every step, which FSDP2's shards do not hold"

    def branch_multiplier(self, stack: str) -> float:  # the eigen learning rates at init: the step toward G
        return self.cfg.alpha_init

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        return UnitNorm()

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        return SphereResidual(sublayer, self.cfg.alpha_init)

    def logit_scale(self, vocab_size: int, d_model: int, stack: str) -> nn.Module:
        return VectorScale(vocab_size, 1.0, d_model ** -0.5)

    def wrap(self, sublayer: Sublayer, stack: str, layer: int) -> nn.Module:
        for module in sublayer.modules():  # no biases anywhere
            if isinstance(module, nn.Linear):
                module.register_parameter("bias", None)
        if sublayer.kind == "ffn":
            width = next(w.shape[0] for role, w, _ in sublayer.projections() if role == "fc1")
            sublayer.act_in = VectorScale(width, 1.0, 1.0, gain=sublayer.d_model ** 0.5)
        else:
            head_dim = sublayer.d_model // sublayer.n_heads
            s_qk = ScaledVector(sublayer.d_model, 1.0, sublayer.d_model ** -0.5)  # shared by q and k
            sublayer.q_norm = ScaledHeadNorm(sublayer.n_heads, head_dim, sublayer.q_norm, s_qk)
            sublayer.k_norm = ScaledHeadNorm(sublayer.n_heads, head_dim, sublayer.k_norm, s_qk)
        return super().wrap(sublayer, stack, layer)

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        for role, weight, _ in sublayer.projections():
            nn.init.normal_(weight)  # only the direction survives
            to_sphere(weight, role)

    @torch.no_grad()
    def init_embedding(self, weight: torch.Tensor, stack: str, role: str) -> None:
        nn.init.normal_(weight)
        to_sphere(weight, "table")

    @torch.no_grad()
    def after_optimizer_step(self, model: nn.Module) -> None:
        in_blocks = set()
        for _, _, _, block in model.residual_blocks():
            for role, weight, _ in block.sublayer.projections():
                to_sphere(weight, role)
            in_blocks.update(id(p) for p in block.parameters())
        for p in model.parameters():  # the embedding, an untied head, learned positions: d_model last
            if p.dim() == 2 and id(p) not in in_blocks:
                to_sphere(p, "table")
