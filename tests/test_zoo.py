"""The normalization zoo: each scheme's rule checked on a built model (combine, norm placement, init)."""

import importlib
import json
import math

import pytest
import torch
from torch import nn

import deepnorm_exp
from deepnorm_exp.build import make_scheme
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.schemes import SCHEMES
from deepnorm_exp.schemes.base import xavier_std

from conftest import TINY, run_cli

PAPER = ("post", "pre", "deepnorm")  # the paper's own schemes; every other registered one is the zoo
ZOO = [name for name in SCHEMES.names() if name not in PAPER]
NORMS = (nn.LayerNorm, nn.RMSNorm)
WIDE = ["model.d_model=64", "model.n_heads=4", "model.d_ff=256"]


def build(norm, depth=4, *overrides, model="decoder"):
    cfg = deepnorm_exp.compose([f"norm={norm}", f"depth={depth}", f"model={model}", *overrides])
    torch.manual_seed(0)
    return deepnorm_exp.build_model(cfg), make_scheme(cfg)


def norms_in(module) -> list:
    return [m for m in module.modules() if isinstance(m, NORMS)]


def x_like(d=64):
    torch.manual_seed(1)
    return torch.randn(2, 5, d)


def role_std(block, role) -> float:
    for r, weight, _ in block.sublayer.projections():
        if r == role:
            return float(weight.detach().std())
    raise KeyError(role)


def test_every_scheme_has_a_row_in_the_zoo_table_and_a_place_in_the_zoo_sweep_and_the_board():
    page = (deepnorm_exp.config.CONF_DIR.parent / "docs" / "schemes.md").read_text()
    for preset in ("zoo_depth_sweep", "protocols/board_schemes"):
        sweep = (deepnorm_exp.config.CONF_DIR / "experiment" / f"{preset}.yaml").read_text()
        swept = next(line for line in sweep.splitlines() if line.strip().startswith("norm:")).split(":")[1].split()[0]
        assert set(swept.split(",")) == set(SCHEMES.names()), preset
    for name in SCHEMES.names():
        assert f"| `{name}` |" in page, name


def test_every_scheme_has_a_module_docstring_naming_its_source_and_a_yaml():
    for name in ZOO:
        doc = importlib.import_module(SCHEMES.get(name).__module__).__doc__
        assert doc and "20" in doc.split("\n")[0] + doc.split("\n")[1], name  # author, year on the first lines
        assert (deepnorm_exp.config.CONF_DIR / "norm" / f"{name}.yaml").is_file()


# -- no LayerNorm, learned scalars ------------------------------------------------------------------
def test_rezero_has_no_norm_and_every_block_starts_as_the_identity():
    model, _ = build("rezero", 3, *WIDE)
    assert norms_in(model) == []
    scales = [block.scale for block in model.modules() if hasattr(block, "scale") and hasattr(block, "sublayer")]
    assert len(scales) == 6 and all(isinstance(s, nn.Parameter) and s.item() == 0.0 for s in scales)
    tokens = torch.randint(0, 256, (2, 7))
    assert torch.equal(model.hidden(tokens), model.embed(tokens))  # identity blocks, no final norm


def test_skipinit_keeps_pre_ln_and_learns_a_branch_scalar_from_its_init():
    model, _ = build("skipinit", 3, *WIDE, "norm.branch_init=0.1")
    block = model.blocks[1].ffn
    assert isinstance(block.scale, nn.Parameter) and block.scale.item() == pytest.approx(0.1)
    assert isinstance(block.norm, nn.LayerNorm) and isinstance(model.final_norm, nn.LayerNorm)
    x = x_like()
    assert torch.allclose(block(x), x + 0.1 * block.sublayer(block.norm(x)))


# -- where the norms sit ------------------------------------------------------------------------------
def test_periln_normalizes_the_input_and_the_output_of_each_sublayer():
    model, _ = build("periln", 2, *WIDE)
    block = model.blocks[0].ffn
    x = x_like()
    expected = x + block.out_norm(block.sublayer(block.norm(x)))
    assert torch.allclose(block(x), expected) and block.norm is not block.out_norm
    assert len(norms_in(model)) == 2 * 4 + 1  # two per sublayer, one final


def test_lnscale_scales_layer_ls_norm_output_by_one_over_sqrt_l():
    model, _ = build("lnscale", 5, *WIDE)
    for layer, block in enumerate(model.blocks):
        assert block.attn.norm.scale == pytest.approx(1 / math.sqrt(layer + 1))
    block = model.blocks[3].attn
    x = x_like()
    assert torch.allclose(block(x), x + block.sublayer(block.norm.norm(x) / 2.0), atol=1e-6)


@pytest.mark.parametrize("overrides, post", [([], 2), (["norm.post_layers=8"], 8), (["norm.post_layers=0"], 0),
                                             (["norm.post_fraction=0.5"], 4)])
def test_mixln_is_post_ln_below_and_pre_ln_above(overrides, post):
    model, _ = build("mixln", 8, *overrides)
    kinds = [type(block.attn).__name__ for block in model.blocks]
    assert kinds == ["PostNormResidual"] * post + ["PreNormResidual"] * (8 - post)
    assert isinstance(model.final_norm, nn.LayerNorm)  # even when every layer is Post-LN, as the official code


def keel_stack(x, blocks, alpha: float, eps: float, names=("attn", "ffn"), args=None) -> torch.Tensor:
    """Keel's eq. 8 written out (arXiv 2601.19895 v2): x <- RMS_1(a x + G(RMS_2(x))) per sublayer, a = alpha but
    1 in the first block, whose attention is x + G(RMS(x)); RMS(x) = x / sqrt(mean(x^2) + eps) * gain.
    `names`: the block's sublayers in order; `args`: what each sublayer takes besides x (masks, memory)."""
    def rms(x, norm):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight
    args = args or {}
    for layer, block in enumerate(blocks):
        for name in names:
            residual, extra = getattr(block, name), args.get(name, ())
            if layer == 0 and name == "attn":
                x = x + residual.sublayer(rms(x, residual.norm), *extra)
            else:
                branch = residual.sublayer(rms(x, residual.branch_norm), *extra)
                x = rms((1.0 if layer == 0 else alpha) * x + branch, residual.norm)
    return x


def gains_off_one(model):
    with torch.no_grad():  # so that a norm read in the wrong place shows
        for norm in norms_in(model):
            norm.weight.uniform_(0.5, 1.5)


@pytest.mark.parametrize("overrides, alpha", [([], 2 * 5), (["norm.alpha=3.5"], 3.5)])
def test_keel_is_eq_8_with_alpha_the_number_of_sublayers_and_a_pre_ln_first_attention(overrides, alpha):
    model, scheme = build("keel", 5, *WIDE, *overrides)
    gains_off_one(model)
    tokens = torch.randint(0, 256, (2, 7))
    assert torch.allclose(model.hidden(tokens), keel_stack(model.embed(tokens), model.blocks, alpha, 1e-5), atol=1e-5)
    assert isinstance(model.final_norm, nn.Identity) and all(type(n) is nn.RMSNorm for n in norms_in(model))
    assert len(norms_in(model)) == 2 * 2 * 5 - 1  # two a sublayer, one in the first attention
    assert scheme.constants()["residual_multiplier"] == {"decoder": alpha}
    off = keel_stack(model.embed(tokens), model.blocks, alpha * 1.01, 1e-5)  # a negative control: alpha 1% off shows
    assert not torch.allclose(model.hidden(tokens), off, atol=1e-5)


def test_keel_norms_have_no_bias_and_its_paper_init_draws_n_0_002():
    layernorm, _ = build("keel", 3, *WIDE, "norm.layer=layernorm")
    assert norms_in(layernorm) and all(n.bias is None and n.weight is not None for n in norms_in(layernorm))
    paper, _ = build("keel", 3, *WIDE, "norm.init=paper")
    xavier, _ = build("keel", 3, *WIDE)
    assert role_std(paper.blocks[1].ffn, "fc2") == pytest.approx(0.02, rel=0.05)
    assert role_std(xavier.blocks[1].ffn, "fc2") == pytest.approx(xavier_std(256, 64), rel=0.05)


def test_keel_in_an_encoder_decoder_counts_each_stacks_sublayers_and_treats_the_first_cross_attention_as_the_ffn():
    encdec, scheme = build("keel", 3, *WIDE, "model.decoder_depth=4", model="encdec")
    assert scheme.constants()["residual_multiplier"] == {"encoder": 6.0, "decoder": 12.0}
    first, second = encdec.decoder[0], encdec.decoder[1]
    assert type(first.attn).__name__ == "PreNormResidual"
    assert first.cross.alpha == 1.0 and first.ffn.alpha == 1.0 and second.cross.alpha == 12.0
    assert encdec.encoder[1].attn.alpha == 6.0 and type(encdec.encoder[0].attn).__name__ == "PreNormResidual"
    gains_off_one(encdec)
    src, tgt = torch.randint(4, 256, (2, 6)), torch.randint(4, 256, (2, 5))
    memory, mask = encdec.encode(src)
    assert torch.allclose(memory, keel_stack(encdec.embed(src), encdec.encoder, 6.0, 1e-5, args={"attn": (mask,)}),
                          atol=1e-5)
    expected = keel_stack(encdec.embed(tgt), encdec.decoder, 12.0, 1e-5, ("attn", "cross", "ffn"),
                          {"cross": (memory, mask)})
    assert torch.allclose(encdec.decoder_hidden(tgt, memory, mask), expected, atol=1e-5)


def test_subln_puts_a_norm_inside_each_sublayer_and_scales_the_init_by_gamma():
    depth = 12
    model, scheme = build("subln", depth, *WIDE)
    gamma = math.sqrt(math.log(2 * depth))
    attn, ffn = model.blocks[5].attn, model.blocks[5].ffn
    assert isinstance(attn.sublayer.inner_norm, nn.LayerNorm) and attn.sublayer.inner_norm.normalized_shape == (64,)
    assert isinstance(ffn.sublayer.inner_norm, nn.LayerNorm) and ffn.sublayer.inner_norm.normalized_shape == (256,)
    assert role_std(attn, "v") == pytest.approx(gamma * xavier_std(64, 64), rel=0.05)
    assert role_std(attn, "q") == pytest.approx(xavier_std(64, 64), rel=0.05)
    assert role_std(ffn, "fc1") == pytest.approx(gamma * xavier_std(64, 256), rel=0.05)
    assert scheme.constants()["init_gain"] == {"decoder": pytest.approx(gamma)}
    _, encdec = build("subln", 6, model="encdec")
    assert encdec.init_gain("encoder") == pytest.approx(math.sqrt(math.log(18) * math.log(12) / 3))
    assert encdec.init_gain("decoder") == pytest.approx(math.sqrt(math.log(18)))


def test_subln_leaves_the_cross_attention_as_torchscale_and_magneto_do():
    """torchscale 0.3.0 builds the inner LayerNorm for self-attention only (multihead_attention.py:
    `if subln and self.self_attention`) and its Sub-LN init loop skips `encoder_attn`; Magneto's authors
    use neither for cross-attention (borisdayma/dalle-mini PR #311). Self-attention and FFN keep both."""
    model, scheme = build("subln", 6, *WIDE, model="encdec")
    gamma = scheme.init_gain("decoder")
    block = model.decoder[2]
    assert isinstance(block.cross.sublayer.inner_norm, nn.Identity)
    for role in ("q", "k", "v", "out"):
        assert role_std(block.cross, role) == pytest.approx(xavier_std(64, 64), rel=0.05), role
    assert isinstance(block.attn.sublayer.inner_norm, nn.LayerNorm)
    assert role_std(block.attn, "v") == pytest.approx(gamma * xavier_std(64, 64), rel=0.05)
    assert role_std(block.ffn, "fc2") == pytest.approx(gamma * xavier_std(256, 64), rel=0.05)


# -- initialisation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["post", "pre"])
def test_dsinit_scales_layer_ls_weights_by_one_over_sqrt_l(base):
    """The paper's rule: Xavier-uniform bounds over sqrt(l), so the std too (tests/test_oracles_zoo.py holds
    both rules to their formulas role by role)."""
    model, _ = build("dsinit", 16, *WIDE, f"norm.base={base}")
    for layer in (0, 3, 15):
        block = model.blocks[layer]
        assert role_std(block.ffn, "fc2") == pytest.approx(xavier_std(256, 64) / math.sqrt(layer + 1), rel=0.05)
        assert role_std(block.attn, "q") == pytest.approx(xavier_std(64, 64) / math.sqrt(layer + 1), rel=0.05)
    assert type(model.blocks[0].attn).__name__ == ("PostNormResidual" if base == "post" else "PreNormResidual")
    assert isinstance(model.final_norm, nn.Identity) == (base == "post")


def test_post_init_divides_layer_ls_xavier_normal_draw_by_n_minus_l_plus_1():
    """DeepNet section 3: W ~ N(0, 1 / (k_l^2 d')), k_l = N - l + 1, l = 1..N: the bottom layer narrowed by N,
    the top one not at all; per stack in an encoder-decoder (the decoder's cross-attention with its layer)."""
    model, _ = build("post_init", 8, *WIDE)
    for layer, k in ((0, 8), (3, 5), (7, 1)):
        block = model.blocks[layer]
        assert role_std(block.ffn, "fc2") == pytest.approx(xavier_std(256, 64) / k, rel=0.05)
        assert role_std(block.attn, "q") == pytest.approx(xavier_std(64, 64) / k, rel=0.05)
    assert type(model.blocks[0].attn).__name__ == "PostNormResidual" and isinstance(model.final_norm, nn.Identity)
    encdec, _ = build("post_init", 3, *WIDE, "model.decoder_depth=6", model="encdec")
    top_of_encoder, bottom_of_decoder = encdec.encoder[2], encdec.decoder[0]
    assert role_std(top_of_encoder.ffn, "fc1") == pytest.approx(xavier_std(64, 256), rel=0.05)
    assert role_std(bottom_of_decoder.cross, "v") == pytest.approx(xavier_std(64, 64) / 6, rel=0.05)


def test_tfixup_has_no_norm_and_scales_weights_and_embeddings_by_depth():
    depth = 12
    model, _ = build("tfixup", depth, *WIDE)
    assert norms_in(model) == []
    scale = (9 * depth) ** -0.25
    block = model.blocks[4]
    assert role_std(block.attn, "v") == pytest.approx(scale * xavier_std(64, 64), rel=0.05)
    assert role_std(block.attn, "k") == pytest.approx(xavier_std(64, 64), rel=0.05)
    assert role_std(block.ffn, "fc1") == pytest.approx(scale * xavier_std(64, 256), rel=0.05)
    assert float(model.embed.token.weight.detach().std()) == pytest.approx(64 ** -0.5 * scale, rel=0.05)
    encdec, _ = build("tfixup", 6, *WIDE, model="encdec")
    enc = (0.67 * 6 ** -0.25)
    layer = encdec.encoder[2]
    assert role_std(layer.attn, "out") == pytest.approx(enc * xavier_std(64, 64), rel=0.05)
    # The official code's effective v: Xavier gain 1 x the factor, in the encoder as in both decoder attentions
    # (its sqrt(2) undoes fairseq's gain 1/sqrt(2) on v).
    assert role_std(layer.attn, "v") == pytest.approx(enc * xavier_std(64, 64), rel=0.05)
    dec = (9 * 6) ** -0.25
    assert role_std(encdec.decoder[2].attn, "v") == pytest.approx(dec * xavier_std(64, 64), rel=0.05)
    assert role_std(encdec.decoder[2].cross, "v") == pytest.approx(dec * xavier_std(64, 64), rel=0.05)
    # only the input embeddings are scaled (section 3): learned positions and an untied head keep N(0, 1/d)
    untied, _ = build("tfixup", depth, *WIDE, "model.positions=learned", "model.tie_embeddings=false")
    assert float(untied.embed.token.weight.detach().std()) == pytest.approx(64 ** -0.5 * scale, rel=0.05)
    for table in (untied.embed.pos, untied.embed.head.weight):
        assert float(table.detach().std()) == pytest.approx(64 ** -0.5, rel=0.05)


# -- CompleteP and depth-muP ---------------------------------------------------------------------------
def test_depth_mup_scales_branches_by_one_over_sqrt_depth_and_its_lr_rule_groups_block_parameters():
    depth = 16
    model, scheme = build("depth_mup", depth, "norm.eps_rule=false", "norm.base_depth=4")
    block = model.blocks[3].ffn
    x = x_like(64)
    assert torch.allclose(block(x), x + block.sublayer(block.norm(x)) / math.sqrt(16 / 4))
    groups = scheme.param_groups(model, lr=1e-3, eps=1e-8)
    assert [g["lr"] for g in groups] == [pytest.approx(1e-3), pytest.approx(1e-3 * math.sqrt(4 / 16))]
    assert [g["eps"] for g in groups] == [1e-8, 1e-8]  # eps_rule off
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    assert {id(p) for p in model.embed.parameters()} <= {id(p) for p in groups[0]["params"]}
    _, plain = build("depth_mup", depth, "norm.lr_rule=false", "norm.eps_rule=false")
    assert plain.param_groups(model, 1e-3, 1e-8) is None
    _, recipe = build("depth_mup", depth)  # both rules on by default, as the official alpha = 1/2 recipe
    assert [g["eps"] for g in recipe.param_groups(model, 1e-3, 1e-8)] == [1e-8, pytest.approx(1e-8 / 4)]
    plain_block = build("depth_mup", depth)[0].blocks[3].ffn
    assert float(plain_block.scale) == pytest.approx(1 / 4)  # base_depth 1: 1/sqrt(L)


@pytest.mark.parametrize("depth_alpha", [0.5, 0.75, 1.0])
def test_completep_branch_lr_and_eps_rules_follow_the_depth_multiplier(depth_alpha):
    """Table 1 of the CompleteP paper, width fixed: branch x m^-alpha, block lr x m^(alpha-1), block eps x
    m^-alpha, m = L / L_base; embeddings and the final LN keep lr and eps."""
    depth, base = 24, 3
    model, scheme = build("completep", depth, f"norm.depth_alpha={depth_alpha}", f"norm.base_depth={base}")
    m = depth / base
    block = model.blocks[5].attn
    x = x_like(64)
    assert torch.allclose(block(x), x + block.sublayer(block.norm(x)) * m ** -depth_alpha, atol=1e-6)
    rest, blocks = scheme.param_groups(model, lr=2e-3, eps=1e-8)
    assert (rest["lr"], rest["eps"]) == (2e-3, 1e-8)
    assert blocks["lr"] == pytest.approx(2e-3 * m ** (depth_alpha - 1))
    assert blocks["eps"] == pytest.approx(1e-8 * m ** -depth_alpha)
    assert {id(p) for p in rest["params"]} == {id(p) for p in [*model.embed.parameters(), *model.final_norm.parameters()]}
    if depth_alpha == 1.0:
        assert blocks["lr"] == 2e-3  # CompleteP's lr does not move with depth


def test_completep_refuses_an_exponent_outside_its_range():
    with pytest.raises(ConfigError, match="depth_alpha"):
        build("completep", 6, "norm.depth_alpha=0.3")


# -- Admin ----------------------------------------------------------------------------------------------
def test_admin_closed_form_omega():
    model, scheme = build("admin", 6, "norm.omega=closed_form")
    n = 12  # two sublayers per layer
    omega = math.sqrt((n + 1) / math.log(n + 1) - 1)
    assert model.blocks[3].ffn.omega.detach() == pytest.approx(torch.full((64,), omega).numpy())
    _, encdec = build("admin", 6, "norm.omega=closed_form", model="encdec")
    assert encdec.residual_multiplier("decoder") == pytest.approx(math.sqrt(19 / math.log(19) - 1))  # 3 per decoder layer


@pytest.mark.parametrize("omega_param", ["vector", "scalar"])
def test_admin_profiling_fills_each_omega_bottom_to_top(omega_param):
    """The recursion itself is held to the official code in tests/test_oracles_zoo.py; here its shape: a trained
    D-dim vector (or a fixed scalar buffer), one value per block, growing from 1, checkpointed."""
    model, scheme = build("admin", 5, *WIDE, f"norm.omega_param={omega_param}")
    blocks = [b for *_, b in model.residual_blocks()]
    scheme.prepare(model, {"tokens": torch.randint(0, 256, (4, 17))})
    omegas = [b.omega.detach() for b in blocks]
    assert all(o.shape == ((64,) if omega_param == "vector" else ()) and (o == o.flatten()[0]).all() for o in omegas)
    values = [float(o.flatten()[0]) for o in omegas]
    assert values[0] == 1.0 and all(b > a for a, b in zip(values, values[1:])) and values[-1] > 1.5
    assert isinstance(blocks[0].omega, nn.Parameter) == (omega_param == "vector")
    assert model.training and "blocks.4.ffn.omega" in model.state_dict()  # checkpointed with the model


# -- sigma-Reparam ------------------------------------------------------------------------------------
def test_sigma_reparam_starts_at_w_and_tracks_the_spectral_norm_by_power_iteration():
    model, scheme = build("sigma_reparam", 2, *WIDE)
    attn = model.blocks[0].attn.sublayer
    reparam = attn.qkv.parametrizations.weight[0]
    original = attn.qkv.parametrizations.weight.original
    assert reparam.gamma.shape == (3,)  # q, k, v: one sigma and gamma each
    assert torch.allclose(attn.qkv.weight, original, atol=1e-5)  # gamma = sigma at init: W_hat = W
    with torch.no_grad():
        original.mul_(torch.linspace(0.5, 2.0, 64 * 3)[:, None])  # change W: sigma is now stale
    true_sigma = torch.linalg.matrix_norm(original.reshape(3, 64, 64), ord=2)
    model.eval()
    for _ in range(3):
        model(torch.randint(0, 256, (1, 4)))
    assert not torch.allclose(reparam.sigma(original.detach().reshape(3, 64, 64)), true_sigma, rtol=1e-3)  # eval: no update
    model.train()
    for _ in range(60):  # one power-iteration step per training step, kept after the optimizer's
        model(torch.randint(0, 256, (1, 4)))
        scheme.after_optimizer_step(model)
    estimate = reparam.sigma(original.detach().reshape(3, 64, 64))
    assert torch.allclose(estimate, true_sigma, rtol=1e-3)
    hat = attn.qkv.weight.detach().reshape(3, 64, 64)
    assert torch.allclose(torch.linalg.matrix_norm(hat, ord=2), reparam.gamma.detach(), rtol=1e-3)
    assert all(isinstance(m.weight, torch.Tensor) for m in attn.modules() if isinstance(m, nn.Linear))
    assert "blocks.0.attn.sublayer.qkv.parametrizations.weight.0.u" in model.state_dict()


# -- RMSNorm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["post", "pre", "deepnorm", "subln", "periln", "mixln", "admin"])
def test_rmsnorm_replaces_every_layernorm(norm):
    model, scheme = build(norm, 4, "norm.layer=rmsnorm")
    assert norms_in(model) and all(isinstance(m, nn.RMSNorm) for m in norms_in(model))
    if norm == "deepnorm":  # the LayerNorm-derived constants, unchanged
        assert scheme.constants() == build("deepnorm", 4)[1].constants()


def test_schemes_without_norms_refuse_a_norm_layer():
    with pytest.raises(deepnorm_exp.errors.ConfigError) as err:
        deepnorm_exp.compose(["norm=rezero", "+norm.layer=rmsnorm"])
    assert err.value.key.startswith("norm")


# -- end to end -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("model", ["decoder", "encdec"])
def test_every_scheme_trains_through_the_cli(tmp_path, model):
    extra = ["data.translation_max_len=12"] if model == "encdec" else []
    proc = run_cli("-m", *TINY, f"model={model}", *extra, f"paths.runs={tmp_path}", "logger=none", "depth=3",
                   "train.steps=12", "norm=" + ",".join(ZOO), timeout=900)
    assert proc.returncode == 0, proc.stderr
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("default/*/summary.json")]
    assert sorted(s["norm"] for s in summaries) == sorted(ZOO)
    assert all(s["status"] == "completed" and math.isfinite(s["final_loss"]) for s in summaries)


@pytest.mark.slow
def test_the_depth_mup_lr_rule_reaches_the_optimizer_and_admin_profiles_before_training(tmp_path):
    from deepnorm_exp.lifecycle.run import run_experiment

    common = [*TINY, f"paths.runs={tmp_path}", "logger=none", "depth=4", "train.keep_checkpoint=true", "train.ckpt_every=3",
              "train.schedule=constant", "train.warmup_steps=0"]
    summary = run_experiment(deepnorm_exp.compose([*common, "norm=depth_mup", "norm.lr_rule=true"]), progress=False)
    state = torch.load(f"{summary['run_dir']}/checkpoint.pt", weights_only=True)
    lrs = [group["lr"] for group in state["optimizer"]["param_groups"]]
    assert lrs == [pytest.approx(1e-3), pytest.approx(1e-3 / 2)]  # blocks: lr * sqrt(1 / 4)
    summary = run_experiment(deepnorm_exp.compose([*common, "norm=admin"]), progress=False)
    model_state = torch.load(f"{summary['run_dir']}/checkpoint.pt", weights_only=True)["model"]
    omegas = [float(v.flatten()[0]) for k, v in model_state.items() if k.endswith(".omega")]
    # profiled, then trained a few steps (a D-dim vector, as the paper's): the first still near 1, growing
    assert len(omegas) == 8 and omegas[0] == pytest.approx(1.0, abs=0.05) and all(b > a for a, b in zip(omegas, omegas[1:]))


def test_dyt_replaces_every_norm_with_a_tanh_of_its_own_alpha0():
    from deepnorm_exp.schemes.dyt import DynamicTanh

    model, _ = build("dyt", 3, *WIDE, "norm.alpha_attn=0.8", "norm.alpha_ffn=0.2", "norm.alpha_final=0.1")
    assert norms_in(model) == []  # no statistic is computed anywhere
    for block in model.blocks:
        assert block.attn.norm.alpha.item() == pytest.approx(0.8) and block.ffn.norm.alpha.item() == pytest.approx(0.2)
    assert isinstance(model.final_norm, DynamicTanh) and model.final_norm.alpha.item() == pytest.approx(0.1)
    block, x = model.blocks[1].ffn, x_like()
    assert torch.allclose(block(x), x + block.sublayer(torch.tanh(0.2 * x)), atol=1e-6)  # weight 1, bias 0 at init
    no_bias, _ = build("dyt", 2, *WIDE, "norm.bias=false")
    assert all(m.bias is None for m in no_bias.modules() if isinstance(m, DynamicTanh))
    encdec, _ = build("dyt", 2, *WIDE, "norm.alpha_attn=0.7", model="encdec")
    assert all(block.cross.norm.alpha.item() == pytest.approx(0.7) for block in encdec.decoder)


def test_derf_replaces_every_norm_with_an_erf_of_its_own_alpha0_and_shift():
    from deepnorm_exp.schemes.derf import DynamicErf

    model, _ = build("derf", 3, *WIDE, "norm.alpha_attn=0.8", "norm.alpha_ffn=0.2", "norm.alpha_final=0.1",
                     "norm.shift=0.3")
    assert norms_in(model) == []  # no statistic is computed anywhere
    erfs = [m for m in model.modules() if isinstance(m, DynamicErf)]
    assert len(erfs) == 2 * 3 + 1 and all(m.shift.item() == pytest.approx(0.3) for m in erfs)
    for block in model.blocks:
        assert block.attn.norm.alpha.item() == pytest.approx(0.8) and block.ffn.norm.alpha.item() == pytest.approx(0.2)
    assert isinstance(model.final_norm, DynamicErf) and model.final_norm.alpha.item() == pytest.approx(0.1)
    block, x = model.blocks[1].ffn, x_like()
    assert torch.allclose(block(x), x + block.sublayer(torch.erf(0.2 * x + 0.3)), atol=1e-6)  # weight 1, bias 0
    no_bias, _ = build("derf", 2, *WIDE, "norm.bias=false")
    assert all(m.bias is None for m in no_bias.modules() if isinstance(m, DynamicErf))
    encdec, _ = build("derf", 2, *WIDE, "norm.alpha_attn=0.7", model="encdec")
    assert all(block.cross.norm.alpha.item() == pytest.approx(0.7) for block in encdec.decoder)


def test_olmo2_normalizes_only_the_output_of_each_sublayer():
    model, _ = build("olmo2", 2, *WIDE)
    block, x = model.blocks[1].attn, x_like()
    assert not hasattr(block, "norm")  # nothing on the sublayer's input
    assert torch.allclose(block(x), x + block.out_norm(block.sublayer(x)))
    assert len(norms_in(model)) == 2 * 2 + 1  # one per sublayer, one final
    periln, _ = build("periln", 2, *WIDE)
    assert not torch.allclose(periln.blocks[1].attn(x), x + periln.blocks[1].attn.out_norm(periln.blocks[1].attn.sublayer(x)))


def test_hybridnorm_normalises_qkv_and_carries_the_normalised_stream_through_the_ffn():
    model, _ = build("hybridnorm", 3, *WIDE)
    attn, ffn, x = model.blocks[1].attn, model.blocks[1].ffn, x_like()
    sub = attn.sublayer
    assert all(isinstance(getattr(sub, n), nn.LayerNorm) and getattr(sub, n).normalized_shape == (16,)
               for n in ("q_norm", "k_norm", "v_norm"))  # per head: 64 / 4 heads
    assert not hasattr(attn, "norm") and torch.allclose(attn(x), x + sub(x))
    h = ffn.norm(x)
    assert torch.allclose(ffn(x), h + ffn.sublayer(h))  # the residual carries N(x), not x
    # v's norm is in the computation: scaling v's weights changes nothing but the v norm's input
    out = sub(x)
    with torch.no_grad():
        sub.qkv.weight[128:].mul_(3.0), sub.qkv.bias[128:].mul_(3.0)
    assert torch.allclose(sub(x), out, atol=1e-5)
    star, _ = build("hybridnorm", 3, *WIDE, "norm.pre_first=true")
    assert [type(b.attn).__name__ for b in star.blocks] == ["PreNormResidual", "PlainResidual", "PlainResidual"]
    assert isinstance(star.blocks[0].attn.sublayer.v_norm, nn.LayerNorm)  # HybridNorm* keeps them in block 0
    assert type(star.blocks[0].ffn).__name__ == "PreNormResidual"


def test_hybridnorm_keeps_the_qk_norm_mitigations_kind_on_q_and_k():
    model, _ = build("hybridnorm", 2, *WIDE, "model.qk_norm=rmsnorm")
    sub = model.blocks[0].attn.sublayer
    assert isinstance(sub.q_norm, nn.RMSNorm) and isinstance(sub.k_norm, nn.RMSNorm)
    assert isinstance(sub.v_norm, nn.LayerNorm)  # norm.layer's


# -- DeepScaleLM -----------------------------------------------------------------------------------------
def test_deepscalelm_constants_keep_the_streams_moment_and_follow_k_over_n():
    _, scheme = build("deepscalelm", 48)
    lam, beta = scheme.residual_multiplier("decoder"), scheme.branch_multiplier("decoder")
    assert beta**2 == pytest.approx(2 / 96)  # k = 2 over 2 residual adds per layer
    assert lam**2 + beta**2 == pytest.approx(1.0)
    _, encdec = build("deepscalelm", 6, "norm.k=1.5", model="encdec")
    assert encdec.branch_multiplier("encoder") ** 2 == pytest.approx(1.5 / 12)
    assert encdec.branch_multiplier("decoder") ** 2 == pytest.approx(1.5 / 18)  # 3 adds per decoder layer (cross-attention)


def test_deepscalelm_blocks_in_both_placements():
    model, scheme = build("deepscalelm", 8, *WIDE)
    lam, beta = scheme.residual_multiplier("decoder"), scheme.branch_multiplier("decoder")
    block, x = model.blocks[2].attn, x_like()
    assert torch.allclose(block(x), lam * x + beta * block.sublayer(block.norm(x)), atol=1e-6)
    post, scheme = build("deepscalelm", 8, *WIDE, "norm.base=post")
    block = post.blocks[2].ffn
    assert torch.allclose(block(x), block.norm(lam * x + beta * block.sublayer(x)), atol=1e-6)
    assert isinstance(post.final_norm, nn.Identity) and isinstance(model.final_norm, nn.LayerNorm)


def test_deepscalelm_init_is_the_moment_preserving_formula():
    from deepnorm_exp.schemes.deepscalelm import ACTIVATION_SECOND_MOMENT

    z = torch.linspace(-12, 12, 400_001, dtype=torch.float64)
    gaussian = torch.exp(-z ** 2 / 2) / math.sqrt(2 * math.pi)
    for name, act in (("gelu", nn.functional.gelu), ("swiglu", nn.functional.silu)):
        assert ACTIVATION_SECOND_MOMENT[name] == pytest.approx(float(torch.trapezoid(act(z) ** 2 * gaussian, z)), abs=1e-4)
    GELU_SECOND_MOMENT = ACTIVATION_SECOND_MOMENT["gelu"]
    d, d_ff = 64, 256
    model, _ = build("deepscalelm", 24, *WIDE, "norm.token_correlation=0.25")
    block = model.blocks[7]
    assert role_std(block.attn, "q") == pytest.approx(d ** -0.5, rel=0.05)
    assert role_std(block.attn, "v") == pytest.approx((math.sqrt(1 / 0.25) / d) ** 0.5, rel=0.05)
    assert role_std(block.attn, "out") == pytest.approx((2 / d) ** 0.5, rel=0.05)
    assert role_std(block.ffn, "fc1") == pytest.approx(d ** -0.5, rel=0.05)
    assert role_std(block.ffn, "fc2") == pytest.approx((1 / (GELU_SECOND_MOMENT * d_ff)) ** 0.5, rel=0.05)
    swiglu, _ = build("deepscalelm", 24, *WIDE, "model.ffn=swiglu", "model.activation_dropout=0.2")
    assert role_std(swiglu.blocks[7].ffn, "fc2") == pytest.approx(
        (0.8 / (ACTIVATION_SECOND_MOMENT["swiglu"] * d_ff)) ** 0.5, rel=0.05)
    assert float(model.embed.token.weight.detach().std()) * 8 == pytest.approx(0.5 ** 0.5, rel=0.05)


def test_deepscalelm_keeps_the_streams_second_moment_near_one_at_depth():
    """The point of the scheme: at init the residual stream's mean square stays about 1 through every block
    (Pre-LN's grows with depth)."""
    moments = {}
    for norm in ("deepscalelm", "pre"):
        model, _ = build(norm, 48, *WIDE, "norm.init=xavier" if norm == "pre" else "norm.k=2")
        x, seen = model.embed(torch.randint(3, 256, (4, 32))), []
        with torch.no_grad():
            for block in model.blocks:
                x = block(x)
                seen.append(float(x.square().mean()))
        moments[norm] = seen
    assert all(0.6 < m < 1.6 for m in moments["deepscalelm"]), moments["deepscalelm"]
    assert moments["pre"][-1] > 3 * moments["pre"][0]


# -- ResiDual --------------------------------------------------------------------------------------------
def test_resi_dual_runs_two_streams_and_joins_them_at_the_output():
    model, _ = build("resi_dual", 3, *WIDE)
    tokens = torch.randint(3, 256, (2, 9))
    with torch.no_grad():
        e = model.embed(tokens)
        a, d = e, e.clone()
        for _, _, _, block in model.residual_blocks():
            h = block.sublayer(a)
            a, d = block.norm(a + h), d + h
        expected = a + model.final_norm.norm(d)
        assert torch.allclose(model.hidden(tokens), expected, atol=1e-5)
        # the Post-LN stream alone is a Post-LN model, carried in the state's first half
        state = model.stream_in(e)
        for block in model.blocks:
            state = block.ffn(block.attn(state))
        assert torch.allclose(state[..., :64], a, atol=1e-5)
    # s changes nothing but through LN_f's eps (LN_f(s d) = LN_f(d) at eps 0): the same weights (seeded)
    small_eps, _ = build("resi_dual", 3, *WIDE, "model.norm_eps=1e-10")
    scaled, _ = build("resi_dual", 3, *WIDE, "model.norm_eps=1e-10", "norm.dual_scale=0.05")
    with torch.no_grad():
        assert torch.allclose(scaled.hidden(tokens), small_eps.hidden(tokens), atol=1e-5)


def test_resi_dual_measures_read_what_the_head_would_see():
    from deepnorm_exp.metrics.blocks import BlockIndex
    from deepnorm_exp.metrics.probe import Probe
    from deepnorm_exp.metrics.representation import RepresentationStats, token_cosine

    model, _ = build("resi_dual", 2, *WIDE)
    tokens = torch.randint(3, 256, (2, 9))
    values = RepresentationStats(BlockIndex.of(model), Probe({"tokens": tokens}, 2, torch.device("cpu")), 1).measure(model)
    with torch.no_grad():  # the last block's Post-LN stream, computed by hand
        state = model.stream_in(model.embed(tokens[:, :-1]))
        for block in model.blocks:
            state = block.ffn(block.attn(state))
    a, d = state[..., :64], state[..., 64:]
    hidden = a + nn.functional.layer_norm(d, (64,))  # what the head would read were the stack to end here
    assert values["token_cosine"][-1] == pytest.approx(token_cosine(hidden), rel=1e-5)
    assert values["token_cosine"][-1] != pytest.approx(token_cosine(a), rel=1e-3)


# -- Hyper-Connections -----------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["hyper_connections", "mhc"])
def test_hyper_connections_carry_n_streams_and_measures_read_their_sum(norm):
    from deepnorm_exp.metrics.blocks import BlockIndex
    from deepnorm_exp.metrics.probe import Probe
    from deepnorm_exp.metrics.representation import RepresentationStats, token_cosine

    model, scheme = build(norm, 2, *WIDE, "norm.streams=3")
    assert scheme.state_width == 3  # the pre-flight's memory estimate counts 3 streams
    tokens = torch.randint(3, 256, (2, 9))
    values = RepresentationStats(BlockIndex.of(model), Probe({"tokens": tokens}, 2, torch.device("cpu")), 1).measure(model)
    with torch.no_grad():
        state = model.stream_in(model.embed(tokens[:, :-1]))
        assert torch.equal(state[..., :64], state[..., 128:])  # the embedding enters as n copies
        for block in model.blocks:
            state = block.ffn(block.attn(state))
    streams = state.unflatten(-1, (3, 64))
    assert values["token_cosine"][-1] == pytest.approx(token_cosine(streams.sum(-2)), rel=1e-5)
    assert torch.allclose(model.final_norm(state), model.final_norm.norm(streams.sum(-2)))
    with pytest.raises(deepnorm_exp.errors.ConfigError) as err:
        build(norm, 2, "norm.streams=0")
    assert err.value.key == "norm.streams"


# -- nGPT ------------------------------------------------------------------------------------------------
def test_ngpt_keeps_every_hidden_state_and_matrix_on_the_sphere_through_training(tmp_path):
    from deepnorm_exp.lifecycle.run import run_experiment

    model, _ = build("ngpt", 3, *WIDE)
    assert norms_in(model) == [] and all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))
    tokens = torch.randint(3, 256, (2, 9))
    with torch.no_grad():
        x = model.stream_in(model.embed(tokens))
        for block in model.blocks:
            x = block.ffn(block.attn(x))
            assert torch.allclose(x.norm(dim=-1), torch.ones(2, 9), atol=1e-5)
        block = model.blocks[1].attn
        block.alpha.param.zero_()  # alpha = 0: the block is the identity on the sphere
        h = model.stream_in(model.embed(tokens))
        assert torch.allclose(block(h), h, atol=1e-6)
    summary = run_experiment(deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "depth=3",
                                                    "norm=ngpt", "train.keep_checkpoint=true", "train.ckpt_every=3",
                                                    "train.lr=1e-2"]),
                             progress=False)
    state = torch.load(f"{summary['run_dir']}/checkpoint.pt", weights_only=True)["model"]
    rows = [k for k in state if k.endswith(("qkv.weight", "fc1.weight", "token.weight", "q.weight", "kv.weight"))]
    columns = [k for k in state if k.endswith(("out.weight", "fc2.weight"))]
    assert rows and columns
    for key in rows:
        assert torch.allclose(state[key].norm(dim=1), torch.ones(state[key].shape[0]), atol=1e-5), key
    for key in columns:
        assert torch.allclose(state[key].norm(dim=0), torch.ones(state[key].shape[1]), atol=1e-5), key
    alphas = [v for k, v in state.items() if k.endswith("alpha.param")]
    assert alphas and not all(torch.equal(a, torch.full_like(a, 16 ** -0.5)) for a in alphas)  # they trained
