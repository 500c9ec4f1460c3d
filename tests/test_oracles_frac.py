"""Frac-Connections (norm=frac_connections) against its authors' pseudocode, transcribed: Generalized
Hyper-Connections, "Virtual Width Networks" (ByteDance Seed, arXiv 2511.11238), appendix B: algorithm 2
(`GHyperConnection`: `_base_width_connection`, `width_connection`, `depth_connection`) and algorithm 3 (a
transformer block with it), at n_in = m, where GHC is Frac-Connections (the FC paper's own text could not be
read here). The pseudocode is a formula around sublayers: the project's attention, FFN, their norms and each
connection's fraction RMSNorm stand in for theirs; their parameters (static_alpha | static_beta, the dynamic
maps and scales) are read from ours, split by the pseudocode's shapes. Final hidden states and every gradient
in fp64 and fp32, with every parameter moved off its init; negative controls: a dynamic scale 1% off, the
factor 1 / sqrt(d / m) left out, and the carried fractions taken unmixed (the analogue of the
hyper-connections implementation that never applied H_res)."""

import copy
import math

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.schemes.frac_connections import FracConnection
from deepnorm_exp.schemes.pre import PreNormResidual
from test_oracles_zoo import TOLERANCES, WIDE, _agree, _hidden_and_grads, _tokens


def ghc_width_connection(h, m, static_scale, dynamic_fn, dynamic_scale, layer_norm, factor, mixed_carry=True):
    """`_base_width_connection`: each of the N slots (here the m fractions) normalised, mapped by the dynamic
    functions, tanh, scaled and added to the static matrix; alpha's first M columns make the branch input,
    its other N the carried slots; beta the write weights."""
    shape = h.shape
    n, nmm = static_scale.shape
    big_m = (nmm - n) // 2
    h_reshape = h.reshape((shape[:-1].numel(), n, shape[-1] // n))
    norm_h = layer_norm(h_reshape)
    alpha_beta = torch.tanh(norm_h @ dynamic_fn.T * factor) * dynamic_scale[None, ...] + static_scale[None, ...]
    alpha, beta = torch.split(alpha_beta, (big_m + n, big_m), dim=-1)
    mix_h = (h_reshape.transpose(1, 2) @ alpha).transpose(1, 2)
    if not mixed_carry:  # control: the slots carried as they were
        mix_h = torch.cat([mix_h[:, :big_m], h_reshape], dim=1)
    return mix_h.reshape(shape[:-1] + mix_h.shape[1:]), beta


def ghc_depth_connection(mix_h, h_o, beta, m):
    """`depth_connection`: slot i gets sum_k beta[i, k] of the branch output's fraction k, plus its carried part."""
    shape = h_o.shape
    h_o = h_o.reshape(shape[:-1] + (m, shape[-1] // m))
    h_i = beta.view(h_o.shape[:2] + beta.shape[1:]) @ h_o
    h = h_i + mix_h[..., m:, :]
    return h.reshape(h.shape[:-2] + (h.shape[-2] * h.shape[-1],))


def ghc_parameters(connection, m):
    """`GHyperConnection.__init__`'s parameters at its printed shapes (n_in = m, dim = d), their values read
    from ours: static_alpha m x 2m, static_beta m x m, dynamic_alpha_fn d/m x 2m, dynamic_beta_fn d/m x m,
    each dynamic scale shaped as its static matrix."""
    width = connection.sublayer.d_model // m
    shapes = {"static_alpha": (m, 2 * m), "static_beta": (m, m), "dynamic_alpha_fn": (width, 2 * m),
              "dynamic_beta_fn": (width, m), "dynamic_alpha_scale": (m, 2 * m), "dynamic_beta_scale": (m, m)}
    theirs = {"static_alpha": connection.static[:, :2 * m], "static_beta": connection.static[:, 2 * m:],
              "dynamic_alpha_fn": connection.dynamic_map[:, :2 * m], "dynamic_beta_fn": connection.dynamic_map[:, 2 * m:],
              "dynamic_alpha_scale": connection.dynamic_scale[:, :2 * m],
              "dynamic_beta_scale": connection.dynamic_scale[:, 2 * m:]}
    assert {name: tuple(value.shape) for name, value in theirs.items()} == shapes
    return theirs


def ghc_sublayer(h, connection, m, scale=1.0, factor=None, mixed_carry=True):
    """Algorithm 3's attention (or FFN) block: width connection, the first m rows as the branch input through
    the block's norm and sublayer, then the depth connection. The pseudocode's parameters from ours:
    static_alpha | static_beta side by side as `static`, dynamic_alpha_fn.T and dynamic_beta_fn.T stacked as
    `dynamic_map`.T, the two dynamic scales side by side as `dynamic_scale`."""
    factor = 1.0 / math.sqrt(h.shape[-1] // m) if factor is None else factor
    theirs = ghc_parameters(connection, m)
    static_scale = torch.cat([theirs["static_alpha"], theirs["static_beta"]], dim=-1)
    dynamic_fn = torch.cat([theirs["dynamic_alpha_fn"].T, theirs["dynamic_beta_fn"].T], dim=0)
    dynamic_scale = torch.cat([theirs["dynamic_alpha_scale"], theirs["dynamic_beta_scale"]], dim=-1)
    mix_h, beta = ghc_width_connection(h, m, static_scale, dynamic_fn, dynamic_scale * scale,
                                       connection.fraction_norm, factor, mixed_carry)
    branch = mix_h[..., :m, :].reshape(mix_h.shape[:-2] + (m * mix_h.shape[-1],))
    out = connection.sublayer(connection.norm(branch))
    return ghc_depth_connection(mix_h, out, beta, m)


def ghc_stack(embedding, blocks, final_norm, m, **control):
    h = embedding
    for block in blocks:
        h = ghc_sublayer(h, block.attn, m, **control)
        h = ghc_sublayer(h, block.ffn, m, **control)
    return final_norm(h)


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("fractions, depth", [(2, 3), (4, 4)])
def test_frac_connections_equal_the_ghc_pseudocode(fractions, depth, dtype, tol, record_deviation):
    cfg = deepnorm_exp.compose(["norm=frac_connections", f"norm.fractions={fractions}", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # static weights off I, dynamic maps off 0, scales and gains off 1
        for name, p in model.named_parameters():
            if p.dim() == 1 or any(key in name for key in ("static", "dynamic")):
                p.add_(0.3 * torch.randn(p.shape, dtype=dtype, generator=generator))
    official = copy.deepcopy(model)
    tokens = _tokens(cfg)
    ours = _hidden_and_grads(lambda: model.hidden(tokens), dict(model.named_parameters()))
    theirs = _hidden_and_grads(lambda: ghc_stack(official.embed(tokens), official.blocks, official.final_norm,
                                                 fractions), dict(official.named_parameters()))
    _agree(record_deviation, ours, theirs, tol)

    with torch.no_grad():
        embedded = official.embed(tokens)
        for control in (dict(scale=1.01), dict(factor=1.0), dict(mixed_carry=False)):
            shown = ghc_stack(embedded, official.blocks, official.final_norm, fractions, **control)
            assert not torch.allclose(ours[0], shown, rtol=tol, atol=tol), control


@pytest.mark.parametrize("dynamic", [True, False])
def test_at_init_a_frac_connection_is_the_pre_ln_block(dynamic):
    """VWN's init at n = m (A = R = B = I, W = 0, S = 1): each connection is x + G(LN(x)) on the same sublayer
    and norm, in the decoder and in the encoder-decoder's three sublayers (cross-attention reads the memory)."""
    for model_args in (["depth=3"], ["model=encdec", "depth=2"]):
        cfg = deepnorm_exp.compose(["norm=frac_connections", f"norm.dynamic={dynamic}", *model_args, *WIDE])
        torch.manual_seed(0)
        model = deepnorm_exp.build_model(cfg).double().eval()
        x, memory = torch.randn(2, 5, 64, dtype=torch.float64), torch.randn(2, 7, 64, dtype=torch.float64)
        connections = [c for c in model.modules() if isinstance(c, FracConnection)]
        assert len(connections) == (6 if model_args == ["depth=3"] else 4 + 6)
        for connection in connections:
            plain = PreNormResidual(connection.sublayer, connection.norm)
            args = (memory, None) if connection.sublayer.kind == "cross_attention" else ()
            torch.testing.assert_close(connection(x, *args), plain(x, *args), rtol=1e-13, atol=1e-13)


def test_the_fractions_mixing_is_what_the_instrument_reads():
    """`stream_mixing` is R^T, row t the weights that make fraction t's carried part: applied to the fractions
    it gives the connection's output less what the sublayer wrote."""
    cfg = deepnorm_exp.compose(["norm=frac_connections", "depth=1", *WIDE])
    torch.manual_seed(0)
    connection = deepnorm_exp.build_model(cfg).double().eval().blocks[0].attn
    with torch.no_grad():
        connection.static.add_(0.3 * torch.randn_like(connection.static))
        connection.dynamic_map.normal_(0, 1.0)
        connection.sublayer.out.weight.zero_()  # the sublayer writes its bias only: zero
        connection.sublayer.out.bias.zero_()
    x = torch.randn(3, 64, dtype=torch.float64)
    fractions = x.unflatten(-1, (4, 16))
    mixing = connection.stream_mixing(fractions)
    assert mixing.shape == (3, 4, 4)
    torch.testing.assert_close(connection(x.unsqueeze(0)).squeeze(0), (mixing @ fractions).flatten(-2))


def test_fractions_must_divide_d_model():
    cfg = deepnorm_exp.compose(["norm=frac_connections", "norm.fractions=3", "depth=1", *WIDE])
    with pytest.raises(deepnorm_exp.errors.ConfigError, match="norm.fractions=3 is invalid: must divide model.d_model=64"):
        deepnorm_exp.build_model(cfg)
