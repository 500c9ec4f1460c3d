"""Encoder-decoder: per-stack constants and init, shapes, causality, padding, greedy decoding."""

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.models.encdec import BOS, EOS, PAD
from deepnorm_exp.schemes.base import xavier_std


def encdec(*overrides, seed=0):
    torch.manual_seed(seed)
    cfg = deepnorm_exp.compose(["model=encdec", "model.d_model=32", "model.n_heads=4", "model.d_ff=64", *overrides])
    return deepnorm_exp.build_model(cfg), cfg


@pytest.mark.parametrize("n,m", [(6, 6), (18, 6), (6, 18), (12, 3)])
def test_summary_constants_carry_both_stacks(n, m):
    from deepnorm_exp.build import make_scheme

    cfg = deepnorm_exp.compose(["model=encdec", "norm=deepnorm", f"model.encoder_depth={n}", f"model.decoder_depth={m}"])
    constants = make_scheme(cfg).constants()
    assert constants["residual_multiplier"] == pytest.approx({"encoder": 0.81 * (n**4 * m) ** (1 / 16), "decoder": (3 * m) ** 0.25})
    assert constants["init_gain"] == pytest.approx({"encoder": 0.87 * (n**4 * m) ** (-1 / 16), "decoder": (12 * m) ** -0.25})


def test_depth_sets_both_stacks_and_overrides_set_them_apart():
    model, _ = encdec("depth=4")
    assert (len(model.encoder), len(model.decoder)) == (4, 4)
    model, _ = encdec("depth=4", "model.encoder_depth=5", "model.decoder_depth=2")
    assert (len(model.encoder), len(model.decoder)) == (5, 2)


def test_init_statistics_per_stack_and_sublayer_cross_attention_included():
    model, _ = encdec("norm=deepnorm", "model.encoder_depth=16", "model.decoder_depth=8", "model.d_model=64",
                      "model.d_ff=256")
    n, m, d, d_ff = 16, 8, 64, 256
    beta = {"encoder": 0.87 * (n**4 * m) ** (-1 / 16), "decoder": (12 * m) ** -0.25}
    pooled = {}
    for stack, _, sub, block in model.residual_blocks():
        for role, weight, bias in block.sublayer.projections():
            pooled.setdefault((stack, sub, role), []).append(weight.detach().flatten())
            assert torch.count_nonzero(bias) == 0
    fans = {"fc1": (d, d_ff), "fc2": (d_ff, d)}
    assert {key[1] for key in pooled} == {"attn", "cross", "ffn"}
    for (stack, sub, role), weights in pooled.items():
        gain = beta[stack] if role in ("v", "out", "fc1", "fc2") else 1.0
        expected = xavier_std(*fans.get(role, (d, d)), gain=gain)
        assert torch.cat(weights).std().item() == pytest.approx(expected, rel=0.05), (stack, sub, role)


def batch(src_len=7, tgt_len=6, b=2):
    torch.manual_seed(1)
    src = torch.randint(3, 256, (b, src_len))
    tgt = torch.randint(3, 256, (b, tgt_len))
    tgt[:, 0] = BOS
    return src, tgt


@pytest.mark.parametrize("norm", ["post", "pre", "deepnorm"])
def test_future_target_tokens_never_change_earlier_logits(norm):
    model, _ = encdec(f"norm={norm}", "depth=2")
    model.eval()
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % 256
    a, b = model(src, tgt), model(src, changed)
    assert a.shape == (2, 6, 256)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("norm", ["post", "pre", "deepnorm"])
def test_a_padded_source_position_never_changes_the_output(norm):
    model, _ = encdec(f"norm={norm}", "depth=2")
    model.eval()
    src, tgt = batch()
    src[:, 5:] = PAD
    unpadded = src[:, :5]
    torch.testing.assert_close(model(src, tgt), model(unpadded, tgt))
    longer = torch.cat([src, torch.full((2, 3), PAD)], dim=1)  # more padding changes nothing either
    torch.testing.assert_close(model(src, tgt), model(longer, tgt))
    real = src.clone()
    real[:, 5:] = 17  # the mask is what makes this true: real tokens there do change the output
    assert not torch.allclose(model(src, tgt), model(real, tgt))


def test_source_content_reaches_the_decoder():
    model, _ = encdec("depth=1")
    model.eval()
    src, tgt = batch()
    other = src.clone()
    other[:, 0] = (other[:, 0] + 1) % 256
    assert not torch.allclose(model(src, tgt), model(other, tgt))


def test_loss_ignores_padding_and_counts_target_tokens():
    model, _ = encdec("depth=1")
    src, tgt = batch()
    tgt[0, 4:] = PAD
    both = model.loss({"src": src, "tgt": tgt})
    assert both.tokens == 3 + 5  # row 0: targets at positions 1-3; row 1: positions 1-5
    row0 = model.loss({"src": src[:1], "tgt": tgt[:1, :4]})
    row1 = model.loss({"src": src[1:], "tgt": tgt[1:]})
    expected = (row0.loss * row0.tokens + row1.loss * row1.tokens) / (row0.tokens + row1.tokens)
    assert both.loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_greedy_decode_stops_at_eos_and_pads(monkeypatch):
    """A scripted decoder (an untrained one may never emit EOS): row 0 ends at its 2nd token, row 1 at its
    4th; decoding stops once both have, and what follows an EOS is padding."""
    model, _ = encdec("depth=1")
    model.eval()
    src, _ = batch()
    eos_at = {0: 2, 1: 4}

    def scripted(out, memory, mask):
        position = out.shape[1]  # the token this call chooses (BOS is position 0)
        logits = torch.zeros(out.shape[0], out.shape[1], model.cfg.vocab_size)
        for row in range(out.shape[0]):
            logits[row, -1, EOS if position == eos_at[row] else 10 + position] = 1.0
        return logits

    monkeypatch.setattr(model, "decode", scripted)
    out = model.greedy_decode(src, max_len=8)
    assert out.tolist() == [[BOS, 11, EOS, PAD, PAD], [BOS, 11, 12, 13, EOS]]


def test_encoder_depth_is_rejected_for_the_decoder_only_model():
    from deepnorm_exp.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        deepnorm_exp.compose(["model=decoder", "model.encoder_depth=3"])
    assert err.value.key == "model.encoder_depth"


def test_untied_output_head():
    tied, _ = encdec("depth=1")
    untied, _ = encdec("depth=1", "model.tie_embeddings=false")
    assert tied.embed.head is None and untied.embed.head is not None
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 256 * 32
