"""How every record file is written and read: one JSON encoding, atomic replacement, tolerant readers.

* JSON has no NaN or infinity, and a diverged run's loss is exactly that: `encode` writes non-finite floats
  as the strings "nan", "inf", "-inf" (at any depth of nesting), `decode` turns them back into floats. Every
  record file (summary.json, metrics.jsonl, events.jsonl, frontier.json) goes through this pair, so strict
  JSON readers accept the files and analysis reads floats.
* `atomic_path` writes a file so that a kill at any moment leaves the old file or the new one, and a failed
  write (a full disk) leaves neither a half file nor its temporary.
* Readers of records never let one damaged file stop the rest: `read_json` and `read_jsonl` warn once,
  naming the file (and line), and give what could be read.
* A directory of files written together (a data-cache entry, a sharded checkpoint) is verified against a
  manifest of each file's size and SHA-256 taken when it was written (`manifest`, `manifest_damage`): a
  flipped bit, a truncated or missing file is named instead of being read as if it were whole.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterator, Optional

log = logging.getLogger("deepnorm_exp")

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def utc_now() -> str:
    """A timestamp for the records: UTC, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def encode(value: Any) -> Any:
    """A JSON-safe copy of `value`: non-finite floats become "nan" / "inf" / "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    return value


def decode(value: Any) -> Any:
    """The inverse of `encode` (also reads the bare NaN / Infinity that Python's json writes)."""
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    if isinstance(value, dict):
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    return json.dumps(encode(value), allow_nan=False, **kwargs)


def loads(text: str) -> Any:
    return decode(json.loads(text))


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yields a hidden temporary path beside `path` to write to; renames it onto `path` if the block succeeds
    and removes it if the block fails (a full disk must not keep the space it could not use).
    (Hidden: readers that list a directory, e.g. pyarrow on layers/, skip names starting with ".". Named by
    process: concurrent writers of the same file each write their own temporary, and the last rename wins.)"""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete what `atomic_path` left in `directory` (and its subdirectories) when a process was killed in
    the middle of a write. Only for a directory this process owns (a run directory under its lock)."""
    removed = []
    for path in Path(directory).rglob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def write_json(path: Path, value: Any) -> None:
    with atomic_path(Path(path)) as temporary:
        temporary.write_text(dumps(value, indent=2) + "\n")


def read_json(path: Path) -> Optional[Any]:
    """The record at `path`, or None if there is none; a damaged one is named in a warning, never raised."""
    path = Path(path)
    try:
        return loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError, OSError) as e:  # JSONDecodeError is a ValueError
        log.warning("%s is damaged and was skipped (%s: %s)", path, type(e).__name__, str(e).splitlines()[0])
        return None


def read_jsonl(path: Path) -> list[dict]:
    """Every record of a JSON-lines file; a damaged line (a run killed mid-write, a corrupted disk) is
    skipped with one warning naming the file and the line."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    records, damaged = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = loads(line)
        except ValueError:
            damaged.append(number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            damaged.append(number)
    if damaged:
        log.warning("%s: skipped %d damaged line(s) (line %s)", path, len(damaged),
                    ", ".join(map(str, damaged[:5])) + (", ..." if len(damaged) > 5 else ""))
    return records


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest(directory: Path, names: Optional[list[str]] = None, skip: tuple[str, ...] = ()) -> dict[str, list]:
    """{relative name: [size, SHA-256]} of `names` (default: every file under `directory`), less `skip`."""
    directory = Path(directory)
    if names is None:
        names = [str(p.relative_to(directory)) for p in sorted(directory.rglob("*")) if p.is_file()]
    return {name: [(directory / name).stat().st_size, file_digest(directory / name)]
            for name in names if name not in skip}


def manifest_damage(directory: Path, expected: dict[str, list], skip: tuple[str, ...] = ()) -> Optional[str]:
    """Why `directory` differs from the manifest `expected` (a file missing, of another size or content, or
    one it does not list), or None if every file is as it was written. `skip`: files the manifest leaves out."""
    directory = Path(directory)
    if not isinstance(expected, dict) or not all(isinstance(v, list) and len(v) == 2 for v in expected.values()):
        return "its manifest is malformed"
    for name, (size, digest) in expected.items():
        path = directory / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            return f"its manifest names a file outside it: {name!r}"
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
        if file_digest(path) != digest:
            return f"{name} differs from what was written (SHA-256)"
    present = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
    extra = sorted(present - set(expected) - set(skip))
    return f"{extra[0]} was not written with it" if extra else None
