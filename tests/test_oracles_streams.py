"""The 2025-26 residual-stream designs against their reference code, installed by `make install` with --no-deps
as the project installs torchscale: Hyper-Connections against the `hyper-connections` package (0.4.11; the
paper has no official code; the package follows its appendix J, algorithm 2). One hyper-connection at a
time, the project's sublayer and weights copied into the package's module, outputs and every gradient in fp64
and fp32; negative controls: a 1% error on the package's side, and the bug one implementation shipped, A_r
never applied (lucidrains/hyper-connections issue 8)."""

import copy

import pytest
import torch
from einops import rearrange
from hyper_connections import HyperConnections as PackageHyperConnections
from torch import nn

import deepnorm_exp
from test_oracles_zoo import _agree
from deepnorm_exp.schemes.hyper_connections import DYNAMIC_SCALE, HyperConnection

# RMSNorm over each stream as the package, its eps as small as F.normalize's: the two norms then agree to
# rounding (the package's has no eps)
WIDE = ["model.d_model=64", "model.n_heads=4", "model.d_ff=256", "model.dropout=0.0", "norm.layer=rmsnorm",
        "model.norm_eps=1e-30"]
STREAMS = 4


def connections(model) -> list[HyperConnection]:
    return [m for m in model.modules() if isinstance(m, HyperConnection)]


def every_connection(build, kind):
    """((model, stack), k, connection) for every connection of a decoder's and an encoder-decoder's stacks at
    depth 3 (3 connections a layer), k its place in its stack, bottom to top."""
    for model, per_layer in (("decoder", {"blocks": 2}), ("encdec", {"encoder": 2, "decoder": 3})):
        built = build(f"model={model}", "depth=3")
        for stack, count in per_layer.items():
            found = [m for m in getattr(built, stack).modules() if isinstance(m, kind)]
            assert len(found) == 3 * count
            for k, connection in enumerate(found):
                yield (model, stack), k, connection


def build(*overrides, dtype=torch.float64):
    cfg = deepnorm_exp.compose(["norm=hyper_connections", "depth=2", *WIDE, *overrides])
    torch.manual_seed(0)
    return deepnorm_exp.build_model(cfg).to(dtype)


class Branch(nn.Module):
    """The package calls branch(h): here the Pre-LN branch G(LN(h)) of the project's hyper-connection."""

    def __init__(self, connection: HyperConnection):
        super().__init__()
        self.norm, self.sublayer = connection.norm, connection.sublayer

    def forward(self, h):
        return self.sublayer(self.norm(h))


def package_twin(ours: HyperConnection, index: int) -> PackageHyperConnections:
    """The package's hyper-connection around a copy of our branch, with our weights in its parameters."""
    twin = copy.deepcopy(ours)
    package = PackageHyperConnections(STREAMS, dim=ours.sublayer.d_model, branch=Branch(twin), layer_index=index)
    package = package.to(ours.static_alpha.dtype)
    with torch.no_grad():
        for name in ("static_alpha", "static_beta", "dynamic_alpha_fn", "dynamic_alpha_scale", "dynamic_beta_fn",
                     "dynamic_beta_scale"):
            target = getattr(package, name)
            target.copy_(getattr(ours, name).reshape(target.shape))  # the package's scales are 0-d, ours (1,)
        package.norm.gamma.copy_(ours.stream_norm.weight - 1)  # the package's RMSNorm: x / rms(x) (gamma + 1)
    return package


def drawn_away(connection: HyperConnection, seed: int) -> None:
    """Every weight moved off its init: A_r far from I, the dynamic maps and scales non-zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (connection.static_alpha, connection.static_beta, connection.dynamic_alpha_fn,
                  connection.dynamic_beta_fn, connection.stream_norm.weight):
            p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        connection.dynamic_alpha_scale.fill_(0.7)
        connection.dynamic_beta_scale.fill_(0.4)


def outputs_and_grads(module, state, params: dict) -> tuple[torch.Tensor, dict]:
    state = state.detach().requires_grad_()
    out = module(state)
    out.square().mean().backward()
    grads = {name: p.grad.detach().clone().reshape(-1) if p.dim() < 2 else p.grad.detach().clone()
             for name, p in params.items()}
    return out.detach(), {**grads, "input": state.grad.detach().clone()}


def as_package(state: torch.Tensor) -> torch.Tensor:
    return rearrange(state, "b t (s d) -> (b s) t d", s=STREAMS)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("which", [0, 1, 2])  # k = 0, 1, 2: each reads its own stream at init
def test_a_hyper_connection_equals_the_packages(which, dtype, tol, record_deviation):
    ours = connections(build(dtype=dtype))[which]
    drawn_away(ours, seed=which)
    package = package_twin(ours, which)
    state = torch.randn(2, 5, STREAMS * 64, dtype=dtype, generator=torch.Generator().manual_seed(7))
    names = ("static_alpha", "static_beta", "dynamic_alpha_fn", "dynamic_alpha_scale", "dynamic_beta_fn",
             "dynamic_beta_scale")
    ours_out, ours_grads = outputs_and_grads(ours, state, {
        **{n: getattr(ours, n) for n in names}, "norm_gain": ours.stream_norm.weight,
        **{f"sublayer.{n}": p for n, p in ours.sublayer.named_parameters()}})
    off_out, off_grads = outputs_and_grads(lambda s: rearrange(package(as_package(s)), "(b s) t d -> b t (s d)",
                                                               s=STREAMS), state, {
        **{n: getattr(package, n) for n in names}, "norm_gain": package.norm.gamma,
        **{f"sublayer.{n}": p for n, p in package.branch.sublayer.named_parameters()}})
    _agree(record_deviation, (ours_out, ours_grads), (off_out, off_grads), tol)

    # negative control: s_a 1% off on the package's side shows
    wrong = package_twin(ours, which)
    with torch.no_grad():
        wrong.dynamic_alpha_scale.mul_(1.01)
    assert not torch.allclose(ours_out, rearrange(wrong(as_package(state)), "(b s) t d -> b t (s d)", s=STREAMS),
                              rtol=tol, atol=tol)
    # the bug of lucidrains/hyper-connections issue 8: the streams kept as they were, A_r never applied
    never_mixed = package_twin(ours, which)
    with torch.no_grad():
        never_mixed.static_alpha[:, 1:] = torch.eye(STREAMS, dtype=dtype)
        never_mixed.dynamic_alpha_fn[:, 1:] = 0
    assert not torch.allclose(ours_out, rearrange(never_mixed(as_package(state)), "(b s) t d -> b t (s d)",
                                                  s=STREAMS), rtol=tol, atol=tol)


def test_every_hyper_connection_starts_as_the_packages_with_the_same_layer_index():
    """Layer k of a stack reads stream k mod n (over the stack's sublayers, attention and FFN each one),
    A_r = I, B = 1, dynamic maps 0, scales 0.01: the package's init for layer_index k, in the decoder and in
    both stacks of the encoder-decoder (its decoder's three sublayers a layer)."""
    for where, k, ours in every_connection(build, HyperConnection):
        package = PackageHyperConnections(STREAMS, dim=64, layer_index=k).to(torch.float64)
        assert torch.equal(ours.static_alpha, package.static_alpha), where
        assert torch.equal(ours.static_beta, package.static_beta)
        assert not ours.dynamic_alpha_fn.any() and not ours.dynamic_beta_fn.any()
        for scale in ("dynamic_alpha_scale", "dynamic_beta_scale"):  # 0.01, as fp32 then widened
            assert torch.equal(getattr(ours, scale), getattr(package, scale).reshape(1)), scale
            assert getattr(ours, scale).item() == pytest.approx(DYNAMIC_SCALE)


def test_one_stream_is_pre_ln_and_static_connections_ignore_the_streams_values():
    """n = 1 at init: A_m = A_r = B = 1 and no dynamic part is x + G(LN(x)), Pre-LN with the same weights
    (Xavier, the zoo's); SHC's weights do not depend on the streams."""
    single = build("norm.streams=1", "norm.dynamic=false", "model=decoder", dtype=torch.float64)
    torch.manual_seed(0)
    pre = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=pre", "norm.init=xavier", "depth=2", *WIDE[:-1],
                                                         "model.norm_eps=1e-30"])).to(torch.float64)
    shared = {k.replace("final_norm.norm.", "final_norm."): v for k, v in single.state_dict().items()
              if "static_" not in k}
    assert shared.keys() == pre.state_dict().keys()
    pre.load_state_dict(shared)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    assert torch.allclose(single(tokens), pre(tokens), atol=1e-12)
    static = connections(build("norm.dynamic=false"))[0]
    alpha, beta = static.weights(torch.randn(2, 5, STREAMS, 64, dtype=torch.float64))
    assert alpha is static.static_alpha and beta is static.static_beta
