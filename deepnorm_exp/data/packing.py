"""Packing a token stream into fixed-length training blocks, and serving them by index from the cache.

Block i is stream[i*L : i*L + L + 1] for L = seq_len: consecutive blocks share one token, so every token
after the first is a prediction target exactly once (and an input exactly once), and only the stream's
last partial block, fewer than L tokens, is dropped. (The usual `group_texts` map drops a partial block
per map batch and never predicts the first token of each block.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch


def token_stream(dataset, column: str = "ids") -> np.ndarray:
    """The documents' token lists of a `datasets.Dataset`, concatenated in row order (no Python loop)."""
    flat = pc.list_flatten(dataset.data.column(column))
    return flat.to_numpy() if flat.num_chunks else np.empty(0, dtype=np.int32)


def pack(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """(blocks of seq_len + 1 tokens overlapping by one, number of trailing tokens left out)."""
    n_blocks = max(len(stream) - 1, 0) // seq_len
    if n_blocks == 0:
        return np.empty((0, seq_len + 1), stream.dtype), len(stream)
    windows = np.lib.stride_tricks.sliding_window_view(stream, seq_len + 1)[::seq_len]
    return np.ascontiguousarray(windows[:n_blocks]), len(stream) - (n_blocks * seq_len + 1)


def blocks_table(blocks: np.ndarray) -> pa.Table:
    """A one-column Arrow table ("tokens": fixed-size lists), zero-copy from the numpy blocks."""
    flat = pa.array(blocks.reshape(-1))
    return pa.table({"tokens": pa.FixedSizeListArray.from_arrays(flat, blocks.shape[1])})


class TokenBlocks:
    """Rows of a cached blocks dataset, indexed like a tensor: `blocks[index]` -> int64 (len(index), L + 1).

    The Arrow file is memory-mapped: a run holds in memory only the batches it draws.
    """

    def __init__(self, dataset):
        self.dataset = dataset.with_format("torch", columns=["tokens"])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index) -> torch.Tensor:
        rows = self.dataset[index.tolist() if isinstance(index, torch.Tensor) else index]["tokens"]
        return rows.long()  # stored as int32
