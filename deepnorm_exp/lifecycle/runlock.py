"""One process per run directory: an exclusive `flock` on `<run dir>/.lock`, held for the whole run.

Two sweeps launched at once into the same root compute the same directory for the same job; the second
to arrive finds the lock taken and leaves the run to the first. The kernel drops the lock when its holder
dies (even by SIGKILL), so a crashed run never blocks its re-run. (flock is reliable on local disks and
most cluster file systems; on NFS without lock support, do not launch the same job twice at once.)
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..locks import FileLock


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
