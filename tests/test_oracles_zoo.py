"""The older zoo (schemes from before 2024) against their official code, as tests/test_oracles.py holds the
newer ones: each official rule transcribed here with its repository, path and commit named, run on the
project's sublayers with the project's weights copied in, hidden states and every gradient compared in fp64
and fp32, and a deliberately wrong constant on the official side caught (the negative control)."""

import copy

import pytest
import torch
from torch import nn

import deepnorm_exp

WIDE = ["model.d_model=64", "model.n_heads=4", "model.d_ff=256", "model.dropout=0.0"]
TOLERANCES = [(torch.float64, 1e-12), (torch.float32, 2e-5)]


def _tokens(cfg, seed=1):
    return torch.randint(0, cfg.data.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))


def _hidden_and_grads(hidden_of, params):
    """hidden_of() and the gradient of mean(hidden^2) for each of `params` ({name: parameter})."""
    for p in params.values():
        p.grad = None
    hidden = hidden_of()
    hidden.square().mean().backward()
    return hidden.detach(), {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}


def _agree(record_deviation, ours, official, tol):
    """ours, official: (hidden, {name: grad}); records the largest deviations and asserts agreement."""
    (hidden, grads), (off_hidden, off_grads) = ours, official
    assert grads.keys() == off_grads.keys() and grads
    record_deviation("hidden / largest", hidden, off_hidden)
    record_deviation("gradients / largest", torch.stack([(g - off_grads[n]).abs().max() for n, g in grads.items()]),
                     0, max(g.abs().max().item() for g in grads.values()))
    assert torch.allclose(hidden, off_hidden, rtol=tol, atol=tol)
    for name, grad in grads.items():
        assert torch.allclose(grad, off_grads[name], rtol=tol, atol=tol * grad.abs().max().item()), name


# --- Mix-LN: github.com/pixeli99/MixLN, peft_pretraining/modeling_llama.py at ff458269dff837f1900025fb7cc864b404b9c7e6
class OfficialRMSNorm(nn.Module):
    """LlamaRMSNorm (lines 75-92): weight * x / sqrt(mean(x^2) + eps), computed here in the input's dtype (the
    official code computes the mean in fp32, which would bound an fp64 comparison at fp32 rounding)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(weight.detach().clone()), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def official_mixln_stack(h, layers, post_num, final_norm):
    """LlamaDecoderLayer's `post_pre` forward (lines 565-601) over the layers, then LlamaModel's final norm,
    applied whatever post_num is (line 1077). layers: (attention, its norm, MLP, its norm) per layer: a layer
    below post_num adds then normalises each sublayer's output (the norms named post_attention_layernorm and
    post_feedforward_layernorm there), a layer above normalises each sublayer's input (input_layernorm,
    post_attention_layernorm)."""
    for index, (attention, attention_norm, mlp, mlp_norm) in enumerate(layers):
        if index < post_num:
            h = attention_norm(h + attention(h))
            h = mlp_norm(h + mlp(h))
        else:
            h = h + attention(attention_norm(h))
            h = h + mlp(mlp_norm(h))
    return final_norm(h)


def _mixln_pair(depth, post_layers, dtype):
    overrides = ["norm=mixln", "norm.layer=rmsnorm", "model.norm_eps=1e-6", f"depth={depth}", *WIDE]
    if post_layers is not None:
        overrides.append(f"norm.post_layers={post_layers}")
    cfg = deepnorm_exp.compose(overrides)
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    with torch.no_grad():  # gains learned away from 1, so the copy is what is compared
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.normal_(1.0, 0.2)
    official_norm = lambda norm: OfficialRMSNorm(norm.weight, 1e-6)  # noqa: E731
    layers = [(block.attn.sublayer, official_norm(block.attn.norm), block.ffn.sublayer, official_norm(block.ffn.norm))
              for block in model.blocks]
    return cfg, model, layers, official_norm(model.final_norm)


def _official_params(model, layers, final_norm):
    """The sublayers' parameters (shared by both sides) and the official norms' under the project's names."""
    params = {n: p for n, p in model.named_parameters() if ".sublayer." in n}
    for layer, (_, attention_norm, _, mlp_norm) in enumerate(layers):
        params[f"blocks.{layer}.attn.norm.weight"] = attention_norm.weight
        params[f"blocks.{layer}.ffn.norm.weight"] = mlp_norm.weight
    params["final_norm.weight"] = final_norm.weight
    return params


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth, post_layers", [(4, None), (12, None), (4, 4)])
def test_mixln_equals_the_official_post_pre_stack(depth, post_layers, dtype, tol, record_deviation):
    """The default count (a quarter of the stack, rounded down: 1 of 4, 3 of 12) and every layer Post-LN,
    where the official model still ends in its final norm."""
    cfg, model, layers, final_norm = _mixln_pair(depth, post_layers, dtype)
    post_num = post_layers if post_layers is not None else depth // 4
    embedded = lambda tokens: model.stream_in(model.embed(tokens))  # noqa: E731
    tokens = _tokens(cfg)
    ours = _hidden_and_grads(lambda: model.hidden(tokens), dict(model.named_parameters()))
    official = _hidden_and_grads(lambda: official_mixln_stack(embedded(tokens), layers, post_num, final_norm),
                                 _official_params(model, layers, final_norm))
    ours = ours[0], {n: g for n, g in ours[1].items() if n in official[1]}
    _agree(record_deviation, ours, official, tol)

    # negative controls: one Post-LN layer more (fewer when all are), or the final norm's gain 1% off, must show
    with torch.no_grad():
        other = post_num - 1 if post_num == depth else post_num + 1
        assert not torch.allclose(ours[0], official_mixln_stack(embedded(tokens), layers, other, final_norm))
        wrong = copy.deepcopy(final_norm)
        wrong.weight.mul_(1.01)
        assert not torch.allclose(ours[0], official_mixln_stack(embedded(tokens), layers, post_num, wrong),
                                  rtol=tol, atol=tol)


# --- ReZero: github.com/majumderb/rezero, rezero/transformer/rztx.py at ff28a73b9b2cf0df190bc6fe5262a351ccad36c0
def official_rezero_stack(h, layers):
    """RZTXEncoderLayer's forward (lines 66-82) layer after layer, as nn.TransformerEncoder stacks it with
    norm=None: each sublayer's output times the layer's one `resweight`, added to the stream (dropout off).
    layers: (resweight, sublayers) per layer."""
    for resweight, sublayers in layers:
        for sublayer in sublayers:
            h = h + sublayer(h) * resweight
    return h


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth", [2, 12])
def test_rezero_equals_the_official_layers_one_alpha_per_layer(depth, dtype, tol, record_deviation):
    cfg = deepnorm_exp.compose(["norm=rezero", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    with torch.no_grad():  # alphas learned away from 0, so the copy is what is compared
        for block in model.blocks:
            block.attn.scale.uniform_(0.1, 0.6)
    resweights = [nn.Parameter(block.attn.scale.detach().reshape(1).clone()) for block in model.blocks]  # shape [1] there
    layers = [(resweight, (block.attn.sublayer, block.ffn.sublayer)) for resweight, block in zip(resweights, model.blocks)]
    tokens = _tokens(cfg)
    embedded = lambda: model.stream_in(model.embed(tokens))  # noqa: E731
    ours = _hidden_and_grads(lambda: model.hidden(tokens), dict(model.named_parameters()))
    official_params = {n: p for n, p in model.named_parameters() if ".sublayer." in n}
    official_params.update({f"blocks.{layer}.attn.scale": r for layer, r in enumerate(resweights)})
    hidden, grads = _hidden_and_grads(lambda: official_rezero_stack(embedded(), layers), official_params)
    official = hidden, {n: g.reshape(ours[1][n].shape) for n, g in grads.items()}
    ours = ours[0], {n: g for n, g in ours[1].items() if n in official[1]}
    _agree(record_deviation, ours, official, tol)

    # negative control: one layer's resweight 1% off must show
    with torch.no_grad():
        resweights[depth // 2].mul_(1.01)
        assert not torch.allclose(ours[0], official_rezero_stack(embedded(), layers), rtol=tol, atol=tol)


def test_rezero_shares_each_layers_alpha_across_its_sublayers_cross_attention_included():
    model = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=rezero", "depth=3", "model=encdec"]))
    for stack in (model.encoder, model.decoder):
        scales = [{id(block.scale) for block in layer.children() if hasattr(block, "scale")} for layer in stack]
        assert [len(s) for s in scales] == [1] * len(stack)
        assert len(set().union(*scales)) == len(stack)  # and each layer its own
    per_sublayer = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=rezero", "norm.alpha_per=sublayer", "depth=3"]))
    assert len({id(block.attn.scale) for block in per_sublayer.blocks} | {id(b.ffn.scale) for b in per_sublayer.blocks}) == 6
