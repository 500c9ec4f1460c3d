"""metrics.jsonl (one JSON object per logged step) and events.jsonl, flushed as written: a crash loses nothing.

A resumed run must continue files that say exactly what the run had recorded when its checkpoint was
taken. Cutting the file back to a byte count is not enough: a file that was truncated or deleted since
would be padded with NUL bytes up to that count. So the checkpoint carries the text itself (scalars only:
kilobytes), and resuming puts back exactly that text, saying so when the file on disk had been damaged.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..records import atomic_path, dumps
from ..rundir import RunDir
from . import Sink

log = logging.getLogger("deepnorm_exp")


class JsonlFile:
    """One append-only JSON-lines file that remembers what it wrote."""

    def __init__(self, path: Path):
        self.path = path
        self.text: list[str] = []  # the lines this run wrote, in order

    def append(self, record: dict) -> None:
        line = dumps(record) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
        self.text.append(line)

    def state(self) -> str:
        return "".join(self.text)

    def restore(self, text: str) -> None:
        """Make the file hold exactly `text`: cut what a crashed attempt wrote after the checkpoint, and
        rebuild a file that no longer starts with `text` (truncated, deleted, overwritten)."""
        expected = text.encode("utf-8")
        try:
            on_disk = self.path.read_bytes()
        except FileNotFoundError:
            on_disk = None
        if on_disk is None or not on_disk.startswith(expected):
            if expected:
                found = "missing" if on_disk is None else f"{len(on_disk)} bytes that differ from the checkpoint's"
                log.warning("%s did not match its checkpoint (%s); rebuilt it from the checkpoint's %d bytes",
                            self.path, found, len(expected))
        if on_disk != expected and (on_disk is not None or expected):
            with atomic_path(self.path) as temporary:
                temporary.write_bytes(expected)
        self.text = [text] if text else []


class JsonlSink(Sink):
    """Appends: a fresh run starts from a cleaned directory, a resumed one continues its files."""

    name = "jsonl"

    def __init__(self, run_dir: Path):
        self.metrics = JsonlFile(RunDir(run_dir).metrics)
        self.events = JsonlFile(RunDir(run_dir).events)

    def log(self, record: dict) -> None:
        self.metrics.append(record)

    def event(self, event: dict) -> None:
        self.events.append(event)

    def state_dict(self) -> dict:
        return {"metrics": self.metrics.state(), "events": self.events.state()}

    def load_state_dict(self, state: dict) -> None:
        self.metrics.restore(state["metrics"])
        self.events.restore(state["events"])
