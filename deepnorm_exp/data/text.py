"""Real text as a language-model stream: local files (`data=text`) or any hub dataset (`data=hub`).

Pipeline, all through `datasets`: documents (one per row) -> a seeded train/eval split of documents where
the source has no eval split -> tokenizer (bytes, or a BPE trained on the training split) -> tokens with
`.map(batched=True, num_proc=...)`, EOS after each document -> packed into blocks of seq_len + 1
(packing.py) -> saved as one cache entry keyed by everything that decides its content (the files' sizes
and modification times, or the hub id; the split; the tokenizer; seq_len), with a `meta.json` (token
counts, tokenizer) and, for BPE, its `tokenizer.json`. An unchanged config loads the entry memory-mapped
without tokenizing; a changed one builds a new entry; a failed build leaves nothing.
"""

from __future__ import annotations

import codecs
import functools
import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import MISSING

from ..config import check_seed
from ..errors import ConfigError, require_choice
from ..locks import FileLock
from . import TaskData, register, unigram_loss_from_counts
from .cache import cache_key, load_entry
from .hub import load_hub
from .packing import TokenBlocks, blocks_table, pack, token_stream
from .tokenizer import BYTE_VOCAB, BpeTokenizer, ByteTokenizer, quiet_fork_warnings

PIPELINE_VERSION = 1  # bump when the tokens an unchanged config produces change, so stale caches go unused
PARALLEL_FROM_DOCUMENTS = 20_000  # num_proc=null tokenizes in one process below this (workers cost ~1 s)
TOKENIZERS = ("byte", "bpe")


@dataclass
class TokenStreamConfig:
    """Keys shared by every text source."""

    seq_len: int = 64  # tokens the model sees per block (blocks hold seq_len + 1)
    tokenizer: str = "byte"  # byte | bpe
    vocab_size: int = BYTE_VOCAB  # byte: 259 (256 bytes + PAD, BOS, EOS); bpe: the size to train to
    eval_fraction: float = 0.01  # documents held out for eval where the source has no eval split
    eval_blocks: int = 256  # the first n eval blocks are the eval set (an eval pass stays cheap)
    seed: int = 1234  # the train/eval split of documents; the training seed does not change the data
    num_proc: Optional[int] = None  # tokenizing processes (null: all cores for large corpora, else 1)

    def __post_init__(self):
        check_seed("seed", self.seed)
        for key in ("seq_len", "vocab_size", "eval_blocks"):
            if getattr(self, key) <= 0:
                raise ConfigError(key, getattr(self, key), "must be a positive integer")
        require_choice("tokenizer", self.tokenizer, TOKENIZERS)
        if self.tokenizer == "byte" and self.vocab_size != BYTE_VOCAB:
            raise ConfigError("vocab_size", self.vocab_size,
                              f"the byte tokenizer has {BYTE_VOCAB} tokens; data.tokenizer=bpe trains to a size")
        if self.vocab_size < BYTE_VOCAB:
            raise ConfigError("vocab_size", self.vocab_size,
                              f"a byte-level BPE needs >= {BYTE_VOCAB}: its 256-byte alphabet plus 3 specials")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ConfigError("eval_fraction", self.eval_fraction, "must be in (0, 1)")
        if self.num_proc is not None and self.num_proc <= 0:
            raise ConfigError("num_proc", self.num_proc, "must be a positive integer or null")


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
        if self.cfg.tokenizer == "byte":
            return ByteTokenizer()
        key = cache_key(f"{self.cfg.name}-bpe", {**self.split_identity(), "vocab_size": self.cfg.vocab_size})
        path = self.cache_dir / "data" / "tokenizers" / f"{key}.json"
        with FileLock(path.with_name(f".{path.name}.lock")):  # concurrent jobs train it once
            if path.exists():
                return BpeTokenizer.load(path)
            texts = train_docs[self.column] if len(train_docs) else []
            batches = (texts[i:i + 1000] for i in range(0, len(texts), 1000))
            return BpeTokenizer.train(batches, self.cfg.vocab_size, path)

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
        (directory / "meta.json").write_text(json.dumps(meta))
        if isinstance(tokenizer, BpeTokenizer):
            tokenizer.tokenizer.save(str(directory / "tokenizer.json"))

    def load(self, task: str) -> TaskData:
        return load_entry(self.entry(), self.build, lambda entry: self._read(entry, task))

    def _read(self, path: Path, task: str) -> TaskData:
        from datasets import load_from_disk

        data, meta = load_from_disk(str(path)), json.loads((path / "meta.json").read_text())
        eval_tokens = TokenBlocks(data["eval"])[torch.arange(min(self.cfg.eval_blocks, len(data["eval"])))]
        counts = torch.tensor(meta["train_target_counts"])
        return TaskData(task=task, train={"tokens": TokenBlocks(data["train"])}, eval={"tokens": eval_tokens},
                        vocab_size=self.cfg.vocab_size, optimal_loss=None,
                        unigram_loss=unigram_loss_from_counts(counts, eval_tokens[:, 1:]))


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
    patterns = [cfg.files] if isinstance(cfg.files, str) else list(cfg.files or [])
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise ConfigError("files", cfg.files, "give one or more text files or globs, e.g. data.files=corpus.txt "
                          "or data.files=[a.txt,shards/*.txt]")
    paths = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise ConfigError("files", pattern, "no such file (nothing matches)")
        for path in matches:
            if not os.path.isfile(path):
                raise ConfigError("files", path, "is not a file")
            if os.path.getsize(path) == 0:
                raise ConfigError("files", path, "is empty")
        paths += [os.path.abspath(p) for p in matches]
    return paths


@register("text")
class TextFiles(TokenStream):
    """`load_dataset("text", data_files=...)`; a seeded eval split of the documents."""

    Config = TextConfig

    def identity(self) -> dict:
        return {"files": _file_identity(resolved_files(self.cfg)), "sample_by": self.cfg.sample_by,
                "encoding": self.cfg.encoding}

    def source_key(self) -> tuple[str, Any]:
        return "data.files", self.cfg.files

    def documents(self):
        from datasets import load_dataset

        docs = load_dataset("text", data_files={"train": resolved_files(self.cfg)}, sample_by=self.cfg.sample_by,
                            encoding=self.cfg.encoding, split="train")
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
        data = load_hub(self.cfg.path, self.cfg.config, split)
        if self.cfg.text_column not in data.column_names:
            raise ConfigError("data.text_column", self.cfg.text_column,
                              f"{self.cfg.path} has columns: {', '.join(data.column_names)}")
        return data.select_columns([self.cfg.text_column])
