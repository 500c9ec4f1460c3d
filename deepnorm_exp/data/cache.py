"""A directory cache for generated datasets, keyed by everything that determines their content.

Each entry is built into a temporary directory and renamed into place, so no reader ever sees a
half-written entry and a failed build leaves nothing behind. Concurrent sweep jobs that need the same
entry take turns on a lock beside it: the first builds, the others wait and load what it built.

An entry is verified before it is used: a manifest written last (`.manifest.json`) holds the size and
SHA-256 of every file, and any difference (a truncated or overwritten Arrow file, a flipped bit, a file
gone) is a damaged entry, rebuilt with a warning that names it, instead of a traceback from pyarrow that
names nothing or, worse, tokens that are silently wrong. An entry that passes its manifest but fails to
load all the same, or that its loader refuses (a tokenizer of another vocabulary: data/text.py), is rebuilt
once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from .. import records
from ..errors import HarnessError, RecordError, first_line
from ..locks import FileLock

if TYPE_CHECKING:  # `datasets` (a second to import) is imported where a dataset is loaded, not by the checks
    from datasets import DatasetDict
log = logging.getLogger("deepnorm_exp")

MANIFEST = ".manifest.json"
T = TypeVar("T")


def cache_key(prefix: str, payload: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def write_manifest(directory: Path) -> None:
    records.write_text(directory / MANIFEST, json.dumps(records.manifest(directory, skip=(MANIFEST,)), indent=1))


def damage(directory: Path) -> Optional[str]:
    """Why the entry at `directory` cannot be trusted, or None if every file is as it was written."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (built by an older version, or its build was interrupted)"
    except (ValueError, OSError) as e:
        return f"unreadable manifest ({type(e).__name__})"
    return records.manifest_damage(directory, manifest, skip=(MANIFEST,))


def _discard(path: Path) -> None:
    """Move a damaged entry out of the way, then delete it (a reader that still has it open keeps its files)."""
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.damaged.", dir=path.parent))
    os.rename(path, trash / "data")
    shutil.rmtree(trash, ignore_errors=True)


def cached_dir(path: Path, build: Callable[[Path], None], rebuild: bool = False) -> Path:
    """`path`, built first by `build(directory)` (which must create `directory`) if it does not exist or is
    damaged (`rebuild`: it is known to be, whatever its manifest says)."""
    if not rebuild and path.exists() and damage(path) is None:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(f".{path.name}.lock")):
        why = "it failed to load" if rebuild else (damage(path) if path.exists() else None)
        if path.exists() and why is None:  # another job built it while this one waited
            return path
        if path.exists():
            log.warning("data cache entry %s is damaged (%s); rebuilding it", path, why)
            _discard(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            build(tmp / "data")
            write_manifest(tmp / "data")
            os.rename(tmp / "data", path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_entry(path: Path, build: Callable[[Path], None], load: Callable[[Path], T]) -> T:
    """`load(entry)` of the verified entry at `path`; an entry that loads with an error is rebuilt once."""
    entry = cached_dir(path, build)
    try:
        return load(entry)
    except Exception as e:  # noqa: BLE001 - what datasets/pyarrow raise on a bad file varies
        log.warning("data cache entry %s failed to load (%s)", entry,
                    first_line(e) if isinstance(e, HarnessError) else type(e).__name__)
    entry = cached_dir(path, build, rebuild=True)
    try:
        return load(entry)
    except Exception as e:  # noqa: BLE001
        raise RecordError(f"data cache entry {entry} fails to load even after a rebuild "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def cached_dataset(path: Path, build: Callable[[], DatasetDict]) -> DatasetDict:
    from datasets import load_from_disk

    return load_entry(path, lambda directory: build().save_to_disk(str(directory)),
                      lambda entry: load_from_disk(str(entry)))
