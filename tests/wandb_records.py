"""Read an offline W&B run's `.wandb` file without a server, for tests.

The file is ":W&B" + 2-byte magic + 1-byte version, then a LevelDB-style log: 32 KiB blocks of records,
each a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and a protobuf `Record`.
"""

import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7


def raw_records(path: Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a .wandb file"
    pos, pending = 7, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer too small for a header: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + HEADER + length > len(data):  # still being written
            return
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def records(path: Path):
    for raw in raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def read_run(path: Path, timeout: float = 30.0) -> dict:
    """{"run": RunRecord, "history_keys": set, "history": [dict key -> value_json], "summary_keys": set}.

    W&B's service may still be flushing the file when `finish()` returns: wait for its exit record.
    """
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in records(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    out = {"run": None, "history_keys": set(), "history": [], "summary_keys": set()}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            out["history"].append(row)
            out["history_keys"] |= set(row)
        elif kind == "summary":
            out["summary_keys"] |= {item.key or "/".join(item.nested_key) for item in record.summary.update}
    return out
