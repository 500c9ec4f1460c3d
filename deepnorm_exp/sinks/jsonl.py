"""metrics.jsonl (one JSON object per logged step) and events.jsonl, flushed as written: a crash loses nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import Sink


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable ("nan", "inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class JsonlSink(Sink):
    def __init__(self, run_dir: Path):
        self.metrics = open(run_dir / "metrics.jsonl", "w", encoding="utf-8")
        self.events_path = run_dir / "events.jsonl"

    def log(self, record: dict) -> None:
        self.metrics.write(json.dumps(_jsonable(record)) + "\n")
        self.metrics.flush()

    def event(self, event: dict) -> None:
        with open(self.events_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(_jsonable(event)) + "\n")

    def finish(self, summary: dict) -> None:
        self.metrics.close()
