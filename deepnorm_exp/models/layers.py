"""The sublayers every model is built from. Each names its projections by role for the scheme's init.

Dropout sits where fairseq (the paper's codebase) and torchscale put it, under their names:
`attention_dropout` on the attention weights, `activation_dropout` on the FFN's hidden activation, and
`dropout` on the sublayer's output G(x), the last thing a sublayer does, so every scheme combines the
dropped-out branch with the residual stream (x + drop(G(x)), LN(alpha x + drop(G(x))), ...). The models
apply `dropout` to the embeddings too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    batch, seq, d = x.shape
    return x.view(batch, seq, n_heads, d // n_heads).transpose(1, 2)


def _rows(bias: torch.Tensor | None, i: int, width: int) -> torch.Tensor | None:
    """Rows i * width to (i + 1) * width of a fused bias; None where a scheme removed the biases (nGPT)."""
    return None if bias is None else bias[i * width:(i + 1) * width]


def _merge(y: torch.Tensor) -> torch.Tensor:
    batch, heads, seq, head_dim = y.shape
    return y.transpose(1, 2).reshape(batch, seq, heads * head_dim)


def qk_norms(kind: str, head_dim: int, eps: float) -> tuple[nn.Module, nn.Module]:
    """The norms q and k pass through per head, before their dot product (`model.qk_norm`): one over each
    head's head_dim coordinates, its gain shared by the heads, as ViT-22B normalises them; identities for
    "none". They make the logits independent of the scale of the q and k weights."""
    if kind == "none":
        return nn.Identity(), nn.Identity()
    make = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}[kind]
    return make(head_dim, eps=eps), make(head_dim, eps=eps)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap tanh(x / cap): smooth, close to x where |x| << cap, never beyond +-cap (Gemma 2's logit
    soft-capping); x itself for None."""
    return x if cap is None else cap * torch.tanh(x / cap)


def _attention_logits(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                      cap: float | None = None) -> torch.Tensor:
    """softcap(q k^T / sqrt(head_dim)), -inf where `mask` forbids the key (False): what the softmax reads."""
    scores = softcap(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), cap)
    return scores if mask is None else scores.masked_fill(~mask, -math.inf)


def _causal_mask(mask: torch.Tensor | None, seq: int, device: torch.device) -> torch.Tensor:
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    return causal if mask is None else mask & causal


@dataclass(frozen=True)
class AttentionSettings:
    """What an attention sublayer is built with (`of`: from the `model` section)."""

    d_model: int
    n_heads: int
    dropout: float = 0.0  # on the sublayer's output
    attention_dropout: float = 0.0  # on the attention weights
    qk_norm: str = "none"
    eps: float = 1e-5  # of the q/k norms
    softcap: float | None = None  # model.attn_softcap

    @classmethod
    def of(cls, cfg) -> "AttentionSettings":
        """From the `model` section (ModelConfig)."""
        return cls(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.attention_dropout, cfg.qk_norm, cfg.norm_eps,
                   cfg.attn_softcap)


class Attends:
    """softmax(logits) v for an attention module with `attention_dropout` and `softcap`: SDPA's fused kernel,
    or written out where the logits are soft-capped, a transform SDPA cannot apply between its product and
    its softmax."""

    def attend(self, q, k, v, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        dropout = self.attention_dropout if self.training else 0.0
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
        if causal:
            mask = _causal_mask(mask, q.shape[-2], q.device)
        return F.dropout(_attention_logits(q, k, mask, self.softcap).softmax(-1), dropout) @ v


class SelfAttention(Attends, nn.Module):
    """Multi-head self-attention through `scaled_dot_product_attention`, causal or with a key mask.

    q, k and v live in one fused weight for speed (one matmul instead of three) but are initialised as
    three separate d x d matrices, since DeepNorm scales v and not q or k.
    """

    kind = "attention"

    def __init__(self, settings: AttentionSettings, causal: bool = True):
        super().__init__()
        d_model, n_heads = settings.d_model, settings.n_heads
        self.d_model, self.n_heads, self.attention_dropout, self.causal = d_model, n_heads, settings.attention_dropout, causal
        self.softcap = settings.softcap
        self.q_norm, self.k_norm = qk_norms(settings.qk_norm, d_model // n_heads, settings.eps)
        self.v_norm = nn.Identity()  # per head, on v: a scheme may set one (HybridNorm)
        self.v_mix = nn.Identity()  # on v (batch, heads, seq, d_head), before v_norm: a scheme may set one (value residual)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.inner_width, self.inner_norm = d_model, nn.Identity()  # before `out`: a scheme may set a norm (Sub-LN)
        self.drop = nn.Dropout(settings.dropout)

    @classmethod
    def of(cls, cfg, causal: bool = True) -> "SelfAttention":
        """From the `model` section (ModelConfig)."""
        return cls(AttentionSettings.of(cfg), causal)

    def projections(self):
        d = self.d_model
        for i, role in enumerate(("q", "k", "v")):
            yield role, self.qkv.weight[i * d:(i + 1) * d], _rows(self.qkv.bias, i, d)
        yield "out", self.out.weight, self.out.bias

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`key_mask`: (batch, 1, 1, seq) bool, True where a key may be attended (non-causal use)."""
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = self.attend(self.q_norm(q), self.k_norm(k), self.v_norm(self.v_mix(v)), key_mask, self.causal)
        return self.drop(self.out(self.inner_norm(_merge(y))))

    def attention_logits(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The logits `forward`'s softmax reads, (batch, heads, seq, seq), -inf at masked keys, written out
        for instrumentation: SDPA never materialises them."""
        batch, seq, d = x.shape
        q, k, _ = self.qkv(x).view(batch, seq, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        mask = _causal_mask(key_mask, seq, x.device) if self.causal else key_mask
        return _attention_logits(self.q_norm(q), self.k_norm(k), mask, self.softcap)

    def attention_probs(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The softmax weights `forward` uses, (batch, heads, seq, seq)."""
        return self.attention_logits(x, key_mask).softmax(-1)


class CrossAttention(Attends, nn.Module):
    """Decoder-to-encoder attention: queries from x, keys and values from the encoder's output."""

    kind = "cross_attention"

    def __init__(self, settings: AttentionSettings):
        super().__init__()
        d_model, n_heads = settings.d_model, settings.n_heads
        self.d_model, self.n_heads, self.attention_dropout = d_model, n_heads, settings.attention_dropout
        self.softcap = settings.softcap
        self.q_norm, self.k_norm = qk_norms(settings.qk_norm, d_model // n_heads, settings.eps)
        self.v_norm = nn.Identity()
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.inner_width, self.inner_norm = d_model, nn.Identity()
        self.drop = nn.Dropout(settings.dropout)

    @classmethod
    def of(cls, cfg) -> "CrossAttention":
        """From the `model` section (ModelConfig)."""
        return cls(AttentionSettings.of(cfg))

    def projections(self):
        d = self.d_model
        yield "q", self.q.weight, self.q.bias
        yield "k", self.kv.weight[:d], _rows(self.kv.bias, 0, d)
        yield "v", self.kv.weight[d:], _rows(self.kv.bias, 1, d)
        yield "out", self.out.weight, self.out.bias

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None) -> torch.Tensor:
        k, v = self.kv(memory).chunk(2, dim=-1)
        y = self.attend(self.q_norm(_heads(self.q(x), self.n_heads)), self.k_norm(_heads(k, self.n_heads)),
                        self.v_norm(_heads(v, self.n_heads)), memory_mask, False)
        return self.drop(self.out(self.inner_norm(_merge(y))))

    def attention_logits(self, x: torch.Tensor, memory: torch.Tensor,
                         memory_mask: torch.Tensor | None) -> torch.Tensor:
        """Logits over the encoder positions, (batch, heads, tgt_len, src_len), -inf at masked ones."""
        q, k = _heads(self.q(x), self.n_heads), _heads(self.kv(memory)[..., :self.d_model], self.n_heads)
        return _attention_logits(self.q_norm(q), self.k_norm(k), memory_mask, self.softcap)

    def attention_probs(self, x: torch.Tensor, memory: torch.Tensor,
                        memory_mask: torch.Tensor | None) -> torch.Tensor:
        """Softmax weights over the encoder positions, (batch, heads, tgt_len, src_len)."""
        return self.attention_logits(x, memory, memory_mask).softmax(-1)


class FeedForward(nn.Module):
    """fc2(act(fc1 x)): `ffn=gelu`, act = gelu; `ffn=swiglu`, fc1 twice as wide, its output split in halves u and
    v, act = u * silu(v) (Shazeer 2020; LLaMA's, nGPT's)."""

    kind = "ffn"

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation_dropout: float = 0.0,
                 ffn: str = "gelu"):
        super().__init__()
        self.d_model, self.activation_kind = d_model, ffn
        self.fc1 = nn.Linear(d_model, 2 * d_ff if ffn == "swiglu" else d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act_in = nn.Identity()  # on fc1's output, before the activation: a scheme may scale it (nGPT's s_uv)
        self.activation_drop = nn.Dropout(activation_dropout)  # before a Sub-LN inner norm, as torchscale
        self.inner_width, self.inner_norm = d_ff, nn.Identity()  # before `fc2`: a scheme may set a norm (Sub-LN)
        self.drop = nn.Dropout(dropout)

    @classmethod
    def of(cls, cfg) -> "FeedForward":
        """From the `model` section (ModelConfig)."""
        return cls(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation_dropout, cfg.ffn)

    def projections(self):
        yield "fc1", self.fc1.weight, self.fc1.bias
        yield "fc2", self.fc2.weight, self.fc2.bias

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        if self.activation_kind == "swiglu":
            u, v = h.chunk(2, dim=-1)
            return u * F.silu(v)
        return F.gelu(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.activation_drop(self.activation(self.act_in(self.fc1(x))))
        return self.drop(self.fc2(self.inner_norm(hidden)))


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    # A constant table, made on the CPU whatever device the model is built under (on the meta device the
    # pre-flight's parameter count would otherwise pay for torch._dynamo's import to run arange there).
    position = torch.arange(n_positions, dtype=torch.float32, device="cpu")[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device="cpu") * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model, device="cpu")
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: d_model // 2])
    return table


class Embeddings(nn.Module):
    """Token embedding times sqrt(d) (fairseq's convention, the paper's codebase) plus positions, and the
    output head: the same matrix (tied, the default) or its own (`model.tie_embeddings=false`)."""

    def __init__(self, cfg, scheme, stack: str):
        super().__init__()
        self.token = nn.Embedding(cfg.vocab_size, cfg.d_model)
        scheme.init_embedding(self.token.weight, stack, "tokens")
        self.scale = math.sqrt(cfg.d_model)
        if cfg.positions == "learned":  # fairseq's learned positions: N(0, 1/d), not scaled
            self.pos = nn.Parameter(torch.empty(cfg.max_seq_len, cfg.d_model))
            scheme.init_embedding(self.pos, stack, "positions")
        else:
            self.register_buffer("pos", sinusoidal_positions(cfg.max_seq_len, cfg.d_model), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.softcap = cfg.logit_softcap
        self.logit_scale = scheme.logit_scale(cfg.vocab_size, cfg.d_model, stack)  # identity but where a scheme scales (nGPT's s_z)
        self.head = None
        if not cfg.tie_embeddings:
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            scheme.init_embedding(self.head.weight, stack, "head")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.drop(self.token(tokens) * self.scale + self.pos[: tokens.shape[1]])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output logits, soft-capped where `model.logit_softcap` says."""
        logits = F.linear(hidden, self.head.weight if self.head is not None else self.token.weight)
        return softcap(self.logit_scale(logits), self.softcap)


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, checkpointing: bool, *args) -> torch.Tensor:
    """Apply blocks in order; with `checkpointing`, keep only each block's input for the backward."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        x = checkpoint(block, x, *args, use_reentrant=False) if checkpointing else block(x, *args)
    return x
