"""Hydra callbacks: the comparison table printed when a multirun ends."""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..lifecycle.summary import format_table, load_summaries


class ComparisonTable(Callback):
    """Prints every run recorded under runs/<experiment>/ as one norm x depth table."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        root = Path(config.paths.runs) / str(config.experiment_name)
        print(f"\n{root}\n{format_table(*load_summaries(root))}", flush=True)
