"""An exclusive `flock` on a file, for the writers that must not overlap: a run and its directory
(rundir.py), a dataset cache entry and a tokenizer being built (data/). The kernel drops the
lock when its holder dies, even by SIGKILL, so a crashed holder never blocks the next one. (flock is
reliable on local disks and most cluster file systems; not on NFS without lock support.)"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class FileLock:
    """An exclusive flock on `path`; `acquire(wait=True)` blocks until the holder releases it or dies."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self, wait: bool = False, patience: float = 0.0) -> bool:
        """`patience`: seconds to keep trying before giving up (a reader's probe, `held_elsewhere`, holds a
        shared lock for microseconds; a run holds its lock for the whole run)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + patience
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "FileLock":
        self.acquire(wait=True)
        return self

    def __exit__(self, *exc) -> None:
        self.release()
