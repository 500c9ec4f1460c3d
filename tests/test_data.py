"""The synthetic language: determinism, exact optimal loss, cache behaviour."""

import numpy as np
import pytest
import torch

import deepnorm_exp
from deepnorm_exp.data import load_data, unigram_loss
from deepnorm_exp.data.synthetic import MarkovLanguage, SyntheticConfig, SyntheticMarkov
from deepnorm_exp.lifecycle.run import run_experiment

from conftest import TINY_MODEL, write_text

SMALL = {"name": "synthetic", "vocab_size": 64, "classes": 8, "seq_len": 16, "train_sequences": 200,
         "eval_sequences": 50}


def test_same_seed_same_tokens_in_separate_caches(tmp_path):
    a = load_data(SMALL, tmp_path / "a")
    b = load_data(SMALL, tmp_path / "b")
    assert torch.equal(a.train["tokens"], b.train["tokens"]) and torch.equal(a.eval["tokens"], b.eval["tokens"])
    assert a.optimal_loss == b.optimal_loss
    c = load_data({**SMALL, "seed": 7}, tmp_path / "c")
    assert not torch.equal(a.train["tokens"], c.train["tokens"])


def test_known_tokens_pin_the_generator(tmp_path):
    """Same seed, same tokens on any machine: numpy's PCG64 and float64 sampling are platform-independent,
    so these values (recorded when the generator was written) must never change without GENERATOR_VERSION."""
    data = load_data(SMALL, tmp_path)
    train, evaluation = data.train["tokens"], data.eval["tokens"]
    assert train.shape == (200, 17) and evaluation.shape == (50, 17)
    assert train.dtype == torch.int64
    assert train[0, :12].tolist() == [44, 51, 63, 28, 44, 7, 55, 24, 24, 52, 17, 63]
    assert evaluation[-1, -6:].tolist() == [17, 28, 4, 28, 16, 42]
    assert data.optimal_loss == pytest.approx(2.363669936260963, rel=1e-12)


def test_optimal_loss_is_the_mean_true_nll_of_the_eval_targets(tmp_path):
    cfg = SyntheticConfig(**{k: v for k, v in SMALL.items()})
    data = load_data(SMALL, tmp_path)
    language = MarkovLanguage(cfg, np.random.default_rng(cfg.seed))  # the tables are drawn first
    tokens = data.eval["tokens"].numpy()
    nll = []
    for seq in tokens:
        for t in range(1, len(seq)):
            p = language.class_probs(seq[t - 2:t - 1] if t >= 2 else None, seq[t - 1:t])[0]
            nll.append(-np.log(p[language.token_class[seq[t]]]) - language.token_logp[seq[t]])
    assert data.optimal_loss == pytest.approx(np.mean(nll), rel=1e-9)
    assert data.optimal_loss < data.unigram_loss < np.log(64)


def test_empirical_transitions_match_the_source(tmp_path):
    """Sampling is correct: first-position class frequencies match the start distribution."""
    cfg = SyntheticConfig(vocab_size=64, classes=8, seq_len=2, train_sequences=40_000, eval_sequences=1)
    language = MarkovLanguage(cfg, np.random.default_rng(0))
    x, _ = language.sample(40_000, 2, np.random.default_rng(1))
    freq = np.bincount(language.token_class[x[:, 0]], minlength=8) / 40_000
    np.testing.assert_allclose(freq, language.start, atol=0.01)


def test_unigram_loss_of_a_uniform_stream():
    tokens = torch.arange(4).repeat(100, 1)[:, :4]
    assert unigram_loss(tokens[:, 1:], tokens[:, 1:], 4) == pytest.approx(np.log(3), rel=1e-2)
    assert unigram_loss(tokens, tokens, 4, pad=0) == pytest.approx(np.log(3), rel=1e-2)


def test_cache_is_reused_and_keyed_by_config(tmp_path, monkeypatch):
    load_data(SMALL, tmp_path)
    calls = []
    original = SyntheticMarkov.build

    def counting_build(self, task):
        calls.append(task)
        return original(self, task)

    monkeypatch.setattr(SyntheticMarkov, "build", counting_build)
    load_data(SMALL, tmp_path)
    assert calls == []  # unchanged config: no regeneration
    load_data({**SMALL, "trigram_weight": 0.3}, tmp_path)
    assert calls == ["lm"]  # changed config: a new cache entry
    assert len([p for p in (tmp_path / "data").iterdir() if not p.name.startswith(".")]) == 2  # not locks


# -- a damaged data-cache entry (issue 13's point 6) ------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["garbage", "flipped", "deleted"])
def test_a_damaged_data_cache_entry_is_named_and_rebuilt(tmp_path, damage, caplog):
    corpus = write_text(tmp_path / "corpus.txt", lines=300)
    cfg = lambda seed: deepnorm_exp.compose([*TINY_MODEL, "data=text", f"data.files={corpus}", f"seed={seed}",
                                             f"paths.runs={tmp_path / 'runs'}", "logger=none"])
    assert run_experiment(cfg(0), progress=False)["status"] == "completed"
    (arrow,) = (tmp_path / "runs" / ".cache" / "data").glob("text-*/train/*.arrow")
    entry = arrow.parent.parent
    if damage == "garbage":
        arrow.write_bytes(b"not an arrow file" * 100)
    elif damage == "flipped":
        data = bytearray(arrow.read_bytes())
        data[-200] ^= 0x01  # a token id: the file still loads, with a wrong token
        arrow.write_bytes(bytes(data))
    else:
        arrow.unlink()
    with caplog.at_level("WARNING", logger="deepnorm_exp"):
        summary = run_experiment(cfg(1), progress=False)
    assert summary["status"] == "completed"
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and str(entry) in warnings[0]
    from deepnorm_exp.data.cache import damage as damage_of

    assert damage_of(entry) is None  # rebuilt whole
