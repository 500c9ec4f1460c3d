"""Real text as a language-model stream: local files (`data=text`) or any hub dataset (`data=hub`).

Pipeline, all through `datasets`: documents (one per row) -> a seeded train/eval split of documents where
the source has no eval split -> tokenizer (bytes, or a BPE trained on the training split) -> tokens with
`.map(batched=True, num_proc=...)`, EOS after each document -> packed into blocks of seq_len + 1
(packing.py) -> saved as one cache entry keyed by everything that decides its content (the files' sizes
and modification times, or the hub id; the split; the tokenizer; seq_len), with a `meta.json` (token
counts, tokenizer) and, for BPE, its `tokenizer.json`. An unchanged config loads the entry memory-mapped
without tokenizing; a changed one builds a new entry; a failed build leaves nothing. A BPE is an entry of
its own (`tokenizers/<key>/`), so it is verified by its manifest like the datasets, and an entry whose
tokenizer or recorded vocabulary exceeds data.vocab_size is rebuilt, never loaded.

`data.files` resolves to real paths, each file once, walked without following symlinked directories under
`**`, and at most MAX_FILES of them (`resolved_files`).
"""

from __future__ import annotations

import codecs
import fnmatch
import functools
import glob
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
from omegaconf import MISSING

from .. import records
from ..config import Rule, check_seed, setting
from ..errors import ConfigError, RecordError, require_choice
from . import TaskData, register, text_size, unigram_loss_from_counts
from .cache import cache_key, load_entry
from .hub import hf_caches, load_hub
from .packing import TokenBlocks, blocks_table, pack, token_stream
from .tokenizer import BYTE_VOCAB, BpeTokenizer, ByteTokenizer, quiet_fork_warnings

PIPELINE_VERSION = 2  # bump when the tokens an unchanged config produces change, so stale caches go unused
MAX_FILES = 10_000  # data.files may name at most this many files: a glob over the wrong tree is refused in one line
MAX_DIRECTORIES = 100_000  # and its globs may list at most this many directories (a `/**/x.txt` walks everything)
PARALLEL_FROM_DOCUMENTS = 20_000  # num_proc=null tokenizes in one process below this (workers cost ~1 s)
TOKENIZERS = ("byte", "bpe")
OPEN_UNIT = Rule(lambda v: 0.0 < v < 1.0, "must be in (0, 1)")
TOKENIZER_FILE = "tokenizer.json"  # the BPE, in its own cache entry and beside each dataset built with it


@dataclass
class TokenStreamConfig:
    """Keys shared by every text source."""

    seq_len: int = setting(64, check="positive_int")  # tokens the model sees per block (blocks hold seq_len + 1)
    tokenizer: str = setting("byte", choices=TOKENIZERS)  # byte | bpe
    # byte: 259 (256 bytes + PAD, BOS, EOS); bpe: the size to train to
    vocab_size: int = setting(BYTE_VOCAB, check="positive_int")
    # documents held out for eval where the source has no eval split
    eval_fraction: float = setting(0.01, check=OPEN_UNIT)
    # the first n eval blocks are the eval set (an eval pass stays cheap)
    eval_blocks: int = setting(256, check="positive_int")
    seed: int = 1234  # the train/eval split of documents; the training seed does not change the data
    # tokenizing processes (null: all cores for large corpora, else 1)
    num_proc: Optional[int] = setting(None, check="positive_int", null="all cores for large corpora, else 1")

    def __post_init__(self):
        check_seed("seed", self.seed)
        if self.tokenizer == "byte" and self.vocab_size != BYTE_VOCAB:
            raise ConfigError("vocab_size", self.vocab_size,
                              f"the byte tokenizer has {BYTE_VOCAB} tokens; data.tokenizer=bpe trains to a size")
        if self.vocab_size < BYTE_VOCAB:
            raise ConfigError("vocab_size", self.vocab_size,
                              f"a byte-level BPE needs >= {BYTE_VOCAB}: its 256-byte alphabet plus 3 specials")


class Tokenize:
    """The batched map function (a class: picklable for num_proc workers, hashable for datasets' cache)."""

    def __init__(self, tokenizer, column: str):
        self.tokenizer, self.column = tokenizer, column

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        texts = [t for t in batch[self.column] if t]  # empty rows (blank lines) are not documents
        return {"ids": self.tokenizer.encode_batch(texts)}


class TokenStream:
    """A text source: subclasses say where the documents come from (`documents`) and what identifies them
    (`identity`, for the cache key); this class turns them into packed, cached blocks."""

    tasks = ("lm",)
    column = "text"

    def __init__(self, cfg: Any, cache_dir: Path):
        self.cfg, self.cache_dir = cfg, cache_dir

    @staticmethod
    def positions(cfg: TokenStreamConfig, task: str) -> int:
        return cfg.seq_len

    def documents(self):
        """`datasets.DatasetDict` with "train" and "eval", the text in column `self.column`."""
        raise NotImplementedError

    def identity(self) -> dict:
        raise NotImplementedError

    def source_key(self) -> tuple[str, Any]:
        """(config key, value) that errors about the documents name: data.files or data.path."""
        raise NotImplementedError

    # -- the split where the source has none ----------------------------------------------------------
    def hold_out(self, docs):
        """Seeded random documents for eval; both splits keep the source's document order."""
        from datasets import DatasetDict

        n_eval = int(np.ceil(self.cfg.eval_fraction * len(docs)))
        if len(docs) - n_eval < 1:
            raise ConfigError(*self.source_key(),
                              f"holds {len(docs)} document(s); holding out data.eval_fraction for eval needs "
                              f"at least 2 (text files: data.sample_by=line|paragraph sets what a document is)")
        order = np.random.default_rng(self.cfg.seed).permutation(len(docs))
        return DatasetDict(train=docs.select(np.sort(order[n_eval:])), eval=docs.select(np.sort(order[:n_eval])))

    # -- tokenizer ------------------------------------------------------------------------------------
    def split_identity(self) -> dict:
        return {**self.identity(), "eval_fraction": self.cfg.eval_fraction, "seed": self.cfg.seed,
                "version": PIPELINE_VERSION}

    def tokenizer(self, train_docs):
        """Bytes, or the BPE trained on `train_docs`: a data cache entry of its own (tokenizers/<key>/), shared
        by every dataset cut from the same split, so trained once; verified like any entry (its manifest's
        digests) and checked for what it is (`BpeTokenizer.load_checked`) before use: a damaged or foreign
        one is rebuilt, never loaded."""
        if self.cfg.tokenizer == "byte":
            return ByteTokenizer()
        key = cache_key(f"{self.cfg.name}-bpe", {**self.split_identity(), "vocab_size": self.cfg.vocab_size})

        def train(directory: Path) -> None:
            directory.mkdir()
            texts = train_docs[self.column] if len(train_docs) else []
            batches = (texts[i:i + 1000] for i in range(0, len(texts), 1000))
            BpeTokenizer.train(batches, self.cfg.vocab_size, directory / TOKENIZER_FILE)

        return load_entry(self.cache_dir / "data" / "tokenizers" / key, train,
                          lambda entry: BpeTokenizer.load_checked(entry / TOKENIZER_FILE, self.cfg.vocab_size))

    # -- the cache entry ------------------------------------------------------------------------------
    def entry(self) -> Path:
        key = cache_key(self.cfg.name, {**self.split_identity(), "tokenizer": self.cfg.tokenizer,
                                        "vocab_size": self.cfg.vocab_size, "seq_len": self.cfg.seq_len})
        return self.cache_dir / "data" / key

    def build(self, directory: Path) -> None:
        from datasets import Dataset, DatasetDict

        docs = self.documents()
        tokenizer = self.tokenizer(docs["train"])
        num_proc = self.cfg.num_proc
        if num_proc is None and len(docs["train"]) >= PARALLEL_FROM_DOCUMENTS:
            num_proc = min(os.cpu_count() or 1, 8)
        if num_proc and num_proc > 1:
            quiet_fork_warnings()
        tokens = docs.map(Tokenize(tokenizer, self.column), batched=True, num_proc=num_proc,
                          remove_columns=docs["train"].column_names, desc="tokenizing")
        meta: dict[str, Any] = {"tokenizer": self.cfg.tokenizer, "vocab_size": tokenizer.vocab_size,
                                "seq_len": self.cfg.seq_len, "config": self.split_identity()}
        blocks = {}
        for split in ("train", "eval"):
            stream = token_stream(tokens[split])
            blocks[split], dropped = pack(stream, self.cfg.seq_len)
            meta[split] = {"documents": len(docs[split]), "tokens": len(stream), "blocks": len(blocks[split]),
                           "dropped_tokens": dropped}
            if len(blocks[split]) == 0:
                raise ConfigError(*self.source_key(), f"its {split} split holds {len(stream)} tokens, fewer than "
                                  f"one block of data.seq_len + 1 = {self.cfg.seq_len + 1}")
        counts = np.bincount(blocks["train"][:, 1:].reshape(-1), minlength=tokenizer.vocab_size)
        meta["train_target_counts"] = counts.tolist()
        DatasetDict({split: Dataset(blocks_table(b)) for split, b in blocks.items()}).save_to_disk(str(directory))
        records.write_text(directory / "meta.json", json.dumps(meta))
        if isinstance(tokenizer, BpeTokenizer):
            tokenizer.tokenizer.save(str(directory / TOKENIZER_FILE))

    def load(self, task: str) -> TaskData:
        return load_entry(self.entry(), self.build, lambda entry: self._read(entry, task))

    def _read(self, path: Path, task: str) -> TaskData:
        from datasets import load_from_disk

        meta = json.loads((path / "meta.json").read_text())
        check_vocabulary(path, meta, self.cfg.vocab_size)
        data = load_from_disk(str(path))
        eval_tokens = TokenBlocks(data["eval"])[torch.arange(min(self.cfg.eval_blocks, len(data["eval"])))]
        counts = torch.tensor(meta["train_target_counts"])
        return TaskData(task=task, train={"tokens": TokenBlocks(data["train"])}, eval={"tokens": eval_tokens},
                        vocab_size=self.cfg.vocab_size, optimal_loss=None,
                        unigram_loss=unigram_loss_from_counts(counts, eval_tokens[:, 1:]))


def check_vocabulary(entry: Path, meta: dict, vocab_size: int) -> None:
    """Refuse (RecordError: the entry is rebuilt) an entry whose tokens may reach past `vocab_size` (the
    model's embedding: an IndexError mid-run), whatever its manifest says: its recorded vocabulary, its
    target counts and, for a BPE, the tokenizer beside it."""
    recorded = meta.get("vocab_size")
    if not isinstance(recorded, int) or not BYTE_VOCAB <= recorded <= vocab_size:
        raise RecordError(f"data cache entry {entry} records a vocabulary of {recorded}; data.vocab_size="
                          f"{vocab_size} allows {BYTE_VOCAB} to {vocab_size}")
    if len(meta.get("train_target_counts") or ()) != recorded:
        raise RecordError(f"data cache entry {entry} counts targets over another vocabulary than its {recorded}")
    if (entry / TOKENIZER_FILE).exists() and \
            BpeTokenizer.load_checked(entry / TOKENIZER_FILE, vocab_size).vocab_size != recorded:
        raise RecordError(f"data cache entry {entry}: its {TOKENIZER_FILE} is not the tokenizer it records")


def _file_identity(paths: list[str]) -> list[tuple[str, int, int]]:
    """What decides the files' content for the cache key: path, size, modification time."""
    stats = [(p, os.stat(p)) for p in paths]
    return [(p, st.st_size, st.st_mtime_ns) for p, st in stats]


@dataclass
class TextConfig(TokenStreamConfig):
    name: str = "text"
    files: Any = None  # a path or glob, or a list of them; each must exist and hold text
    sample_by: str = "line"  # what one document is: line | paragraph | document (datasets' text loader)
    encoding: str = "utf-8"  # of the files; latin-1 reads any bytes (binary files included)

    def __post_init__(self):
        super().__post_init__()
        require_choice("sample_by", self.sample_by, ("line", "paragraph", "document"))
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ConfigError("encoding", self.encoding, "not a text encoding Python knows "
                              "(e.g. utf-8, latin-1, cp1252)") from None
        for path in resolved_files(self):  # missing, empty or undecodable files fail here, before any compute
            undecodable = first_undecodable(path, os.path.getsize(path), os.stat(path).st_mtime_ns, self.encoding)
            if undecodable is not None:
                raise ConfigError("files", path, f"is not {self.encoding} text: {undecodable}; set data.encoding to "
                                  f"the file's encoding (data.encoding=latin-1 reads any bytes)")


@functools.lru_cache(maxsize=256)
def first_undecodable(path: str, size: int, mtime_ns: int, encoding: str) -> str | None:
    """Where `path` stops decoding as `encoding` ("byte offset N (b'\\xe9')"), or None; decoded in 1 MiB
    chunks (~0.2 s per 100 MB), once per process for an unchanged file (size and mtime are the cache key)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    offset = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            pending = len(decoder.getstate()[0])  # bytes of a character the last chunk cut in two
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:  # e.start counts from the pending bytes
                where = offset - pending + e.start
                return f"byte offset {where} ({e.object[e.start:e.start + 4]!r}) does not decode"
            if not chunk:
                return None
            offset += len(chunk)


def resolved_files(cfg: TextConfig) -> list[str]:
    """The files `data.files` names, as real paths, each once, in the order given (a glob's matches sorted).

    A file reached twice (listed twice, through a symlink or a hard link, by two globs) is read once: read
    twice, its documents would land in both splits. `**` never descends into a symlinked directory, so a link
    to its own directory cannot make the tree endless (glob.glob follows it: 200 lines read as 8,200
    documents, and two such links never finish). More than MAX_FILES files, or globs that list more than
    MAX_DIRECTORIES directories, are refused before any file is read."""
    patterns = [cfg.files] if isinstance(cfg.files, str) else list(cfg.files or [])
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise ConfigError("files", cfg.files, "give one or more text files or globs, e.g. data.files=corpus.txt "
                          "or data.files=[a.txt,shards/*.txt]")
    paths: dict[Any, str] = {}  # inode -> real path: a hard link is the same file too
    for pattern in patterns:
        matches = sorted(itertools.islice(glob_matches(os.path.expanduser(pattern)), MAX_FILES + 1))
        if not matches:
            raise ConfigError("files", pattern, "no such file (nothing matches)")
        for path in matches:
            if not os.path.isfile(path):
                raise ConfigError("files", path, "is not a file")
            if os.path.getsize(path) == 0:
                raise ConfigError("files", path, "is empty")
            real = os.path.realpath(path)
            paths.setdefault(_inode(path) or real, real)
            if len(paths) > MAX_FILES or len(matches) > MAX_FILES:
                raise ConfigError("files", cfg.files, f"names more than {MAX_FILES:,} files (the bound on "
                                  f"data.files); give fewer, larger files or a narrower glob")
    return list(paths.values())


def glob_matches(pattern: str) -> Iterator[str]:
    """What `glob.glob(pattern, recursive=True)` matches (hidden names only by a part that starts with "."),
    except that `**` never enters a directory through a symlink, nor one it has entered already (a bind
    mount of a parent): every walk ends. At most MAX_DIRECTORIES directories are listed."""
    if not glob.has_magic(pattern):
        if os.path.lexists(pattern):
            yield pattern
        return
    root = os.sep if pattern.startswith(os.sep) else os.curdir
    parts = [part for part in pattern.split(os.sep) if part]
    parts = [part for i, part in enumerate(parts) if not (part == "**" and parts[i - 1:i] == ["**"])]
    here = os.curdir + os.sep
    for path in GlobWalk(pattern).matches(root, parts):
        yield path[len(here):] if root == os.curdir and path != here else path  # relative, as it was given


class GlobWalk:
    """The directory listings of one pattern's matching, counted."""

    def __init__(self, pattern: str):
        self.pattern, self.listed = pattern, 0

    def matches(self, directory: str, parts: list[str]) -> Iterator[str]:
        """The paths under `directory` that the pattern's `parts` (its components, in order) match."""
        part, rest = parts[0], parts[1:]
        if part == "**":
            for below in self.directories(directory):
                yield from self.matches(below, rest) if rest else self.entries(below)
        elif not glob.has_magic(part):
            path = os.path.join(directory, part)
            if not rest and os.path.lexists(path):
                yield path
            elif rest and os.path.isdir(path):
                yield from self.matches(path, rest)
        else:
            for name in self.names(directory):
                if fnmatch.fnmatch(name, part) and (part.startswith(".") or not name.startswith(".")):
                    path = os.path.join(directory, name)
                    if not rest:
                        yield path
                    elif os.path.isdir(path):  # a pattern part enters a link once: no recursion, no cycle
                        yield from self.matches(path, rest)

    def directories(self, top: str) -> Iterator[str]:
        """`top` and every directory under it that is not hidden, never through a symlink, each once."""
        entered = set()
        for directory, subdirectories, _ in os.walk(top, followlinks=False):
            self.count()
            entered.add(_inode(directory))
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith(".")
                                       and _inode(os.path.join(directory, d)) not in entered)
            yield directory

    def entries(self, directory: str) -> Iterator[str]:
        """What a trailing `**` matches in `directory`: the directory itself and its files."""
        yield os.path.join(directory, "")
        for name in self.names(directory):
            if not name.startswith(".") and not os.path.isdir(os.path.join(directory, name)):
                yield os.path.join(directory, name)

    def names(self, directory: str) -> list[str]:
        self.count()
        try:
            with os.scandir(directory) as entries:
                return sorted(entry.name for entry in entries)
        except OSError:  # unreadable or gone: matches nothing, as for glob
            return []

    def count(self) -> None:
        self.listed += 1
        if self.listed > MAX_DIRECTORIES:
            raise ConfigError("files", self.pattern, f"lists more than {MAX_DIRECTORIES:,} directories (the bound "
                              f"on data.files' globs); give a narrower glob")


def _inode(path: str) -> Optional[tuple[int, int]]:
    """What identifies a file or directory whatever the path to it (a hard link, a bind mount); None for one
    gone since it was listed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@register("text")
class TextFiles(TokenStream):
    """`load_dataset("text", data_files=...)`; a seeded eval split of the documents."""

    Config = TextConfig

    @staticmethod
    def host_bytes(cfg: TextConfig, task: str):
        return text_size.host_bytes(cfg, resolved_files(cfg))  # from the files' sizes: nothing is read

    def identity(self) -> dict:
        return {"files": _file_identity(resolved_files(self.cfg)), "sample_by": self.cfg.sample_by,
                "encoding": self.cfg.encoding}

    def source_key(self) -> tuple[str, Any]:
        return "data.files", self.cfg.files

    def documents(self):
        from datasets import load_dataset

        with hf_caches(self.cache_dir) as datasets_cache:  # datasets' cache under paths.cache, never $HF_HOME
            docs = load_dataset("text", data_files={"train": resolved_files(self.cfg)}, split="train",
                                sample_by=self.cfg.sample_by, encoding=self.cfg.encoding,
                                cache_dir=str(datasets_cache))
        return self.hold_out(docs)


@dataclass
class HubTextConfig(TokenStreamConfig):
    name: str = "hub"
    path: str = MISSING  # hub id (e.g. Salesforce/wikitext) or a local directory laid out like one
    config: Optional[str] = None  # the dataset's configuration (e.g. wikitext-103-raw-v1)
    text_column: str = "text"  # the column that holds the documents
    train_split: str = "train"  # the split trained on
    eval_split: Optional[str] = "validation"  # null: hold out eval_fraction of the training documents


@register("hub")
class HubText(TokenStream):
    """`load_dataset(data.path, data.config)` with a text column; where the hub is unreachable and the cache
    lacks the dataset, one line naming HF_HUB_OFFLINE and the cache path."""

    Config = HubTextConfig

    @property
    def column(self) -> str:
        return self.cfg.text_column

    def identity(self) -> dict:
        local = Path(self.cfg.path)
        files = _file_identity(sorted(str(p) for p in local.rglob("*") if p.is_file())) if local.is_dir() else None
        return {"path": self.cfg.path, "config": self.cfg.config, "column": self.cfg.text_column,
                "train_split": self.cfg.train_split, "eval_split": self.cfg.eval_split, "files": files}

    def source_key(self) -> tuple[str, Any]:
        return "data.path", self.cfg.path

    def documents(self):
        from datasets import DatasetDict

        train = self._split(self.cfg.train_split)
        if self.cfg.eval_split is None:
            return self.hold_out(train)
        return DatasetDict(train=train, eval=self._split(self.cfg.eval_split))

    def _split(self, split: str):
        data = load_hub(self.cfg.path, self.cfg.config, split, cache_dir=self.cache_dir)  # under paths.cache
        if self.cfg.text_column not in data.column_names:
            raise ConfigError("data.text_column", self.cfg.text_column,
                              f"{self.cfg.path} has columns: {', '.join(data.column_names)}")
        return data.select_columns([self.cfg.text_column])
