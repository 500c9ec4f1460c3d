"""Tokenizers for real text: UTF-8 bytes (no training), or a byte-level BPE trained with `tokenizers`.

Both share the id layout of the translation task: 0 PAD, 1 BOS, 2 EOS, then the vocabulary. The byte
tokenizer maps byte b to b + 3 (vocabulary 259). The BPE starts from the 256-byte alphabet, so it can
encode any text, and learns merges up to `vocab_size` on the training split only (never the eval split).
Each document is encoded and terminated by EOS, which is what separates documents once they are packed.

Its training is bounded and interruptible. Bounded: a word (what the pre-tokenizer cuts: a run of letters,
of digits, of punctuation or of whitespace) is at most MAX_WORD_CHARS characters, longer runs being cut into
pieces of that length before they are counted; the trainer's work per merge grows with the length of the
words holding the pair, so one 1 MB line without whitespace took minutes, and now takes what 16,000 short
words take. The cut applies when encoding too, so what was trained on is what is encoded; ordinary text has
no such runs and is tokenized as before. Interruptible: it runs in a worker thread while this one takes the
preemption signals (SIGTERM, SIGUSR1/2, SIGINT); one arriving stops it within STOP_POLL_S, the signal is
handed to whoever held it before (a run's PreemptionGuard records it), and `TrainingStopped` says so.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from ..errors import HarnessError, RecordError
from ..signals import SIGNALS, act_as_before
from ..records import atomic_path
from ..special_tokens import BOS, EOS, PAD, SPECIALS

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")  # ids PAD, BOS, EOS in this order
BYTE_VOCAB = 256 + SPECIALS  # also the smallest byte-level BPE: its alphabet plus the specials
MAX_WORD_CHARS = 64  # longer runs of non-whitespace (or of whitespace) are cut: BPE training super-linear in them
STOP_POLL_S = 0.1  # how often the waiting thread looks for a stop signal while the BPE trains
assert (PAD, BOS, EOS) == (0, 1, 2)


class TrainingStopped(HarnessError):
    """A stop signal arrived while the BPE was training: nothing was saved; a re-run trains it again."""

    def __init__(self, signum: int):
        super().__init__(f"BPE training stopped by {signal.Signals(signum).name} before it finished; no tokenizer "
                         f"was cached (the next run trains it again)")


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
    def load_checked(cls, path: Path, vocab_size: int) -> "BpeTokenizer":
        """The BPE at `path`, refused in one line (RecordError) unless it is one `train(..., vocab_size)` makes:
        a byte-level BPE with the word bound, the specials at 0-2 and at most `vocab_size` tokens (a larger
        vocabulary gives ids the model has no embedding for: an IndexError mid-run)."""
        tokenizer = cls.load(path).tokenizer
        made, expected = json.loads(tokenizer.to_str()), json.loads(untrained().to_str())
        size = tokenizer.get_vocab_size()
        if (made.get("model") or {}).get("type") != "BPE":
            why = "it is not a BPE"
        elif any(made.get(part) != expected[part] for part in ("pre_tokenizer", "decoder")):
            why = f"it does not cut words as this harness does (byte-level, runs cut at {MAX_WORD_CHARS} characters)"
        elif [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] != [PAD, BOS, EOS]:
            why = "its special tokens are not at ids 0-2"
        elif not BYTE_VOCAB <= size <= vocab_size:
            why = f"it has {size} tokens, data.vocab_size={vocab_size} allows {BYTE_VOCAB} to {vocab_size}"
        else:
            return cls(tokenizer)
        raise RecordError(f"tokenizer {path} is not the one this data needs: {why}")

    @classmethod
    def train(cls, batches: Iterator[list[str]], vocab_size: int, path: Path) -> "BpeTokenizer":
        """Learn merges on `batches` of texts; save to `path` (atomically: a killed job leaves no file).
        A stop signal ends it early with `TrainingStopped` (module docstring)."""
        from tokenizers import pre_tokenizers, trainers

        tokenizer = untrained()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        with StopSignals() as stop:
            train_until_stopped(tokenizer, trainer, batches, stop)
        assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, BOS, EOS]
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tokenizer.save(str(tmp))
        return cls(tokenizer)


def untrained():
    """A byte-level BPE without merges: runs longer than MAX_WORD_CHARS cut first (the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE())
    long_run = Regex(rf"\S{{{MAX_WORD_CHARS}}}|\s{{{MAX_WORD_CHARS}}}")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(long_run, "isolated"),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class StopSignals:
    """Records the preemption signals that arrive inside the block instead of acting on them (the first one
    is kept in `signum`); on leaving, gives each signal back its handler and hands a recorded one to it (a
    run's PreemptionGuard records it; the default ends the process). Outside the main thread, where signals
    cannot be caught, it records nothing."""

    def __enter__(self) -> "StopSignals":
        self.signum: int | None = None
        self.previous: dict[int, object] = {}
        for signum in SIGNALS:
            try:
                if signal.getsignal(signum) != signal.SIG_IGN:  # an ignored signal stays ignored
                    self.previous[signum] = signal.signal(signum, self._record)
            except ValueError:  # not the main thread
                pass
        return self

    def _record(self, signum: int, frame) -> None:
        self.signum = self.signum or signum

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        if self.signum is not None:
            act_as_before(self.signum, self.previous[self.signum])


def train_until_stopped(tokenizer, trainer, batches: Iterator[list[str]], stop: StopSignals) -> None:
    """`tokenizer.train_from_iterator(batches, trainer)`, in a worker thread (tokenizers releases the GIL) so
    that this thread takes a signal at once; raises TrainingStopped when `stop` records one. The counting pass
    stops at its next batch; the merges, native code that cannot be stopped, finish in the abandoned daemon
    thread and are discarded (nothing is saved from it)."""
    outcome: dict[str, BaseException] = {}

    def checked_batches():
        for batch in batches:
            yield batch
            if stop.signum is not None:  # checked before the next batch is read
                raise TrainingStopped(stop.signum)

    def work():
        try:
            tokenizer.train_from_iterator(checked_batches(), trainer)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = e

    worker = threading.Thread(target=work, name="bpe-training", daemon=True)
    worker.start()
    while worker.is_alive() and stop.signum is None:
        worker.join(STOP_POLL_S)
    if stop.signum is not None:
        raise TrainingStopped(stop.signum)
    if "error" in outcome:
        raise outcome["error"]


def load_tokenizer(path: Optional[Path]) -> ByteTokenizer | BpeTokenizer:
    """The tokenizer a cached dataset was made with: its `tokenizer.json`, or bytes where it has none."""
    return BpeTokenizer.load(path) if path is not None and path.exists() else ByteTokenizer()


def quiet_fork_warnings() -> None:
    # tokenizers warns (once per worker) when a process that used its thread pool forks; `datasets` forks
    # for num_proc > 1. Workers then run single-threaded, which is what num_proc intends anyway.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
