"""A test hook, active only where a test puts this directory on PYTHONPATH: pauses a training run at a
chosen step so the test can act on it (send a signal, kill a service) at a known point, with no race
against the run's own speed.

DEEPNORM_TEST_PAUSE_AT=<step> and DEEPNORM_TEST_PAUSE_DIR=<dir>: when the trainer finishes step <step>,
before any callback sees it (so a checkpoint caused by a signal lands at exactly that step), the process
writes its pid to <dir>/paused and waits until <dir>/go exists. Once only: a resumed process, or a second
one (another rank reaching the step at the same moment included), never pauses (the `paused` file exists).

DEEPNORM_TEST_ABORT_AT_EXIT=1: a torchrun worker (RANK is set; not the launcher itself) aborts (SIGABRT) if
it reaches the interpreter's exit handlers, as a rank can when gloo's threads are torn down with it.
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
