"""One process per run directory: an exclusive `flock` on `<run dir>/.lock`, held for the whole run.

Two sweeps launched at once into the same root compute the same directory for the same job; the second
to arrive finds the lock taken and leaves the run to the first. The kernel drops the lock when its holder
dies (even by SIGKILL), so a crashed run never blocks its re-run. (flock is reliable on local disks and
most cluster file systems; on NFS without lock support, do not launch the same job twice at once.)
"""

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


class RunLock(FileLock):
    def __init__(self, run_dir: Path):
        super().__init__(run_dir / ".lock")


def held_elsewhere(run_dir: Path) -> bool:
    """Whether another open of the run's lock holds it: the run is being trained now (by another process,
    or by this one through another open). Read-only: opens an existing lock file and writes nothing."""
    try:
        fd = os.open(Path(run_dir) / ".lock", os.O_RDONLY)
    except OSError:
        return False  # no lock file: never run by this harness, or not since it was copied
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # conflicts only with the run's exclusive lock
    except BlockingIOError:
        return True
    except OSError:
        return False  # a file system whose locks need write access (NFS): unknown, said as not running
    finally:
        os.close(fd)  # closing releases the lock if this took it
    return False
