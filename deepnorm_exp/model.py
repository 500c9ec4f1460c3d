"""Decoder-only Transformer LM whose residual blocks come from a normalization scheme.

The model builds plain sublayers and asks the scheme to wrap them (`scheme.wrap`): the scheme decides
where the norms sit, how the residual combines and how the weights start. Nothing here knows scheme names.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ModelConfig
from .schemes import NormScheme


class SelfAttention(nn.Module):
    """Multi-head attention through `scaled_dot_product_attention`.

    q, k and v live in one fused weight for speed (one matmul instead of three) but are initialised as
    three separate d x d matrices, since DeepNorm scales v and not q or k.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, causal: bool = True):
        super().__init__()
        self.d_model, self.n_heads, self.dropout, self.causal = d_model, n_heads, dropout, causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def projections(self):
        d = self.d_model
        for i, role in enumerate(("q", "k", "v")):
            yield role, self.qkv.weight[i * d:(i + 1) * d], self.qkv.bias[i * d:(i + 1) * d]
        yield "out", self.out.weight, self.out.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(batch, seq, d))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.d_model = d_model
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def projections(self):
        yield "fc1", self.fc1.weight, self.fc1.bias
        yield "fc2", self.fc2.weight, self.fc2.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.gelu(self.fc1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, scheme: NormScheme, layer: int):
        super().__init__()
        self.attn = scheme.wrap(SelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout), "decoder", layer)
        self.ffn = scheme.wrap(FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout), "decoder", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.attn(x))


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: d_model // 2])
    return table


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig, depth: int, scheme: NormScheme):
        super().__init__()
        self.cfg, self.depth = cfg, depth
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        scheme.init_embedding(self.embed.weight, "decoder")
        self.embed_scale = math.sqrt(cfg.d_model)
        if cfg.positions == "learned":  # fairseq's learned positions: N(0, 1/d), not scaled
            self.pos = nn.Parameter(torch.empty(cfg.max_seq_len, cfg.d_model))
            scheme.init_embedding(self.pos, "decoder")
        else:
            self.register_buffer("pos", sinusoidal_positions(cfg.max_seq_len, cfg.d_model), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg, scheme, layer) for layer in range(depth))
        self.final_norm = scheme.final_norm(cfg.d_model, "decoder")
        self.head = None
        if not cfg.tie_embeddings:
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            scheme.init_embedding(self.head.weight, "decoder")

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final hidden state F(x), (batch, seq, d_model)."""
        seq = tokens.shape[1]
        x = self.drop(self.embed(tokens) * self.embed_scale + self.pos[:seq])
        checkpointing = self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
        return self.final_norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits, (batch, seq, vocab)."""
        h = self.features(tokens)
        return F.linear(h, self.head.weight if self.head is not None else self.embed.weight)

    def residual_blocks(self) -> Iterator[tuple[str, int, str, nn.Module]]:
        """(stack, layer, sublayer name, residual block) for every sublayer, bottom to top."""
        for layer, block in enumerate(self.blocks):
            yield "decoder", layer, "attn", block.attn
            yield "decoder", layer, "ffn", block.ffn


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
