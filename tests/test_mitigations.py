"""The mitigations the field uses against training instabilities, each a key that composes with every scheme:
model.qk_norm (tests/test_model.py), model.attn_softcap, model.logit_softcap, train.z_loss and AdamW's
train.weight_decay. Each changes exactly what it says, against a computation written here, and is off by
default (tests/test_config.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

import deepnorm_exp
from deepnorm_exp.build import make_scheme
from deepnorm_exp.config import parse_section, TrainConfig
from deepnorm_exp.models.layers import AttentionSettings, CrossAttention, SelfAttention
from deepnorm_exp.schemes import SCHEMES
from deepnorm_exp.train.optim import build_optimizer, build_scheduler
from deepnorm_exp.train.trainer import Callback, Trainer

CPU = torch.device("cpu")
SMALL = ["depth=2", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "data.vocab_size=32", "data.classes=4"]
MITIGATIONS = {  # each at the documented example value
    "qk_norm": ["model.qk_norm=layernorm"],
    "attn_softcap": ["model.attn_softcap=50"],
    "logit_softcap": ["model.logit_softcap=30"],
    "z_loss": ["train.z_loss=1e-4"],
    "weight_decay": ["train.weight_decay=0.1"],
}


def tiny(*overrides, seed=0):
    torch.manual_seed(seed)
    cfg = deepnorm_exp.compose([*SMALL, *overrides])
    return cfg, deepnorm_exp.build_model(cfg)


def batch_for(model: str, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    if model == "decoder":
        return {"tokens": torch.randint(3, 32, (2, 9), generator=g)}
    return {"src": torch.randint(3, 32, (2, 6), generator=g), "tgt": torch.randint(3, 32, (2, 7), generator=g)}


def trainer_of(cfg, net, batches, steps, callbacks=()):
    """The trainer as a run assembles it (lifecycle/assemble.py): the scheme's pass before training and its
    parameter groups, AdamW and the schedule from `train`, z-loss."""
    train = parse_section(TrainConfig, cfg.train, "train")
    scheme = make_scheme(cfg)
    scheme.prepare(net, batches[0])
    optimizer = build_optimizer(net, train, scheme)
    return Trainer(model=net, optimizer=optimizer, scheduler=build_scheduler(optimizer, train), batches=iter(batches),
                   steps=steps, device=CPU, z_loss=train.z_loss, callbacks=list(callbacks))


# --- soft-capping ----------------------------------------------------------------------------------------
def by_hand_attention(q, k, v, cap, mask=None):
    scores = cap * torch.tanh(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    return scores.softmax(-1) @ v


def test_attention_softcap_bounds_the_logits_and_forward_applies_it():
    """|logit| <= cap after capping; forward is softmax(cap tanh(q.k / sqrt(d) / cap)) v written out here; a cap
    far above the logits gives the uncapped (SDPA) output."""
    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 16) * 5, torch.randn(2, 7, 16) * 5  # large inputs: logits well past the cap of 2
    for cap in (2.0, 1e9):
        attention, cross = SelfAttention(AttentionSettings(16, 2, softcap=cap)).eval(), CrossAttention(AttentionSettings(16, 2, softcap=cap)).eval()
        plain, plain_cross = SelfAttention(AttentionSettings(16, 2)).eval(), CrossAttention(AttentionSettings(16, 2)).eval()
        plain.load_state_dict(attention.state_dict())
        plain_cross.load_state_dict(cross.state_dict())
        with torch.no_grad():
            logits = attention.attention_logits(x)
            q, k, v = attention.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
            causal = torch.ones(5, 5, dtype=torch.bool).tril()
            expected = attention.out(by_hand_attention(q, k, v, cap, causal).transpose(1, 2).reshape(2, 5, 16))
            torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-5)
            cq = cross.q(x).view(2, 5, 2, 8).transpose(1, 2)
            ck, cv = (t.view(2, 7, 2, 8).transpose(1, 2) for t in cross.kv(memory).chunk(2, dim=-1))
            expected_cross = cross.out(by_hand_attention(cq, ck, cv, cap).transpose(1, 2).reshape(2, 5, 16))
            torch.testing.assert_close(cross(x, memory, None), expected_cross, rtol=1e-5, atol=1e-5)
            if cap == 2.0:
                finite = logits[logits.isfinite()]
                assert finite.abs().max() <= 2.0 and plain.attention_logits(x).isfinite().logical_and(
                    plain.attention_logits(x).abs() > 2.0).any()  # the cap was binding
            else:
                torch.testing.assert_close(attention(x), plain(x), rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(cross(x, memory, None), plain_cross(x, memory, None), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["decoder", "encdec"])
def test_logit_softcap_is_cap_tanh_of_the_same_models_logits(model):
    """The capped model has the uncapped one's weights (capping adds none) and its logits are exactly
    cap tanh(logits / cap) of the uncapped model's."""
    _, plain = tiny(f"model={model}")
    _, capped = tiny(f"model={model}", "model.logit_softcap=0.5")
    capped.load_state_dict(plain.state_dict())
    batch = batch_for(model)
    with torch.no_grad():
        args = (batch["tokens"],) if model == "decoder" else (batch["src"], batch["tgt"])
        raw, out = plain(*args), capped(*args)
    torch.testing.assert_close(out, 0.5 * torch.tanh(raw / 0.5))
    assert out.abs().max() <= 0.5 < raw.abs().max()


# --- z-loss ------------------------------------------------------------------------------------------------
def test_z_loss_adds_exactly_its_gradient_and_leaves_the_recorded_loss_alone():
    """One step's gradients with train.z_loss=c minus those without are c times the gradient of
    mean((logsumexp of the logits)^2), computed here from the logits; the loss the trainer reports is the
    cross-entropy both times."""
    batch = batch_for("decoder")
    grads, losses = {}, {}
    for c in (0.0, 0.5):
        cfg, net = tiny(f"train.z_loss={c}")
        trainer = trainer_of(cfg, net, [batch], 1)
        losses[c], *_ = trainer._forward_backward(batch)
        grads[c] = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    _, reference = tiny()
    logits = reference(batch["tokens"][:, :-1])
    z_term = torch.logsumexp(logits.double(), -1).square().mean()
    names, params = zip(*[(n, p) for n, p in reference.named_parameters() if n in grads[0.0]])
    expected = dict(zip(names, torch.autograd.grad(z_term, params)))
    assert losses[0.5] == losses[0.0]
    tokens = batch["tokens"]
    cross_entropy = F.cross_entropy(logits.detach().flatten(0, 1), tokens[:, 1:].flatten())
    assert losses[0.0] == pytest.approx(float(cross_entropy), rel=1e-6)
    for name in names:  # relative to the whole tensor: a difference of two fp32 gradients cancels digits
        difference, z_grad = (grads[0.5][name] - grads[0.0][name]).double(), 0.5 * expected[name].double()
        assert float((difference - z_grad).norm()) <= 1e-5 * float(z_grad.norm()) and z_grad.norm() > 0, name


def test_z_loss_pulls_log_z_toward_zero():
    """What z-loss is for: after the same 30 Adam steps on one batch, |mean log Z| is well below where the
    same run without z-loss leaves it (both start at the same log Z: the same initial weights)."""
    from deepnorm_exp.metrics.output_logits import OutputLogZ

    batch = batch_for("decoder")
    seen = {}
    for c in (0.0, 0.1):
        cfg, net = tiny(f"train.z_loss={c}", "train.warmup_steps=0", "train.schedule=constant", "train.lr=1e-2")
        seen[c] = []
        trainer_of(cfg, net, [batch] * 30, 30, [OutputLogZ(every=1), KeepLogZ(seen[c])]).fit()
    assert seen[0.0][0] == pytest.approx(seen[0.1][0]) and abs(seen[0.0][0]) > 1
    assert abs(seen[0.1][-1]) < 0.5 * abs(seen[0.0][-1]), seen


class KeepLogZ(Callback):
    def __init__(self, seen: list):
        self.seen = seen

    def on_step_end(self, trainer, out):
        self.seen.append(trainer.record["log_z_mean"])


# --- weight decay ----------------------------------------------------------------------------------------
def test_weight_decay_is_decoupled_adamw_shrinking_every_weight_by_lr_times_decay():
    """With a zero gradient (lr > 0, no loss) AdamW with decay wd moves each weight by exactly -lr wd theta."""
    cfg, net = tiny("train.weight_decay=0.1", "train.lr=1e-2", "train.warmup_steps=0", "train.schedule=constant")
    train = parse_section(TrainConfig, cfg.train, "train")
    optimizer = build_optimizer(net, train, None)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), before[n] * (1 - 1e-2 * 0.1), msg=n)


# --- every scheme with every mitigation -------------------------------------------------------------------
IN_PLACE = {  # what each mitigation's key must have put where it acts (its effect is tested above)
    # the norm itself, or inside the scheme's own q and k step (nGPT normalises after it)
    "qk_norm": lambda net, trainer: all(isinstance(getattr(m.q_norm, "before", m.q_norm), torch.nn.LayerNorm)
                                        for m in attentions(net)),
    "attn_softcap": lambda net, trainer: all(m.softcap == 50 for m in attentions(net)),
    "logit_softcap": lambda net, trainer: net.embed.softcap == 30,
    "z_loss": lambda net, trainer: trainer.z_loss == 1e-4,
    "weight_decay": lambda net, trainer: all(g["weight_decay"] == 0.1 for g in trainer.optimizer.param_groups),
}


def attentions(net):
    found = [m for m in net.modules() if isinstance(m, (SelfAttention, CrossAttention))]
    assert found
    return found


@pytest.mark.slow
@pytest.mark.parametrize("model", ["decoder", "encdec"])
@pytest.mark.parametrize("mitigation", sorted(MITIGATIONS))
def test_every_scheme_trains_a_few_steps_with_each_mitigation(model, mitigation):
    """Three AdamW steps through the trainer as a run assembles it, each scheme with the mitigation at its
    documented example value: in place where it acts, and finite losses after."""
    batches = [batch_for(model, seed) for seed in range(3)]
    for norm in SCHEMES.names():
        cfg, net = tiny(f"norm={norm}", f"model={model}", *MITIGATIONS[mitigation])
        trainer = trainer_of(cfg, net, batches, 3)
        trainer.fit()
        assert IN_PLACE[mitigation](net, trainer), (norm, mitigation)
        with torch.no_grad():
            assert all(math.isfinite(float(net.loss(b).loss)) for b in batches), (norm, mitigation)


def test_the_mitigation_studys_table_labels_runs_from_their_config_and_applies_its_rule():
    import pandas as pd

    from deepnorm_exp.analysis.mitigations import mitigation_of, mitigation_table, verdict

    def run(norm, seed, trained, **config):
        keys = {"model.qk_norm": "none", "model.attn_softcap": None, "model.logit_softcap": None,
                "train.z_loss": 0.0, "train.weight_decay": 0.0, **config}
        return {"norm": norm, "depth": 48, "seed": seed, "status": "completed", "trained": trained,
                "eval_loss": 3.0 + seed, "diagnosis.kind": "trained" if trained else "collapsed_at_init", **keys}

    runs = pd.DataFrame([run("post", 0, False), run("post", 1, False),
                         run("post", 0, True, **{"model.qk_norm": "layernorm"}),
                         run("post", 1, False, **{"model.qk_norm": "layernorm"}),
                         run("post", 0, False, **{"model.attn_softcap": 50.0, "model.logit_softcap": 30.0}),
                         run("post", 1, False, **{"model.attn_softcap": 50.0, "model.logit_softcap": 30.0}),
                         run("pre", 0, True), run("pre", 1, True),
                         run("pre", 0, False, **{"train.z_loss": 1e-4}), run("pre", 1, True, **{"train.z_loss": 1e-4})])
    assert list(mitigation_of(runs)) == ["none", "none", "qk_norm=layernorm", "qk_norm=layernorm",
                                         "attn_softcap=50, logit_softcap=30", "attn_softcap=50, logit_softcap=30",
                                         "none", "none", "z_loss=0.0001", "z_loss=0.0001"]
    table = mitigation_table(runs).set_index(["norm", "mitigation"])
    assert table.loc[("post", "qk_norm=layernorm"), "verdict"] == "lets it train"  # 1/2 with, 0/2 without
    assert table.loc[("post", "qk_norm=layernorm"), "trained"] == "1/2"
    assert table.loc[("post", "attn_softcap=50, logit_softcap=30"), "verdict"] == "no change in whether it trains"
    assert table.loc[("pre", "z_loss=0.0001"), "verdict"] == "no change in whether it trains"  # 1/2 still trains
    assert table.loc[("post", "none"), "diagnosis"] == "2 collapsed_at_init"
    assert verdict(1.0, 0.0) == "stops it training" and verdict(None, 1.0).startswith("no run without")
    # a run whose config.yaml was unreadable has no mitigation keys: unknown, and in neither side of a verdict
    unread = pd.concat([runs, pd.DataFrame([{"norm": "post", "depth": 48, "seed": 2, "status": "completed",
                                             "trained": True, "eval_loss": 3.0}])], ignore_index=True)
    assert mitigation_of(unread).iloc[-1] == "unknown"
    assert mitigation_table(unread).set_index(["norm", "mitigation"]).loc[("post", "none"), "trained"] == "0/2"
