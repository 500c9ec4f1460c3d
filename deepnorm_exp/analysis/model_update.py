"""The decoder-only views of the paper's mechanism (not judged: the claims read early_update_encdec, the
paper's shape and window): the model update ||F(x,θt) − F(x,θ0)||, the LayerNorm inputs and the per-layer
gradients over the first 200 steps, at two rates and at 1,000 layers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import plots
from .page import Page, Study

if TYPE_CHECKING:
    from .evidence import Evidence


def mechanism_section(page: Page, evidence: Evidence, name: str) -> None:
    runs = evidence.at_one_lr(name)
    page.figure(name, plots.model_update(evidence.scalars(name)),
                "||F(x,θt) − F(x,θ0)|| over the first steps, per scheme, one line per depth (decoder-only).")
    page.figure("ln_input_norm", plots.ln_input_norm(evidence.layers(name), runs),
                "LayerNorm input ||x|| / sqrt(d) by position in the stack, at the last per-layer step.")
    page.figure("layer_grad_norm", plots.layer_profile(evidence.layers(name), "grad_norm"),
                "Per-layer gradient norm by position in the stack, at the last per-layer step.")


def low_rate_section(page: Page, evidence: Evidence, name: str) -> None:
    page.figure(name, plots.model_update(evidence.scalars(name)),
                "||F(x,θt) − F(x,θ0)|| at lr 1e-4, per scheme, one line per depth.")


def thousand_layers_section(page: Page, evidence: Evidence, name: str) -> None:
    page.figure(name, plots.model_update(evidence.scalars(name)),
                "||F(x,θt) − F(x,θ0)|| at 1,000 layers, per scheme.")


DECODER = Study("model_update", "Decoder-only model update, LayerNorm inputs and per-layer gradients (a second view, "
                "not judged)", "The first 200 steps (warm-up 100) at depths 6 to 100, two seeds, lr 1e-3, every scalar "
                "every step, per-layer vectors every 10. The mechanism claims read early_update_encdec, the paper's "
                "shape and window, instead.", mechanism_section)
LOW_LR = Study("model_update_low_lr", "The same at a tenth of the rate (a second view, not judged)",
               "model_update's training at lr 1e-4: at 1e-3 every scheme's update reaches about sqrt(2 d) by the peak, "
               "as far as unrelated outputs lie apart.", low_rate_section)
THOUSAND_LAYERS = Study("model_update_1000l", "The same at 1,000 layers (an extension, not judged)",
                        "model_update's training at depth 1,000, one seed.", thousand_layers_section)
