"""FLOPs a training token costs, and the model FLOPs utilisation (MFU) a run achieves.

Per token, training costs 6 FLOPs per weight of every matrix the token passes through (2 forward, 4
backward; the output head counts, the embedding lookup does not), plus 12 d_model x context FLOPs per
attention sublayer (scores and weighted values, forward and backward; a causal mask is counted in full, as
PaLM's appendix B and Chinchilla do). Activation checkpointing's recomputed forward is not counted: MFU
measures the model's FLOPs, not the hardware's. MFU = achieved model FLOP/s / (peak FLOP/s x processes).
"""

from __future__ import annotations

import torch
from torch import nn

from .trainer import Callback, StepOutput, Trainer

# Dense bf16 tensor-core peaks, TFLOP/s, from the vendors' datasheets (no sparsity); matched against
# torch.cuda.get_device_name. `train.peak_tflops` overrides (any other GPU, or a clock-limited one).
PEAK_BF16_TFLOPS = {
    "H200": 989.0, "H100": 989.0, "H800": 989.0, "GH200": 989.0, "A100": 312.0, "A800": 312.0,
    "L40S": 362.0, "L4": 121.0, "A10": 125.0, "RTX 4090": 165.2, "RTX 3090": 71.0, "V100": 125.0,
    "MI300X": 1307.4, "MI250X": 383.0,
}


def flops_per_token(model: nn.Module, context: int) -> float:
    """Training FLOPs per target token of `model` on sequences of `context` positions."""
    matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    embeddings = [m for m in model.modules() if hasattr(m, "logits") and hasattr(m, "token")]
    tied_head = next((m.token.weight.numel() for m in embeddings if getattr(m, "head", None) is None), 0)
    d_model = model.cfg.d_model
    attention = sum(1 for _, _, sublayer, _ in model.residual_blocks() if sublayer in ("attn", "cross"))
    return 6.0 * (matrices + tied_head) + 12.0 * d_model * context * attention


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    """The device's peak bf16 FLOP/s: `override_tflops` if given, else the table's entry for this GPU;
    None on a CPU or an unknown GPU (MFU is then not reported, the achieved FLOP/s still is)."""
    if override_tflops is not None:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    match = max((key for key in PEAK_BF16_TFLOPS if key in name), key=len, default=None)
    return PEAK_BF16_TFLOPS[match] * 1e12 if match else None


class Throughput(Callback):
    """Beside every `tokens_per_s` record: `flops_per_s` (model FLOPs achieved, all processes together)
    and, where the peak is known, `mfu`. Install it after ScalarMetrics."""

    def __init__(self, flops_per_token: float, peak: float | None, processes: int):
        self.flops_per_token, self.peak, self.processes = flops_per_token, peak, processes

    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if "tokens_per_s" in trainer.record:
            achieved = trainer.record["tokens_per_s"] * self.flops_per_token
            trainer.record["flops_per_s"] = achieved
            if self.peak:
                trainer.record["mfu"] = achieved / (self.peak * self.processes)

    def mfu(self, tokens_per_s: float | None) -> float | None:
        if tokens_per_s is None or not self.peak:
            return None
        return tokens_per_s * self.flops_per_token / (self.peak * self.processes)
