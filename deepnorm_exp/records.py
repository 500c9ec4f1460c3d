"""How every record file is written and read: one JSON encoding, atomic replacement, tolerant readers.

* JSON has no NaN or infinity, and a diverged run's loss is exactly that: `encode` writes non-finite floats
  as the strings "nan", "inf", "-inf" (at any depth of nesting), `decode` turns them back into floats. Every
  record file (summary.json, metrics.jsonl, events.jsonl, frontier.json) goes through this pair, so strict
  JSON readers accept the files and analysis reads floats.
* `atomic_path` writes a file so that a kill at any moment leaves the old file or the new one, and a failed
  write (a full disk) leaves neither a half file nor its temporary.
* Readers of records never let one damaged file stop the rest: `read_json` and `read_jsonl` warn once,
  naming the file (and line), and give what could be read.
"""

from __future__ import annotations

import contextlib
import datetime
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
