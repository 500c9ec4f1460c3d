"""Decoder-only Transformer LM whose residual blocks come from a normalization scheme.

The model builds plain sublayers and asks the scheme to wrap them (`scheme.wrap`): the scheme decides
where the norms sit, how the residual combines and how the weights start. Nothing here knows scheme names.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..schemes import NormScheme
from . import LossOutput, next_token_loss, register
from .layers import Embeddings, FeedForward, SelfAttention, run_blocks


class DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, scheme: NormScheme, layer: int):
        super().__init__()
        self.attn = scheme.wrap(SelfAttention.of(cfg), "decoder", layer)
        self.ffn = scheme.wrap(FeedForward.of(cfg), "decoder", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.attn(x))


@register("decoder")
class DecoderLM(nn.Module):
    task = "lm"

    @staticmethod
    def stack_depths(cfg) -> dict[str, int]:
        return {"decoder": cfg.model.decoder_depth or cfg.depth}

    def __init__(self, cfg: ModelConfig, depths: dict[str, int], scheme: NormScheme):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg, scheme, "decoder")
        self.stream_in = scheme.stream_in(cfg.d_model, "decoder")
        self.blocks = nn.ModuleList(DecoderBlock(cfg, scheme, layer) for layer in range(depths["decoder"]))
        self.final_norm = scheme.final_norm(cfg.d_model, "decoder")

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final hidden state, (batch, seq, d_model): what the output head reads."""
        checkpointing = self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()
        return self.final_norm(run_blocks(self.blocks, self.stream_in(self.embed(tokens)), checkpointing))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits, (batch, seq, vocab)."""
        return self.embed.logits(self.hidden(tokens))

    def features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """F(x): the final hidden state at every position `loss(batch)` predicts from."""
        return self.hidden(batch["tokens"][:, :-1])

    def loss(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Mean next-token cross-entropy of `batch["tokens"]`, (batch, seq + 1)."""
        tokens = batch["tokens"]
        return next_token_loss(self(tokens[:, :-1]), tokens[:, 1:])

    def residual_blocks(self) -> Iterator[tuple[str, int, str, nn.Module]]:
        """(stack, layer, sublayer name, residual block) for every sublayer, bottom to top."""
        for layer, block in enumerate(self.blocks):
            yield "decoder", layer, "attn", block.attn
            yield "decoder", layer, "ffn", block.ffn
