"""metrics.jsonl: one JSON object per logged step, flushed as written so a crash loses nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable ("nan", "inf")
    return value


class JsonlSink:
    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "w", encoding="utf-8")

    def log(self, record: dict) -> None:
        self.file.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self.file.flush()

    def finish(self, summary: dict) -> None:
        self.file.close()
