"""Tokenizers for real text: UTF-8 bytes (no training), or a byte-level BPE trained with `tokenizers`.

Both share the id layout of the translation task: 0 PAD, 1 BOS, 2 EOS, then the vocabulary. The byte
tokenizer maps byte b to b + 3 (vocabulary 259). The BPE starts from the 256-byte alphabet, so it can
encode any text, and learns merges up to `vocab_size` on the training split only (never the eval split).
Each document is encoded and terminated by EOS, which is what separates documents once they are packed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from ..records import atomic_path
from .translation import BOS, EOS, PAD, SPECIALS

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")  # ids PAD, BOS, EOS in this order
BYTE_VOCAB = 256 + SPECIALS  # also the smallest byte-level BPE: its alphabet plus the specials
assert (PAD, BOS, EOS) == (0, 1, 2)


class ByteTokenizer:
    vocab_size = BYTE_VOCAB

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.append(np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) + SPECIALS, EOS)
                for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) - SPECIALS for i in ids if i >= SPECIALS).decode("utf-8", errors="replace")


class BpeTokenizer:
    """A `tokenizers.Tokenizer` (byte-level BPE) behind the same two methods as the byte tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.append(np.asarray(e.ids, dtype=np.int32), EOS) for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids if i >= SPECIALS])

    @classmethod
    def load(cls, path: Path) -> "BpeTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    @classmethod
    def train(cls, batches: Iterator[list[str]], vocab_size: int, path: Path) -> "BpeTokenizer":
        """Learn merges on `batches` of texts; save to `path` (atomically: a killed job leaves no file)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tokenizer.train_from_iterator(batches, trainer)
        assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, BOS, EOS]
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tokenizer.save(str(tmp))
        return cls(tokenizer)


def load_tokenizer(path: Optional[Path]) -> ByteTokenizer | BpeTokenizer:
    """The tokenizer a cached dataset was made with: its `tokenizer.json`, or bytes where it has none."""
    return BpeTokenizer.load(path) if path is not None and path.exists() else ByteTokenizer()


def quiet_fork_warnings() -> None:
    # tokenizers warns (once per worker) when a process that used its thread pool forks; `datasets` forks
    # for num_proc > 1. Workers then run single-threaded, which is what num_proc intends anyway.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
