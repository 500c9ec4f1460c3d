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


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    tokens = torch.randint(0, 256, (4, 17))
    grads = []
    for ckpt in ("false", "true"):
        model = tiny_model("norm=deepnorm", f"model.activation_checkpointing={ckpt}", seed=1).train()
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


def test_the_paper_1000_layer_preset_builds_its_3_7b_parameter_model():
    """experiment=paper_1000l: 500L-500L, d 512, 8 heads, FFN 2048 (the paper: 3.8B with its 64k
    vocabulary; ours has the synthetic 256). Built on the meta device: shapes and init, no memory."""
    from deepnorm_exp.models import count_params

    cfg = deepnorm_exp.compose(["experiment=paper_1000l"])
    with torch.device("meta"):
        model = deepnorm_exp.build_model(cfg)
    assert len(model.encoder) == len(model.decoder) == 500
    assert count_params(model) == 3_678_339_072
