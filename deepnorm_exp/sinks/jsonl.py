"""metrics.jsonl (one JSON object per logged step) and events.jsonl, flushed as written: a crash loses nothing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from . import Sink


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable ("nan", "inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class JsonlSink(Sink):
    """Appends: a fresh run starts from a cleaned directory, a resumed one continues its files."""

    def __init__(self, run_dir: Path):
        self.metrics_path, self.events_path = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
        self.metrics = open(self.metrics_path, "a", encoding="utf-8")

    def log(self, record: dict) -> None:
        self.metrics.write(json.dumps(_jsonable(record)) + "\n")
        self.metrics.flush()

    def event(self, event: dict) -> None:
        with open(self.events_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(_jsonable(event)) + "\n")

    def finish(self, summary: dict) -> None:
        self.metrics.close()

    def state_dict(self) -> dict:
        events = self.events_path.stat().st_size if self.events_path.exists() else 0
        return {"metrics_bytes": self.metrics.tell(), "events_bytes": events}

    def load_state_dict(self, state: dict) -> None:
        self.metrics.close()
        os.truncate(self.metrics_path, state["metrics_bytes"])
        self.metrics = open(self.metrics_path, "a", encoding="utf-8")
        if self.events_path.exists():
            os.truncate(self.events_path, state["events_bytes"])
