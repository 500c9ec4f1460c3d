"""A synthetic translation task with an exactly known optimal loss, built on the synthetic language.

Source: a sentence of the Markov language (length uniform in [min_len, max_len]). Target: each source token
mapped through a fixed random bijection of the vocabulary, the order reversed within consecutive blocks of
`reorder` tokens (so the model must learn an alignment, not a copy), then EOS. With probability `noise`
each target token (EOS excepted) is replaced by a uniformly drawn one. Given the whole source, the clean
target is determined, so the Bayes-optimal NLL of a target token is -log(1 - noise + noise / R) where the
token is the clean one and -log(noise / R) where noise changed it (R real tokens), and 0 at EOS.

Token ids: 0 PAD, 1 BOS, 2 EOS, then the R = vocab_size - 3 real tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..special_tokens import BOS, EOS, PAD, SPECIALS


def reorder_positions(length: int, block: int) -> np.ndarray:
    """Where each source position lands in the target: reversed within blocks of `block`."""
    i = np.arange(length)
    start = (i // block) * block
    end = np.minimum(start + block, length)
    return start + (end - 1 - i)


def make_pairs(language, cfg, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """n (source, noisy target, clean target) triples, padded; plus each pair's optimal NLL sum and count."""
    real = cfg.vocab_size - SPECIALS
    bijection = rng.permutation(real) + SPECIALS
    words, _ = language.sample(n, cfg.translation_max_len, rng)
    lengths = rng.integers(cfg.translation_min_len, cfg.translation_max_len + 1, size=n)
    noise_draw, noise_token = rng.random((n, cfg.translation_max_len)), rng.integers(0, real, (n, cfg.translation_max_len))

    src = np.zeros((n, cfg.translation_max_len), dtype=np.int64)
    clean = np.zeros((n, cfg.translation_max_len + 2), dtype=np.int64)
    clean[:, 0] = BOS
    for row, length in enumerate(lengths):
        src[row, :length] = words[row, :length] + SPECIALS
        clean[row, 1 + reorder_positions(length, cfg.translation_reorder)] = bijection[words[row, :length]]
        clean[row, 1 + length] = EOS
    noisy = clean.copy()
    is_real = clean[:, 1:-1] >= SPECIALS
    replace = (noise_draw < cfg.translation_noise) & is_real
    noisy[:, 1:-1] = np.where(replace, noise_token + SPECIALS, clean[:, 1:-1])

    p_clean = 1 - cfg.translation_noise + cfg.translation_noise / real
    token_nll = np.where(noisy[:, 1:-1] == clean[:, 1:-1], -np.log(p_clean),
                         -np.log(max(cfg.translation_noise, 1e-300) / real))
    nll_sum = np.where(is_real, token_nll, 0.0).sum(axis=1)  # EOS: NLL 0; PAD: not a target
    return {"src": src, "tgt": noisy, "reference": clean, "optimal_nll_sum": nll_sum,
            "n_targets": (lengths + 1).astype(np.int64)}


def pair_bytes(n: int, max_len: int) -> int:
    """Peak host bytes of `make_pairs(n)` and of turning its columns into a dataset, beyond the language's
    sampling: make_pairs holds about nine n x max_len int64/float64 arrays at once, and `Dataset.from_dict`
    converts the int64 columns (src, tgt, reference: 3 max_len + 4 values a pair with the NLL and count)
    through Python lists, ~50 bytes a value with the columns and the Arrow table (peak RSS measured 49.4 here
    and 50.5 on CI's machine, whose allocator and library builds differ: the bound keeps 7% above the higher;
    tests/test_resources.py holds it against tracemalloc and peak RSS)."""
    return max(72 * n * max_len, 54 * n * (3 * max_len + 4))


def pair_load_bytes(n: int, max_len: int) -> tuple[int, int]:
    """(peak, held) host bytes of loading n cached pairs: the columns read back as numpy and copied to
    int64 tensors; held, the training split's src and tgt and the eval split's reference (8 bytes each)."""
    return 14 * n * (3 * max_len + 4), 8 * n * (2 * max_len + 4)


def language_config(cfg):
    """The synthetic language of the source side: the real tokens only."""
    return dataclasses.replace(cfg, vocab_size=cfg.vocab_size - SPECIALS)
