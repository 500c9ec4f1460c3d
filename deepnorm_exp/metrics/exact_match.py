"""Exact-match accuracy of greedy translations against the noiseless references."""

from __future__ import annotations

import torch
from torch import nn

from ..data import TaskData
from ..models.encdec import EOS, PAD


@torch.no_grad()
def exact_match(model: nn.Module, data: TaskData, n: int, batch_size: int, device: torch.device) -> float:
    """Share of the first `n` held-out sources whose greedy translation equals the reference through EOS."""
    was_training = model.training
    model.eval()
    src, reference = data.eval["src"][:n], data.eval["reference"][:n]
    hits = 0
    for start in range(0, src.shape[0], batch_size):
        ref = reference[start:start + batch_size].to(device)
        out = model.greedy_decode(src[start:start + batch_size].to(device), max_len=ref.shape[1] - 1)
        out = torch.nn.functional.pad(out, (0, ref.shape[1] - out.shape[1]), value=PAD)
        # Compare through the reference's EOS: tokens after it are padding in both when decoding stopped.
        valid = torch.cumsum((ref == EOS).long(), dim=1) - (ref == EOS).long() == 0
        hits += int(((out == ref) | ~valid).all(dim=1).sum())
    model.train(was_training)
    return hits / src.shape[0]
