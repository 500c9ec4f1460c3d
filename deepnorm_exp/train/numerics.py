"""How a run computes: autocast precision and fp16's loss scaling, deterministic kernels, subnormal floats.
Each is set from the config for the run and undone after it."""

from __future__ import annotations

import contextlib
import logging
import os

import torch
from omegaconf import DictConfig

log = logging.getLogger("deepnorm_exp")


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def loss_scaler(train: DictConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's dynamic loss scaling (torch.amp.GradScaler; CUDA, or the CPU's fp16 autocast)."""
    if train.precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, init_scale=train.loss_scale_init,
                                growth_interval=train.loss_scale_window)


DETERMINISTIC_CUBLAS = ":4096:8"  # cuBLAS's documented setting for reproducible results


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """bf16 (or other) autocast when a dtype is given; full precision otherwise."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


@contextlib.contextmanager
def deterministic_kernels(enabled: bool):
    """torch.use_deterministic_algorithms for the run, then as it was. On CUDA, several kernels (index and
    scatter backward, some attention backward) add with atomics in whatever order threads arrive, so two
    runs of one config, or a run and its resume, can differ in the last bits and then drift; on the CPU the
    harness's runs repeat bit for bit without this. cuBLAS also needs a fixed workspace, which it reads once
    per process: the command line sets it before CUDA starts (`deepnorm_exp.__main__`); a process that used
    CUDA before this run without it (a notebook's earlier run) is told so."""
    if not enabled:
        yield
        return
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        if torch.cuda.is_initialized():
            log.warning("train.deterministic: cuBLAS's workspace was set when this process first used CUDA; "
                        "for bit-identical matrix products set CUBLAS_WORKSPACE_CONFIG=%s before it starts",
                        DETERMINISTIC_CUBLAS)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = DETERMINISTIC_CUBLAS
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@contextlib.contextmanager
def subnormals_flushed(enabled: bool):
    """Subnormal floats flushed to zero on the CPU for the run (torch.set_flush_denormal), then kept again,
    torch's default (torch cannot say what the process had). x86 computes with a subnormal tens of times
    slower than with a normal float, and deep Post-LN's backward is full of them: its gradient vanishes
    toward the bottom. Measured here at depth 200 (d_model 64, batch 8 x 64, 2 cores): 3.87 s a step with
    subnormals, 0.70 s flushed, while Pre-LN's step is 0.66 s either way. What is flushed is below
    1.2e-38; GPUs compute with subnormals at full speed, so the option changes nothing there."""
    if enabled:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if enabled:
            torch.set_flush_denormal(False)
