"""A seeded second-order Markov language whose Bayes-optimal next-token loss is known exactly.

Tokens belong to word classes (`classes` of them, equal sizes, assigned at random). The next token's class
depends on the classes of the two tokens before it, and the token is then drawn within its class:

    p(x_t | x_{t-2}, x_{t-1}) = C(k_t | k_{t-2}, k_{t-1}) * E(x_t | k_t)
    C(. | a, b) = (1 - w) * B[b] + w * T[a, b]

B has one row per class, T one per pair of classes, E one Zipf law per class. Every row is a Zipf law
(weight 1 / rank^s) over its own random permutation, so distributions are peaked and unlike each other.
A model first learns token frequencies (the unigram loss), then classes and the one-back transition, then
the two-back part (attention to position t-2): the eval loss walks down a ladder whose bottom,
`optimal_loss`, is the exact mean of -log p over the eval targets. The class structure is what lets a
small model learn in a few hundred steps, like byte-level text does.

Sequences start with x0's class from a Zipf start distribution and x1's class from B. Generation uses
numpy's PCG64 with float64 inverse-CDF sampling: the same seed gives the same tokens on any machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import check_seed, setting
from ..errors import ConfigError
from . import HostBytes, TaskData, register, unigram_loss
from .cache import cache_key, cached_dataset
from .translation import PAD, language_config, make_pairs, pair_bytes, pair_load_bytes

GENERATOR_VERSION = 2  # bump when the generated tokens change, so stale caches are not reused


@dataclass
class SyntheticConfig:
    name: str = "synthetic"
    vocab_size: int = setting(256, check="positive_int")  # tokens of the language
    seq_len: int = setting(64, check="positive_int")  # tokens the model sees per sequence (each stored sequence has seq_len + 1)
    train_sequences: int = setting(20_000, check="positive_int")  # sequences of the training split
    eval_sequences: int = setting(256, check="positive_int")  # sequences of the held-out split
    classes: int = setting(32, check="positive_int")  # word classes; the next class depends on the classes of the two tokens before
    class_zipf: float = setting(2.5, check="above_zero")  # peakedness of the class transitions
    emission_zipf: float = setting(2.0, check="above_zero")  # peakedness of the tokens within a class
    trigram_weight: float = setting(0.6, check="unit_interval")  # share of the class transition that depends on the token two back
    seed: int = 1234  # the language and its samples; the training seed does not change the data
    # The translation task (models whose task is "translation", e.g. model=encdec; see translation.py):
    translation_min_len: int = setting(4, check="positive_int")  # shortest source sentence, in tokens
    translation_max_len: int = 24  # longest source sentence
    translation_reorder: int = setting(3, check="positive_int")  # target order reversed within blocks of this many tokens (1: monotone)
    translation_noise: float = setting(0.05, check="fraction")  # chance a target token is replaced by a random one
    eval_decode: int = setting(64, check="positive_int")  # held-out pairs decoded greedily for exact-match accuracy

    def __post_init__(self):
        check_seed("seed", self.seed)
        # 3 ids are reserved for the translation task's PAD, BOS, EOS; the check holds for both tasks
        if not 2 <= self.classes <= self.vocab_size - 3:
            raise ConfigError("classes", self.classes, f"must be in [2, vocab_size - 3={self.vocab_size - 3}]")
        if self.translation_max_len < self.translation_min_len:
            raise ConfigError("translation_max_len", self.translation_max_len,
                              f"must be >= translation_min_len={self.translation_min_len}")


# Host memory, from the config alone (`SyntheticMarkov.host_bytes`): what numpy allocates while the source
# builds and loads, by array. tests/test_resources.py holds the estimate within 1.0-1.3x of real loads: their
# numpy allocations (tracemalloc) and, for translation pairs, their peak resident memory.
WORD = 8  # bytes of a float64 or int64 element: the tables, the random draws, the tokens while generated
SEQUENCE_CLASS_BYTES = 26  # per sequence and class, each position: the (n, classes) class distribution, its
# two gathered parts and its cumulative sum (numpy reuses temporaries above 256 kB; measured 24-25)
SEQUENCE_BYTES = 32  # per sequence: its NLL, the previous classes, the drawn class, index arrays


def table_bytes(classes: int, vocab_size: int) -> tuple[int, int]:
    """(peak, held) bytes of `MarkovLanguage`'s tables: the trigram table is classes^3 floats, built from as
    many random keys and their argsort order (two classes^3 arrays at once); the bigram table classes^2; per
    token its class, log-probability, member index and emission probability."""
    k = classes
    held = WORD * (k**3 + k**2 + k) + 4 * WORD * vocab_size
    return max(2 * WORD * k**3 + WORD * (k**2 + k), held), held


def sample_bytes(n: int, length: int, classes: int, vocab_size: int) -> int:
    """Peak bytes of `MarkovLanguage.sample(n, length)` beyond the tables: two uniform draws and the tokens
    (n x length, 8 bytes each), and per position the class distributions (n x classes) or, when a class
    holds more tokens than there are classes, the within-class cumulative sums (n x tokens per class)."""
    per_class = -(-vocab_size // classes)
    step = max(SEQUENCE_CLASS_BYTES * classes, WORD * classes + (WORD + 1) * per_class)
    return n * (3 * WORD * length + step + SEQUENCE_BYTES)


def zipf(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


class MarkovLanguage:
    """The source's tables: class transitions, token classes and within-class emissions."""

    def __init__(self, cfg: SyntheticConfig, rng: np.random.Generator):
        k, v = cfg.classes, cfg.vocab_size
        self.w = cfg.trigram_weight

        def zipf_rows(n: int) -> np.ndarray:
            order = np.argsort(rng.random((n, k)), axis=1)  # a random permutation per row
            rows = np.empty((n, k))
            np.put_along_axis(rows, order, np.broadcast_to(zipf(k, cfg.class_zipf), (n, k)), axis=1)
            return rows

        self.start = zipf_rows(1)[0]
        self.bigram = zipf_rows(k)
        self.trigram = zipf_rows(k * k).reshape(k, k, k)
        self.token_class = rng.permutation(v) % k
        # members[c] lists class c's tokens in emission-rank order (random), emission[c] their probabilities
        self.members = [np.flatnonzero(self.token_class == c)[rng.permutation((self.token_class == c).sum())]
                        for c in range(k)]
        self.emission = [zipf(len(m), cfg.emission_zipf) for m in self.members]
        self.token_logp = np.empty(v)
        for members, probs in zip(self.members, self.emission):
            self.token_logp[members] = np.log(probs)

    def class_probs(self, a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
        """Next-class distribution given the two previous tokens (a is None at position 1)."""
        kb = self.token_class[b]
        if a is None:
            return self.bigram[kb]
        return (1 - self.w) * self.bigram[kb] + self.w * self.trigram[self.token_class[a], kb]

    def _emit(self, classes: np.ndarray, u: np.ndarray) -> np.ndarray:
        tokens = np.empty(classes.shape[0], dtype=np.int64)
        for c in np.unique(classes):
            rows = classes == c
            rank = _inverse_cdf(np.broadcast_to(self.emission[c], (rows.sum(), self.emission[c].size)), u[rows])
            tokens[rows] = self.members[c][rank]
        return tokens

    def sample(self, n: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n sequences of `length` tokens, and each sequence's mean true NLL over positions 1.."""
        u_class, u_token = rng.random((n, length)), rng.random((n, length))
        x = np.empty((n, length), dtype=np.int64)
        nll = np.zeros(n)
        first = _inverse_cdf(np.broadcast_to(self.start, (n, self.start.size)), u_class[:, 0])
        x[:, 0] = self._emit(first, u_token[:, 0])
        for t in range(1, length):
            p = self.class_probs(x[:, t - 2] if t >= 2 else None, x[:, t - 1])
            classes = _inverse_cdf(p, u_class[:, t])
            x[:, t] = self._emit(classes, u_token[:, t])
            nll -= np.log(p[np.arange(n), classes]) + self.token_logp[x[:, t]]
        return x, nll / (length - 1)


def _inverse_cdf(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(p, axis=1)
    return np.minimum((cdf < u[:, None] * cdf[:, -1:]).sum(axis=1), p.shape[1] - 1)


@register("synthetic")
class SyntheticMarkov:
    """The synthetic language as a language-model stream (task "lm") or as translation pairs."""

    Config = SyntheticConfig
    tasks = ("lm", "translation")

    def __init__(self, cfg: SyntheticConfig, cache_dir: Path):
        self.cfg, self.cache_dir = cfg, cache_dir

    @staticmethod
    def positions(cfg: SyntheticConfig, task: str) -> int:
        return cfg.seq_len if task == "lm" else cfg.translation_max_len + 1  # target input: BOS + tokens

    @staticmethod
    def host_bytes(cfg: SyntheticConfig, task: str) -> HostBytes:
        """Building (the tables, then sampling every sequence), then loading the cached dataset (its tokens
        read back as int64), computed from the keys: nothing is generated. A cached dataset skips the
        build; the estimate is the build's (an upper bound)."""
        n = cfg.train_sequences + cfg.eval_sequences
        if task == "lm":
            length = cfg.seq_len + 1
            tables_peak, tables_held = table_bytes(cfg.classes, cfg.vocab_size)
            sequences = sample_bytes(n, length, cfg.classes, cfg.vocab_size)
            load = 2 * WORD * n * length  # int64 tokens, and the unigram loss's copy of the targets
            held = WORD * n * length
        else:
            real = language_config(cfg).vocab_size
            tables_peak, tables_held = table_bytes(cfg.classes, real)
            sequences = max(sample_bytes(n, cfg.translation_max_len, cfg.classes, real),
                            pair_bytes(n, cfg.translation_max_len))
            load, held = pair_load_bytes(n, cfg.translation_max_len)
        build = max(tables_peak, tables_held + sequences)
        tables = tables_peak if build == tables_peak else tables_held
        return HostBytes(peak=max(build, load), held=held,
                         parts={"classes": tables, "train_sequences": max(build, load) - tables})

    def build(self, task: str):
        from datasets import Dataset, DatasetDict

        rng = np.random.default_rng(self.cfg.seed)
        n_train, n_eval = self.cfg.train_sequences, self.cfg.eval_sequences
        if task == "lm":
            language = MarkovLanguage(self.cfg, rng)
            tokens, nll = language.sample(n_train + n_eval, self.cfg.seq_len + 1, rng)
            dtype = np.int16 if self.cfg.vocab_size <= np.iinfo(np.int16).max else np.int32
            columns = {"tokens": tokens.astype(dtype), "optimal_nll_sum": nll * self.cfg.seq_len,
                       "n_targets": np.full(len(nll), self.cfg.seq_len)}
        else:
            language = MarkovLanguage(language_config(self.cfg), rng)
            columns = make_pairs(language, self.cfg, n_train + n_eval, rng)
        split = {"train": slice(0, n_train), "eval": slice(n_train, None)}
        return DatasetDict({name: Dataset.from_dict({k: v[s] for k, v in columns.items()})
                            for name, s in split.items()})

    def load(self, task: str) -> TaskData:
        fields = {k: v for k, v in asdict(self.cfg).items() if task == "translation" or not k.startswith("translation")}
        key = cache_key(f"synthetic-{task}", {**fields, "eval_decode": 0, "version": GENERATOR_VERSION})
        data = cached_dataset(self.cache_dir / "data" / key, lambda: self.build(task))

        def tensors(split: str, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
            table = data[split].with_format("numpy")[:]
            return {name: torch.from_numpy(table[name].astype(np.int64)) for name in names}

        names = ("tokens",) if task == "lm" else ("src", "tgt")
        train = tensors("train", names)
        evaluation = tensors("eval", names if task == "lm" else (*names, "reference"))
        # Unformatted columns: float64 as stored.
        optimal = float(np.sum(data["eval"]["optimal_nll_sum"]) / np.sum(data["eval"]["n_targets"]))
        target = "tokens" if task == "lm" else "tgt"
        return TaskData(
            task=task,
            train=train,
            eval=evaluation,
            vocab_size=self.cfg.vocab_size,
            optimal_loss=optimal,
            unigram_loss=unigram_loss(train[target][:, 1:], evaluation[target][:, 1:], self.cfg.vocab_size,
                                      pad=None if task == "lm" else PAD),
        )
