"""`make bench` (section `data`): the text pipeline's cold and warm cache times, and whether the loader can
keep up with a 1,000-layer step.

On a generated ~100 MB text file (Zipf-distributed pseudo-words, one document per line), each in a fresh
process with an empty `datasets` cache where it says cold:
  * cold: `load_data` from the text file to packed, cached blocks (datasets' text loader, tokenizing map,
    packing, save), byte tokenizer and a BPE trained to 8,192 tokens;
  * warm: the same call once the entry exists (memory-mapped, nothing tokenized);
  * loader: batches of 8 x 65 tokens drawn with the trainer's sampler (RandomBatches over the memory-mapped
    blocks), tokens per second, against what a depth-1,000 training step consumes per second.
Ratios and times from one run; never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BATCH, SEQ = 8, 64  # the shape of bench.py's step


def write_corpus(path: Path, megabytes: int, seed: int = 0) -> Path:
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzéü"))
    words = np.array(["".join(rng.choice(letters, rng.integers(2, 11))) for _ in range(20_000)])
    p = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    p /= p.sum()
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < megabytes * 1_000_000:
            ids = rng.choice(len(words), size=(2_000, 130), p=p)
            lengths = rng.integers(10, 130, size=2_000)
            f.write("".join(" ".join(words[row[:n]]) + "\n" for row, n in zip(ids, lengths)))
    return path


def child(args) -> None:
    """One measurement in this process: load (cold or warm), then optionally draw batches."""
    import torch

    import deepnorm_exp
    from deepnorm_exp.data import load_data
    from deepnorm_exp.train.batches import RandomBatches

    overrides = ["data=text", f"data.files={args.file}", f"train.seq_len={SEQ}", *json.loads(args.overrides)]
    cfg = deepnorm_exp.compose(overrides)
    started = time.perf_counter()
    data = load_data(cfg.data, args.cache)
    out = {"load_s": time.perf_counter() - started, "train_blocks": data.train_size}
    if args.batches:
        torch.set_num_threads(1)
        batches = RandomBatches(data.train, BATCH, seed=0)
        next(batches)
        started = time.perf_counter()
        for _ in range(args.batches):
            next(batches)["tokens"].to("cpu")
        out["loader_tokens_per_s"] = args.batches * BATCH * SEQ / (time.perf_counter() - started)
    print(json.dumps(out))


def measure(file: Path, cache: Path, hf_cache: Path, overrides: list[str], batches: int = 0) -> dict:
    env = {**os.environ, "HF_DATASETS_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_data", "--child", "--file", str(file),
                           "--cache", str(cache), "--overrides", json.dumps(overrides), "--batches", str(batches)],
                          env=env, capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)  # `-m benchmarks.*` from the repository root
    return json.loads(proc.stdout.strip().splitlines()[-1])


def data_section(root: Path, megabytes: int, depth_step_s: float | None) -> None:
    started = time.perf_counter()
    corpus = write_corpus(root / "corpus.txt", megabytes)
    size_mb = corpus.stat().st_size / 1e6
    print(f"text pipeline on a generated {size_mb:.0f} MB file ({time.perf_counter() - started:.0f} s to write), "
          f"{os.cpu_count()} cores:")
    for name, overrides in (("byte", []), ("bpe 8192", ["data.tokenizer=bpe", "data.vocab_size=8192"])):
        cache = root / f"cache-{name.split()[0]}"
        cold = measure(corpus, cache, root / f"hf-{name.split()[0]}", overrides)
        warm = measure(corpus, cache, root / f"hf-{name.split()[0]}", overrides, batches=2_000)
        print(f"  {name:<9} cold {cold['load_s']:6.1f} s ({size_mb / cold['load_s']:.1f} MB/s)  warm "
              f"{warm['load_s']:5.2f} s  {warm['train_blocks']:,} blocks  loader "
              f"{warm['loader_tokens_per_s']:,.0f} tokens/s")
    per_batch_ms = BATCH * SEQ / warm["loader_tokens_per_s"] * 1e3
    line = f"  loader: {per_batch_ms:.2f} ms per batch of {BATCH} x {SEQ + 1} tokens"
    if depth_step_s:
        consumed = BATCH * SEQ / depth_step_s
        line += (f"; a depth-1,000 step here takes {depth_step_s:.2f} s ({consumed:,.0f} tokens/s): the loader "
                 f"delivers {warm['loader_tokens_per_s'] / consumed:,.0f}x that")
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--file", default="")
    parser.add_argument("--cache", default="")
    parser.add_argument("--overrides", default="[]")
    parser.add_argument("--batches", type=int, default=0)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--depth-step-s", type=float, default=None)
    args = parser.parse_args()
    if args.child:
        return child(args)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data_section(Path(tmp), args.megabytes, args.depth_step_s)


if __name__ == "__main__":
    main()
