"""Writing a record so that a kill at any moment leaves the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yields a hidden temporary path beside `path` to write to; renames it onto `path` if the block succeeds.
    (Hidden: readers that list a directory, e.g. pyarrow on layers/, skip names starting with ".". Named by
    process: concurrent writers of the same file each write their own temporary, and the last rename wins.)"""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    yield temporary
    os.replace(temporary, path)
