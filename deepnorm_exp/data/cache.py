"""A directory cache for generated datasets, keyed by everything that determines their content.

Built through `datasets` (`DatasetDict.save_to_disk`) into a temporary directory and renamed into place,
so concurrent sweep jobs never see a half-written cache: the first rename wins, the others discard theirs.
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

disable_progress_bar()  # the harness has its own progress bar; datasets' would print one per split


def cache_key(prefix: str, payload: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def cached_dataset(path: Path, build: Callable[[], DatasetDict]) -> DatasetDict:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            build().save_to_disk(str(tmp / "data"))
            try:
                os.rename(tmp / "data", path)
            except OSError:
                if not path.exists():  # a failure other than "another job got there first"
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return load_from_disk(str(path))
