"""Per-layer vectors on disk: one Parquet file per measured step, `layers/step_0000050.parquet`.

Each file is a long table (one row per residual block: step, stack, layer, sublayer, position, then one
column per metric), written to a hidden temporary name and renamed, so a killed run never leaves a half
file. `pandas.read_parquet(run_dir / "layers")` reads them all (files starting with "." are skipped);
at 1,000 layers a file is ~2,000 rows, tens of kB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files import atomic_path
from . import Sink


class LayerFileSink(Sink):
    def __init__(self, directory: Path):
        self.directory = directory
        self.last_step: int | None = None

    def log_layers(self, step: int, table: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.directory.mkdir(exist_ok=True)
        rows = len(next(iter(table.values())))
        columns = {"step": np.full(rows, step, dtype=np.int64), **table}
        with atomic_path(self.directory / f"step_{step:07d}.parquet") as temporary:
            pq.write_table(pa.table(columns), temporary)
        self.last_step = step

    def state_dict(self) -> dict:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        last = -1 if state["last_step"] is None else state["last_step"]
        for path in self.directory.glob("step_*.parquet"):
            if int(path.stem.split("_")[1]) > last:
                path.unlink()


def load_layers(run_dir: Path):
    """Every per-layer record of a run as one pandas DataFrame (empty if the run logged none)."""
    import pandas as pd

    directory = Path(run_dir) / "layers"
    if not directory.is_dir() or not any(directory.glob("step_*.parquet")):
        return pd.DataFrame()
    # One file per step; columns differ where a step measured less (step 0 has no gradients): concat aligns.
    frames = [pd.read_parquet(path) for path in sorted(directory.glob("step_*.parquet"))]
    return pd.concat(frames, ignore_index=True).sort_values(["step", "position"], ignore_index=True)
