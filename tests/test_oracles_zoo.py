"""The older zoo (schemes from before 2024) against their official code, as tests/test_oracles.py holds the
newer ones: each official rule transcribed here with its repository, path and commit named, run on the
project's sublayers with the project's weights copied in, hidden states and every gradient compared in fp64
and fp32, and a deliberately wrong constant on the official side caught (the negative control)."""

import copy

import pytest
import torch
from torch import nn

import deepnorm_exp
from deepnorm_exp.build import make_scheme

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


# --- sigma-Reparam: github.com/apple/ml-sigma-reparam, vision/layers.py at fea4e359126f812bd3e0a12234c56330fe4b5fa2
def official_spectral_normed_weight(weight, u, gamma, training):
    """SpectralNormedWeight.get_sigma and forward (lines 34-51) times SNLinear's learned scale (lines 140-145)
    for one matrix: one power-iteration step from the stored u, W gamma / (v^T W u'); u' kept in training.
    Returns (W_hat, the u now stored)."""
    with torch.no_grad():
        v = nn.functional.normalize(weight.mv(u), dim=0)
        u_step = nn.functional.normalize(weight.T.mv(v), dim=0)
    sigma = torch.einsum("c,cd,d->", v, weight, u_step)
    return gamma * weight / sigma, (u_step if training else u)


def _sigma_model(qkv, dtype):
    cfg = deepnorm_exp.compose(["norm=sigma_reparam", f"norm.qkv={qkv}", "depth=2", *WIDE])
    torch.manual_seed(0)
    return cfg, deepnorm_exp.build_model(cfg).to(dtype), make_scheme(cfg)


def _parametrized(model):
    """(name, module, its SigmaReparam) for every reparametrized nn.Linear."""
    return [(name, m, m.parametrizations.weight[0]) for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and hasattr(m, "parametrizations")]


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("qkv", ["split", "fused"])
def test_sigma_reparam_equals_the_official_weight_through_training_steps_and_eval(qkv, dtype, tol, record_deviation):
    """Each reparametrized matrix against the official module run alongside it: W moved away from its init so
    the power iteration has work to do, three training steps (forward, backward, Adam step), then an eval
    forward, which takes a step from the stored u without keeping it (where the project reused u before).
    `split` compares each of q, k, v with an official module of its own, `fused` the whole in-projection."""
    cfg, model, scheme = _sigma_model(qkv, dtype)
    with torch.no_grad():
        for _, module, _ in _parametrized(model):
            module.parametrizations.weight.original.add_(0.05 * torch.randn_like(module.parametrizations.weight.original))
    # the official state per matrix: W's rows, gamma, u (copied from the project's at the start)
    state = {(name, g): reparam.u[g].clone() for name, _, reparam in _parametrized(model) for g in range(reparam.groups)}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = _tokens(cfg)
    deviations = []
    for step in range(4):
        training = step < 3
        model.train(training)
        if training:
            optimizer.zero_grad()
            model(tokens).square().mean().backward()  # u' stored in u_next
        else:
            with torch.no_grad():
                model(tokens)
        for name, module, reparam in _parametrized(model):
            original = module.parametrizations.weight.original.detach()
            mats = original.reshape(reparam.groups, -1, original.shape[1])
            with torch.no_grad():
                ours = module.weight.reshape(reparam.groups, -1, original.shape[1])  # a read: no step kept
            for g in range(reparam.groups):
                hat, state[name, g] = official_spectral_normed_weight(mats[g], state[name, g], reparam.gamma[g].detach(),
                                                                      training)
                deviations.append(((ours[g] - hat).abs().max() / hat.abs().max()).item())
                assert torch.allclose(ours[g], hat, rtol=tol, atol=tol * hat.abs().max().item()), (name, g, step)
        if training:
            optimizer.step()
            scheme.after_optimizer_step(model)
            for name, _, reparam in _parametrized(model):
                for g in range(reparam.groups):
                    assert torch.allclose(reparam.u[g], state[name, g], rtol=tol, atol=tol), (name, g)
    record_deviation("W_hat / largest", torch.tensor(max(deviations)), torch.tensor(0.0), 1.0)

    # negative controls, on the last state: two power steps, or the stored u never updated, must show
    name, module, reparam = _parametrized(model)[0]
    original = module.parametrizations.weight.original.detach()
    mat, u, gamma = original.reshape(reparam.groups, -1, original.shape[1])[0], state[name, 0], reparam.gamma[0].detach()
    hat, _ = official_spectral_normed_weight(mat, u, gamma, False)
    two_steps, _ = official_spectral_normed_weight(mat, official_spectral_normed_weight(mat, u, gamma, True)[1], gamma,
                                                   False)
    stale = gamma * mat / torch.linalg.vector_norm(mat.mv(u))  # sigma from the stored u, no step
    for wrong in (two_steps, stale):
        assert not torch.allclose(hat, wrong, rtol=tol, atol=tol * hat.abs().max().item())


def test_sigma_reparam_steps_u_once_per_optimizer_step_under_activation_checkpointing():
    """The recompute runs the forward again: it must compute the same sigma (the same gradients as without
    checkpointing) and keep one power-iteration step, not two."""
    grads, us = [], []
    for checkpointing in (False, True):
        cfg = deepnorm_exp.compose(["norm=sigma_reparam", "depth=3", *WIDE,
                                    f"model.activation_checkpointing={str(checkpointing).lower()}"])
        torch.manual_seed(0)
        model, scheme = deepnorm_exp.build_model(cfg).double().train(), make_scheme(cfg)
        with torch.no_grad():
            for _, module, _ in _parametrized(model):
                module.parametrizations.weight.original.add_(0.05 * torch.randn_like(module.parametrizations.weight.original))
        model.loss({"tokens": _tokens(cfg)}).loss.backward()
        scheme.after_optimizer_step(model)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        us.append(torch.cat([r.u.flatten() for _, _, r in _parametrized(model)]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-14)
    assert torch.allclose(us[0], us[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("qkv", ["split", "fused"])
def test_sigma_reparam_gradients_equal_the_official_weights(qkv, dtype, tol, record_deviation):
    """d/dW and d/dgamma of sum(W_hat * R), R fixed: the gradient flows through W in both sigma and W, never
    through the power iteration's vectors, on both sides."""
    _, model, _ = _sigma_model(qkv, dtype)
    model.train()
    deviations = []
    for name, module, reparam in _parametrized(model):
        original = module.parametrizations.weight.original
        with torch.no_grad():
            original.add_(0.05 * torch.randn_like(original))
        weight_r = torch.randn_like(original)
        original.grad, reparam.gamma.grad = None, None
        (module.weight * weight_r).sum().backward()
        ours = torch.cat([original.grad.flatten(), reparam.gamma.grad])
        w, gamma = original.detach().clone().requires_grad_(), reparam.gamma.detach().clone().requires_grad_()
        mats, rs = w.reshape(reparam.groups, -1, w.shape[1]), weight_r.reshape(reparam.groups, -1, w.shape[1])
        sum(((official_spectral_normed_weight(mats[g], reparam.u[g], gamma[g], True)[0] * rs[g]).sum()
             for g in range(reparam.groups))).backward()
        official = torch.cat([w.grad.flatten(), gamma.grad])
        deviations.append(((ours - official).abs().max() / official.abs().max()).item())
        assert torch.allclose(ours, official, rtol=tol, atol=tol * official.abs().max().item()), name
    record_deviation("gradients / largest", torch.tensor(max(deviations)), torch.tensor(0.0), 1.0)


def test_sigma_reparam_official_init_draws_what_snlinear_draws():
    """norm.init=official: SNLinear's trunc_normal(std 0.02) weights and the fresh nn.Linear's uniform biases
    (U(+-1/sqrt(fan_in)): std bound / sqrt(3)), pooled over every linear map of 8 layers."""
    cfg = deepnorm_exp.compose(["norm=sigma_reparam", "norm.init=official", "depth=8", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg)
    linears = [m for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    weights = torch.cat([m.parametrizations.weight.original.detach().flatten() for m in linears])
    assert weights.std().item() == pytest.approx(0.02, rel=0.01)
    for fan_in in {m.in_features for m in linears}:
        biases = torch.cat([m.bias.detach() for m in linears if m.in_features == fan_in])
        bound = fan_in ** -0.5
        assert biases.abs().max().item() <= bound and biases.std().item() == pytest.approx(bound / 3 ** 0.5, rel=0.1)
    xavier = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=sigma_reparam", "depth=8", *WIDE]))
    assert all((m.bias == 0).all() for m in xavier.blocks.modules() if isinstance(m, nn.Linear))


# --- DS-Init: github.com/bzhangGo/zero, models/transformer.py at d97e2c21b1c6d0467fe821223042247bf2b46bf9
def official_ds_limit(tf_shape, layer, gain=1.0):
    """The bound of tf.variance_scaling_initializer(gain * (layer + 1) ** -0.5, mode="fan_avg",
    distribution="uniform") (lines 37-45 and 123-131, `layer` counting from 0 in each stack): sqrt(3 scale / n),
    n the mean of the [fan_in, fan_out] shape's fans."""
    scale = gain * (layer + 1) ** -0.5
    return (3 * scale / max(1.0, sum(tf_shape) / 2)) ** 0.5


def official_tf_shape(kind, role, weight):
    """The official variable's shape: self-attention's q, k, v are one fused [d, 3d] map (func.py's qkv_map);
    cross-attention's q, k, v and every other map are separate [fan_in, fan_out] ones."""
    fan_out, fan_in = weight.shape
    return (fan_in, 3 * fan_out) if kind == "attention" and role in ("q", "k", "v") else (fan_in, fan_out)


def paper_ds_limit(tf_shape, layer):
    """The paper's equation (the official README's image): U(-gamma a / sqrt(l), gamma a / sqrt(l)) with a the
    Xavier-uniform bound of the matrix itself and gamma 1, l = layer + 1."""
    return (6 / sum(tf_shape)) ** 0.5 / (layer + 1) ** 0.5


def _ds_cells(rule, seeds=range(4)):
    """{(stack, layer, sublayer, role): (draws pooled over seeds, the matrix's [fan_in, fan_out], the official
    variable's)} of an encoder-decoder."""
    cells = {}
    for seed in seeds:
        torch.manual_seed(seed)
        model = deepnorm_exp.build_model(deepnorm_exp.compose(
            ["norm=dsinit", f"norm.rule={rule}", "model=encdec", "depth=12", *WIDE]))
        for stack, layer, name, block in model.residual_blocks():
            for role, weight, _ in block.sublayer.projections():
                key = (stack, layer, name, role)
                draws = cells.get(key, (torch.empty(0),))[0]
                cells[key] = (torch.cat([draws, weight.detach().flatten()]), tuple(weight.shape[::-1]),
                              official_tf_shape(block.sublayer.kind, role, weight))
    return cells


def _ds_cells_follow(cells, limit_of):
    """Every cell's draws are uniform on +-limit: none beyond it, the largest within 0.3% of it (a 1% error in
    the bound shows), the std limit / sqrt(3) within 3%."""
    worst = 0.0
    for (stack, layer, name, role), (draws, own, official) in cells.items():
        limit = limit_of(own, official, layer)
        largest = draws.abs().max().item()
        if not (0.997 * limit <= largest <= limit * (1 + 1e-6)):
            return False, worst
        worst = max(worst, abs(draws.std().item() / (limit / 3 ** 0.5) - 1))
    return worst < 0.03, worst


DS_RULES = {"official": lambda own, official, layer: official_ds_limit(official, layer),
            "paper": lambda own, official, layer: paper_ds_limit(own, layer)}


@pytest.mark.parametrize("rule", DS_RULES)
def test_dsinit_draws_the_official_code_or_the_papers_rule_per_stack_role_and_layer(rule, record_deviation):
    cells, limit_of = _ds_cells(rule), DS_RULES[rule]
    follows, worst = _ds_cells_follow(cells, limit_of)
    record_deviation("std per cell / largest", torch.tensor(worst), torch.tensor(0.0), 1.0)
    assert follows, worst
    # negative controls: the other rule, and this rule's bound 1% off, must not pass
    other = DS_RULES["paper" if rule == "official" else "official"]
    assert not _ds_cells_follow(cells, other)[0]
    assert not _ds_cells_follow(cells, lambda *cell: 0.99 * limit_of(*cell))[0]


# --- T-Fixup: github.com/layer6ai-labs/T-Fixup at cce506a5c87628c65b2be0596fc7080cb06ed8e5 (fairseq fork):
# fairseq/modules/multihead_attention.py reset_parameters, fairseq/modules/transformer_layer.py
# fixup_initialization (encoder lines 31-49, decoder 157-175), fairseq/models/transformer.py's embeddings
def official_tfixup_draws(kind, role, weight, stack, depths):
    """(bound of the uniform weight draw, bound of the uniform bias draw or 0 for a zero bias) of one projection:
    q, k, v Xavier-uniform at gain 1/sqrt(2) with nn.Linear's default biases, out, fc1, fc2 Xavier-uniform at gain
    1 with zero biases; then v, out, fc1, fc2 (both attentions) times the stack's factor, v times sqrt(2) more."""
    fan_out, fan_in = weight.shape
    factor = 0.67 * depths["encoder"] ** -0.25 if stack == "encoder" else (9 * depths["decoder"]) ** -0.25
    gain = {"q": 2 ** -0.5, "k": 2 ** -0.5, "v": 2 ** -0.5 * factor * 2 ** 0.5}.get(role, factor)
    bias = fan_in ** -0.5 if role in ("q", "k", "v") else 0.0
    return gain * (6 / (fan_in + fan_out)) ** 0.5, bias


def official_tfixup_table_std(d_model, depths):
    """The shared token table: N(0, d^(-1/2)) times the encoder's (9N)^(-1/4), which the official encoder
    always applies (the decoder's own scaling is skipped when the table is shared)."""
    return d_model ** -0.5 * (9 * depths["encoder"]) ** -0.25


def _tfixup_cells(draws=official_tfixup_draws, seeds=range(4)):
    """Per (stack, layer, sublayer, role): pooled weights, pooled biases and the expected bounds, of an
    encoder-decoder with 4 encoder and 8 decoder layers; and the shared table's pooled draws."""
    cells, tables = {}, []
    for seed in seeds:
        torch.manual_seed(seed)
        model = deepnorm_exp.build_model(deepnorm_exp.compose(
            ["norm=tfixup", "norm.init=official", "model=encdec", "depth=8", "model.encoder_depth=4", *WIDE]))
        depths = {"encoder": 4, "decoder": 8}
        tables.append(model.embed.token.weight.detach().flatten())
        for stack, layer, name, block in model.residual_blocks():
            for role, weight, bias in block.sublayer.projections():
                key = (stack, layer, name, role)
                w, b = cells.get(key, (torch.empty(0), torch.empty(0), None))[:2]
                cells[key] = (torch.cat([w, weight.detach().flatten()]), torch.cat([b, bias.detach()]),
                              draws(block.sublayer.kind, role, weight, stack, depths))
    return cells, torch.cat(tables)


def _uniform_on(draws, bound):
    """Uniform on +-bound: none beyond it, the largest within 0.3% of it, the std bound / sqrt(3) within 3%."""
    largest = draws.abs().max().item()
    return 0.997 * bound <= largest <= bound * (1 + 1e-6) and abs(draws.std().item() * 3 ** 0.5 / bound - 1) < 0.03


def _tfixup_follows(cells, scale=1.0):
    """Weights per cell; the uniform biases pooled by bound (a cell holds too few to test alone), the others zero."""
    biases_by_bound = {}
    for weights, biases, (weight_bound, bias_bound) in cells.values():
        if not _uniform_on(weights, scale * weight_bound):
            return False
        if not bias_bound and not (biases == 0).all():
            return False
        biases_by_bound.setdefault(bias_bound, []).append(biases)
    return all(_uniform_on(torch.cat(pooled), scale * bound) for bound, pooled in biases_by_bound.items() if bound)


def test_tfixup_official_init_draws_what_the_official_code_draws_per_stack_role_and_layer():
    cells, table = _tfixup_cells()
    assert _tfixup_follows(cells)
    assert table.std().item() == pytest.approx(official_tfixup_table_std(64, {"encoder": 4}), rel=0.02)
    # negative controls: every bound 1% off; the decoder's factor taken as the encoder's rule; the table
    # scaled by the decoder's depth (the paper's reading here)
    assert not _tfixup_follows(cells, 1.01)

    def decoder_as_encoder(kind, role, weight, stack, depths):
        return official_tfixup_draws(kind, role, weight, "encoder", {"encoder": depths["decoder"]})

    assert not _tfixup_follows(_tfixup_cells(decoder_as_encoder, seeds=range(1))[0])
    assert table.std().item() != pytest.approx(64 ** -0.5 * (9 * 8) ** -0.25, rel=0.02)


# --- Admin: github.com/LiyuanLucasLiu/Transformer-Clinic, fairseq/fairseq/modules/transformer_layer.py at
# 70f72b708ab074db5ca3726494e3263516041159 (`adaptive-profiling`: encoder lines 161-263, decoder 519-656);
# and the admin-torch package (0.1.0, installed by the Makefile), its calculate_init and as_module
def official_admin_profile(x, blocks):
    """The profiling pass: r starts at 1; at each sublayer the omega is set to r, then r = sqrt(var(omega x) +
    var(g)), numpy's population variance over every element, and the pass continues through LN(g + x omega).
    blocks: (sublayer, norm) in order. Returns the omegas."""
    r, omegas = 1.0, []
    for sublayer, norm in blocks:
        g = sublayer(x)
        omega = r
        omegas.append(omega)
        r = float(torch.sqrt(torch.var(x * omega, correction=0) + torch.var(g, correction=0)))
        x = norm(g + x * omega)
    return omegas


def official_admin_stack(x, blocks, omegas):
    """The layers' forward after profiling: x + residual * omega, then the layer norm (lines 196, 261)."""
    for (sublayer, norm), omega in zip(blocks, omegas):
        x = norm(sublayer(x) + x * omega)
    return x


def _admin_model(depth, dtype, *overrides):
    cfg = deepnorm_exp.compose(["norm=admin", f"depth={depth}", *WIDE, *overrides])
    torch.manual_seed(0)
    return cfg, deepnorm_exp.build_model(cfg).to(dtype), make_scheme(cfg)


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth", [2, 12])
def test_admin_profiling_equals_the_official_recursion(depth, dtype, tol, record_deviation):
    cfg, model, scheme = _admin_model(depth, dtype)
    tokens = torch.randint(0, cfg.data.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    scheme.prepare(model, {"tokens": tokens})
    ours = torch.tensor([float(block.omega[0]) for *_, block in model.residual_blocks()], dtype=torch.float64)
    blocks = [(block.sublayer, block.norm) for *_, block in model.residual_blocks()]
    model.eval()
    with torch.no_grad():
        x = model.stream_in(model.embed(tokens[:, :-1]))  # what the pass reads: the inputs of next-token loss
        official = torch.tensor(official_admin_profile(x, blocks), dtype=torch.float64)
        record_deviation("omegas / largest", ours, official)
        assert torch.allclose(ours, official, rtol=tol, atol=0)
        # negative controls: the project's earlier rule (1 + the sum of branch variances, every omega 1 during
        # the pass, unbiased variances), and the embedding 1% larger, must not pass
        variances, h = [], x
        for sublayer, norm in blocks:
            g = sublayer(h)
            variances.append(float(g.var()))
            h = norm(h + g)
        earlier = torch.tensor([(1 + sum(variances[:i])) ** 0.5 for i in range(len(blocks))], dtype=torch.float64)
        assert not torch.allclose(earlier, official, rtol=1e-3, atol=0)
        larger = torch.tensor(official_admin_profile(1.01 * x, blocks), dtype=torch.float64)
        assert not torch.allclose(ours, larger, rtol=tol, atol=0)


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth", [2, 12])
def test_admin_blocks_equal_the_official_layers_with_per_channel_omegas(depth, dtype, tol, record_deviation):
    """The trained D-dim omegas moved apart channel by channel, hidden states and every gradient."""
    cfg, model, _ = _admin_model(depth, dtype)
    model.eval()
    with torch.no_grad():
        for *_, block in model.residual_blocks():
            block.omega.uniform_(0.5, 3.0)
    blocks = [(block.sublayer, block.norm) for *_, block in model.residual_blocks()]
    omegas = [block.omega for *_, block in model.residual_blocks()]
    tokens = _tokens(cfg)
    params = dict(model.named_parameters())
    ours = _hidden_and_grads(lambda: model.hidden(tokens), params)
    official = _hidden_and_grads(lambda: model.final_norm(official_admin_stack(
        model.stream_in(model.embed(tokens)), blocks, omegas)), params)
    _agree(record_deviation, ours, official, tol)
    with torch.no_grad():  # negative control: one omega channel 1% off
        wrong = [o.clone() for o in omegas]
        wrong[depth][5] *= 1.01
        assert not torch.allclose(ours[0], official_admin_stack(model.stream_in(model.embed(tokens)), blocks, wrong),
                                  rtol=tol, atol=tol)


@pytest.mark.parametrize("model_kind, depth", [("decoder", 1), ("decoder", 6), ("decoder", 100), ("encdec", 6)])
def test_admin_closed_form_and_block_equal_admin_torch(model_kind, depth):
    import admin_torch

    cfg = deepnorm_exp.compose(["norm=admin", "norm.omega=closed_form", "norm.omega_param=scalar", f"model={model_kind}",
                                f"depth={depth}", *WIDE])
    scheme = make_scheme(cfg)
    for stack, layers in scheme.depths.items():
        n = (3 if stack == "decoder" and model_kind == "encdec" else 2) * layers  # "the number of residual layers"
        assert scheme.closed_form(stack) == admin_torch.calculate_init(n)
        assert scheme.closed_form(stack) != admin_torch.calculate_init(n + 1)  # negative control
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).eval()
    stack, _, _, block = next(model.residual_blocks())
    n = 2 * scheme.depths[stack]
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        official = block.norm(admin_torch.as_module(n)(x, block.sublayer(x)))  # its buffer: a float32 (1,)
        assert torch.equal(block(x), official)
        vector = admin_torch.as_module(n, as_parameter=True, embed_dim=64).omega  # the trained form
        ours = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=admin", "norm.omega=closed_form",
                                                              f"model={model_kind}", f"depth={depth}", *WIDE]))
        assert torch.equal(next(ours.residual_blocks())[3].omega.detach(), vector.detach())


# --- DeepScaleLM: github.com/akhilkedia/TranformersGetStable at 7f48e64db03fd68a4cacf8da9e9c1b375900e569,
# DSLM_signal_propagation_figures/megatron/model/transformer.py, ParallelTransformerLayer.forward (lines 679-785)
# and ParallelTransformer's final norm (962-966, 1100-1101)
def official_dslm_stack(h, layers, lam, beta, post, first_norm, final_norm):
    """Each layer: a = LN_in(h); h1 = lam r + beta Attn(a), r = a in Post-LN mode, h otherwise; c = LN_pa(h1);
    h = lam r' + beta MLP(c), r' = c in Post-LN mode, h1 otherwise; then the final norm. layers: (attention,
    LN_in, MLP, LN_pa). In Post-LN mode a layer's LN_in is the previous layer's output norm, the first layer's
    `first_norm` (on the embedding)."""
    for attention, ln_in, mlp, ln_pa in layers:
        a = ln_in(h)
        h1 = lam * (a if post else h) + beta * attention(a)
        c = ln_pa(h1)
        h = lam * (c if post else h1) + beta * mlp(c)
    return final_norm(h)


def _dslm_layers(model, post, first_norm):
    blocks = list(model.blocks)
    if not post:
        return [(b.attn.sublayer, b.attn.norm, b.ffn.sublayer, b.ffn.norm) for b in blocks], model.final_norm
    inputs = [first_norm] + [b.ffn.norm for b in blocks[:-1]]  # the norm each layer's input went through
    return [(b.attn.sublayer, ln_in, b.ffn.sublayer, b.attn.norm) for b, ln_in in zip(blocks, inputs)], blocks[-1].ffn.norm


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("base, embedding_norm", [("pre", False), ("post", True), ("post", False)])
@pytest.mark.parametrize("depth", [2, 12])
def test_deepscalelm_equals_the_official_megatron_layers(base, embedding_norm, depth, dtype, tol, record_deviation):
    """Pre-LN as the official code; Post-LN with the official embedding norm (`norm.embedding_norm=true`), or
    without it (the paper's formula), equal to the official layers with that norm taken out."""
    cfg = deepnorm_exp.compose(["norm=deepscalelm", f"norm.base={base}", f"norm.embedding_norm={str(embedding_norm).lower()}",
                                f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    scheme = make_scheme(cfg)
    with torch.no_grad():  # norms' affine learned away from (1, 0), so the copy is what is compared
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
    first_norm = model.stream_in if embedding_norm else nn.Identity()
    layers, final = _dslm_layers(model, base == "post", first_norm)
    lam, beta = scheme.residual_multiplier("decoder"), scheme.branch_multiplier("decoder")
    tokens = _tokens(cfg)
    params = dict(model.named_parameters())
    ours = _hidden_and_grads(lambda: model.hidden(tokens), params)
    official = _hidden_and_grads(lambda: official_dslm_stack(model.embed(tokens), layers, lam, beta, base == "post",
                                                              first_norm, final), params)
    _agree(record_deviation, ours, official, tol)
    with torch.no_grad():  # negative control: lambda 1% off
        wrong = official_dslm_stack(model.embed(tokens), layers, 1.01 * lam, beta, base == "post", first_norm, final)
        assert not torch.allclose(ours[0], wrong, rtol=tol, atol=tol)
        if base == "post" and not embedding_norm:  # the official embedding norm is a real difference
            norm = nn.LayerNorm(64, dtype=dtype)
            assert not torch.allclose(ours[0], official_dslm_stack(model.embed(tokens), _dslm_layers(model, True, norm)[0],
                                                                   lam, beta, True, norm, final), rtol=tol, atol=tol)


# --- Norm placements from official LLM code, each transcribed as a stack around the project's sublayers, with
# the official RMSNorm (in the input's dtype, `OfficialRMSNorm`) holding the project's gains:
# LayerNorm Scaling: github.com/lmsdss/LayerNorm-Scaling, peft_pretraining/modeling_llama.py at 5d4dd11 (the
#   LlamaDecoderLayer forward's scaled branch, lines 427-454; from 33c3899 on its NORM_TYPE test never matches);
# Peri-LN: github.com/allenai/OLMo-core, src/olmo_core/nn/transformer/block.py at fa6c501 (PeriNormTransformerBlock,
#   lines 312-361; the paper released no code);
# HybridNorm: github.com/BryceZhuo/HybridNorm, dense_model/olmo/model.py at f0dd605 (OLMoSequentialBlock, lines
#   797-894, per-head q/k/v norms applied in attention(), lines 668-673);
# OLMo 2: allenai/OLMo-core block.py at fa6c501 (ReorderedNormTransformerBlock, lines 293-309), allenai/OLMo
#   olmo/model.py at 59a53e3 (norm_after).
def official_lns_stack(h, layers, final_norm):
    for index, (attention, n_in, mlp, n_post) in enumerate(layers):
        scale = 1 / (index + 1) ** 0.5
        h = h + attention(scale * n_in(h))
        h = h + mlp(scale * n_post(h))
    return final_norm(h)


def official_peri_stack(h, layers, final_norm):
    for attention, n_in, out_a, mlp, n_f, out_f in layers:
        h = h + out_a(attention(n_in(h)))
        h = h + out_f(mlp(n_f(h)))
    return final_norm(h)


def official_hybrid_stack(h, layers, final_norm):
    """Attention on the raw stream (its q, k, v normalised per head inside); the FFN on the normalised stream,
    whose residual is the normalised value."""
    for attention, mlp, n_ffn in layers:
        h = h + attention(h)
        n = n_ffn(h)
        h = n + mlp(n)
    return final_norm(h)


def official_hybrid_attention(attention, q_norm, k_norm, v_norm):
    """OLMo's attention() with use_query/key/value_norm: the heads split, each normalised over head_dim (one gain
    shared by the heads), causal softmax attention, the output projection."""
    def forward(x):
        batch, seq, d = x.shape
        q, k, v = attention.qkv(x).view(batch, seq, 3, attention.n_heads, -1).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q_norm(q), k_norm(k), v_norm(v), is_causal=True)
        return attention.out(y.transpose(1, 2).reshape(batch, seq, d))
    return forward


def official_olmo2_stack(h, layers, final_norm):
    for attention, out_a, mlp, out_f in layers:
        h = h + out_a(attention(h))
        h = h + out_f(mlp(h))
    return final_norm(h)


def _copy(norm, eps):
    return OfficialRMSNorm(norm.weight, eps)


PLACEMENTS = {  # norm: (the official stack, its layers from the project's model, the RMSNorm eps of the official code)
    "lnscale": (official_lns_stack, lambda b, eps: (b.attn.sublayer, _copy(b.attn.norm.norm, eps), b.ffn.sublayer,
                                                    _copy(b.ffn.norm.norm, eps)), 1e-6),
    "periln": (official_peri_stack, lambda b, eps: (b.attn.sublayer, _copy(b.attn.norm, eps), _copy(b.attn.out_norm, eps),
                                                    b.ffn.sublayer, _copy(b.ffn.norm, eps), _copy(b.ffn.out_norm, eps)), 1e-6),
    "hybridnorm": (official_hybrid_stack, lambda b, eps: (
        official_hybrid_attention(b.attn.sublayer, *(_copy(getattr(b.attn.sublayer, f"{n}_norm"), eps) for n in "qkv")),
        b.ffn.sublayer, _copy(b.ffn.norm, eps)), 1e-5),
    "olmo2": (official_olmo2_stack, lambda b, eps: (b.attn.sublayer, _copy(b.attn.out_norm, eps), b.ffn.sublayer,
                                                    _copy(b.ffn.out_norm, eps)), 1e-6),
}


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth", [4, 12])
@pytest.mark.parametrize("norm", PLACEMENTS)
def test_placements_equal_the_official_llm_blocks(norm, depth, dtype, tol, record_deviation):
    """Hidden states and the gradients of every sublayer weight; the official norms hold the project's gains
    (perturbed from 1), RMSNorm at the official eps."""
    stack, layers_of, eps = PLACEMENTS[norm]
    cfg = deepnorm_exp.compose([f"norm={norm}", "norm.layer=rmsnorm", f"model.norm_eps={eps}", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.normal_(1.0, 0.2)
    layers = [layers_of(block, eps) for block in model.blocks]
    final = _copy(model.final_norm, eps)
    tokens = _tokens(cfg)
    weights = {n: p for n, p in model.named_parameters() if ".sublayer." in n and not n.endswith("_norm.weight")}
    ours = _hidden_and_grads(lambda: model.hidden(tokens), weights)
    official = _hidden_and_grads(lambda: stack(model.stream_in(model.embed(tokens)), layers, final), weights)
    _agree(record_deviation, ours, official, tol)
    with torch.no_grad():  # negative control: the final norm's gain 1% off
        wrong = copy.deepcopy(final)
        wrong.weight.mul_(1.01)
        assert not torch.allclose(ours[0], stack(model.stream_in(model.embed(tokens)), layers, wrong), rtol=tol, atol=tol)
