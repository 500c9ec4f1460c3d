"""The studies the results page shows, in its order: each is one module's `Study` (its preset, section,
README block), so a new study is its module plus one line here."""

from __future__ import annotations

from . import (board, budget, depth_sweep, early_window, final_quality, frontier, lr_study, mitigations, model_update,
               steps_to_train, warmup)
from .page import Study

STUDIES: list[Study] = [
    steps_to_train.DECODER, steps_to_train.ENCDEC, steps_to_train.FP16,
    lr_study.SYNTHETIC, lr_study.TEXT, final_quality.TEXT_FINAL, budget.BUDGET,
    early_window.EARLY_UPDATE, steps_to_train.THOUSAND_LAYERS,
    model_update.DECODER, model_update.LOW_LR, model_update.THOUSAND_LAYERS,
    warmup.LOW_LR, warmup.QUICK_RATE, mitigations.MITIGATIONS, frontier.FRONTIER,
    depth_sweep.DECODER, depth_sweep.ENCDEC, depth_sweep.GPU, depth_sweep.QUICKSTART, board.BOARD, frontier.BOARD_FRONTIER,
    depth_sweep.ZOO,
]
