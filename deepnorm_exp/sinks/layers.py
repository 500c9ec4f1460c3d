"""Per-layer vectors on disk: one Parquet file per measured step, `layers/step_0000050.parquet`.

Each file is a long table (one row per residual block: step, stack, layer, sublayer, position, then one
column per metric), written to a hidden temporary name and renamed, so a killed run never leaves a half
file. `pandas.read_parquet(run_dir / "layers")` reads them all (files starting with "." are skipped);
at 1,000 layers a file is ~2,000 rows, tens of kB.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from ..records import atomic_path, parquet_size_problem
from ..rundir import RunDir
from . import Sink

log = logging.getLogger("deepnorm_exp")

# A step's file holds a row per residual block: 2,000 rows of ~20 numbers at depth 1,000. Far more is not one.
MAX_STEP_ROWS, MAX_STEP_BYTES = 1_000_000, 256 * 2**20
STEP_FILE = re.compile(r"step_(\d{7,})\.parquet")  # what log_layers names a file; nothing else is read back


def step_files(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of each file in `directory` named exactly as `log_layers` names them, in step order; a
    stray file ("step_0000005 (copy).parquet") is neither read nor deleted."""
    if not directory.is_dir():
        return []
    found = ((STEP_FILE.fullmatch(path.name), path) for path in directory.iterdir())
    return sorted((int(match.group(1)), path) for match, path in found if match and path.is_file())


class LayerFileSink(Sink):
    name = "layers"

    def __init__(self, directory: Path):
        self.directory = directory
        self.steps: list[int] = []  # the steps this run wrote a file for, in order

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step:07d}.parquet"  # STEP_FILE reads it back

    def log_layers(self, step: int, table: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.directory.mkdir(exist_ok=True)
        rows = len(next(iter(table.values())))
        columns = {"step": np.full(rows, step, dtype=np.int64), **table}
        with atomic_path(self.path(step)) as temporary:
            pq.write_table(pa.table(columns), temporary)
        self.steps.append(step)

    def state_dict(self) -> dict:
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: dict) -> None:
        """Delete what a crashed attempt wrote after the checkpoint; name the files the checkpoint knows
        that are gone (measurements cannot be rebuilt: they are missing from the record, and said so)."""
        self.steps = list(state["steps"])
        last = self.steps[-1] if self.steps else -1
        for step, path in step_files(self.directory):
            if step > last:
                path.unlink()
        missing = [step for step in self.steps if not self.path(step).is_file()]
        if missing:
            log.warning("%s: the per-layer files of step(s) %s are missing; the resumed run goes on without them",
                        self.directory, ", ".join(map(str, missing)))


def load_layers(run_dir: Path):
    """Every per-layer record of a run as one pandas DataFrame (empty if the run logged none)."""
    import pandas as pd

    # One file per step; columns differ where a step measured less (step 0 has no gradients): concat aligns.
    frames = []
    for _, path in step_files(RunDir(run_dir).layers):
        if why := parquet_size_problem(path, MAX_STEP_ROWS, MAX_STEP_BYTES):
            log.warning("%s is damaged and was skipped (%s)", path, why)
            continue
        try:
            frames.append(pd.read_parquet(path))
        except Exception as e:  # noqa: BLE001 - whatever pyarrow raises on a damaged file
            log.warning("%s is damaged and was skipped (%s)", path, type(e).__name__)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values(["step", "position"], ignore_index=True)
