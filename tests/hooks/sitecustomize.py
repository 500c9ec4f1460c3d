"""A test hook, active only where a test puts this directory on PYTHONPATH: pauses a training run at a
chosen step so the test can act on it (send a signal, kill a service) at a known point, with no race
against the run's own speed.

DEEPNORM_TEST_PAUSE_AT=<step> and DEEPNORM_TEST_PAUSE_DIR=<dir>: when the trainer finishes step <step>,
before any callback sees it (so a checkpoint caused by a signal lands at exactly that step), the process
writes its pid to <dir>/paused and waits until <dir>/go exists. Once only: a resumed process, or a second
one (another rank reaching the step at the same moment included), never pauses (the `paused` file exists).

DEEPNORM_TEST_ABORT_AT_EXIT=1: a torchrun worker (RANK is set; not the launcher itself) aborts (SIGABRT) if
it reaches the interpreter's exit handlers, as a rank can when gloo's threads are torn down with it.

DEEPNORM_TEST_DISK_FULL=<rank>:<pattern>: in the torchrun worker of that rank, a file whose name matches the
shell pattern (e.g. `__1_*.distcp`, a shard DCP writes; `*trainer.pt*`, the temporary of a sharded
checkpoint's trainer.pt), opened for writing in binary, takes its first 64 bytes and then fails as a full
disk does (OSError ENOSPC): one rank's disk filling during a save, which the other ranks do not see.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

STEP = int(os.environ.get("DEEPNORM_TEST_PAUSE_AT", "0"))
DIRECTORY = os.environ.get("DEEPNORM_TEST_PAUSE_DIR", "")
TARGET = "deepnorm_exp.train.trainer"


def pause() -> None:
    paused, go = os.path.join(DIRECTORY, "paused"), os.path.join(DIRECTORY, "go")
    if os.path.exists(paused):
        return
    mine = f"{paused}.{os.getpid()}.tmp"
    with open(mine, "w") as f:
        f.write(str(os.getpid()))
    try:
        os.link(mine, paused)  # atomic, and fails if it exists: of processes arriving together, one pauses
    except FileExistsError:
        return
    finally:
        os.unlink(mine)
    deadline = time.monotonic() + 600
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)


def patch(module) -> None:
    emit = module.Trainer._emit

    def paused_emit(self, hook, *args):
        if hook == "on_step_end" and args and args[0].step == STEP:
            pause()
        return emit(self, hook, *args)

    module.Trainer._emit = paused_emit


class Finder(importlib.abc.MetaPathFinder):
    """Patches the trainer module right after it is first imported (torch is not imported before that)."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if STEP and DIRECTORY:
    sys.meta_path.insert(0, Finder())
if os.environ.get("DEEPNORM_TEST_ABORT_AT_EXIT") and "RANK" in os.environ:
    import atexit

    atexit.register(os.abort)


def fill_disk(rank: str, pattern: str) -> None:
    import builtins
    import errno
    import fnmatch
    import io

    room, real_open = 64, io.open

    class FullDisk(io.BufferedWriter):
        def write(self, data) -> int:
            if self.tell() + memoryview(data).nbytes > room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    def open_on_a_full_disk(file, mode="r", *args, **kwargs):
        if (isinstance(file, (str, os.PathLike)) and "w" in mode and "b" in mode
                and fnmatch.fnmatch(os.path.basename(os.fspath(file)), pattern)):
            return FullDisk(io.FileIO(file, "wb"))
        return real_open(file, mode, *args, **kwargs)

    if os.environ.get("RANK") == rank:
        io.open = builtins.open = open_on_a_full_disk


if ":" in os.environ.get("DEEPNORM_TEST_DISK_FULL", ""):
    fill_disk(*os.environ["DEEPNORM_TEST_DISK_FULL"].split(":", 1))
