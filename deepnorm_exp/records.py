"""How every record file is written and read: one JSON encoding, atomic replacement, tolerant readers.

* JSON has no NaN or infinity, and a diverged run's loss is exactly that: `encode` writes non-finite floats
  as the strings "nan", "inf", "-inf" (at any depth of nesting), `decode` turns them back into floats. Every
  record file (summary.json, metrics.jsonl, events.jsonl, frontier.json) goes through this pair, so strict
  JSON readers accept the files and analysis reads floats.
* `atomic_path` writes a file so that a kill at any moment leaves the old file or the new one, and a failed
  write (a full disk) leaves neither a half file nor its temporary.
* Readers of records never let one damaged file stop the rest: `read_json` and `read_jsonl` warn once,
  naming the file (and line), and give what could be read.
* A record is input: it may be damaged or hostile. `read_json` and `read_yaml` refuse a file over
  `MAX_RECORD_BYTES` before reading it, and `read_yaml` reads plain YAML (no aliases, which the harness never
  writes and which can expand a few kB into millions of nodes; no interpolation: `${oc.env:...}` stays text).
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
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from .errors import first_line

log = logging.getLogger("deepnorm_exp")

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# A summary.json or config.yaml is a few kB (the largest published: 3 kB); a file this large is not one.
MAX_RECORD_BYTES = 4 * 2**20


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


_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: the mode a plain open() would give a new file


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yields a hidden temporary path beside `path` to write to; renames it onto `path` if the block succeeds
    and removes it if the block fails (a full disk must not keep the space it could not use).
    The temporary is created here, exclusively (`mkstemp`: a file or link already at a name is never written
    through), and the rename replaces `path` itself: a symlink there is replaced, its target left alone.
    (Hidden: readers that list a directory, e.g. pyarrow on layers/, skip names starting with ".". Named
    uniquely: concurrent writers of the same file each write their own temporary, and the last rename wins.)"""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would make every record private
        os.close(fd)
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """`path` holds `text` (UTF-8), written through `atomic_path`."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(Path(path)) as temporary:
        temporary.write_bytes(data)


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
    write_text(path, dumps(value, indent=2) + "\n")


def read_json(path: Path) -> Optional[Any]:
    """The record at `path`, or None if there is none; a damaged one is named in a warning, never raised."""
    path = Path(path)
    try:
        return loads(read_bounded(path))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError, OSError, RecursionError) as e:  # JSONDecodeError is a ValueError
        log.warning("%s is damaged and was skipped (%s: %s)", path, type(e).__name__, first_line(e))
        return None


class RecordTooLarge(ValueError):
    """A record file larger than any the harness writes: not read."""


def read_bounded(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> str:
    """The text of `path`, refused (RecordTooLarge) if it holds more than `max_bytes`: checked before
    reading, and again on what was read (the file may grow in between)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise RecordTooLarge(f"{os.fstat(f.fileno()).st_size:,} bytes, over the {max_bytes:,} a record may hold")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RecordTooLarge(f"over the {max_bytes:,} bytes a record may hold")
    return data.decode("utf-8")


class _PlainYaml(yaml.SafeLoader):
    """Safe YAML without aliases, reading floats as YAML 1.2 does (`1e-3` is a number, as OmegaConf reads
    it; PyYAML's YAML 1.1 would give a string)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "an alias (*name): records never hold one",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


_PlainYaml.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.[\d_]*(?:[eE][-+]?\d+)?|\.\d[\d_]*(?:[eE][-+]?\d+)?|\d[\d_]*[eE][-+]?\d+"
               r"|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def read_yaml(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """The plain containers of a YAML record (a run's config.yaml, a sweep's multirun.yaml), never
    interpolated. Raises ValueError (yaml's errors are ValueErrors here) or OSError for a damaged file."""
    try:
        return yaml.load(read_bounded(Path(path), max_bytes), Loader=_PlainYaml)  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, RecursionError) as e:
        raise ValueError(f"not plain YAML: {first_line(e)}") from None


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


def parquet_size_problem(path: Path, max_rows: int, max_decoded_bytes: int) -> Optional[str]:
    """Why the Parquet file at `path` is too large to read whole, from its footer alone (a few kB of
    run-length encoding can decode to gigabytes), or None."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as e:  # noqa: BLE001 - whatever pyarrow raises on a file that is not Parquet
        return f"not a Parquet table ({type(e).__name__})"
    decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if meta.num_rows > max_rows:
        return f"{meta.num_rows:,} rows, over the {max_rows:,} it may hold"
    if decoded > max_decoded_bytes:
        return f"{decoded:,} bytes decoded, over the {max_decoded_bytes:,} it may hold"
    return None
