"""DeepNorm, Sub-LN and Pre-LN against the official code: torchscale 0.3.0 (microsoft/torchscale), installed by
`make install` with --no-deps (Makefile). The project's weights are copied into torchscale's Decoder and
EncoderDecoder; logits and every gradient must agree to rounding in fp64 and fp32 at two depths; a deliberately
wrong constant on torchscale's side (its alpha, 1% off) must be caught; and each weight role's initial std is
held against torchscale's own init.

torchscale imports `drop_path` from timm, whose every release imports torchvision, which this machine's CPU
torch cannot load. The oracle configurations have drop_path_rate 0, so torchscale never calls it; the stand-in
below is installed only where timm cannot be imported, and raises if it is ever called.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
from torch import nn

import deepnorm_exp
from deepnorm_exp.schemes.base import xavier_std


def _import_torchscale():
    """torchscale's classes, timm stood in for while they import (and removed from sys.modules after)."""
    stand_in = {}
    try:
        import timm.models.layers  # noqa: F401
    except Exception:  # not installed, or installed without torchvision
        def drop_path(*args, **kwargs):
            raise AssertionError("torchscale called drop_path: the oracle must run with drop_path_rate 0")

        stand_in = {name: types.ModuleType(name) for name in ("timm", "timm.models", "timm.models.layers")}
        stand_in["timm.models.layers"].drop_path = drop_path
        sys.modules.update(stand_in)
    try:
        from torchscale.architecture.config import DecoderConfig, EncoderDecoderConfig
        from torchscale.architecture.decoder import Decoder
        from torchscale.architecture.encoder_decoder import EncoderDecoder
    except ImportError as err:
        raise ImportError(f"{err}: the oracle needs torchscale 0.3.0 and fairscale, which `make install` puts in "
                          "with --no-deps (the Makefile's ORACLES)") from err
    finally:
        for name in stand_in:
            del sys.modules[name]
    return DecoderConfig, EncoderDecoderConfig, Decoder, EncoderDecoder


DecoderConfig, EncoderDecoderConfig, Decoder, EncoderDecoder = _import_torchscale()

D, HEADS, FF = 64, 4, 256
WIDE = [f"model.d_model={D}", f"model.n_heads={HEADS}", f"model.d_ff={FF}", "model.dropout=0.0"]
TORCHSCALE_FLAGS = {  # the project's scheme -> torchscale's switches
    "deepnorm": dict(deepnorm=True, subln=False),
    "subln": dict(deepnorm=False, subln=True),
    "pre": dict(deepnorm=False, subln=False),
}


class Positions(nn.Module):
    """The project's sinusoidal table handed to torchscale as its `embed_positions` (torchscale takes positions
    from its caller); the table is an input here, not what is compared."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, tokens, **kwargs):
        return self.table[: tokens.shape[1]]


def _decoder_config(norm: str, depth: int, vocab: int) -> DecoderConfig:
    return DecoderConfig(decoder_embed_dim=D, decoder_attention_heads=HEADS, decoder_ffn_embed_dim=FF,
                         decoder_layers=depth, vocab_size=vocab, no_scale_embedding=False,
                         share_decoder_input_output_embed=True, **TORCHSCALE_FLAGS[norm])


def _encdec_config(norm: str, depth: int, vocab: int) -> EncoderDecoderConfig:
    return EncoderDecoderConfig(encoder_embed_dim=D, encoder_attention_heads=HEADS, encoder_ffn_embed_dim=FF,
                                decoder_embed_dim=D, decoder_attention_heads=HEADS, decoder_ffn_embed_dim=FF,
                                encoder_layers=depth, decoder_layers=depth, vocab_size=vocab,
                                no_scale_embedding=False, share_all_embeddings=True, **TORCHSCALE_FLAGS[norm])


def build_torchscale(model_kind: str, norm: str, depth: int, ours: nn.Module, vocab: int) -> nn.Module:
    positions = Positions(ours.embed.pos.clone())
    embed = nn.Embedding(vocab, D)
    if model_kind == "decoder":
        return Decoder(_decoder_config(norm, depth, vocab), embed_tokens=embed, embed_positions=positions)
    return EncoderDecoder(_encdec_config(norm, depth, vocab), encoder_embed_tokens=embed,
                          encoder_embed_positions=positions, decoder_embed_positions=positions)


def _attention_pairs(ours, theirs):
    """(our parameter, the slice of it, torchscale's parameter) for one attention sublayer."""
    if hasattr(ours, "qkv"):  # self-attention: q, k, v fused in the project, apart in torchscale
        for i, role in enumerate("qkv"):
            rows = slice(i * D, (i + 1) * D)
            yield ours.qkv.weight, rows, getattr(theirs, f"{role}_proj").weight
            yield ours.qkv.bias, rows, getattr(theirs, f"{role}_proj").bias
    else:  # cross-attention: q apart, k and v fused
        yield ours.q.weight, slice(None), theirs.q_proj.weight
        yield ours.q.bias, slice(None), theirs.q_proj.bias
        for i, role in enumerate("kv"):
            rows = slice(i * D, (i + 1) * D)
            yield ours.kv.weight, rows, getattr(theirs, f"{role}_proj").weight
            yield ours.kv.bias, rows, getattr(theirs, f"{role}_proj").bias
    yield ours.out.weight, slice(None), theirs.out_proj.weight
    yield ours.out.bias, slice(None), theirs.out_proj.bias
    yield from _norm_pairs(ours.inner_norm, theirs.inner_attn_ln)


def _norm_pairs(ours, theirs):
    assert isinstance(ours, nn.Identity) == (theirs is None), "one side has a norm the other lacks"
    if theirs is None:
        return
    yield ours.weight, slice(None), theirs.weight
    yield ours.bias, slice(None), theirs.bias


def _ffn_pairs(ours, theirs):
    for name in ("fc1", "fc2"):
        yield getattr(ours, name).weight, slice(None), getattr(theirs, name).weight
        yield getattr(ours, name).bias, slice(None), getattr(theirs, name).bias
    yield from _norm_pairs(ours.inner_norm, theirs.ffn_layernorm)


def _stack_pairs(blocks, layers, final_norm, ts_final_norm):
    for block, layer in zip(blocks, layers, strict=True):
        yield from _attention_pairs(block.attn.sublayer, layer.self_attn)
        yield from _norm_pairs(block.attn.norm, layer.self_attn_layer_norm)
        if hasattr(block, "cross"):
            yield from _attention_pairs(block.cross.sublayer, layer.encoder_attn)
            yield from _norm_pairs(block.cross.norm, layer.encoder_attn_layer_norm)
        yield from _ffn_pairs(block.ffn.sublayer, layer.ffn)
        yield from _norm_pairs(block.ffn.norm, layer.final_layer_norm)
    yield from _norm_pairs(final_norm, ts_final_norm)


def parameter_pairs(ours, theirs):
    """Every parameter of the project's model with its counterpart in torchscale's, each exactly once."""
    if hasattr(ours, "blocks"):  # decoder-only
        yield ours.embed.token.weight, slice(None), theirs.embed_tokens.weight
        yield from _stack_pairs(ours.blocks, theirs.layers, ours.final_norm, theirs.layer_norm)
    else:
        yield ours.embed.token.weight, slice(None), theirs.encoder.embed_tokens.weight
        yield from _stack_pairs(ours.encoder, theirs.encoder.layers, ours.encoder_norm, theirs.encoder.layer_norm)
        yield from _stack_pairs(ours.decoder, theirs.decoder.layers, ours.decoder_norm, theirs.decoder.layer_norm)


def _torchscale_logits(theirs, batch):
    if "tokens" in batch:
        return theirs(batch["tokens"])[0]
    src, tgt = batch["src"], batch["tgt"]
    encoder_out = theirs.encoder(src, encoder_padding_mask=src == 0, features_only=True)
    return theirs.decoder(tgt, encoder_out=encoder_out)[0]


def _our_logits(ours, batch):
    return ours(batch["tokens"]) if "tokens" in batch else ours(batch["src"], batch["tgt"])


def _batch(model_kind: str, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if model_kind == "decoder":
        return {"tokens": torch.randint(3, vocab, (2, 16), generator=g)}
    src = torch.randint(3, vocab, (2, 12), generator=g)
    src[1, 9:] = 0  # padding, masked as keys on both sides
    return {"src": src, "tgt": torch.randint(3, vocab, (2, 10), generator=g)}


def build_pair(model_kind: str, norm: str, depth: int, dtype: torch.dtype):
    cfg = deepnorm_exp.compose([f"model={model_kind}", f"norm={norm}", f"depth={depth}", *WIDE])
    vocab = cfg.data.vocab_size
    torch.manual_seed(0)
    ours = deepnorm_exp.build_model(cfg)
    with torch.no_grad():  # every LayerNorm away from (1, 0), so the copy is what is compared
        for module in ours.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
    theirs = build_torchscale(model_kind, norm, depth, ours, vocab)
    pairs = list(parameter_pairs(ours, theirs))
    covered = {id(p) for p, _, _ in pairs}
    assert covered == {id(p) for p in ours.parameters()}, "a parameter of the project's model is not mapped"
    assert {id(t) for _, _, t in pairs} == {id(p) for p in theirs.parameters()}, "a torchscale parameter is unset"
    with torch.no_grad():
        for mine, rows, their in pairs:
            their.copy_(mine[rows])
    ours.to(dtype).eval(), theirs.to(dtype).eval()
    return ours, theirs, _batch(model_kind, vocab)


def _backward(logits):
    logits.square().mean().backward()
    return logits.detach()


CASES = [("decoder", "deepnorm"), ("decoder", "subln"), ("decoder", "pre"),
         ("encdec", "deepnorm"), ("encdec", "subln"), ("encdec", "pre")]


# torchscale computes the FFN's activation and the attention softmax in fp32 whatever the input's dtype
# (`activation_fn(x.float())`, `softmax(..., dtype=torch.float32)`: upcasts for fp16, a rounding to fp32 in
# fp64), so in fp64 the two agree to fp32's rounding of those two operations, not to fp64's.
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-6), (torch.float32, 3e-5)])
@pytest.mark.parametrize("depth", [2, 12])
@pytest.mark.parametrize("model_kind, norm", CASES)
def test_equals_torchscale(model_kind, norm, depth, dtype, tol, record_deviation):
    ours, theirs, batch = build_pair(model_kind, norm, depth, dtype)
    ours_logits, their_logits = _backward(_our_logits(ours, batch)), _backward(_torchscale_logits(theirs, batch))
    record_deviation("logits / largest", ours_logits, their_logits)
    assert torch.allclose(ours_logits, their_logits, rtol=tol, atol=tol), \
        (ours_logits - their_logits).abs().max().item()
    # atol on the largest gradient's scale: the k biases' gradients are zero but for rounding (a softmax ignores a
    # shift common to every key)
    scale = max(p.grad.abs().max().item() for p in ours.parameters())
    pairs = list(parameter_pairs(ours, theirs))
    record_deviation("gradients / largest", torch.stack([(m.grad[r] - t.grad).abs().max() for m, r, t in pairs]),
                     0, scale)
    for mine, rows, their in pairs:
        assert torch.allclose(mine.grad[rows], their.grad, rtol=tol, atol=tol * scale), their.shape

    # negative control: alpha (or, where alpha is 1, a LayerNorm gain) 1% off in one torchscale layer
    with torch.no_grad():
        layer = (theirs.layers if model_kind == "decoder" else theirs.decoder.layers)[-1]
        if layer.alpha != 1.0:
            layer.alpha *= 1.01
        else:
            layer.final_layer_norm.weight.mul_(1.01)
        assert not torch.allclose(ours_logits, _torchscale_logits(theirs, batch), rtol=tol, atol=tol)


def test_the_oracle_sees_the_sub_ln_cross_attention_fault():
    """The issue's fault, rebuilt: give the decoder's cross-attention Sub-LN's inner LayerNorm (what
    schemes/subln.py did before the fix) and the mapping refuses it: torchscale has no norm there. (The gain
it also gave that sublayer shows in test_init_std_per_role_against_torchscale's cross roles.)"""
    ours, theirs, _ = build_pair("encdec", "subln", 2, torch.float64)
    ours.decoder[0].cross.sublayer.inner_norm = nn.LayerNorm(D)
    with pytest.raises(AssertionError, match="one side has a norm the other lacks"):
        list(parameter_pairs(ours, theirs))


# --- the initialisation, role by role ------------------------------------------------------------------
def kaiming_uniform_std(fan_in: int) -> float:
    """nn.Linear's default weight init (kaiming-uniform, a = sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return 1 / math.sqrt(3 * fan_in)


def role_stds(model: nn.Module, ours: bool) -> dict[tuple[str, str], float]:
    """{(stack, role): std of every weight of that role in that stack}, attention roles by sublayer kind."""
    draws: dict[tuple[str, str], list[torch.Tensor]] = {}
    if ours:
        for stack, _, name, block in model.residual_blocks():
            prefix = "cross_" if name == "cross" else ""
            for role, weight, _ in block.sublayer.projections():
                draws.setdefault((stack, prefix + role), []).append(weight.detach().flatten())
    else:
        for stack, layers in _torchscale_stacks(model):
            for layer in layers:
                sources = [("", layer.self_attn), ("cross_", getattr(layer, "encoder_attn", None))]
                for prefix, attn in sources:
                    if attn is None:
                        continue
                    for role in ("q", "k", "v"):
                        draws.setdefault((stack, prefix + role), []).append(getattr(attn, f"{role}_proj").weight.flatten())
                    draws.setdefault((stack, prefix + "out"), []).append(attn.out_proj.weight.flatten())
                for role in ("fc1", "fc2"):
                    draws.setdefault((stack, role), []).append(getattr(layer.ffn, role).weight.flatten())
    return {key: torch.cat(ws).std().item() for key, ws in draws.items()}


def _torchscale_stacks(model):
    if isinstance(model, Decoder):
        return [("decoder", model.layers)]
    return [("encoder", model.encoder.layers), ("decoder", model.decoder.layers)]


def _fans(role: str) -> tuple[int, int]:
    return {"fc1": (D, FF), "fc2": (FF, D)}.get(role.removeprefix("cross_"), (D, D))


# The paper's init draws Xavier-normal weights with the scheme's gain; torchscale keeps nn.Linear's default and
# multiplies the same roles by its factor. Both factors agree but one (DeepNorm's encoder-decoder encoder: the
# paper's 0.87 against torchscale's 1.15), so the stds' ratio is that of the two draws, times 0.87 / 1.15 there;
# `constants=torchscale` reproduces torchscale's draws (ratio 1).
BETA_ROLES = {"v", "out", "fc1", "fc2"}
INIT_CASES = [("decoder", "deepnorm", ["norm.constants=torchscale"], "torchscale"),
              ("encdec", "deepnorm", ["norm.constants=torchscale"], "torchscale"),
              ("decoder", "deepnorm", [], "paper"),
              ("encdec", "deepnorm", [], "paper"),
              ("decoder", "subln", [], "paper"),
              ("encdec", "subln", [], "paper"),
              ("decoder", "pre", ["norm.init=xavier"], "paper"),
              ("encdec", "pre", ["norm.init=xavier"], "paper")]


def expected_std_ratio(model_kind: str, norm: str, stack: str, role: str, rule: str) -> float:
    if rule == "torchscale":
        return 1.0
    fan_in, fan_out = _fans(role)
    ratio = xavier_std(fan_in, fan_out) / kaiming_uniform_std(fan_in)
    if (model_kind, norm, stack) == ("encdec", "deepnorm", "encoder") and role in BETA_ROLES:
        ratio *= 0.87 / 1.15
    return ratio


@pytest.mark.parametrize("model_kind, norm, overrides, rule", INIT_CASES)
def test_init_std_per_role_against_torchscale(model_kind, norm, overrides, rule, record_deviation):
    """Drawn at depth 12 (24 or 36 matrices a role): the std of one role's weights over the stack."""
    depth = 12
    cfg = deepnorm_exp.compose([f"model={model_kind}", f"norm={norm}", f"depth={depth}", *WIDE, *overrides])
    torch.manual_seed(0)
    ours = deepnorm_exp.build_model(cfg)
    torch.manual_seed(1)
    theirs = build_torchscale(model_kind, norm, depth, ours, cfg.data.vocab_size)
    our_std, their_std = role_stds(ours, ours=True), role_stds(theirs, ours=False)
    assert our_std.keys() == their_std.keys()
    ratios = {key: std / their_std[key] for key, std in our_std.items()}
    expected = {(stack, role): expected_std_ratio(model_kind, norm, stack, role, rule) for stack, role in ratios}
    record_deviation("init std ratio / expected - 1", torch.tensor([ratios[k] / expected[k] for k in ratios]), 1.0, 1.0)
    for key, ratio in ratios.items():
        assert ratio == pytest.approx(expected[key], rel=0.03), key
