"""Encoder-decoder Transformer (the DeepNet paper's translation setting), sublayers wrapped by the scheme.

Encoder layers: bidirectional self-attention, FFN. Decoder layers: causal self-attention, cross-attention to
the encoder output, FFN. One shared vocabulary: source and target share one embedding, and the output head
too unless `model.tie_embeddings=false` (the paper's joint dictionary). Padding (token 0) is masked as attention keys and in the loss.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..schemes import NormScheme
from ..special_tokens import BOS, EOS, PAD
from . import LossOutput, next_token_loss, register
from .layers import CrossAttention, Embeddings, FeedForward, SelfAttention, run_blocks


class EncoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, scheme: NormScheme, layer: int):
        super().__init__()
        self.attn = scheme.wrap(SelfAttention.of(cfg, causal=False), "encoder", layer)
        self.ffn = scheme.wrap(FeedForward.of(cfg), "encoder", layer)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.attn(x, key_mask))


class CrossDecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, scheme: NormScheme, layer: int):
        super().__init__()
        self.attn = scheme.wrap(SelfAttention.of(cfg), "decoder", layer)
        self.cross = scheme.wrap(CrossAttention.of(cfg), "decoder", layer)
        self.ffn = scheme.wrap(FeedForward.of(cfg), "decoder", layer)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.cross(self.attn(x), memory, memory_mask))


@register("encdec")
class EncoderDecoder(nn.Module):
    task = "translation"

    @staticmethod
    def stack_depths(cfg) -> dict[str, int]:
        """`depth` sets both stacks; model.encoder_depth / model.decoder_depth set them apart."""
        return {"encoder": cfg.model.encoder_depth or cfg.depth, "decoder": cfg.model.decoder_depth or cfg.depth}

    def __init__(self, cfg: ModelConfig, depths: dict[str, int], scheme: NormScheme):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg, scheme, "decoder")  # shared by both stacks and the output head
        self.encoder_stream_in = scheme.stream_in(cfg.d_model, "encoder")
        self.encoder = nn.ModuleList(EncoderBlock(cfg, scheme, layer) for layer in range(depths["encoder"]))
        self.encoder_norm = scheme.final_norm(cfg.d_model, "encoder")
        self.decoder_stream_in = scheme.stream_in(cfg.d_model, "decoder")
        self.decoder = nn.ModuleList(CrossDecoderBlock(cfg, scheme, layer) for layer in range(depths["decoder"]))
        self.decoder_norm = scheme.final_norm(cfg.d_model, "decoder")

    def _checkpointing(self) -> bool:
        return self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder output and its key mask, (batch, 1, 1, src_len), True at real (non-pad) tokens."""
        key_mask = (src != PAD)[:, None, None, :]
        x = run_blocks(self.encoder, self.encoder_stream_in(self.embed(src)), self._checkpointing(), key_mask)
        return self.encoder_norm(x), key_mask

    def decoder_hidden(self, tgt_in: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """The decoder's final hidden state, (batch, tgt_len, d_model)."""
        x = run_blocks(self.decoder, self.decoder_stream_in(self.embed(tgt_in)), self._checkpointing(), memory, memory_mask)
        return self.decoder_norm(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every target prefix, (batch, tgt_len, vocab)."""
        return self.embed.logits(self.decoder_hidden(tgt_in, memory, memory_mask))

    def features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """F(x): the decoder's final hidden state at every target position `loss(batch)` predicts from."""
        return self.decoder_hidden(batch["tgt"][:, :-1], *self.encode(batch["src"]))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt_in, *self.encode(src))

    def loss(self, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Teacher-forced cross-entropy over the target tokens after BOS, padding ignored."""
        tgt = batch["tgt"]
        return next_token_loss(self(batch["src"], tgt[:, :-1]), tgt[:, 1:], ignore_index=PAD)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, max_len: int) -> torch.Tensor:
        """Greedy translations, (batch, <= max_len + 1): BOS, then tokens until EOS (PAD after it)."""
        memory, mask = self.encode(src)
        out = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            step = self.decode(out, memory, mask)[:, -1].argmax(-1)
            step = torch.where(done, torch.full_like(step, PAD), step)
            out = torch.cat([out, step[:, None]], dim=1)
            done |= step == EOS
            if bool(done.all()):
                break
        return out

    def residual_blocks(self) -> Iterator[tuple[str, int, str, nn.Module]]:
        for layer, block in enumerate(self.encoder):
            yield "encoder", layer, "attn", block.attn
            yield "encoder", layer, "ffn", block.ffn
        for layer, block in enumerate(self.decoder):
            yield "decoder", layer, "attn", block.attn
            yield "decoder", layer, "cross", block.cross
            yield "decoder", layer, "ffn", block.ffn
