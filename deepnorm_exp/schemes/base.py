"""What a normalization scheme decides, and the defaults every scheme starts from.

The model builds plain sublayers (attention, FFN) and hands each one to `scheme.wrap`, which returns the
residual block around it: where the norms sit, how the residual combines, and how the sublayer's weights
are initialised. The model never asks which scheme it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol

import torch
from torch import nn

from ..config import setting
from ..constant_roles import ROLES


class Sublayer(Protocol):
    """A residual branch G(x): attention or FFN. `projections` names its weights by role. `inner_norm`
    (nn.Identity unless a scheme sets one, as Sub-LN does) acts on the `inner_width`-wide activation before
    the sublayer's last projection. `kind` says which branch it is, for the schemes whose rule differs
    between them (DyT's alpha_0, Sub-LN's cross-attention)."""

    kind: str  # "attention" (self), "cross_attention" or "ffn"
    d_model: int
    inner_width: int
    inner_norm: nn.Module
    drop: nn.Dropout  # on G(x), the sublayer's last step (its p: DeepScaleLM's init)
    # attention only: n_heads, and q_norm, k_norm, v_norm (per head; identities unless set);
    # FFN only: act_in (on fc1's output, before the activation), activation_kind ("gelu" | "swiglu"),
    # activation_drop (on the hidden activation)

    def projections(self) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
        """(role, weight, bias) for each projection; roles: q, k, v, out, fc1, fc2."""
        ...


@dataclass
class SchemeConfig:
    name: str = "?"

    def __post_init__(self):
        """What involves several keys (a key's own rule is its `setting`, which config.parse_section checks)."""


NORM_LAYERS = ("layernorm", "rmsnorm")


@dataclass
class NormedConfig(SchemeConfig):
    """Schemes with normalization layers choose their kind (the DeepNorm constants were derived for LayerNorm)."""

    layer: str = setting("layernorm", choices=NORM_LAYERS)  # layernorm | rmsnorm


BASELINE_INITS = ("fairseq", "xavier")
QKV_GAIN = 2 ** -0.5  # fairseq's q, k, v gain (see BaselineInit)


@dataclass
class BaselineConfig(NormedConfig):
    """The paper's baselines (Post-LN, Pre-LN): their structure, initialised as `init` says."""

    init: str = setting("fairseq", choices=BASELINE_INITS)  # fairseq | xavier


class NormScheme:
    """Base scheme: no normalization, residual x + G(x), Xavier-normal (gain 1) weights, zero biases.

    Subclasses override what their rule changes. `depths` maps each stack ("decoder", later "encoder")
    to its number of layers, from which schemes derive their constants.
    """

    Config = SchemeConfig
    # why FSDP2 may not shard it (None: it may): nGPT's post-step renormalisation needs whole matrices
    unshardable: str | None = None
    # the memory estimate (train/memory.py): what the scheme's own operations add to a layer's saved
    # activations, as a factor, and the residual state's width in d_model (ResiDual carries two streams)
    activation_factor = 1.0
    state_width = 1
    # and what each residual block's own operations save per position whatever d_model is (mHC's Sinkhorn rounds)
    block_floats = 0
    # and what they save in d_model-wide vectors per position, whatever the sublayer (Block AttnRes's sources)
    block_width = 0.0

    def __init__(self, cfg: SchemeConfig, depths: Mapping[str, int], eps: float):
        self.cfg = cfg
        self.depths = dict(depths)
        self.eps = eps

    # --- constants -------------------------------------------------------------------------------
    # named by the role each plays (constant_roles.ROLES), whatever the scheme's paper calls it
    def residual_multiplier(self, stack: str) -> float:
        """Multiplier of the residual stream x where the branch joins it."""
        return 1.0

    def branch_multiplier(self, stack: str) -> float:
        """Multiplier of the branch G(x)."""
        return 1.0

    def init_gain(self, stack: str) -> float:
        """The init gain of the projections the scheme scales (see `gain`)."""
        return 1.0

    def residual_adds(self, stack: str) -> int:
        """The residual connections in `stack`: two a layer, three in a decoder that cross-attends (the count
        Admin's closed form, DeepScaleLM's beta and Keel's alpha are made of)."""
        per_layer = 3 if stack == "decoder" and "encoder" in self.depths else 2
        return per_layer * self.depths[stack]

    def constants(self) -> dict[str, dict[str, float]]:
        """{role: {stack: value}} for every role of constant_roles.ROLES: what summary.json reports."""
        return {role: {s: getattr(self, role)(s) for s in self.depths} for role in ROLES}

    # --- structure ------------------------------------------------------------------------------
    def norm(self, d_model: int) -> nn.Module:
        """A normalization layer of the configured kind (`norm.layer`, for schemes whose Config has it)."""
        if self.cfg.layer == "rmsnorm":
            return nn.RMSNorm(d_model, eps=self.eps)
        return nn.LayerNorm(d_model, eps=self.eps)

    def residual(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        """The block that combines x and G(x); called after `init_sublayer`."""
        raise NotImplementedError

    def stream_in(self, d_model: int, stack: str) -> nn.Module:
        """Turns the embedding into the residual state the first block reads (identity: the state is the
        hidden stream). A scheme with more than one stream (ResiDual) packs them on the last dimension; its
        blocks then offer `hidden_state(state)`, the d_model-wide view per-block measures read, and its
        `final_norm` turns the state back into d_model-wide hidden states. nGPT puts the embedding on the
        sphere here."""
        return nn.Identity()

    def final_norm(self, d_model: int, stack: str) -> nn.Module:
        """Applied to a stack's output (Pre-LN needs one; Post-LN's output is already normalized)."""
        return nn.Identity()

    def logit_scale(self, vocab_size: int, d_model: int, stack: str) -> nn.Module:
        """Applied to the output logits, before a soft-cap (nGPT's learned s_z; identity for the rest)."""
        return nn.Identity()

    def wrap(self, sublayer: nn.Module, stack: str, layer: int) -> nn.Module:
        """Initialise a sublayer's weights and return its residual block. `layer` counts from 0."""
        self.init_sublayer(sublayer, stack, layer)
        return self.residual(sublayer, stack, layer)

    # --- hooks around training (default: nothing) ------------------------------------------------
    def prepare(self, model: nn.Module, batch: dict) -> None:
        """Called once when the model is built, with a training batch (Admin's profiling); also for a resumed
        run, before its checkpoint is loaded, so the model then holds theta_0 exactly (deterministic: eval mode)."""

    def after_optimizer_step(self, model: nn.Module) -> None:
        """Called after every optimizer step that changed the weights (torch's step post-hook; a step fp16's
        scaler skips is not one): nGPT puts its weights back on the sphere here."""

    def param_groups(self, model: nn.Module, lr: float, eps: float) -> list[dict] | None:
        """Optimizer parameter groups, for schemes with their own learning-rate or Adam-epsilon rule, given the
        run's `train.lr` and `train.adam_eps` (None: one group)."""
        return None

    # --- initialisation -------------------------------------------------------------------------
    def gain(self, role: str, stack: str, layer: int) -> float:
        """Xavier gain of one projection; DeepNorm-like schemes return their init gain for v, out, fc1, fc2."""
        return 1.0

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        for role, weight, bias in sublayer.projections():
            nn.init.xavier_normal_(weight, gain=self.gain(role, stack, layer))
            if bias is not None:
                bias.zero_()

    @torch.no_grad()
    def init_embedding(self, weight: torch.Tensor, stack: str, role: str) -> None:
        """Token embeddings (`role` "tokens"), learned positions ("positions") and an untied output head
        ("head"): N(0, 1/d); tokens are used times sqrt(d) (fairseq's convention, the paper's codebase)."""
        nn.init.normal_(weight, std=weight.shape[1] ** -0.5)


class BaselineInit:
    """The initialisation of the codebase the paper's Post-LN and Pre-LN baselines ran in (`init=fairseq`,
    the default), or the base scheme's Xavier-normal with gain 1 everywhere (`init=xavier`).

    fairseq's: every projection Xavier-uniform, gain 1/sqrt(2) for q, k and v and 1 for out, fc1, fc2, biases
    0. That is fairseq 0.8 and Transformer-Clinic (the DeepNet authors' fairseq fork, whose `--init-type
    deepnet` is DeepNorm): one fused (3d, d) in-projection with Xavier gain 1, whose per-matrix bound equals
    that of a (d, d) matrix with gain 1/sqrt(2); fairseq 0.9 and later split the projections and keep the
    1/sqrt(2). Later fairseq differs elsewhere, documented in docs, not offered: from 0.9 the q/k/v biases keep
    nn.Linear's uniform default, and from 0.10 fc1 and fc2 are plain nn.Linear (kaiming-uniform). Mixed into
    PostLN and PreLN only: schemes built on their structure keep the rule their own papers give."""

    cfg: BaselineConfig

    @torch.no_grad()
    def init_sublayer(self, sublayer: Sublayer, stack: str, layer: int) -> None:
        if self.cfg.init == "xavier":
            return super().init_sublayer(sublayer, stack, layer)
        for role, weight, bias in sublayer.projections():
            nn.init.xavier_uniform_(weight, gain=QKV_GAIN if role in ("q", "k", "v") else 1.0)
            if bias is not None:
                bias.zero_()


@torch.no_grad()
def linear_default_bias_(bias: torch.Tensor, fan_in: int) -> None:
    """What a fresh nn.Linear draws for its bias, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (official codes that keep it)."""
    bound = 1 / math.sqrt(fan_in)
    nn.init.uniform_(bias, -bound, bound)


def xavier_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    """The std `nn.init.xavier_normal_` draws from (used by tests and docs)."""
    return gain * math.sqrt(2.0 / (fan_in + fan_out))
