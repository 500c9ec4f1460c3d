"""The synthetic translation task and the hub loader (on a parallel corpus written here, never the network)."""

import json

import numpy as np
import pytest
import torch

from deepnorm_exp.data import load_data
from deepnorm_exp.data.tokenizer import BYTE_VOCAB, ByteTokenizer
from deepnorm_exp.data.translation import BOS, EOS, PAD, SPECIALS, reorder_positions
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.metrics.exact_match import exact_match

SMALL = {"name": "synthetic", "vocab_size": 40, "classes": 4, "train_sequences": 300, "eval_sequences": 100,
         "translation_min_len": 3, "translation_max_len": 9, "translation_noise": 0.1}


def test_reorder_reverses_within_blocks():
    assert reorder_positions(7, 3).tolist() == [2, 1, 0, 5, 4, 3, 6]
    assert reorder_positions(4, 1).tolist() == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return load_data(SMALL, tmp_path_factory.mktemp("cache"), task="translation")


def test_targets_are_the_reordered_bijection_of_the_source(pairs):
    src, ref = pairs.eval["src"], pairs.eval["reference"]
    mapping = {}
    for s, r in zip(src.tolist(), ref.tolist()):
        n = sum(t != PAD for t in s)
        assert r[0] == BOS and r[n + 1] == EOS and all(t == PAD for t in r[n + 2:])
        body = r[1:n + 1]
        for i, j in enumerate(reorder_positions(n, 3)):
            assert mapping.setdefault(s[i], body[j]) == body[j]  # one fixed bijection
    assert len(set(mapping.values())) == len(mapping)
    assert all(t >= SPECIALS for t in mapping)


def test_noise_rate_and_exact_optimal_loss(pairs):
    ref = pairs.eval["reference"]
    assert pairs.train["tgt"].shape[1] == 11  # BOS + up to 9 tokens + EOS
    noisy_eval = pairs.eval["tgt"]
    body = ref[:, 1:-1] >= SPECIALS
    changed = (noisy_eval[:, 1:-1] != ref[:, 1:-1]) & body
    r = 40 - SPECIALS
    p_clean = 1 - 0.1 + 0.1 / r
    nll = -np.log(p_clean) * int((body & ~changed).sum()) - np.log(0.1 / r) * int(changed.sum())
    n_targets = (noisy_eval[:, 1:] != PAD).sum().item()
    assert pairs.optimal_loss == pytest.approx(nll / n_targets, rel=1e-9)
    assert 0.06 < (changed.sum() / body.sum()).item() < 0.14  # expected 0.1 * (1 - 1/37)
    assert pairs.optimal_loss < pairs.unigram_loss


def test_same_seed_same_pairs(tmp_path, pairs):
    again = load_data(SMALL, tmp_path, task="translation")
    assert all(torch.equal(pairs.train[k], again.train[k]) for k in pairs.train)


class Oracle(torch.nn.Module):
    """Decodes the reference for known sources: exact_match must then be 1; a corrupted one, less."""

    def __init__(self, src, ref, corrupt_rows=()):
        super().__init__()
        self.table = {tuple(s): r for s, r in zip(src.tolist(), ref.tolist())}
        self.corrupt = set(corrupt_rows)

    def greedy_decode(self, src, max_len):
        rows = []
        for s in src.tolist():
            r = list(self.table[tuple(s)])
            if tuple(s) in self.corrupt:
                r[1] = r[1] + 1
            eos = r.index(EOS)
            rows.append(r[:eos + 1] + [PAD] * (max_len + 1 - eos - 1))
        return torch.tensor(rows)


def test_exact_match_scores_through_eos(pairs):
    src, ref = pairs.eval["src"], pairs.eval["reference"]
    assert exact_match(Oracle(src, ref), pairs, 20, 8, torch.device("cpu")) == 1.0
    corrupt = [tuple(s) for s in src[:5].tolist()]
    assert exact_match(Oracle(src, ref, corrupt), pairs, 20, 8, torch.device("cpu")) == pytest.approx(15 / 20)


def write_corpus(root, n_train=40, n_eval=10):
    root.mkdir()
    for split, n in (("train", n_train), ("validation", n_eval)):
        with open(root / f"{split}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"translation": {"de": f"Satz Nummer {i} über Größe",
                                                    "en": f"sentence number {i} about size"}}) + "\n")
    return root


def test_hub_loader_reads_a_hub_layout_directory(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    cfg = {"name": "translation_hub", "path": str(corpus), "config": None, "max_len": 16}
    data = load_data(cfg, tmp_path / "cache", task="translation")
    assert data.vocab_size == BYTE_VOCAB and data.optimal_loss is None
    assert data.train["src"].shape == (40, 17) and data.train["tgt"].shape == (40, 18)
    decode = ByteTokenizer().decode
    assert decode(data.eval["src"][3].tolist()) == "Satz Nummer 3 ü"  # 16 bytes: ü takes 2
    assert data.eval["tgt"][3, 0] == BOS and decode(data.eval["tgt"][3].tolist()) == "sentence number "
    assert torch.equal(data.eval["reference"], data.eval["tgt"])


def test_hub_loader_fails_with_one_line_when_unreachable(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    # The libraries read HF_HUB_OFFLINE when imported; set what they read, so no request is ever sent.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = {"name": "translation_hub", "path": "no-such-org/no-such-dataset-deepnorm", "config": None}
    with pytest.raises(ConfigError) as err:
        load_data(cfg, tmp_path, task="translation")
    assert err.value.key == "data.path" and "HF_HUB_OFFLINE" in str(err.value) and "\n" not in str(err.value)


def test_hub_loader_names_missing_languages(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    cfg = {"name": "translation_hub", "path": str(corpus), "config": None, "source_lang": "fr"}
    with pytest.raises(ConfigError, match="de.*en"):
        load_data(cfg, tmp_path / "cache", task="translation")
