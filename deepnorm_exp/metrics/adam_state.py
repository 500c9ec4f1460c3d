"""Adam's own view of each block: how large its unscaled update is, and how much of it epsilon decides.

Wortsman et al. 2023: when a parameter's gradient RMS falls toward Adam's epsilon, the update
m_hat / (sqrt(v_hat) + eps) shrinks below the sign-like size Adam is meant to take, and the layer stops
learning; lowering epsilon restores it. Deep Post-LN's bottom blocks, whose gradients vanish, are where to
look."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..train.trainer import Callback, StepOutput, Trainer, is_due
from . import Context, instrument
from .blocks import ParamBlocks


@dataclass
class AdamStateConfig:
    adam_state: bool = True  # per-layer adam_update_rms and adam_below_eps, from the optimizer's state


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP: this rank's shard


class AdamState(Callback):
    """Every `every` steps, after the optimizer step, per residual block (its parameters' coordinates
    together), from Adam's moments m and v after `t` steps (bias-corrected: m_hat = m / (1 - beta1^t),
    v_hat = v / (1 - beta2^t)):

    * `adam_update_rms`: the RMS of u = m_hat / (sqrt(v_hat) + eps), the update before the learning rate
      (about 1 where gradients keep their sign; far below 1 where sqrt(v_hat) is at or under eps);
    * `adam_below_eps`: the share of coordinates whose sqrt(v_hat) is below eps.

    Nothing is recorded under an optimizer without Adam's moments."""

    def __init__(self, blocks: ParamBlocks, every: int):
        self.blocks, self.every = blocks, every
        self.position = {p: i for i, p in enumerate(blocks.params)}

    @torch.no_grad()
    def on_step_end(self, trainer: Trainer, out: StepOutput) -> None:
        if not is_due(out.step, self.every, trainer.steps):
            return
        rows, where, mesh = [], [], None  # per parameter: sum of u^2, coordinates, coordinates below eps
        for group in trainer.optimizer.param_groups:
            beta1, beta2 = group.get("betas", (None, None))
            for p in group["params"]:
                state = trainer.optimizer.state.get(p, {})
                if "exp_avg_sq" not in state or p not in self.position:
                    continue
                t = float(state["step"])
                mesh = mesh or getattr(state["exp_avg"], "device_mesh", None)
                m, v = _local(state["exp_avg"]).float(), _local(state["exp_avg_sq"]).float()
                root_v = (v / (1 - beta2 ** t)).sqrt()
                u = (m / (1 - beta1 ** t)) / (root_v + group["eps"])
                rows.append(torch.stack([u.double().square().sum(), torch.full((), u.numel(), dtype=torch.float64,
                                         device=u.device), (root_v < group["eps"]).sum().double()]))
                where.append(self.position[p])
        if not rows:
            return
        stacked = torch.stack(rows, dim=1)  # (3, parameters seen), still on the device: one transfer below
        if mesh is not None:  # every rank holds a shard of each parameter's state
            torch.distributed.all_reduce(stacked, group=mesh.get_group())
        sums = torch.zeros(3, len(self.blocks.params), dtype=torch.float64)
        sums[:, torch.tensor(where)] = stacked.cpu()
        per_block = torch.zeros(3, self.blocks.n_blocks, dtype=torch.float64)
        inside = self.blocks.block_of >= 0
        per_block.index_add_(1, self.blocks.block_of[inside], sums[:, inside])
        coordinates = per_block[1]
        trainer.layer_record["adam_update_rms"] = (per_block[0] / coordinates).sqrt().float().numpy()
        trainer.layer_record["adam_below_eps"] = (per_block[2] / coordinates).float().numpy()


@instrument("adam_state", AdamStateConfig, order=25)
def build(cfg, context: Context) -> AdamState | None:
    every = context.layer_every(cfg.adam_state)
    return AdamState(context.blocks, every) if every else None
