"""Schemes against their official code: the official module's forward, transcribed here with its source and
commit named (never the project's code under another name), given the project's weights; outputs and
gradients must agree to rounding in fp64 and fp32 at two depths, and a deliberately wrong constant on the
official side must be caught (the negative control)."""

import copy

import pytest
import torch
from torch import nn

import deepnorm_exp
from deepnorm_exp.schemes.dyt import DynamicTanh

WIDE = ["model.d_model=64", "model.n_heads=4", "model.d_ff=256", "model.dropout=0.0"]


# --- DyT: github.com/jiachenzhu/DyT, dynamic_tanh.py at aab5dde0bc1bdd4410f687dad404c87b31808f90 ---------
class OfficialDynamicTanh(nn.Module):
    """Transcribed from DynamicTanh in dynamic_tanh.py (channels_last=True, the form that replaces
    nn.LayerNorm in a Transformer)."""

    def __init__(self, normalized_shape, channels_last=True, alpha_init_value=0.5):
        super().__init__()
        self.normalized_shape, self.alpha_init_value, self.channels_last = normalized_shape, alpha_init_value, channels_last
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        x = torch.tanh(self.alpha * x)
        if self.channels_last:
            x = x * self.weight + self.bias
        else:
            x = x * self.weight[:, None, None] + self.bias[:, None, None]
        return x


def official_convert_ln_to_dyt(module):
    """Transcribed from convert_ln_to_dyt in dynamic_tanh.py: every nn.LayerNorm, recursively, becomes a
    DynamicTanh of its shape (alpha_0 0.5)."""
    module_output = module
    if isinstance(module, nn.LayerNorm):
        module_output = OfficialDynamicTanh(module.normalized_shape, True)
    for name, child in module.named_children():
        module_output.add_module(name, official_convert_ln_to_dyt(child))
    del module
    return module_output


def _logits_and_grads(model, tokens):
    model.zero_grad()
    logits = model(tokens)
    logits.square().mean().backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("depth", [2, 12])
def test_dyt_equals_the_official_module_on_pre_ln(depth, dtype, tol):
    """The official recipe is Pre-LN with every LayerNorm converted: built here from the project's Pre-LN
    (Xavier init, as the zoo's) and given the DyT model's weights, it must compute what norm=dyt does."""
    cfg = deepnorm_exp.compose(["norm=dyt", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    ours = deepnorm_exp.build_model(cfg).to(dtype)
    official = official_convert_ln_to_dyt(deepnorm_exp.build_model(deepnorm_exp.compose(
        ["norm=pre", "norm.init=xavier", f"depth={depth}", *WIDE]))).to(dtype)
    assert sum(isinstance(m, OfficialDynamicTanh) for m in official.modules()) == 2 * depth + 1
    with torch.no_grad():  # alpha learned away from 0.5, so the copy is what is compared, not the defaults
        for module in ours.modules():
            if isinstance(module, DynamicTanh):
                module.alpha.uniform_(0.3, 1.2)
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
    official.load_state_dict(ours.state_dict())
    ours.eval(), official.eval()  # no dropout on either side
    tokens = torch.randint(0, cfg.data.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    (ours_logits, ours_grads), (off_logits, off_grads) = (_logits_and_grads(m, tokens) for m in (ours, official))
    assert ours_grads.keys() == off_grads.keys()
    assert torch.allclose(ours_logits, off_logits, rtol=tol, atol=tol)
    for name, grad in ours_grads.items():
        assert torch.allclose(grad, off_grads[name], rtol=tol, atol=tol * grad.abs().max().item()), name

    # negative control: one layer's alpha 1% off on the official side must show in the logits
    wrong = copy.deepcopy(official)
    with torch.no_grad():
        next(m for m in wrong.modules() if isinstance(m, OfficialDynamicTanh)).alpha.mul_(1.01)
    assert not torch.allclose(ours_logits, wrong(tokens).detach(), rtol=tol, atol=tol)


def test_dyt_defaults_are_the_official_modules_init():
    official = OfficialDynamicTanh(64)
    ours = DynamicTanh(64, 0.5)
    for name in ("alpha", "weight", "bias"):
        assert torch.equal(getattr(ours, name), getattr(official, name)), name
