"""Parallel text from the Hugging Face hub (or a local copy of it) through `datasets`, byte-level tokens.

`data=translation_hub` loads `load_dataset(data.path, data.config)`: any dataset whose rows hold a
`translation` dict keyed by language (IWSLT 2017, WMT, OPUS-100 all do). `data.path` may also be a local
directory of parquet/json files laid out like the hub's (train.*, validation.*): the same code runs for
both, and the tests use that. `datasets`' and the hub's caches are under `paths.cache` (data/hub.py), never
$HF_HOME. Where the hub is unreachable and the cache lacks the dataset, loading stops with one line naming
HF_HUB_OFFLINE and the cache path.

Tokens: PAD 0, BOS 1, EOS 2, then the 256 byte values of the UTF-8 text (vocabulary 259, shared by both
languages; the byte tokenizer of data/tokenizer.py reads them back). Sides longer than `max_len` bytes are cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..config import setting
from ..errors import ConfigError
from . import TaskData, register, unigram_loss
from .hub import load_hub
from .tokenizer import BYTE_VOCAB
from ..special_tokens import BOS, EOS, PAD, SPECIALS


@dataclass
class HubTranslationConfig:
    name: str = "translation_hub"
    path: str = "IWSLT/iwslt2017"  # hub id, or a local directory laid out like one
    config: Optional[str] = "iwslt2017-de-en"  # the dataset's configuration
    source_lang: str = "de"  # key of the source side in the `translation` column
    target_lang: str = "en"  # key of the target side
    train_split: str = "train"  # the split trained on
    eval_split: str = "validation"  # the held-out split
    max_len: int = setting(128, check="positive_int")  # bytes per side
    max_train_pairs: Optional[int] = None  # the first n training pairs (None: all)
    max_eval_pairs: int = setting(512, check="positive_int")  # held-out pairs evaluated
    eval_decode: int = setting(64, check="positive_int")  # held-out pairs decoded greedily for exact-match accuracy
    vocab_size: int = BYTE_VOCAB  # byte tokens shared by both languages (fixed)

    def __post_init__(self):
        if self.vocab_size != BYTE_VOCAB:
            raise ConfigError("vocab_size", self.vocab_size, f"the byte tokenizer has {BYTE_VOCAB} tokens")


def encode(texts: list[str], max_len: int, bos: bool) -> np.ndarray:
    """Byte tokens, EOS-terminated (and BOS-started for targets), padded to one width."""
    width = max_len + 1 + bos
    out = np.full((len(texts), width), PAD, dtype=np.int64)
    for row, text in enumerate(texts):
        ids = [BOS] * bos + [b + SPECIALS for b in text.encode("utf-8")[:max_len]] + [EOS]
        out[row, :len(ids)] = ids
    return out


@register("translation_hub")
class HubTranslation:
    Config = HubTranslationConfig
    tasks = ("translation",)

    def __init__(self, cfg: HubTranslationConfig, cache_dir: Path):
        self.cfg, self.cache_dir = cfg, cache_dir

    @staticmethod
    def positions(cfg: HubTranslationConfig, task: str) -> int:
        return cfg.max_len + 1  # source: bytes + EOS; target input: BOS + bytes

    def _split(self, split: str, limit: Optional[int]):
        data = load_hub(self.cfg.path, self.cfg.config, split, cache_dir=self.cache_dir)  # under paths.cache
        if limit is not None:
            data = data.select(range(min(limit, len(data))))
        return data

    def _tensors(self, split: str, limit: Optional[int], reference: bool) -> dict[str, torch.Tensor]:
        rows = self._split(split, limit)["translation"]
        try:
            src = [r[self.cfg.source_lang] for r in rows]
            tgt = [r[self.cfg.target_lang] for r in rows]
        except KeyError as e:
            raise ConfigError("data.source_lang/target_lang", e.args[0],
                              f"rows hold languages {sorted(rows[0]) if rows else []}") from None
        tensors = {"src": torch.from_numpy(encode(src, self.cfg.max_len, bos=False)),
                   "tgt": torch.from_numpy(encode(tgt, self.cfg.max_len, bos=True))}
        if reference:  # real text has no noiseless target: exact match compares with the target itself
            tensors["reference"] = tensors["tgt"]
        return tensors

    def load(self, task: str) -> TaskData:
        train = self._tensors(self.cfg.train_split, self.cfg.max_train_pairs, reference=False)
        evaluation = self._tensors(self.cfg.eval_split, self.cfg.max_eval_pairs, reference=True)
        return TaskData(task=task, train=train, eval=evaluation, vocab_size=BYTE_VOCAB, optimal_loss=None,
                        unigram_loss=unigram_loss(train["tgt"][:, 1:], evaluation["tgt"][:, 1:], BYTE_VOCAB, pad=PAD))
