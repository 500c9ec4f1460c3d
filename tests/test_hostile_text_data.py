"""Hostile text input (issue 38, class 4): what `data.files` matches, what the BPE trains on, what the cache
hands back. Each case asserts on the work done (files listed, documents read, word lengths, batches pulled),
never on seconds."""

import json
import os
import signal
import threading
import time

import pytest

import deepnorm_exp
from deepnorm_exp.data import load_data
from deepnorm_exp.data import text as text_module
from deepnorm_exp.data.cache import MANIFEST, write_manifest
from deepnorm_exp.data.text import resolved_files
from deepnorm_exp.data.tokenizer import MAX_WORD_CHARS, BpeTokenizer
from deepnorm_exp.errors import ConfigError, HarnessError
from deepnorm_exp.lifecycle.preemption import PreemptionGuard

from conftest import write_text, TINY_MODEL, run_cli, one_error_line

LISTINGS_ALLOWED = 50  # directories a small corpus tree may list; a cycle lists without end


def text_cfg(tmp_path, files, *overrides):
    return deepnorm_exp.compose(["data=text", f"data.files={files}", f"paths.cache={tmp_path / 'cache'}",
                                 "train.seq_len=16", *overrides]).data


def documents_read(tmp_path, files, *overrides) -> int:
    """The documents (both splits) of the dataset built from `files`."""
    load_data(text_cfg(tmp_path, files, *overrides), tmp_path / "cache")
    (meta,) = (tmp_path / "cache" / "data").glob("text-*/meta.json")
    meta = json.loads(meta.read_text())
    return meta["train"]["documents"] + meta["eval"]["documents"]


@pytest.fixture
def listings(monkeypatch, tmp_path):
    """Counts the directories listed under tmp_path (glob and os.walk both list through os.scandir); fails
    past the budget instead of hanging."""
    listed, scandir = [], os.scandir

    def counting_scandir(path="."):
        if os.path.abspath(path).startswith(str(tmp_path)):
            listed.append(path)
        if len(listed) > LISTINGS_ALLOWED:
            raise AssertionError(f"listed more than {LISTINGS_ALLOWED} directories (last: {path})")
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    return listed


# -- data.files ---------------------------------------------------------------------------------------
def test_a_symlink_to_its_own_directory_is_not_followed_by_a_recursive_glob(tmp_path, listings):
    corpus = write_text(tmp_path / "corpus" / "a.txt", lines=200)
    (tmp_path / "corpus" / "loop").symlink_to(tmp_path / "corpus", target_is_directory=True)
    assert resolved_files(text_cfg(tmp_path, corpus)) == [str(corpus.resolve())]  # the config is built first
    assert resolved_files(text_cfg(tmp_path, tmp_path / "corpus/**/*.txt")) == [str(corpus.resolve())]


@pytest.mark.parametrize("pattern", ["**/*.txt", "**/**/*.txt", "*/**/*.txt", "**"])
def test_two_links_to_their_own_directory_do_not_hang_the_glob(tmp_path, listings, pattern):
    corpus = write_text(tmp_path / "corpus" / "sub" / "a.txt", lines=20)
    for name in ("one", "two"):
        (tmp_path / "corpus" / name).symlink_to(tmp_path / "corpus", target_is_directory=True)
    if pattern == "**":  # matches directories too: refused as not a file, after a bounded walk
        with pytest.raises(ConfigError) as err:
            text_cfg(tmp_path, tmp_path / "corpus" / pattern)
        assert err.value.key == "data.files" and "is not a file" in str(err.value)
        return
    assert resolved_files(text_cfg(tmp_path, tmp_path / "corpus" / pattern)) == [str(corpus.resolve())]


def test_held_out_lines_never_reach_training_through_a_symlinked_directory(tmp_path):
    write_text(tmp_path / "corpus" / "a.txt", lines=200)
    (tmp_path / "corpus" / "loop").symlink_to(tmp_path / "corpus", target_is_directory=True)
    assert documents_read(tmp_path, tmp_path / "corpus/**/*.txt") == 200


@pytest.mark.parametrize("listing", ["[{a},{a}]", "[{a},{link}]", "[{a},{dir}/*.txt]", "[{dir}/./a.txt,{a}]",
                                     "[{a},{hard}]"])
def test_the_same_file_listed_twice_is_read_once(tmp_path, listing):
    a = write_text(tmp_path / "corpus" / "a.txt", lines=120)
    (tmp_path / "link.txt").symlink_to(a)
    os.link(a, tmp_path / "hard.txt")
    files = listing.format(a=a, link=tmp_path / "link.txt", dir=tmp_path / "corpus", hard=tmp_path / "hard.txt")
    assert resolved_files(text_cfg(tmp_path, files)) == [str(a.resolve())]
    assert documents_read(tmp_path, files) == 120


def test_files_keep_the_order_they_were_listed_in_once_deduplicated(tmp_path):
    a, b = (write_text(tmp_path / f"{name}.txt", lines=5) for name in "ab")
    assert resolved_files(text_cfg(tmp_path, f"[{b},{a},{b}]")) == [str(b.resolve()), str(a.resolve())]


def test_more_files_than_the_bound_are_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "MAX_FILES", 5, raising=False)
    for i in range(6):
        write_text(tmp_path / "shards" / f"{i}.txt", lines=3)
    five = ",".join(str(tmp_path / "shards" / f"{i}.txt") for i in range(5))
    assert len(resolved_files(text_cfg(tmp_path, f"[{five}]"))) == 5
    with pytest.raises(ConfigError) as err:
        text_cfg(tmp_path, tmp_path / "shards/*.txt")
    message = str(err.value)
    assert err.value.key == "data.files" and "more than 5 files" in message and "\n" not in message


def test_a_glob_that_lists_more_directories_than_the_bound_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "MAX_DIRECTORIES", 20, raising=False)
    write_text(tmp_path / "tree" / "a.txt", lines=3)
    for i in range(30):
        (tmp_path / "tree" / f"d{i}").mkdir()
    with pytest.raises(ConfigError) as err:
        text_cfg(tmp_path, tmp_path / "tree/**/a.txt")
    assert err.value.key == "data.files" and "more than 20 directories" in str(err.value)


# -- the BPE's training -------------------------------------------------------------------------------
def longest_word(tokenizer: BpeTokenizer, text: str) -> int:
    """The longest word (in byte-level symbols) the trainer counts for `text`: its pre-tokenization."""
    return max(len(word) for word, _ in tokenizer.tokenizer.pre_tokenizer.pre_tokenize_str(text))


@pytest.mark.parametrize("alphabet", ["abcdefghij", "a", " ", "é東"])
def test_bpe_training_counts_bounded_words_on_lines_of_one_long_run(tmp_path, alphabet):
    lines = [(alphabet * 4000)[:20_000], (alphabet[::-1] * 4000)[:20_000]]
    tok = BpeTokenizer.train(iter([lines]), vocab_size=600, path=tmp_path / "tok.json")
    bound = MAX_WORD_CHARS * max(len(c.encode()) for c in alphabet)  # byte-level symbols
    assert max(longest_word(tok, line) for line in lines) <= bound
    assert max(len(token) for token in tok.tokenizer.get_vocab()) <= bound  # no merge spans a longer run
    for line in lines:
        (ids,) = tok.encode_batch([line])
        assert tok.decode(ids) == line  # cutting the runs loses nothing


def test_bpe_words_of_ordinary_text_are_not_cut(tmp_path):
    text = "A sentence with ordinary words, naïve ones, and 12345 numbers.\n  Indented."
    tok = BpeTokenizer.train(iter([[text] * 50]), vocab_size=300, path=tmp_path / "tok.json")
    from tokenizers import pre_tokenizers

    plain = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)
    assert tok.tokenizer.pre_tokenizer.pre_tokenize_str(text) == plain


def test_a_stop_signal_interrupts_bpe_training_and_caches_nothing(tmp_path):
    pulled, total = [], 20_000

    def batches():
        for i in range(total):
            pulled.append(i)
            if i == 2:  # a preemption while the corpus is being counted, to the thread that takes signals
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
                time.sleep(0.5)  # lets it act before the next batch (the assertion is on batches, not time)
            yield [f"line {i} of a corpus", "more words"]

    with PreemptionGuard() as guard:  # what a run has installed while its data loads
        with pytest.raises(HarnessError) as err:
            BpeTokenizer.train(batches(), vocab_size=300, path=tmp_path / "tok.json")
    assert "SIGTERM" in str(err.value) and "\n" not in str(err.value)
    assert guard.signum == signal.SIGTERM  # handed on: the run still knows it was preempted
    assert len(pulled) < 1000 and not list(tmp_path.iterdir())  # stopped early; no tokenizer, no temporary


# -- cached tokenizers --------------------------------------------------------------------------------
def plant_foreign_tokenizer(tmp_path, rewrite_manifest: bool) -> int:
    """Overwrite every cached tokenizer file with one trained to another vocabulary size (and, if asked, the
    manifest beside it, as a tool that 'repairs' the cache would); returns how many were planted."""
    corpus = (tmp_path / "corpus.txt").read_text().splitlines()
    foreign = BpeTokenizer.train(iter([corpus]), vocab_size=420, path=tmp_path / "foreign.json")
    assert foreign.vocab_size > 300
    planted = 0
    for path in (tmp_path / "cache" / "data" / "tokenizers").rglob("*.json"):
        if path.name != MANIFEST and "model" in json.loads(path.read_text()):
            path.write_text((tmp_path / "foreign.json").read_text())
            planted += 1
            if rewrite_manifest and (path.parent / MANIFEST).exists():
                write_manifest(path.parent)
    return planted


@pytest.mark.parametrize("rewrite_manifest", [False, True], ids=["digest-differs", "manifest-rewritten"])
def test_a_planted_tokenizer_of_another_vocabulary_is_never_used(tmp_path, rewrite_manifest, caplog):
    corpus = write_text(tmp_path / "corpus.txt", lines=600)
    bpe = ("data.tokenizer=bpe", "data.vocab_size=300")
    load_data(text_cfg(tmp_path, corpus, *bpe), tmp_path / "cache")
    assert plant_foreign_tokenizer(tmp_path, rewrite_manifest) == 1
    data = load_data(text_cfg(tmp_path, corpus, *bpe, "train.seq_len=8"), tmp_path / "cache")  # a new entry
    assert data.vocab_size == 300 and int(data.eval["tokens"].max()) < 300
    cached = [p for p in (tmp_path / "cache" / "data").rglob("tokenizer*.json")]
    assert cached and all(BpeTokenizer.load(p).vocab_size <= 300 for p in cached)  # nothing records the foreign one
    why = "tokens, data.vocab_size=300 allows 259 to 300" if rewrite_manifest else "is damaged (tokenizer.json"
    assert why in caplog.text and "rebuilding it" in caplog.text


@pytest.mark.parametrize("foreign, says", [("unbounded", "does not cut words as this harness does"),
                                           ("specials", "special tokens are not at ids 0-2"),
                                           ("wordpiece", "it is not a BPE")])
def test_a_tokenizer_not_made_by_this_harness_is_refused_in_one_line(tmp_path, foreign, says):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from deepnorm_exp.errors import RecordError

    texts = write_text(tmp_path / "corpus.txt", lines=100).read_text().splitlines()
    tok = BpeTokenizer.train(iter([texts]), vocab_size=300, path=tmp_path / "tok.json").tokenizer
    if foreign == "unbounded":  # what the harness trained before the word bound
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif foreign == "specials":
        tok = Tokenizer.from_str(tok.to_str().replace('"<pad>"', '"<pda>"'))
    else:
        wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, **{t: i + 1 for i, t in enumerate("abc")}}))
        wordpiece.pre_tokenizer, wordpiece.decoder = tok.pre_tokenizer, tok.decoder
        tok = wordpiece
    tok.save(str(tmp_path / "foreign.json"))
    with pytest.raises(RecordError) as err:
        BpeTokenizer.load_checked(tmp_path / "foreign.json", vocab_size=300)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_dataset_entry_recording_a_larger_vocabulary_is_rebuilt(tmp_path, caplog):
    corpus = write_text(tmp_path / "corpus.txt", lines=600)
    bpe = ("data.tokenizer=bpe", "data.vocab_size=300")
    load_data(text_cfg(tmp_path, corpus, *bpe), tmp_path / "cache")
    (meta_path,) = (tmp_path / "cache" / "data").glob("text-*/meta.json")
    meta = json.loads(meta_path.read_text())
    meta.update(vocab_size=420, train_target_counts=meta["train_target_counts"] + [1] * 120)
    meta_path.write_text(json.dumps(meta))
    write_manifest(meta_path.parent)  # consistent with itself: only the vocabulary check can tell
    data = load_data(text_cfg(tmp_path, corpus, *bpe), tmp_path / "cache")
    assert json.loads(meta_path.read_text())["vocab_size"] <= 300 and data.vocab_size == 300
    assert "records a vocabulary of 420" in caplog.text


LATIN1 = b"plain ascii line\n" * 10 + b"caf\xe9 au lait\n" * 200  # the first non-UTF-8 byte at offset 173


@pytest.mark.slow
def test_text_that_is_not_utf8_is_named_with_its_offset_and_reads_with_an_encoding(tmp_path):
    corpus = tmp_path / ("deep" * 20) / "corpus.txt"  # past the width of an echoed value: cut in its middle
    corpus.parent.mkdir()
    corpus.write_bytes(LATIN1)
    args = [*TINY_MODEL, "data=text", f"data.files={corpus}", f"paths.runs={tmp_path / 'runs'}", "logger=none"]
    refused_run = run_cli(*args)
    assert refused_run.returncode == 2
    line = one_error_line(refused_run)
    assert "data.files=" in line and "/corpus.txt (" in line and "byte offset 173" in line and "utf-8" in line
    assert not (tmp_path / "runs").exists()
    accepted = run_cli(*args, "data.encoding=latin-1")
    assert accepted.returncode == 0, accepted.stderr[-3000:]


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_the_offset_of_the_first_undecodable_byte_is_exact_across_read_chunks(tmp_path, cut):
    from deepnorm_exp.data.text import first_undecodable

    # A 3-byte character cut by the 1 MiB read boundary at `cut` bytes in, then a byte that never decodes.
    prefix = b"a" * ((1 << 20) - cut) + "\u20ac".encode() + b"ok\n"
    path = tmp_path / "big.txt"
    path.write_bytes(prefix + b"\xff" + b"tail\n")
    assert first_undecodable(str(path), 0, 0, "utf-8") == f"byte offset {len(prefix)} (b'\\xfftai') does not decode"
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert first_undecodable(str(binary), 0, 0, "utf-8").startswith("byte offset 128 ")
    assert first_undecodable(str(binary), 0, 0, "latin-1") is None  # reads any bytes
