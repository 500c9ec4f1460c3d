"""Instrumentation: every measurement against an independent computation, and what the paper's claims
look like when measured on tiny models."""

import copy
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call

import deepnorm_exp
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.metrics import BlockIndex, ParamBlocks, Probe, build_instruments, metrics_schema
from deepnorm_exp.metrics.activations import ActivationStats
from deepnorm_exp.metrics.gradients import LayerGradNorms
from deepnorm_exp.metrics.model_update import ModelUpdate
from deepnorm_exp.metrics.representation import RepresentationStats, kurtosis, token_cosine
from deepnorm_exp.metrics.updates import ParameterUpdates
from deepnorm_exp.models.layers import AttentionSettings, CrossAttention, SelfAttention
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.sinks.layers import load_layers
from deepnorm_exp.train.trainer import Callback, StepOutput, Trainer

from conftest import TINY

CPU = torch.device("cpu")


def tiny(*overrides, seed=0):
    torch.manual_seed(seed)
    cfg = deepnorm_exp.compose(["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "data.vocab_size=32",
                                "data.classes=4", *overrides])
    return deepnorm_exp.build_model(cfg)


def lm_batch(n=3, seq=9, vocab=32, seed=1):
    return {"tokens": torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))}


class Capture(Callback):
    """Keeps copies of what the other callbacks recorded (the trainer clears them after each step)."""

    def __init__(self):
        self.records, self.layers = {}, {}

    def on_step_end(self, trainer, out):
        self.records[out.step] = dict(trainer.record)
        self.layers[out.step] = dict(trainer.layer_record)


def sgd_trainer(model, batch, callbacks, lr=0.05, steps=1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    capture = Capture()
    trainer = Trainer(model=model, optimizer=opt, scheduler=sched, batches=iter([batch] * steps), steps=steps,
                      device=CPU, callbacks=[*callbacks, capture])
    return trainer, capture


def hand_sgd_step(model, batch, lr):
    """theta_1 = theta_0 - lr * grad, computed with autograd.grad on a copy; returns (theta_1, grads)."""
    reference = copy.deepcopy(model).train()
    names, params = zip(*[(n, p) for n, p in reference.named_parameters()])
    loss = reference.loss(batch).loss
    grads = torch.autograd.grad(loss, params)
    return reference, {n: (p - lr * g).detach() for n, p, g in zip(names, params, grads)}, dict(zip(names, grads))


# --- model update ------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["post", "deepnorm"])
def test_model_update_after_one_sgd_step_matches_the_hand_computation(norm):
    model = tiny(f"norm={norm}", "depth=2")
    batch, probe_batch = lm_batch(), lm_batch(n=2, seed=7)
    reference, theta_1, _ = hand_sgd_step(model, batch, lr=0.05)
    reference.eval()
    with torch.no_grad():
        f0 = reference.features(probe_batch)
        f1 = _features_with(reference, theta_1, probe_batch)
    # ||F1 - F0|| over the 2 x 8 probe positions, root-mean-squared: written out, not via the module.
    per_position = ((f1 - f0) ** 2).sum(-1)
    expected = math.sqrt(per_position.sum().item() / per_position.numel())

    trainer, capture = sgd_trainer(model, batch, [ModelUpdate(Probe(probe_batch, 2, CPU), every=1, model=model)])
    trainer.fit()
    got = capture.records[1]
    assert expected > 1e-4  # the step moved the output, so the comparison means something
    assert got["model_update"] == pytest.approx(expected, rel=1e-4)
    assert got["model_update_step"] == pytest.approx(expected, rel=1e-4)  # theta_{t-1} = theta_0 at step 1


def _features_with(model, params, batch):
    class Features(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, b):
            return self.inner.features(b)

    return functional_call(Features(model), {f"inner.{k}": v for k, v in params.items()}, (batch,))


def test_model_update_step_measures_only_the_last_step():
    model = tiny("norm=pre", "depth=2")
    probe = Probe(lm_batch(n=2, seed=7), 2, CPU)
    trainer, capture = sgd_trainer(model, lm_batch(), [ModelUpdate(probe, every=1, model=model)], lr=0.05, steps=3)
    snapshots = []

    class Snap(Callback):
        def on_step_end(self, trainer, out):
            snapshots.append(probe.features(trainer.model))

    trainer.callbacks = [*trainer.callbacks, Snap()]
    initial = probe.features(model)
    trainer.fit()
    from deepnorm_exp.metrics.probe import rms_distance

    assert capture.records[3]["model_update"] == pytest.approx(rms_distance(snapshots[2], initial), rel=1e-5)
    assert capture.records[3]["model_update_step"] == pytest.approx(rms_distance(snapshots[2], snapshots[1]),
                                                                    rel=1e-5)


# --- gradients and updates ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder", "encdec"])
def test_per_layer_grad_norms_equal_autograd_grad_per_block(kind):
    overrides = ["norm=post", "depth=3"] + (["model=encdec", "model.encoder_depth=2"] if kind == "encdec" else [])
    model = tiny(*overrides)
    if kind == "encdec":
        gen = torch.Generator().manual_seed(3)
        batch = {"src": torch.randint(3, 32, (2, 7), generator=gen), "tgt": torch.randint(3, 32, (2, 6), generator=gen)}
        batch["src"][0, 5:] = 0  # padding
    else:
        batch = lm_batch()
    index = BlockIndex.of(model)
    reference = copy.deepcopy(model).train()
    loss = reference.loss(batch).loss
    ref_blocks = [block for _, _, _, block in reference.residual_blocks()]
    expected = []
    for block in ref_blocks:
        grads = torch.autograd.grad(loss, list(block.parameters()), retain_graph=True)
        expected.append(math.sqrt(sum(float((g ** 2).sum()) for g in grads)))

    trainer, capture = sgd_trainer(model, batch, [LayerGradNorms(ParamBlocks(model, index), every=1)])
    trainer.fit()
    got = capture.layers[1]["grad_norm"]
    assert len(got) == len(index) == (2 * 2 + 3 * 3 if kind == "encdec" else 2 * 3)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_update_norms_of_an_sgd_step_are_lr_times_the_gradient():
    lr = 0.05
    model = tiny("norm=deepnorm", "depth=3")
    batch = lm_batch()
    _, theta_1, grads = hand_sgd_step(model, batch, lr)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    index = BlockIndex.of(model)
    trainer, capture = sgd_trainer(model, batch, [ParameterUpdates(ParamBlocks(model, index), 1, 1)], lr=lr)
    trainer.fit()
    grad_norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    theta_norm = math.sqrt(sum(float((p ** 2).sum()) for p in before.values()))
    assert capture.records[1]["update_norm"] == pytest.approx(lr * grad_norm, rel=1e-4)
    assert capture.records[1]["update_ratio"] == pytest.approx(lr * grad_norm / theta_norm, rel=1e-4)
    names = {p: n for n, p in model.named_parameters()}
    for position, block in enumerate(index.blocks):
        block_names = [names[p] for p in block.parameters()]
        delta = math.sqrt(sum(float(((theta_1[n] - before[n]) ** 2).sum()) for n in block_names))
        norm = math.sqrt(sum(float((before[n] ** 2).sum()) for n in block_names))
        assert capture.layers[1]["update_ratio"][position] == pytest.approx(delta / norm, rel=1e-3)


class KeepGrads(Callback):
    """Copies of every gradient at each step, before the optimizer uses them."""

    def __init__(self, model):
        self.model, self.grads = model, []

    def after_backward(self, trainer, out):
        self.grads.append({n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("eps", [1e-8, 1e-3])
def test_adam_state_is_m_hat_over_root_v_hat_from_the_gradients_by_hand(eps):
    """Three Adam steps; the moments rebuilt here from the gradients each step saw (m = b1 m + (1 - b1) g,
    v = b2 v + (1 - b2) g^2, bias-corrected) give each block's RMS of m_hat / (sqrt(v_hat) + eps) and share of
    sqrt(v_hat) under eps. eps 1e-3 puts many coordinates under it."""
    from deepnorm_exp.metrics.adam_state import AdamState

    model = tiny("norm=post", "depth=3")
    index = BlockIndex.of(model)
    betas = (0.9, 0.98)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=betas, eps=eps)
    keep, capture = KeepGrads(model), Capture()
    batches = [lm_batch(seed=s) for s in range(3)]
    trainer = Trainer(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                      batches=iter(batches), steps=3, device=CPU,
                      callbacks=[keep, AdamState(ParamBlocks(model, index), every=1), capture])
    trainer.fit()
    names = {p: n for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(g, dtype=torch.float64) for n, g in keep.grads[0].items()}
    v = {n: torch.zeros_like(g, dtype=torch.float64) for n, g in keep.grads[0].items()}
    for t, grads in enumerate(keep.grads, start=1):
        for n, g in grads.items():
            m[n] = betas[0] * m[n] + (1 - betas[0]) * g.double()
            v[n] = betas[1] * v[n] + (1 - betas[1]) * g.double() ** 2
        rms, below = [], []
        for block in index.blocks:
            us, roots = [], []
            for p in block.parameters():
                n = names[p]
                root = (v[n] / (1 - betas[1] ** t)).sqrt()
                us.append(((m[n] / (1 - betas[0] ** t)) / (root + eps)).flatten())
                roots.append(root.flatten())
            u, root = torch.cat(us), torch.cat(roots)
            rms.append(float(u.square().mean().sqrt()))
            below.append(float((root < eps).double().mean()))
        np.testing.assert_allclose(capture.layers[t]["adam_update_rms"], rms, rtol=1e-4)
        np.testing.assert_allclose(capture.layers[t]["adam_below_eps"], below, atol=1e-6)
    # The FFN blocks (odd positions) have no coordinate whose gradient is exactly zero, so none is under
    # eps 1e-8, and some are under 1e-3. (Attention blocks always have some: the k bias's gradient is exactly
    # zero, softmax ignoring a shift shared by a query's logits.)
    assert bool((capture.layers[3]["adam_below_eps"][1::2] > 0).all()) == (eps == 1e-3)
    assert (capture.layers[3]["adam_below_eps"][0::2] > 0).all()


def test_adam_state_records_nothing_under_sgd():
    from deepnorm_exp.metrics.adam_state import AdamState

    model = tiny("depth=2")
    trainer, capture = sgd_trainer(model, lm_batch(), [AdamState(ParamBlocks(model, BlockIndex.of(model)), every=1)])
    trainer.fit()
    assert "adam_update_rms" not in capture.layers[1]


@pytest.mark.parametrize("kind", ["decoder", "encdec"])
def test_weight_norms_are_each_blocks_weights_and_its_q_and_k_matrices(kind):
    """At step 0 and after an SGD step: the L2 norm of each block's parameters, and of its q and k weight
    matrices, read here from the fused projection by row ranges (self-attention: rows 0-d, d-2d of qkv;
    cross-attention: q, and rows 0-d of kv); NaN for FFN blocks."""
    from deepnorm_exp.metrics.weights import WeightNorms

    overrides = ["norm=deepnorm", "depth=2"] + (["model=encdec"] if kind == "encdec" else [])
    model = tiny(*overrides)
    batch = lm_batch() if kind == "decoder" else {"src": torch.randint(3, 32, (2, 6)), "tgt": torch.randint(3, 32, (2, 5))}
    index = BlockIndex.of(model)

    class AtStart(Callback):
        def on_train_start(self, trainer):
            self.layers = dict(trainer.layer_record)

    start = AtStart()
    trainer, capture = sgd_trainer(model, batch, [WeightNorms(index, ParamBlocks(model, index), every=1), start])

    def expected():
        d = 16
        out = {"param_norm": [], "wq_norm": [], "wk_norm": []}
        for sub, block in zip(index.sublayers, index.blocks):
            out["param_norm"].append(float(torch.cat([p.detach().flatten() for p in block.parameters()]).norm()))
            layer = block.sublayer
            if sub == "attn":
                q, k = layer.qkv.weight[:d], layer.qkv.weight[d:2 * d]
            elif sub == "cross":
                q, k = layer.q.weight, layer.kv.weight[:d]
            else:
                q = k = torch.tensor(math.nan)
            out["wq_norm"].append(float(q.detach().norm()))
            out["wk_norm"].append(float(k.detach().norm()))
        return out

    before = expected()
    trainer.fit()
    for when, layers in ((before, start.layers), (expected(), capture.layers[1])):
        for name, values in when.items():
            np.testing.assert_allclose(layers[name], values, rtol=1e-5, err_msg=name)
    assert before["param_norm"] != expected()["param_norm"]  # the step moved them: step 1 is not step 0 again


# --- activations --------------------------------------------------------------------------------------
def test_attention_probs_reproduce_the_sdpa_outputs():
    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    key_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    key_mask[1, ..., 3:] = False
    memory_mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    memory_mask[0, ..., 4:] = False

    def by_hand(attn, probs, values):
        heads = probs @ values.view(2, -1, 2, 8).transpose(1, 2)
        return attn.out(heads.transpose(1, 2).reshape(2, -1, 16))

    causal, bidirectional = SelfAttention(AttentionSettings(16, 2)).eval(), SelfAttention(AttentionSettings(16, 2), causal=False).eval()
    cross = CrossAttention(AttentionSettings(16, 2)).eval()
    with torch.no_grad():
        for attn, mask in ((causal, None), (bidirectional, key_mask)):
            probs = attn.attention_probs(x, mask)
            assert torch.allclose(probs.sum(-1), torch.ones(()))
            torch.testing.assert_close(by_hand(attn, probs, attn.qkv(x)[..., 32:]), attn(x, mask))
        probs = cross.attention_probs(x, memory, memory_mask)
        torch.testing.assert_close(by_hand(cross, probs, cross.kv(memory)[..., 16:]), cross(x, memory, memory_mask))
        assert float(probs[0, ..., 4:].abs().max()) == 0.0


def test_activation_stats_match_direct_computations():
    """Zeroed q/k make causal attention uniform: query i's entropy is log(i + 1), exactly."""
    model = tiny("norm=pre", "depth=2").eval()
    with torch.no_grad():
        for _, _, name, block in model.residual_blocks():
            if name == "attn":
                block.sublayer.qkv.weight[:32].zero_()
                block.sublayer.qkv.bias[:32].zero_()
    probe_batch = lm_batch(n=2, seq=9)
    stats = ActivationStats(BlockIndex.of(model), Probe(probe_batch, 2, CPU), every=1).measure(model)
    entropy = float(torch.log(torch.arange(1, 9, dtype=torch.float32)).mean())
    np.testing.assert_allclose(stats["attn_entropy"][[0, 2]], entropy, rtol=1e-5)
    assert np.isnan(stats["attn_entropy"][[1, 3]]).all()  # FFN blocks have no attention
    with torch.no_grad():  # Pre-LN: the first block's LN reads the embeddings; its sublayer sees LN(x)
        x = model.embed(probe_batch["tokens"][:, :-1])
        first = model.blocks[0].attn
        out = first.sublayer(first.norm(x))
    assert stats["ln_input_norm"][0] == pytest.approx(float(x.norm(dim=-1).mean()), rel=1e-5)
    assert stats["out_norm"][0] == pytest.approx(float(out.norm(dim=-1).mean()), rel=1e-5)


# --- representation: rank collapse, outliers, attention logits -----------------------------------------
def test_representation_stats_match_a_block_by_block_forward_written_here():
    """Each block's output recomputed by running the blocks in order (the model's own loop not used), and
    each measure computed another way: pairwise cosines with F.cosine_similarity, kurtosis with numpy, the
    attention logits from the fused q/k weights by einsum under the causal mask."""
    model = tiny("norm=post", "depth=2").eval()
    batch = lm_batch(n=2, seq=9)
    stats = RepresentationStats(BlockIndex.of(model), Probe(batch, 2, CPU), every=1).measure(model)
    with torch.no_grad():
        x = model.embed(batch["tokens"][:, :-1])
        position = 0
        for layer in model.blocks:
            for name in ("attn", "ffn"):
                block = getattr(layer, name)
                if name == "attn":
                    q, k = (w.view(2, 8, 16) for w in block.sublayer.qkv.weight[:32].split(16))
                    h = x  # Post-LN: the sublayer reads the residual stream itself
                    bq, bk = block.sublayer.qkv.bias[:32].split(16)
                    logits = torch.einsum("bqhe,bkhe->bhqk", (torch.einsum("bsd,hed->bshe", h, q) + bq.view(2, 8)),
                                          (torch.einsum("bsd,hed->bshe", h, k) + bk.view(2, 8))) / math.sqrt(8)
                    allowed = torch.ones(8, 8, dtype=torch.bool).tril()
                    assert stats["attn_logit_max"][position] == pytest.approx(float(logits[..., allowed].abs().max()),
                                                                              rel=1e-5)
                else:
                    assert np.isnan(stats["attn_logit_max"][position])
                x = block(x)
                cosines = [float(torch.nn.functional.cosine_similarity(x[b, i], x[b, j], dim=0))
                           for b in range(2) for i in range(8) for j in range(8) if i != j]
                assert stats["token_cosine"][position] == pytest.approx(np.mean(cosines), rel=1e-5)
                values = x.numpy().astype(np.float64).ravel()
                moment = ((values - values.mean()) ** 4).mean() / values.var() ** 2
                assert stats["act_kurtosis"][position] == pytest.approx(moment, rel=1e-5)
                assert stats["act_max"][position] == pytest.approx(float(np.abs(values).max()), rel=1e-6)
                position += 1


def test_representation_stats_of_a_model_whose_activations_overflow_are_nan_not_an_error():
    """DeepNorm with alpha 1e30: the residual stream overflows, the logits are not finite."""
    model = tiny("norm=deepnorm", "depth=2", "norm.alpha=1e30").eval()
    stats = RepresentationStats(BlockIndex.of(model), Probe(lm_batch(n=2, seq=9), 2, CPU), every=1).measure(model)
    assert np.isnan(stats["attn_logit_max"][2])  # the second layer's attention reads the overflowed stream


def _numpy_sinkhorn(logits: np.ndarray, rounds: int) -> np.ndarray:
    m = np.exp(logits)
    for _ in range(rounds):
        m = m / m.sum(axis=0, keepdims=True)  # columns
        m = m / m.sum(axis=1, keepdims=True)  # then rows
    return m


@pytest.mark.parametrize("norm", ["hyper_connections", "mhc", "frac_connections"])
def test_stream_mixing_matches_numpy_on_static_mixings_drawn_away(norm):
    """Static connections (norm.dynamic=false: H_res the same at every position), their weights drawn off
    the init: each block's H_res rebuilt from its parameters with numpy (HC: A_r transposed; mHC: Sinkhorn
    of exp(b_res), columns then rows; frac-connections: R transposed, the fractions its streams), its spectral
    norm by SVD, its distance from doubly stochastic by definition, and the gains of the running product
    within each stack (encoder, then decoder afresh)."""
    from deepnorm_exp.metrics.stream_mixing import StreamMixing

    n = ["norm.fractions=3", "model.d_model=48"] if norm == "frac_connections" else ["norm.streams=3"]
    model = tiny(f"norm={norm}", "norm.dynamic=false", "model=encdec", "depth=2", *n).double().eval()
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():  # HC's [A_m | A_r], mHC's [b_pre | b_post | b_res], FC's [A | R | B]
            if p.dim() <= 2 and p.shape[-1] in (3 + 1, 3 + 3 + 9, 3 * 3):
                p.add_(0.4 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    index = BlockIndex.of(model)
    batch = {"src": lm_batch(n=2, seq=7)["tokens"], "tgt": lm_batch(n=2, seq=9, seed=2)["tokens"]}
    stats = StreamMixing(index, Probe(batch, 2, CPU), every=1).measure(model)
    products = {}
    for position, (block, stack) in enumerate(zip(index.blocks, index.stacks)):
        if norm == "mhc":
            h = _numpy_sinkhorn(block.bias.detach().numpy()[6:].reshape(3, 3), 20)
        elif norm == "frac_connections":
            h = block.static.detach().numpy()[:, 3:6].T
        else:
            h = block.static_alpha.detach().numpy()[:, 1:].T
        products[stack] = h @ products[stack] if stack in products else h
        product = products[stack]
        distance = max(np.abs(h.sum(1) - 1).max(), np.abs(h.sum(0) - 1).max(), max(0.0, -h.min()))
        expected = {"mix_spectral_norm": np.linalg.svd(h, compute_uv=False)[0], "mix_ds_distance": distance,
                    "mix_gain_forward": np.abs(product).sum(1).max(), "mix_gain_backward": np.abs(product).sum(0).max()}
        for name, value in expected.items():
            assert stats[name][position] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, position)
    if norm != "mhc":  # drawn away, A_r (R) is far from doubly stochastic and its product grows
        assert stats["mix_ds_distance"].min() > 0.1 and stats["mix_gain_forward"][-1] > 1.5
    else:  # Sinkhorn: every H_res doubly stochastic to its rounds, so no product can grow
        assert stats["mix_ds_distance"].max() < 1e-6 and stats["mix_gain_forward"].max() < 1 + 1e-6


def test_stream_mixing_records_a_blow_up_as_inf_and_reads_dynamic_products_per_position():
    """Per position, the composite product of two dynamic mHC blocks' H_res and its gains recomputed with
    numpy from the mixings captured at each block; a position whose H_res is infinite makes the gain inf,
    not NaN (the rule reading it would stay silent on NaN); `largest` leaves NaN positions out."""
    from deepnorm_exp.metrics.stream_mixing import StreamMixing, largest

    model = tiny("norm=mhc", "depth=2").eval()
    index = BlockIndex.of(model)
    with torch.no_grad():
        for block in index.blocks:
            block.mapping.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
            block.gates.fill_(1.0)
    captured = []
    for block in index.blocks:
        block.register_forward_pre_hook(lambda module, args: captured.append(
            module.stream_mixing(args[0].detach().unflatten(-1, (4, -1))).double().numpy()))
    stats = StreamMixing(index, Probe(lm_batch(n=2, seq=9), 2, CPU), every=1).measure(model)
    mixings = captured[-len(index.blocks):]  # the instrument's own forward
    product = np.einsum("btij,btjk->btik", mixings[1], mixings[0])
    assert stats["mix_gain_forward"][1] == pytest.approx(np.abs(product).sum(-1).max(), rel=1e-6)
    assert stats["mix_gain_backward"][1] == pytest.approx(np.abs(product).sum(-2).max(), rel=1e-6)
    assert largest(torch.tensor([1.0, math.nan, 3.0])) == 3.0 and math.isnan(largest(torch.tensor([math.nan])))
    assert largest(torch.tensor([1.0, math.inf])) == math.inf
    hc = tiny("norm=hyper_connections", "norm.dynamic=false", "depth=2").eval()
    with torch.no_grad():
        BlockIndex.of(hc).blocks[0].static_alpha[0, 1] = math.inf
    blown = StreamMixing(BlockIndex.of(hc), Probe(lm_batch(n=2, seq=9), 2, CPU), every=1).measure(hc)
    assert blown["mix_gain_forward"][0] == math.inf and math.isnan(blown["mix_spectral_norm"][0])


def test_stream_mixing_is_installed_only_for_multi_stream_schemes_and_dynamic_mixing_is_read_per_position():
    """A single-stream scheme records no mix columns; HC's dynamic H_res at init is I at every position
    (gains 1); mHC's dynamic one after weights drawn away differs by position, and the largest over the
    probe's positions is what is recorded."""
    from deepnorm_exp.metrics import Context, SharedConfig, parse_metrics
    from deepnorm_exp.metrics.stream_mixing import StreamMixing, build

    cfg = parse_metrics(deepnorm_exp.compose([])["metrics"])
    batch = lm_batch(n=2, seq=9)
    assert build(cfg, Context(cfg, 1, tiny("norm=pre", "depth=2"), batch, CPU)) is None
    model = tiny("norm=hyper_connections", "depth=2").eval()
    stats = StreamMixing(BlockIndex.of(model), Probe(batch, 2, CPU), every=1).measure(model)
    assert all(np.allclose(stats[name], 1.0) for name in ("mix_spectral_norm", "mix_gain_forward", "mix_gain_backward"))
    assert np.allclose(stats["mix_ds_distance"], 0.0)
    model = tiny("norm=mhc", "depth=2").eval()
    block = BlockIndex.of(model).blocks[1]
    with torch.no_grad():
        block.mapping.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
        block.gates.fill_(1.0)
    captured = {}
    block.register_forward_pre_hook(lambda module, args: captured.setdefault("state", args[0].detach()))
    stats = StreamMixing(BlockIndex.of(model), Probe(batch, 2, CPU), every=1).measure(model)
    with torch.no_grad():
        per_position = torch.linalg.matrix_norm(block.stream_mixing(captured["state"].unflatten(-1, (4, -1))).double(), ord=2)
    assert per_position.std() > 0 and stats["mix_spectral_norm"][1] == pytest.approx(float(per_position.max()), rel=1e-6)


def test_token_cosine_reads_collapse_as_one_and_orthogonal_positions_as_zero():
    same = torch.randn(1, 1, 6).expand(3, 5, 6)
    assert token_cosine(same) == pytest.approx(1.0)
    assert token_cosine(torch.eye(4).unsqueeze(0)) == pytest.approx(0.0, abs=1e-7)
    assert math.isnan(token_cosine(torch.randn(2, 1, 6)))
    assert kurtosis(torch.randn(200_000, generator=torch.Generator().manual_seed(0))) == pytest.approx(3.0, abs=0.05)


# --- loss spikes ------------------------------------------------------------------------------------------
class FakeTrainer:
    def __init__(self, steps):
        self.steps, self.events, self.record = steps, [], {}


def test_loss_spikes_are_the_steps_a_pandas_rolling_median_and_mad_flag():
    """A noisy falling loss with three planted spikes and one non-finite step: the callback's spikes are the
    steps pandas finds (median and MAD of the 20 finite losses before each step), and a resumed callback
    (its state through a checkpoint's round trip) counts as the uninterrupted one."""
    import pandas as pd

    from deepnorm_exp.metrics.spikes import MAD_TO_SIGMA, LossSpikes

    rng = np.random.default_rng(0)
    losses = list(4 - np.linspace(0, 1, 200) + 0.02 * rng.standard_normal(200))
    for step in (50, 120, 121):
        losses[step] += 1.0
    losses[80] = float("nan")
    window, k = 20, 6.0
    finite = pd.Series([loss for loss in losses if math.isfinite(loss)])
    median = finite.rolling(window).median().shift(1)
    mad = finite.rolling(window).apply(lambda w: np.median(np.abs(w - np.median(w)))).shift(1) * MAD_TO_SIGMA
    finite_steps = [i + 1 for i, loss in enumerate(losses) if math.isfinite(loss)]
    expected = [finite_steps[i] for i in finite.index if finite[i] > median[i] + k * mad[i]]
    assert expected == [51, 121, 122]  # a median is robust to one spike in its window: both neighbours count

    def run(steps, callback, trainer):
        for step in steps:
            callback.on_step_end(trainer, StepOutput(step=step, loss=losses[step - 1], grad_norm=1.0, lr=1e-3,
                                                     tokens=1))
    whole, trainer = LossSpikes(window, k, every=10), FakeTrainer(200)
    run(range(1, 201), whole, trainer)
    assert [e["step"] for e in trainer.events] == expected and trainer.record["loss_spikes"] == 3
    first, resumed = LossSpikes(window, k, every=10), LossSpikes(window, k, every=10)
    run(range(1, 101), first, FakeTrainer(200))
    state = torch.load(_round_trip(first.state_dict()), weights_only=True)
    resumed.load_state_dict(state)
    rest = FakeTrainer(200)
    run(range(101, 201), resumed, rest)
    assert [e["step"] for e in rest.events] == [121, 122] and rest.record["loss_spikes"] == 3


def _round_trip(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("model", ["decoder", "encdec"])
def test_log_z_is_the_logsumexp_of_the_logits_the_step_trained_on_padding_left_out(model):
    from deepnorm_exp.metrics.output_logits import OutputLogZ
    from deepnorm_exp.models.encdec import PAD

    net = tiny("depth=2", f"model={model}")
    if model == "decoder":
        batch = lm_batch()
        with torch.no_grad():  # the weights the step's forward saw
            logits, kept = net(batch["tokens"][:, :-1]), torch.ones(3, 8, dtype=torch.bool)
    else:
        src, tgt = torch.randint(3, 32, (2, 6)), torch.randint(3, 32, (2, 7))
        tgt[0, 4:] = PAD
        batch = {"src": src, "tgt": tgt}
        with torch.no_grad():
            logits, kept = net(src, tgt[:, :-1]), tgt[:, 1:] != PAD
    by_hand = torch.logsumexp(logits.double(), -1)[kept]  # float64, only the real targets
    trainer, capture = sgd_trainer(net, batch, [OutputLogZ(every=1)])
    trainer.fit()
    assert capture.records[1]["log_z_mean"] == pytest.approx(float(by_hand.mean()), rel=1e-5)
    assert capture.records[1]["log_z_abs_max"] == pytest.approx(float(by_hand.abs().max()), rel=1e-5)
    assert kept.sum() < kept.numel() or model == "decoder"


def test_a_flat_loss_has_no_spikes_and_the_keys_are_checked():
    from deepnorm_exp.metrics.spikes import is_spike

    assert is_spike(5.0, [1.0] * 10, 6.0)[0] is False  # zero deviation: no scale to be far on
    from deepnorm_exp.metrics import parse_metrics

    with pytest.raises(ConfigError, match=r"^metrics.spike_window=2 is invalid: must be >= 3"):
        parse_metrics({"spike_window": 2})
    with pytest.raises(ConfigError, match=r"^metrics.spike_k=0.0 is invalid: must be > 0"):
        parse_metrics({"spike_k": 0.0})


# --- no effect on training, records on disk ----------------------------------------------------------
def test_instruments_never_change_what_training_computes(tmp_path):
    """With dropout on (training draws random numbers), every metric on every step vs none: same losses."""
    losses = {}
    for name, metrics in (("off", ["metrics=off"]),
                          ("all", ["train.log_every=1", "metrics.layer_every=1", "metrics.probe_batch=3"])):
        cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path / name}", "logger=none", "model.dropout=0.2",
                                    "train.log_every=1", *metrics])
        summary = run_experiment(cfg, progress=False)
        lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        losses[name] = [(r["step"], r["loss"], r["grad_norm"]) for r in records if "loss" in r]
        assert summary["status"] == "completed"
    assert len(losses["all"]) == 6 and losses["all"] == losses["off"]


def test_layer_files_hold_every_block_at_every_measured_step(tmp_path):
    cfg = deepnorm_exp.compose([*TINY, f"paths.runs={tmp_path}", "logger=none", "model=encdec", "depth=2",
                                "model.decoder_depth=3", "train.steps=7", "metrics.layer_every=3",
                                "data.translation_max_len=6"])
    summary = run_experiment(cfg, progress=False)
    layers = load_layers(summary["run_dir"])
    blocks = 2 * 2 + 3 * 3
    assert sorted(layers.step.unique()) == [0, 3, 6, 7]  # init, every 3 steps, and the last step
    assert len(layers) == 4 * blocks
    assert set(layers.columns) >= {"step", "stack", "layer", "sublayer", "position", "grad_norm",
                                   "update_ratio", "ln_input_norm", "out_norm", "attn_entropy", "token_cosine",
                                   "act_max", "act_kurtosis", "attn_logit_max"}
    at3 = layers[layers.step == 3]
    assert list(at3.position) == list(range(blocks))
    assert set(at3[at3["stack"] == "decoder"].sublayer) == {"attn", "cross", "ffn"}
    assert at3.grad_norm.gt(0).all() and at3.update_ratio.gt(0).all() and at3.ln_input_norm.gt(0).all()
    assert at3[at3.sublayer == "ffn"].attn_entropy.isna().all()
    assert at3[at3.sublayer != "ffn"].attn_entropy.gt(0).all()
    assert layers[layers.step == 0].grad_norm.isna().all()  # nothing to measure before a backward
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "update_norm", "update_ratio", "model_update",
            "model_update_step", "eval_loss"} <= set().union(*(json.loads(line) for line in lines))


def test_turning_metrics_off_installs_nothing():
    model = tiny("depth=2")
    MetricsConfig = metrics_schema()
    off = MetricsConfig(update_norm=False, model_update=False, layer_every=0, spikes=False, log_z=False)
    assert build_instruments(off, 10, model, lm_batch(), CPU)[0] == []
    only_grads = MetricsConfig(update_norm=False, model_update=False, activations=False, layer_updates=False,
                               representation=False, spikes=False, log_z=False, adam_state=False,
                               weight_norms=False)
    assert [type(i).__name__ for i in build_instruments(only_grads, 10, model, lm_batch(), CPU)[0]] == \
        ["LayerGradNorms"]


@pytest.mark.parametrize("key,value", [("metrics.layer_every", -1), ("metrics.probe_batch", 0)])
def test_bad_metrics_config_names_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        deepnorm_exp.compose([f"{key}={value}"])


# --- the paper's measurements, at laptop scale ---------------------------------------------------------
@pytest.fixture(scope="module")
def depth50_layers(tmp_path_factory):
    """Post-LN, Pre-LN and DeepNorm, 50 layers, measured at init and after 10 steps of Adam at lr 1e-3."""
    root = tmp_path_factory.mktemp("depth50")
    out = {}
    for norm in ("post", "pre", "deepnorm"):
        cfg = deepnorm_exp.compose([*TINY, f"paths.runs={root}", "logger=none", f"norm={norm}", "depth=50",
                                    "model.d_model=32", "model.d_ff=128", "train.steps=10", "train.lr=1e-3",
                                    "train.warmup_steps=0", "train.eval_every=100", "metrics.layer_every=10"])
        summary = run_experiment(cfg, progress=False)
        out[norm] = (load_layers(summary["run_dir"]), summary["residual_multiplier"]["decoder"])
    return out


def test_post_ln_inputs_grow_past_the_residual_scale_and_deepnorm_stays_near_it(depth50_layers):
    """The paper: ||x|| entering Post-LN's LayerNorms grows beyond sqrt(d), shrinking the gradient through
    them (||dLN/dx|| = O(sqrt(d)/||x||)). DeepNorm multiplies x by alpha on purpose, so its raw LN input is
    alpha*sqrt(d) from the start; what the argument needs is the input in units of alpha*sqrt(d), the scale
    at which the residual path passes gradient through the LN unattenuated."""
    d = 32
    post, _ = depth50_layers["post"]
    deep, alpha = depth50_layers["deepnorm"]
    deep_at_init = deep[deep.step == 0].ln_input_norm
    assert deep_at_init.mean() == pytest.approx(alpha * math.sqrt(d), rel=0.05)  # measured, then compared
    post_10 = post[post.step == 10].ln_input_norm.mean() / math.sqrt(d)
    deep_10 = deep[deep.step == 10].ln_input_norm.mean() / (alpha * math.sqrt(d))
    assert post_10 > deep_10 * 1.1
    growth = {name: frame[frame.step == 10].ln_input_norm.mean() / frame[frame.step == 0].ln_input_norm.mean()
              for name, (frame, _) in depth50_layers.items() if name != "pre"}
    assert growth["post"] > growth["deepnorm"]


def test_gradient_profiles_post_vanishes_at_the_bottom_pre_grows_there_deepnorm_stays_flat(depth50_layers):
    """Mean gradient norm of the 10 bottom blocks over the 10 top blocks, after 10 steps. Measured here
    (d 32): Post-LN ~0.003, DeepNorm ~0.3, Pre-LN ~2 (at init all three are between 0.7 and 3)."""
    def bottom_over_top(norm):
        frame = depth50_layers[norm][0]
        at = frame[frame.step == 10].sort_values("position")
        return at.grad_norm.head(10).mean() / at.grad_norm.tail(10).mean()

    assert bottom_over_top("post") < 0.03
    assert bottom_over_top("deepnorm") > 0.1
    assert bottom_over_top("pre") > 1.0


def test_flops_per_token_counts_every_matrix_and_the_attention():
    """Against the formula written out by hand (PaLM appendix B): 6 per weight of each matrix a token
    passes (q, k, v, out, fc1, fc2 per layer; the tied output head), 12 d T per attention sublayer."""
    from deepnorm_exp.train.throughput import flops_per_token

    d, d_ff, vocab, layers, context = 16, 32, 32, 6, 24
    matrices = layers * (4 * d * d + 2 * d * d_ff) + vocab * d
    assert flops_per_token(tiny(), context) == 6 * matrices + 12 * d * context * layers
    untied = tiny("model.tie_embeddings=false")  # its own head: still counted once, as a matrix
    assert flops_per_token(untied, context) == 6 * matrices + 12 * d * context * layers
    encdec = tiny("model=encdec")  # self-attention in both stacks, cross-attention in the decoder
    encoder_decoder_matrices = layers * (4 * d * d + 2 * d * d_ff) + layers * (8 * d * d + 2 * d * d_ff) + vocab * d
    assert flops_per_token(encdec, context) == 6 * encoder_decoder_matrices + 12 * d * context * 3 * layers


def test_throughput_reports_achieved_flops_and_mfu_against_the_peak():
    from deepnorm_exp.train.throughput import PEAK_BF16_TFLOPS, Throughput, peak_flops

    class Record:
        record = {"tokens_per_s": 1000.0}

    throughput = Throughput(flops_per_token=6e9, peak=989e12, processes=2)
    throughput.on_step_end(Record, None)
    assert Record.record["flops_per_s"] == 6e12 and Record.record["mfu"] == pytest.approx(6e12 / (2 * 989e12))
    assert peak_flops(CPU, None) is None and peak_flops(CPU, 100.0) == 100e12
    assert PEAK_BF16_TFLOPS["H200"] == 989.0  # dense bf16, the datasheet's figure without sparsity


def test_an_instrument_is_one_module_that_registers_its_keys_and_its_builder():
    """What adding a metric takes, besides its line in conf/metrics/default.yaml: a module that registers
    its `metrics.*` keys and a builder (here made in the test). The section's schema, its checks and the
    callbacks a run installs follow without an edit anywhere else."""
    from dataclasses import dataclass

    from deepnorm_exp.metrics import INSTRUMENTS, instrument

    @dataclass
    class LossEchoConfig:
        loss_echo: bool = False  # a test instrument

    class LossEcho(Callback):
        pass

    @instrument("loss_echo", LossEchoConfig, order=99)
    def build(cfg, context):
        return LossEcho() if cfg.loss_echo else None

    metrics_schema.cache_clear()
    try:
        assert "loss_echo" in {f.name for f in dataclasses.fields(metrics_schema())}
        cfg = deepnorm_exp.compose(["+metrics.loss_echo=true"])
        model = tiny("depth=2")
        assert type(build_instruments(cfg.metrics, 10, model, lm_batch(), CPU)[0][-1]).__name__ == "LossEcho"
        assert deepnorm_exp.compose([]).metrics.loss_echo is False  # its default, in every run's config
        with pytest.raises(ConfigError, match="metrics.loss_echo"):
            deepnorm_exp.compose(["+metrics.loss_echo=maybe"])
    finally:
        INSTRUMENTS._items.pop("loss_echo")
        metrics_schema.cache_clear()
    assert "loss_echo" not in {f.name for f in dataclasses.fields(metrics_schema())}
