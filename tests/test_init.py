"""Initialisation statistics of real built models: the rule each scheme's source specifies."""

import math

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.schemes.base import xavier_std


def projections_by_role(model):
    roles = {}
    for _, _, _, block in model.residual_blocks():
        for role, weight, bias in block.sublayer.projections():
            roles.setdefault(role, []).append((weight.detach(), bias.detach()))
    return roles


def pooled_std(pairs):
    return torch.cat([w.flatten() for w, _ in pairs]).std().item()


@pytest.fixture(scope="module")
def deepnorm_model():
    torch.manual_seed(0)
    cfg = deepnorm_exp.compose(["norm=deepnorm", "depth=24", "model.d_model=64", "model.d_ff=256"])
    return deepnorm_exp.build_model(cfg), (8 * 24) ** -0.25


def test_deepnorm_scales_v_out_fc1_fc2_by_beta(deepnorm_model):
    model, beta = deepnorm_model
    d, d_ff = 64, 256
    expected = {"q": xavier_std(d, d), "k": xavier_std(d, d), "v": beta * xavier_std(d, d),
                "out": beta * xavier_std(d, d), "fc1": beta * xavier_std(d, d_ff), "fc2": beta * xavier_std(d_ff, d)}
    roles = projections_by_role(model)
    assert set(roles) == set(expected)
    for role, std in expected.items():
        assert pooled_std(roles[role]) == pytest.approx(std, rel=0.03), role
        assert all(torch.count_nonzero(b) == 0 for _, b in roles[role]), f"{role} bias must start at 0"


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_the_baselines_start_as_fairseq_starts_them(norm):
    """Xavier-uniform (bound gain * sqrt(6 / (fan_in + fan_out))), gain 1/sqrt(2) for q, k, v (fairseq's
    MultiheadAttention.reset_parameters; fairseq 0.8's fused in-projection with gain 1 has the same bound),
    gain 1 for out, fc1, fc2, biases 0."""
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(deepnorm_exp.compose([f"norm={norm}", "depth=12"]))
    roles = projections_by_role(model)
    d, d_ff = 64, 256
    fans = {"q": (d, d), "k": (d, d), "v": (d, d), "out": (d, d), "fc1": (d, d_ff), "fc2": (d_ff, d)}
    for role, (fan_in, fan_out) in fans.items():
        gain = 2 ** -0.5 if role in ("q", "k", "v") else 1.0
        bound = gain * math.sqrt(6 / (fan_in + fan_out))
        weights = torch.cat([w.flatten() for w, _ in roles[role]])
        assert weights.abs().max().item() <= bound and weights.abs().max().item() > 0.99 * bound, role
        assert pooled_std(roles[role]) == pytest.approx(bound / math.sqrt(3), rel=0.03), role  # uniform's std
        assert all(torch.count_nonzero(b) == 0 for _, b in roles[role]), role


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_the_baselines_xavier_init_is_normal_with_gain_one(norm):
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(deepnorm_exp.compose([f"norm={norm}", "norm.init=xavier", "depth=12"]))
    roles = projections_by_role(model)
    assert pooled_std(roles["q"]) == pytest.approx(xavier_std(64, 64), rel=0.03)
    assert pooled_std(roles["v"]) == pytest.approx(xavier_std(64, 64), rel=0.03)
    assert pooled_std(roles["fc2"]) == pytest.approx(xavier_std(256, 64), rel=0.03)
    weights = torch.cat([w.flatten() for w, _ in roles["q"]])
    assert weights.abs().max().item() > math.sqrt(6 / 128)  # a normal draw passes the uniform's bound


def test_schemes_built_on_the_baselines_structure_keep_their_own_init():
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=periln", "depth=12"]))
    assert pooled_std(projections_by_role(model)["q"]) == pytest.approx(xavier_std(64, 64), rel=0.03)
    with pytest.raises(Exception, match="init"):
        deepnorm_exp.compose(["norm=periln", "+norm.init=fairseq"])  # not a key of theirs


def test_hybridnorm_megatron_init_is_the_authors_recipe():
    """N(0, sqrt(2/(5d))) cut at 3 std (a cut normal's std is 0.9866 of its parameter), out and fc2 over
    sqrt(2L); the default stays the zoo's Xavier."""
    depth, d = 12, 64
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=hybridnorm", "norm.init=megatron", f"depth={depth}"]))
    base, cut = math.sqrt(2 / (5 * d)), 0.9866
    for role, pairs in projections_by_role(model).items():
        std = base / math.sqrt(2 * depth) if role in ("out", "fc2") else base
        assert pooled_std(pairs) == pytest.approx(cut * std, rel=0.03), role
        assert max(w.abs().max().item() for w, _ in pairs) <= 3 * std, role
    xavier = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=hybridnorm", f"depth={depth}"]))
    assert pooled_std(projections_by_role(xavier)["fc2"]) == pytest.approx(xavier_std(256, 64), rel=0.03)
    with pytest.raises(ConfigError, match="init"):
        deepnorm_exp.build_model(deepnorm_exp.compose(["norm=hybridnorm", "norm.init=olmo", "depth=2"]))


def test_torchscale_preset_scales_pytorch_default_init():
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=deepnorm", "norm.constants=torchscale", "depth=24"]))
    beta = (8 * 24) ** -0.25
    roles = projections_by_role(model)
    kaiming_uniform_std = 1 / math.sqrt(3 * 64)  # nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert pooled_std(roles["q"]) == pytest.approx(kaiming_uniform_std, rel=0.03)
    assert pooled_std(roles["v"]) == pytest.approx(beta * kaiming_uniform_std, rel=0.03)
    assert pooled_std(roles["fc2"]) == pytest.approx(beta / math.sqrt(3 * 256), rel=0.03)
    bias = torch.cat([b for _, b in roles["v"]])
    assert bias.abs().max().item() <= beta / 8 + 1e-6 and bias.abs().max().item() > 0


def test_fused_qkv_is_initialised_as_three_matrices(deepnorm_model):
    model, beta = deepnorm_model
    qkv = model.blocks[0].attn.sublayer.qkv.weight.detach()
    q, k, v = qkv[:64], qkv[64:128], qkv[128:]
    assert v.std().item() / q.std().item() == pytest.approx(beta, rel=0.1)
    assert k.std().item() == pytest.approx(q.std().item(), rel=0.1)
