"""Decoder-only model: shapes, causality, positions, tied head, activation checkpointing."""

import pytest
import torch

import deepnorm_exp


def tiny_model(*overrides, seed=0):
    torch.manual_seed(seed)
    cfg = deepnorm_exp.compose(["depth=3", "model.d_model=32", "model.n_heads=4", "model.d_ff=64", *overrides])
    return deepnorm_exp.build_model(cfg)


@pytest.mark.parametrize("norm", ["post", "pre", "deepnorm"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_future_tokens_never_change_earlier_logits(norm, positions):
    model = tiny_model(f"norm={norm}", f"model.positions={positions}").eval()
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 256
    a, b = model(tokens), model(changed)
    assert a.shape == (2, 12, 256)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_positions_matter():
    model = tiny_model().eval()
    tokens = torch.tensor([[5, 6, 7, 8]])
    swapped = torch.tensor([[6, 5, 7, 8]])
    assert not torch.allclose(model(tokens)[0, 3], model(swapped)[0, 3])


def test_tied_and_untied_heads():
    tied = tiny_model()
    untied = tiny_model("model.tie_embeddings=false")
    assert tied.embed.head is None and untied.embed.head is not None
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 256 * 32


@pytest.mark.parametrize("norm", ["deepnorm", "resi_dual", "hyper_connections", "mhc", "value_residual", "attn_res",
                                  "frac_connections", "keel"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(norm):
    """Schemes whose state carries more than the stream (a second stream, n streams, the first layer's values)
    too: what a recomputed block reads is what it read the first time, and gradients reach every layer."""
    tokens = torch.randint(0, 256, (4, 17))
    grads = []
    for ckpt in ("false", "true"):
        model = tiny_model(f"norm={norm}", f"model.activation_checkpointing={ckpt}", seed=1).train()
        loss = model.loss({"tokens": tokens}).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for g0, g1 in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(g0, g1)


def test_depth_1000_builds_with_the_paper_constants():
    model = tiny_model("depth=1000", "model.d_model=8", "model.n_heads=2", "model.d_ff=16", "norm=deepnorm")
    assert len(model.blocks) == 1000
    assert model.blocks[0].attn.alpha == pytest.approx(2000**0.25)
    with torch.no_grad():
        out = model(torch.randint(0, 256, (1, 8)))
    assert torch.isfinite(out).all()


@pytest.mark.slow
def test_the_paper_1000_layer_preset_builds_its_3_7b_parameter_model():
    """experiment=paper_1000l: 500L-500L, d 512, 8 heads, FFN 2048 (the paper: 3.8B with its 64k
    vocabulary; ours has the synthetic 256). Built on the meta device: shapes and init, no memory."""
    from deepnorm_exp.models import count_params

    cfg = deepnorm_exp.compose(["experiment=paper_1000l"])
    with torch.device("meta"):
        model = deepnorm_exp.build_model(cfg)
    assert len(model.encoder) == len(model.decoder) == 500
    assert count_params(model) == 3_678_339_072


# --- model.qk_norm: a mitigation that composes with every scheme ------------------------------------------
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_qk_norm_makes_the_attention_logits_independent_of_the_q_and_k_weights_scale(kind):
    """Scaling q's and k's weights and biases by 10 scales q k^T by 100 without QK-norm, and leaves it
    alone with it (up to the norm's epsilon); self- and cross-attention alike."""
    from deepnorm_exp.models.layers import AttentionSettings, CrossAttention, SelfAttention

    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    for qk_norm in ("none", kind):
        attention = SelfAttention(AttentionSettings(16, 2, qk_norm=qk_norm)).eval()
        cross = CrossAttention(AttentionSettings(16, 2, qk_norm=qk_norm)).eval()
        with torch.no_grad():
            before = attention.attention_logits(x), cross.attention_logits(x, memory, None)
            attention.qkv.weight[:32] *= 10
            attention.qkv.bias[:32] *= 10
            for weight, bias in ((cross.q.weight, cross.q.bias), (cross.kv.weight[:16], cross.kv.bias[:16])):
                weight *= 10
                bias *= 10
            after = attention.attention_logits(x), cross.attention_logits(x, memory, None)
        for b, a in zip(before, after):
            finite = b.isfinite()
            if qk_norm == "none":
                torch.testing.assert_close(a[finite], 100 * b[finite], rtol=1e-4, atol=1e-4)
            else:
                torch.testing.assert_close(a[finite], b[finite], rtol=1e-3, atol=1e-3)
        # and forward uses the same logits: its output against the softmax written out
        probs = attention.attention_probs(x)
        v = attention.qkv(x)[..., 32:].view(2, 5, 2, 8).transpose(1, 2)
        by_hand = attention.out((probs @ v).transpose(1, 2).reshape(2, 5, 16))
        torch.testing.assert_close(by_hand, attention(x), rtol=1e-5, atol=1e-5)


def test_qk_norm_off_builds_the_same_model_and_a_bad_value_is_one_line():
    from deepnorm_exp.errors import ConfigError

    plain, named = tiny_model("depth=2"), tiny_model("depth=2", "model.qk_norm=none")
    assert [k for k in plain.state_dict()] == [k for k in named.state_dict()]
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), named.state_dict().values()))
    with pytest.raises(ConfigError, match="qk_norm.*choose one of: none, layernorm, rmsnorm"):
        deepnorm_exp.compose(["model.qk_norm=l2"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["decoder", "encdec"])
def test_qk_norm_composes_with_every_scheme(model):
    """Every registered scheme builds with QK-norm, adds exactly two norms per attention sublayer (a scheme that
    normalises q and k itself has them replaced by the mitigation's kind, HybridNorm, or applies its own after
    them, nGPT), and takes a finite training step."""
    from deepnorm_exp.schemes import SCHEMES

    for norm in SCHEMES.names():
        overrides = [f"norm={norm}", "depth=2", f"model={model}", "model.qk_norm=rmsnorm"]
        net = tiny_model(*overrides)
        attentions = [m for m in net.modules() if hasattr(m, "q_norm")]
        assert attentions and all(isinstance(getattr(m.q_norm, "before", m.q_norm), torch.nn.RMSNorm)
                                  for m in attentions), norm
        extra = sum(p.numel() for m in attentions for p in (*m.q_norm.parameters(), *m.k_norm.parameters()))
        plain = tiny_model(*overrides[:-1])
        own = sum(p.numel() for m in plain.modules() if hasattr(m, "q_norm")
                  for p in (*m.q_norm.parameters(), *m.k_norm.parameters()))
        assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in plain.parameters()) - own + extra
        batch = ({"tokens": torch.randint(3, 32, (2, 9))} if model == "decoder" else
                 {"src": torch.randint(3, 32, (2, 6)), "tgt": torch.randint(3, 32, (2, 7))})
        loss = net.loss(batch).loss
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None), norm


@pytest.mark.slow
def test_swiglu_ffn_builds_and_trains_with_every_scheme():
    """`model.ffn=swiglu`: fc1 twice as wide, fc2(u * silu(v)), under every registered scheme."""
    from deepnorm_exp.schemes import SCHEMES

    for norm in SCHEMES.names():
        net = tiny_model(f"norm={norm}", "depth=2", "model.ffn=swiglu")
        ffn = net.blocks[0].ffn.sublayer
        assert ffn.fc1.out_features == 2 * ffn.fc2.in_features, norm
        x = torch.randn(2, 3, ffn.d_model)
        u, v = ffn.act_in(ffn.fc1(x)).chunk(2, dim=-1)
        assert torch.allclose(ffn.activation(ffn.act_in(ffn.fc1(x))), u * torch.nn.functional.silu(v)), norm
        loss = net.loss({"tokens": torch.randint(3, 32, (2, 9))}).loss
        loss.backward()
        assert torch.isfinite(loss), norm
