"""A directory cache for generated datasets, keyed by everything that determines their content.

Each entry is built into a temporary directory and renamed into place, so no reader ever sees a
half-written entry and a failed build leaves nothing behind. Concurrent sweep jobs that need the same
entry take turns on a lock beside it: the first builds, the others wait and load what it built.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from datasets import DatasetDict, load_from_disk
from datasets.utils.logging import disable_progress_bar

from ..runlock import FileLock

disable_progress_bar()  # the harness has its own progress bar; datasets' would print one per split


def cache_key(prefix: str, payload: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def cached_dir(path: Path, build: Callable[[Path], None]) -> Path:
    """`path`, built first by `build(directory)` (which must create `directory`) if it does not exist."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(f".{path.name}.lock")):
        if path.exists():  # another job built it while this one waited
            return path
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            build(tmp / "data")
            os.rename(tmp / "data", path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def cached_dataset(path: Path, build: Callable[[], DatasetDict]) -> DatasetDict:
    return load_from_disk(str(cached_dir(path, lambda directory: build().save_to_disk(str(directory)))))
