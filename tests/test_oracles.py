"""Schemes against their official code: the official module's forward, transcribed here with its source and
commit named (never the project's code under another name), given the project's weights; outputs and
gradients must agree to rounding in fp64 and fp32 at two depths, and a deliberately wrong constant on the
official side must be caught (the negative control)."""

import copy

import pytest
import torch
from torch import nn

import deepnorm_exp
from deepnorm_exp.schemes.derf import DynamicErf
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


# --- Derf: github.com/zlab-princeton/Derf, ViT/dynamic_erf.py at 6e1d81c1978778c00ef2195670ea6001a92c1dab -----
class OfficialDynamicErf(nn.Module):
    """Transcribed from Dynamic_erf in dynamic_erf.py (channels_last=True); its GPT-2 patch's module computes
    the same (weight * erf(alpha x + shift) + bias)."""

    def __init__(self, normalized_shape, channels_last=True, alpha_init_value=0.5, shift_init_value=0.0):
        super().__init__()
        self.normalized_shape, self.alpha_init_value = normalized_shape, alpha_init_value
        self.channels_last, self.shift_init_value = channels_last, shift_init_value
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.shift = nn.Parameter(torch.ones(1) * shift_init_value)

    def forward(self, x):
        x = self.alpha * x + self.shift
        x = torch.erf(x)
        if self.channels_last:
            x = x * self.weight + self.bias
        else:
            x = x * self.weight[:, None, None] + self.bias[:, None, None]
        return x


def official_convert_ln_to_derf(module, alpha_init_value=0.5, shift_init_value=0.0):
    """Transcribed from convert_ln_to_derf in dynamic_erf.py: every nn.LayerNorm, recursively, becomes a
    Dynamic_erf of its shape."""
    module_output = module
    if isinstance(module, nn.LayerNorm):
        module_output = OfficialDynamicErf(module.normalized_shape, True, alpha_init_value, shift_init_value)
    for name, child in module.named_children():
        module_output.add_module(name, official_convert_ln_to_derf(child, alpha_init_value, shift_init_value))
    del module
    return module_output


POINTWISE = {"dyt": (official_convert_ln_to_dyt, OfficialDynamicTanh, DynamicTanh),
             "derf": (official_convert_ln_to_derf, OfficialDynamicErf, DynamicErf)}


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("depth", [2, 12])
@pytest.mark.parametrize("norm", sorted(POINTWISE))
def test_pointwise_norms_equal_the_official_module_on_pre_ln(norm, depth, dtype, tol, record_deviation):
    """The official recipe (DyT's and Derf's) is Pre-LN with every LayerNorm converted: built here from the
    project's Pre-LN (Xavier init, as the zoo's) and given the scheme's weights, it must compute what
    norm=dyt / norm=derf does."""
    convert, official_module, ours_module = POINTWISE[norm]
    cfg = deepnorm_exp.compose([f"norm={norm}", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    ours = deepnorm_exp.build_model(cfg).to(dtype)
    official = convert(deepnorm_exp.build_model(deepnorm_exp.compose(
        ["norm=pre", "norm.init=xavier", f"depth={depth}", *WIDE]))).to(dtype)
    assert sum(isinstance(m, official_module) for m in official.modules()) == 2 * depth + 1
    with torch.no_grad():  # learned away from their starts, so the copy is what is compared, not the defaults
        for module in ours.modules():
            if isinstance(module, ours_module):
                module.alpha.uniform_(0.3, 1.2)
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
                if hasattr(module, "shift"):
                    module.shift.uniform_(-0.3, 0.3)
    official.load_state_dict(ours.state_dict())
    ours.eval(), official.eval()  # no dropout on either side
    tokens = torch.randint(0, cfg.data.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    (ours_logits, ours_grads), (off_logits, off_grads) = (_logits_and_grads(m, tokens) for m in (ours, official))
    assert ours_grads.keys() == off_grads.keys()
    record_deviation("logits / largest", ours_logits, off_logits)
    record_deviation("gradients / largest",
                     torch.stack([(g - off_grads[n]).abs().max() for n, g in ours_grads.items()]),
                     0, max(g.abs().max().item() for g in ours_grads.values()))
    assert torch.allclose(ours_logits, off_logits, rtol=tol, atol=tol)
    for name, grad in ours_grads.items():
        assert torch.allclose(grad, off_grads[name], rtol=tol, atol=tol * grad.abs().max().item()), name

    # negative controls: one layer's alpha (and Derf's shift) 1% off on the official side must show
    for name in ("alpha", "shift") if norm == "derf" else ("alpha",):
        wrong = copy.deepcopy(official)
        with torch.no_grad():
            getattr(next(m for m in wrong.modules() if isinstance(m, official_module)), name).mul_(1.01)
        assert not torch.allclose(ours_logits, wrong(tokens).detach(), rtol=tol, atol=tol), name


def test_dyt_defaults_are_the_official_modules_init():
    official = OfficialDynamicTanh(64)
    ours = DynamicTanh(64, 0.5)
    for name in ("alpha", "weight", "bias"):
        assert torch.equal(getattr(ours, name), getattr(official, name)), name


def test_derf_defaults_are_the_official_modules_init():
    official, ours = OfficialDynamicErf(64), DynamicErf(64, 0.5)
    for name in ("alpha", "shift", "weight", "bias"):
        assert torch.equal(getattr(ours, name), getattr(official, name)), name
    model = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=derf", "depth=2", *WIDE]))
    assert all(m.alpha.item() == 0.5 and m.shift.item() == 0.0 for m in model.modules() if isinstance(m, DynamicErf))


# --- nGPT: github.com/NVIDIA/ngpt, model.py and train.py at ed19eb232380d41a9d71024b58d2403937d8f2c9 -------
def official_justnorm(x, idim=-1):
    """model.py's justnorm (train.py's, with its fp32 cast, is the same in fp32 and fp64 here): no epsilon."""
    return x / x.norm(p=2, dim=idim, keepdim=True)


class OfficialNGPTBlock(nn.Module):
    """Transcribed from Block (use_nGPT=1) in model.py: parameters by the official names and stored scales;
    the rotary step left out (the project has no rotary positions; the official one is not a rotation,
    NVIDIA/ngpt#10); the attention written out where the code calls flash_attn_func (softmax_scale
    sqrt(d_k), causal), in the dtype of the test rather than bf16."""

    def __init__(self, n_embd, n_head, base_scale, attn_alpha_init_value=0.05):
        super().__init__()
        self.n_embd, self.n_head = n_embd, n_head
        self.query = nn.Linear(n_embd, n_embd, bias=False)
        self.key = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(n_embd, n_embd, bias=False)
        self.att_c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.c_fc = nn.Linear(n_embd, 2 * 4 * n_embd, bias=False)
        self.mlp_c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)
        self.attn_alpha_init_value, self.attn_alpha_init_scaling = attn_alpha_init_value, base_scale
        self.attn_alpha = nn.Parameter(self.attn_alpha_init_scaling * torch.ones(n_embd))
        self.mlp_alpha_init_value, self.mlp_alpha_init_scaling = 0.05, base_scale
        self.mlp_alpha = nn.Parameter(self.mlp_alpha_init_scaling * torch.ones(n_embd))
        self.sqk_init_value, self.sqk_init_scaling = 1.0, base_scale
        self.sqk = nn.Parameter(self.sqk_init_scaling * torch.ones(n_embd))
        self.suv_init_value, self.suv_init_scaling = 1.0, 1.0
        self.suv = nn.Parameter(self.suv_init_scaling * torch.ones(2 * 4 * n_embd))

    def forward(self, h):
        B, T, C = h.size()
        hd = C // self.n_head
        q = self.query(h).view(B, T, self.n_head, hd)
        k = self.key(h).view(B, T, self.n_head, hd)
        v = self.value(h).view(B, T, self.n_head, hd)
        sqk = (self.sqk * (self.sqk_init_value / self.sqk_init_scaling)).view(1, 1, self.n_head, hd)
        q = sqk * official_justnorm(q)
        k = sqk * official_justnorm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (hd ** 0.5)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        h_att = self.att_c_proj(y)
        lr = torch.abs(self.attn_alpha * (self.attn_alpha_init_value / self.attn_alpha_init_scaling))
        A_norm, B_norm = official_justnorm(h), official_justnorm(h_att)
        h = official_justnorm(A_norm + lr * (B_norm - A_norm))
        uv = self.c_fc(h)
        suv = self.suv * ((self.suv_init_value / self.suv_init_scaling) * (self.n_embd ** 0.5))
        u, v = torch.chunk(suv * uv, 2, dim=-1)
        h_mlp = self.mlp_c_proj(u * nn.functional.silu(v))
        lr = torch.abs(self.mlp_alpha * (self.mlp_alpha_init_value / self.mlp_alpha_init_scaling))
        A_norm, B_norm = official_justnorm(h), official_justnorm(h_mlp)
        return official_justnorm(A_norm + lr * (B_norm - A_norm))


class OfficialNGPT(nn.Module):
    """GPT (use_nGPT=1) from the first block on: the blocks, then logits = s_z (lm_head h), no final norm."""

    def __init__(self, depth, n_embd, n_head, vocab, attn_alpha_init_value=0.05):
        super().__init__()
        base_scale = n_embd ** -0.5
        self.h = nn.ModuleList(OfficialNGPTBlock(n_embd, n_head, base_scale, attn_alpha_init_value)
                               for _ in range(depth))
        self.wte = nn.Embedding(vocab, n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.sz_init_value, self.sz_init_scaling = 1.0, base_scale
        self.sz = nn.Parameter(self.sz_init_scaling * torch.ones(vocab))

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return (self.sz * (self.sz_init_value / self.sz_init_scaling)) * self.lm_head(x)

    @torch.no_grad()
    def normalize_matrices(self):
        """train.py's normalize_matrices: every matrix along its n_embd axis."""
        self.wte.weight.data.copy_(official_justnorm(self.wte.weight.data, 1))
        self.lm_head.weight.data.copy_(official_justnorm(self.lm_head.weight.data, 1))
        for block in self.h:
            for name in ("query", "key", "value", "c_fc"):
                getattr(block, name).weight.data.copy_(official_justnorm(getattr(block, name).weight.data, 1))
            for name in ("att_c_proj", "mlp_c_proj"):
                getattr(block, name).weight.data.copy_(official_justnorm(getattr(block, name).weight.data, 0))


def ngpt_pairs(ours, official):
    """(our tensor, official tensor) for every parameter of the official model, the stored values compared."""
    d = ours.cfg.d_model
    yield ours.embed.token.weight, official.wte.weight
    yield ours.embed.token.weight, official.lm_head.weight  # tied in the project, untied there: the same values
    yield ours.embed.logit_scale.scale.param, official.sz
    for block, theirs in zip(ours.blocks, official.h, strict=True):
        attn, ffn = block.attn.sublayer, block.ffn.sublayer
        for i, name in enumerate(("query", "key", "value")):
            yield attn.qkv.weight[i * d:(i + 1) * d], getattr(theirs, name).weight
        yield attn.out.weight, theirs.att_c_proj.weight
        yield attn.q_norm.s_qk.param, theirs.sqk
        yield ffn.fc1.weight, theirs.c_fc.weight
        yield ffn.act_in.scale.param, theirs.suv
        yield ffn.fc2.weight, theirs.mlp_c_proj.weight
        yield block.attn.alpha.param, theirs.attn_alpha
        yield block.ffn.alpha.param, theirs.mlp_alpha


def _ngpt_pair(depth, dtype):
    cfg = deepnorm_exp.compose(["norm=ngpt", f"depth={depth}", *WIDE, "model.ffn=swiglu", "model.d_ff=256"])
    torch.manual_seed(0)
    ours = deepnorm_exp.build_model(cfg).to(dtype)
    official = OfficialNGPT(depth, 64, 4, cfg.data.vocab_size).to(dtype)
    with torch.no_grad():  # the learned vectors away from their inits, so the copy is what is compared
        for p in ours.parameters():
            if p.dim() == 1:
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
        for mine, theirs in ngpt_pairs(ours, official):
            theirs.copy_(mine)
    return cfg, ours, official


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("depth", [2, 12])
def test_ngpt_equals_the_official_blocks_and_head(depth, dtype, tol, record_deviation):
    cfg, ours, official = _ngpt_pair(depth, dtype)
    # every parameter of ours has its official counterpart (one s_qk for q and k, as the official sqk)
    assert {id(m) for m, _ in ngpt_pairs(ours, official)} >= {id(p) for p in ours.parameters() if p.dim() == 1}
    tokens = torch.randint(0, cfg.data.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    h0 = ours.stream_in(ours.embed(tokens)).detach()  # the project's embedding on the sphere: the input
    ours_logits = ours(tokens)
    off_logits = official(h0)
    record_deviation("logits / largest", ours_logits, off_logits)
    assert torch.allclose(ours_logits, off_logits, rtol=tol, atol=tol), (ours_logits - off_logits).abs().max()
    ours_logits.square().mean().backward()
    off_logits.square().mean().backward()
    scale = max(p.grad.abs().max().item() for p in official.parameters() if p.grad is not None)
    # the embedding is tied here and the input h0 there: every other parameter's gradient is compared
    grads = [(ours.embed.logit_scale.scale.param.grad, official.sz.grad)]
    for block, theirs in zip(ours.blocks, official.h):
        d = 64
        attn, ffn = block.attn.sublayer, block.ffn.sublayer
        grads += [(attn.qkv.weight.grad[i * d:(i + 1) * d], getattr(theirs, name).weight.grad)
                  for i, name in enumerate(("query", "key", "value"))]
        grads += [(mine.grad, their.grad) for mine, their in [
            (attn.out.weight, theirs.att_c_proj.weight), (ffn.fc1.weight, theirs.c_fc.weight),
            (ffn.fc2.weight, theirs.mlp_c_proj.weight), (attn.q_norm.s_qk.param, theirs.sqk),
            (ffn.act_in.scale.param, theirs.suv), (block.attn.alpha.param, theirs.attn_alpha),
            (block.ffn.alpha.param, theirs.mlp_alpha)]]
    record_deviation("gradients / largest", torch.stack([(m - t).abs().max() for m, t in grads]), 0, scale)
    for mine, their in grads:
        assert torch.allclose(mine, their, rtol=tol, atol=tol * scale)

    # negative control: the official attention alpha's init value 1% off (in every block)
    wrong = OfficialNGPT(depth, 64, 4, cfg.data.vocab_size, attn_alpha_init_value=0.05 * 1.01).to(dtype)
    wrong.load_state_dict(official.state_dict())
    assert not torch.allclose(ours_logits.detach(), wrong(h0), rtol=tol, atol=tol)


def test_ngpt_renormalises_every_matrix_as_the_official_normalize_matrices():
    cfg, ours, official = _ngpt_pair(3, torch.float64)
    scheme = deepnorm_exp.build.make_scheme(cfg)
    with torch.no_grad():  # an optimizer step's worth of drift off the sphere, the same on both sides
        for mine, theirs in ngpt_pairs(ours, official):
            if mine.dim() == 2:
                mine.add_(0.3 * torch.randn_like(mine))
        for mine, theirs in ngpt_pairs(ours, official):
            theirs.copy_(mine)
    drifted = {name: block.weight.detach().clone() for name, block in official.h[0].named_children()
               if name in ("att_c_proj", "mlp_c_proj")}
    scheme.after_optimizer_step(ours)
    official.normalize_matrices()
    for mine, theirs in ngpt_pairs(ours, official):
        assert torch.allclose(mine, theirs, rtol=1e-12, atol=1e-12), theirs.shape
    # negative control: the same drifted out and fc2 put on the sphere by rows instead of columns
    for name, weight in drifted.items():
        getattr(official.h[0], name).weight.data.copy_(official_justnorm(weight, 1))
    assert not all(torch.allclose(m, t) for m, t in ngpt_pairs(ours, official))


# --- CompleteP: github.com/EleutherAI/nanoGPT-mup, branch completep, 6f8bc3bdc744556141255f810a22387b2255b6c1 -
def official_completep_block(x, attn, ln_1, mlp, ln_2, depth_multiplier, depth_alpha_exp):
    """Block.forward in model.py with depth_alpha_enabled: the attention and MLP branches each times
    1 / depth_multiplier ** depth_alpha_exp (the project's sublayers and norms passed in as the branches)."""
    residual_scaling = 1 / (depth_multiplier ** depth_alpha_exp)
    x = x + residual_scaling * attn(ln_1(x))
    return x + residual_scaling * mlp(ln_2(x))


def official_completep_groups(named_params, lr, adam_eps, depth_multiplier, depth_alpha_exp):
    """configure_optimizers in model.py (mup and depth_alpha enabled, width multiplier 1), then train.py's
    lr = lr * lr_scale per group: {parameter name: (lr, eps)}. Parameters are sorted by nanoGPT's names, here
    given by `official_name` (the project's names in nanoGPT's terms)."""
    depth_lr_scaling = depth_multiplier ** (depth_alpha_exp - 1)
    width_lr_scaling = 1 / 1.0
    adam_eps *= (1 / 1.0) * (depth_multiplier ** (-1 * depth_alpha_exp))
    scale = {"emb": 1.0, "hidden_ln": depth_lr_scaling, "hidden_weight": width_lr_scaling * depth_lr_scaling,
             "hidden_bias": depth_lr_scaling, "final_ln": 1.0}
    return {name: (lr * scale[official_name(name)], adam_eps) for name, _ in named_params}


def official_name(name: str) -> str:
    """The project's parameter names in the categories nanoGPT's name tests give (wte: emb; '.ln_': the
    blocks' norms; c_attn, c_fc, c_proj weights and biases; ln_f)."""
    if name.startswith("embed."):
        return "emb"
    if name.startswith("final_norm."):
        return "final_ln"
    if ".norm." in name:
        return "hidden_ln"
    return "hidden_weight" if name.endswith("weight") else "hidden_bias"


@pytest.mark.parametrize("norm, depth_alpha", [("completep", 0.5), ("completep", 1.0), ("depth_mup", 0.5)])
def test_completep_equals_the_official_block_and_optimizer_rules(norm, depth_alpha, record_deviation):
    """CompleteP at both ends of its range, and depth-muP's defaults against the official alpha = 1/2 recipe."""
    depth, base, lr, eps = 24, 3, 2e-3, 1e-8
    alpha = [f"norm.depth_alpha={depth_alpha}"] if norm == "completep" else []
    cfg = deepnorm_exp.compose([f"norm={norm}", f"depth={depth}", *WIDE, *alpha, f"norm.base_depth={base}"])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).double()
    block = model.blocks[4]
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    official = official_completep_block(x, block.attn.sublayer, block.attn.norm, block.ffn.sublayer, block.ffn.norm,
                                        depth / base, depth_alpha)
    record_deviation("block output / largest", block(x).detach(), official.detach())
    assert torch.allclose(block(x), official, rtol=1e-14, atol=1e-14)

    groups = deepnorm_exp.build.make_scheme(cfg).param_groups(model, lr, eps)
    ours = {id(p): (g["lr"], g["eps"]) for g in groups for p in g["params"]}
    theirs = official_completep_groups(model.named_parameters(), lr, eps, depth / base, depth_alpha)
    for name, p in model.named_parameters():
        our_lr, our_eps = ours[id(p)]
        their_lr, their_eps = theirs[name]
        assert our_lr == pytest.approx(their_lr, rel=1e-12), name
        if official_name(name) in ("emb", "final_ln"):  # the paper's rule: eps scaled in the blocks only
            assert our_eps == pytest.approx(their_eps * (depth / base) ** depth_alpha, rel=1e-12), name
        else:
            assert our_eps == pytest.approx(their_eps, rel=1e-12), name
    # negative control: the official exponent 1% off shows in the block and in the blocks' eps
    wrong = official_completep_block(x, block.attn.sublayer, block.attn.norm, block.ffn.sublayer, block.ffn.norm,
                                     depth / base, depth_alpha * 1.01)
    assert not torch.allclose(block(x), wrong, rtol=1e-8, atol=1e-8)
    wrong_groups = official_completep_groups(model.named_parameters(), lr, eps, depth / base, depth_alpha * 1.01)
    name = "blocks.0.attn.sublayer.out.weight"
    assert ours[id(dict(model.named_parameters())[name])][1] != pytest.approx(wrong_groups[name][1], rel=1e-6)


# --- ResiDual: github.com/microsoft/ResiDual, resi_dual/ at 8682f7510be105a0caf5b98a021e712f44f90ace ------------
def official_resi_dual_stack(x, sublayers, layer_norm, res_input_norm_scale=1.0, alpha=1.0):
    """ResiDualEncoder.forward (resi_dual.py) around ResiDualEncoderLayer.forward (resi_dual_layers.py), with
    each layer's two sublayers given as (branch, its post-LN) pairs in order, dropout off:
    res = x * scale; per sublayer: xr = x, x = branch(x), res = res + x * scale, x = LN(x + xr);
    then x * alpha + layer_norm(res)."""
    res = x * res_input_norm_scale
    for branch, post_ln in sublayers:
        xr = x
        x = branch(x)
        res = res + x * res_input_norm_scale
        x = post_ln(x + xr)
    return x * alpha + layer_norm(res)


def _resi_dual_model(model_kind, depth, dtype):
    cfg = deepnorm_exp.compose(["norm=resi_dual", f"model={model_kind}", f"depth={depth}", *WIDE,
                                "norm.dual_scale=0.05"])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype)
    with torch.no_grad():  # every LayerNorm away from (1, 0), so each is the one it should be
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1.0, 0.2)
                module.bias.normal_(0.0, 0.2)
    return cfg, model


def _official_resi_dual_hidden(model, batch, alpha=1.0):
    """The official stacks around the project's sublayers: the encoder's, then the decoder's (whose
    cross-attention reads the encoder's output, as ResiDualDecoderLayer's)."""
    if "tokens" in batch:
        pairs = [(block.sublayer, block.norm) for *_, block in model.residual_blocks()]
        return official_resi_dual_stack(model.embed(batch["tokens"]), pairs, model.final_norm.norm, 0.05, alpha)
    blocks = list(model.residual_blocks())
    mask = (batch["src"] != 0)[:, None, None, :]
    encoder = [((lambda x, b=b: b.sublayer(x, mask)) if name == "attn" else b.sublayer, b.norm)
               for stack, _, name, b in blocks if stack == "encoder"]
    memory = official_resi_dual_stack(model.embed(batch["src"]), encoder, model.encoder_norm.norm, 0.05, alpha)
    decoder = [((lambda x, b=b: b.sublayer(x, memory, mask)) if name == "cross" else b.sublayer, b.norm)
               for stack, _, name, b in blocks if stack == "decoder"]
    return official_resi_dual_stack(model.embed(batch["tgt"]), decoder, model.decoder_norm.norm, 0.05, alpha)


def _our_resi_dual_hidden(model, batch):
    if "tokens" in batch:
        return model.hidden(batch["tokens"])
    return model.decoder_hidden(batch["tgt"], *model.encode(batch["src"]))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("depth", [2, 12])
@pytest.mark.parametrize("model_kind", ["decoder", "encdec"])
def test_resi_dual_equals_the_official_stack(model_kind, depth, dtype, tol, record_deviation):
    cfg, model = _resi_dual_model(model_kind, depth, dtype)
    g = torch.Generator().manual_seed(1)
    batch = ({"tokens": torch.randint(3, cfg.data.vocab_size, (2, 16), generator=g)} if model_kind == "decoder" else
             {"src": torch.randint(3, cfg.data.vocab_size, (2, 12), generator=g),
              "tgt": torch.randint(3, cfg.data.vocab_size, (2, 10), generator=g)})
    if model_kind == "encdec":
        batch["src"][1, 9:] = 0  # padding, masked as keys
    grads = []
    for forward in (_our_resi_dual_hidden, _official_resi_dual_hidden):  # the same parameters, two computations
        model.zero_grad()
        hidden = forward(model, batch)
        hidden.square().mean().backward()
        grads.append((hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (ours, our_grads), (official, official_grads) = grads
    record_deviation("hidden state / largest", ours, official)
    assert torch.allclose(ours, official, rtol=tol, atol=tol)
    assert our_grads.keys() == official_grads.keys()
    scale = max(g.abs().max().item() for g in our_grads.values())
    record_deviation("gradients / largest",
                     torch.stack([(g - official_grads[n]).abs().max() for n, g in our_grads.items()]), 0, scale)
    for name, grad in our_grads.items():
        assert torch.allclose(grad, official_grads[name], rtol=tol, atol=tol * scale), name
    # negative control: the official output weight on the Post-LN stream 1% off
    with torch.no_grad():
        assert not torch.allclose(ours, _official_resi_dual_hidden(model, batch, alpha=1.01), rtol=tol, atol=tol)
