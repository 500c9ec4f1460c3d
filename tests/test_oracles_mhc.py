"""mHC (norm=mhc) against the `hyper-connections` package's ManifoldConstrainedHyperConnections (0.4.11, installed
--no-deps by `make install`; DeepSeek's own code is fused kernels). The package departs from the paper's Eq. 7
in one place the project keeps as the paper (its RMSNorm and its dynamic map act on each stream alone, where
the paper's act on the n d-wide vector), so the package is an oracle exactly where the two forms coincide:
phi block-diagonal (stream s's logits read stream s only) and every stream of a position at the same RMS.
There, outputs and every parameter's gradient agree in fp64 and fp32; with the dynamic maps at zero, the
input's gradient too. The package normalises H_res's rows before its columns, the paper (and the project) the
columns first: both are run to convergence (1,000 rounds; at 200 the two orders still differ by 1e-7 with these logits), where Sinkhorn's scaling is unique. Controls: a gate
1% off, and H_res replaced by a matrix that is only row-stochastic (Sinkhorn skipped)."""

import copy
import itertools

import pytest
import torch
from einops import rearrange
from hyper_connections.manifold_constrained_hyper_connections import (
    ManifoldConstrainedHyperConnections as PackageMHC)

import deepnorm_exp
from deepnorm_exp.schemes.mhc import GATE_INIT, ManifoldConstrainedConnection, sinkhorn_knopp
from test_oracles_streams import STREAMS, WIDE, Branch, as_package, every_connection, outputs_and_grads
from test_oracles_zoo import _agree

CONVERGED = 1000  # Sinkhorn rounds at which both orders reach the same doubly stochastic matrix to fp64 rounding
D = 64


def build(*overrides, dtype=torch.float64):
    cfg = deepnorm_exp.compose(["norm=mhc", "depth=2", *WIDE, *overrides])
    torch.manual_seed(0)
    return deepnorm_exp.build_model(cfg).to(dtype)


def connections(model) -> list[ManifoldConstrainedConnection]:
    return [m for m in model.modules() if isinstance(m, ManifoldConstrainedConnection)]


@pytest.fixture
def package_in_input_dtype(monkeypatch):
    """The package computes its mappings in fp32 whatever its input (`.float()`); for the fp64 comparison its
    `.float()` leaves an fp64 tensor as it is, so both sides compute in fp64."""
    as_float = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t: t if t.dtype == torch.float64 else as_float(t))


def drawn_away(ours: ManifoldConstrainedConnection, seed: int, with_phi: bool):
    """Biases (and gates) off their init; phi block-diagonal (the package's form) `with_phi`, else zero (a
    static connection has none). Returns the package's (fn, beta_fn): phi's shared blocks."""
    g = torch.Generator().manual_seed(seed)
    n, dtype = STREAMS, ours.bias.dtype
    fn = 0.3 * torch.randn(D, 1 + n, generator=g, dtype=dtype) if with_phi else torch.zeros(D, 1 + n, dtype=dtype)
    beta_fn = 0.3 * torch.randn(D, generator=g, dtype=dtype) if with_phi else torch.zeros(D, dtype=dtype)
    with torch.no_grad():
        ours.bias.add_(0.5 * torch.randn(ours.bias.shape, generator=g, dtype=dtype))
        if not ours.dynamic:
            return fn, beta_fn
        ours.gates.copy_(torch.tensor([0.7, 0.4, 0.9], dtype=dtype))
        ours.mapping.zero_()
        for s in range(n):
            rows = slice(s * D, (s + 1) * D)
            ours.mapping[rows, s] = fn[:, 0]  # H~_pre[s]
            ours.mapping[rows, n + s] = beta_fn  # H~_post[s]
            for t in range(n):
                ours.mapping[rows, 2 * n + t * n + s] = fn[:, 1 + t]  # H~_res[t, s]
    return fn, beta_fn


def package_twin(ours: ManifoldConstrainedConnection, fn, beta_fn, index: int) -> PackageMHC:
    """The package's connection around a copy of our branch, with our weights in its parameters (its alpha[s, t]
    is our H_res[t, s]); for a static connection its dynamic maps are zero."""
    n, dtype = STREAMS, ours.bias.dtype
    package = PackageMHC(n, dim=D, branch=Branch(copy.deepcopy(ours)), layer_index=index,
                         sinkhorn_iters=CONVERGED).to(dtype)
    pre, post, residual = ours.bias.detach().split([n, n, n * n])
    with torch.no_grad():
        package.static_alpha.copy_(torch.cat([pre.unsqueeze(1), residual.view(n, n).T], dim=1))
        package.static_beta.copy_(post)
        package.dynamic_alpha_fn.copy_(fn.unsqueeze(0))
        package.dynamic_beta_fn.copy_(beta_fn)
        if ours.dynamic:
            package.pre_branch_scale.fill_(ours.gates[0].item())
            package.h_post_scale.fill_(ours.gates[1].item())
            package.residual_scale.fill_(ours.gates[2].item())
    return package


def equal_rms_streams(dtype) -> torch.Tensor:
    """(2, 5, n d) with every stream of a position at the same RMS, where the paper's RMSNorm of the flattened
    streams and the package's of each stream coincide."""
    state = torch.randn(2, 5, STREAMS, D, dtype=dtype, generator=torch.Generator().manual_seed(7))
    scale = torch.rand(2, 5, 1, 1, dtype=dtype, generator=torch.Generator().manual_seed(8)) + 0.5
    return (state / state.square().mean(-1, keepdim=True).sqrt() * scale).flatten(-2)


def ours_and_package(ours: ManifoldConstrainedConnection, package: PackageMHC, state, with_input: bool):
    """Outputs and gradients, named alike on both sides: bias, (gates, phi's blocks as the package's fn,) the
    sublayer's, (the input's)."""
    n, dynamic = STREAMS, ours.dynamic
    ours_params = {"bias": ours.bias, **({"gates": ours.gates, "mapping": ours.mapping} if dynamic else {})}
    ours_out, g = outputs_and_grads(ours, state, {**ours_params,
                                                  **{f"sub.{k}": p for k, p in ours.sublayer.named_parameters()}})
    ours_grads = {"bias": g["bias"]}
    if dynamic:
        blocks = g.pop("mapping").view(n, D, -1)  # the package's fn is one block shared by every stream
        s = torch.arange(n)
        ours_grads.update(gates=g["gates"], fn_pre=blocks[s, :, s].sum(0), beta_fn=blocks[s, :, n + s].sum(0),
                          fn_res=torch.stack([blocks[s, :, 2 * n + t * n + s].sum(0) for t in range(n)], -1))
    ours_grads.update({k: v for k, v in g.items() if k.startswith("sub.") or (with_input and k == "input")})
    off_out, p = outputs_and_grads(
        lambda x: rearrange(package(as_package(x)), "(b s) t d -> b t (s d)", s=n), state,
        {"static_alpha": package.static_alpha, "static_beta": package.static_beta,
         "fn": package.dynamic_alpha_fn, "beta_fn": package.dynamic_beta_fn, "pre_scale": package.pre_branch_scale,
         "post_scale": package.h_post_scale, "res_scale": package.residual_scale,
         **{f"sub.{k}": q for k, q in package.branch.sublayer.named_parameters()}})
    alpha = p.pop("static_alpha").view(n, 1 + n)
    fn = p.pop("fn").view(D, 1 + n)
    off_grads = {"bias": torch.cat([alpha[:, 0], p.pop("static_beta"), alpha[:, 1:].T.flatten()])}
    if dynamic:
        off_grads.update(gates=torch.cat([p.pop("pre_scale"), p.pop("post_scale"), p.pop("res_scale")]),
                         fn_pre=fn[:, 0], beta_fn=p.pop("beta_fn"), fn_res=fn[:, 1:])
    off_grads.update({k: v for k, v in p.items() if k.startswith("sub.") or (with_input and k == "input")})
    return (ours_out, ours_grads), (off_out, off_grads)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("which, form", list(itertools.product([0, 1, 2], ["phi", "phi_zero", "static"])))
def test_an_mhc_connection_equals_the_packages(which, form, dtype, tol, record_deviation, package_in_input_dtype):
    """`phi`: the dynamic maps block-diagonal, every parameter's gradient; `phi_zero`: a dynamic connection with
    phi zero, the input's gradient too (the two RMSNorms' derivatives then meet zero); `static`:
    `norm.dynamic=false`, the bias alone."""
    static = ["norm.dynamic=false"] if form == "static" else []
    ours = connections(build(f"norm.sinkhorn_rounds={CONVERGED}", *static, dtype=dtype))[which]
    assert ours.dynamic == (form != "static")
    fn, beta_fn = drawn_away(ours, seed=which, with_phi=form == "phi")
    state = equal_rms_streams(dtype)
    mine, theirs = ours_and_package(ours, package_twin(ours, fn, beta_fn, which), state, with_input=form != "phi")
    _agree(record_deviation, mine, theirs, tol)

    n = STREAMS
    off_by_one_percent = package_twin(ours, fn, beta_fn, which)
    with torch.no_grad():
        off_by_one_percent.residual_scale.mul_(1.01)
        off_by_one_percent.static_beta.mul_(1.01)
    shown = off_by_one_percent(as_package(state)).unflatten(0, (2, n)).transpose(1, 2).flatten(-2)
    assert not torch.allclose(mine[0], shown, rtol=tol, atol=tol)
    # Sinkhorn skipped: exp(H~_res) made row-stochastic only (a softmax), the constraint the paper adds to HC
    rows_only = package_twin(ours, fn, beta_fn, which)
    rows_only.residual_mix_constraint_fn = lambda logits: logits.softmax(dim=-1)
    shown = rows_only(as_package(state)).unflatten(0, (2, n)).transpose(1, 2).flatten(-2)
    assert not torch.allclose(mine[0], shown, rtol=tol, atol=tol)


def test_every_connection_starts_as_the_packages_with_the_same_layer_index():
    """b_pre = e_(k mod n) for the stack's k-th sublayer (attention, [cross-attention,] FFN), b_post = 1,
    b_res = I, phi = 0, gates 0.01: the package's init for layer_index k, in both models and both stacks.
    At step 0: H_pre 0.731 / 0.5, H_post 1.462, H_res = Sinkhorn(exp(I)) 0.475 on the diagonal (it mixes)."""
    n = STREAMS
    for where, k, ours in every_connection(build, ManifoldConstrainedConnection):
        package = PackageMHC(n, dim=D, layer_index=k).to(torch.float64)
        pre, post, residual = ours.bias.split([n, n, n * n])
        assert torch.equal(pre, package.static_alpha[:, 0]), where
        assert torch.equal(residual.view(n, n).T, package.static_alpha[:, 1:])
        assert torch.equal(post, package.static_beta)
        assert not ours.mapping.any() and not package.dynamic_alpha_fn.any()
        assert ours.gates.tolist() == pytest.approx([GATE_INIT] * 3)
        h_pre, h_post, h_res = ours.mappings(torch.randn(3, n, D, dtype=torch.float64))
        assert h_pre[0, k % n].item() == pytest.approx(0.7311, abs=1e-4)
        assert h_pre[0].sum().item() == pytest.approx(0.7311 + 0.5 * (n - 1), abs=1e-4)
        assert h_post[0].tolist() == pytest.approx([1.4621] * n, abs=1e-4)
        assert h_res[0].diagonal().tolist() == pytest.approx([0.4754] * n, abs=1e-4)


def test_sinkhorn_follows_the_papers_order_and_its_gap_closes_with_rounds():
    """Eq. 9: columns then rows, so after any number of rounds every row sums to 1 to rounding, every entry is
    positive, and the columns' gap closes as rounds grow. With logits of std 2 (a trained H~_res might be so
    spread) the paper's 20 rounds leave a column 0.63% off and the spectral norm 4e-5 above 1, the
    approximation gap mHC-lite (arXiv 2601.05732) reports; at 100 rounds 1e-8 and 1 to rounding. A product
    of 50 matrices stays row-stochastic and its columns stay within 1e-3 at 20 rounds."""
    logits = 2 * torch.randn(50, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ones = torch.ones(50, 4, dtype=torch.float64)
    for rounds in (1, 3, 20):
        matrix = sinkhorn_knopp(logits, rounds)
        assert torch.allclose(matrix.sum(-1), ones, atol=1e-14) and (matrix > 0).all()
    gap = {rounds: (sinkhorn_knopp(logits, rounds).sum(-2) - 1).abs().max().item() for rounds in (20, 100)}
    assert 1e-3 < gap[20] < 1e-2 and gap[100] < 1e-7
    assert torch.linalg.matrix_norm(sinkhorn_knopp(logits, 100), ord=2).max() <= 1 + 1e-12
    product = torch.linalg.multi_dot(list(sinkhorn_knopp(logits, 20)))
    assert torch.allclose(product.sum(-1), ones[0], atol=1e-12)
    assert torch.allclose(product.sum(-2), ones[0], atol=1e-3)
    # and a huge logit does not overflow (the largest is taken off before exp)
    assert torch.isfinite(sinkhorn_knopp(logits + 1e4, 20)).all()


def test_static_mhc_ignores_the_streams_values():
    static = connections(build("norm.dynamic=false"))[0]
    assert not hasattr(static, "mapping")
    a = static.mappings(torch.randn(2, 5, STREAMS, D, dtype=torch.float64))
    b = static.mappings(torch.randn(2, 5, STREAMS, D, dtype=torch.float64))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
