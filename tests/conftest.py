import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepnorm_exp.train.trainer import Callback

# Tests never touch the network: the hub libraries read these when first imported (here, and in every
# subprocess the tests start, which inherits the environment).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent

# A model and data small enough that a run takes a second or two on 2 CPU cores.
TINY_MODEL = [
    "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.max_seq_len=32",
    "train.seq_len=16", "train.batch_size=4", "train.steps=6", "train.log_every=2", "train.eval_every=3",
]
TINY = [*TINY_MODEL, "data.train_sequences=64", "data.eval_sequences=8", "data.vocab_size=32", "data.classes=4"]

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
         "have an they you were her she there had all one we their über straße naïve 東京").split()


def config(root, *overrides):
    """A tiny run's composed config under `root`, without W&B."""
    import deepnorm_exp

    return deepnorm_exp.compose([*TINY, f"paths.runs={root}", "logger=none", *overrides])


def one_error_line(result) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("deepnorm_exp: error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def refused(argv, capsys) -> str:
    """The command line's refusal of `argv`, in this process (the pre-flight check runs before Hydra): exit
    status 2 and the one line it printed."""
    from deepnorm_exp.__main__ import main

    with pytest.raises(SystemExit) as exit:
        main(list(map(str, argv)))
    assert exit.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("deepnorm_exp: error: "), err
    return lines[0]


LONG = "a" * 10_000  # a hostile value: far past any line's length


def slow_beyond_first(cases: list) -> list:
    """Parametrize cases that take one path with other inputs: the first runs in `make test-fast`, the rest
    (marked slow) only in `make test`."""
    return [cases[0], *(pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
                        for case in cases[1:])]


def write_text(path: Path, lines: int, seed: int = 0) -> Path:
    """A text file of `lines` random sentences (one document per line), non-ASCII words included."""
    import random

    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + "\n"
                            for _ in range(lines)), encoding="utf-8")
    return path


@pytest.fixture
def runs_root(tmp_path):
    return tmp_path / "runs"


@pytest.fixture
def tiny(runs_root):
    """Overrides for a tiny run recorded under a temporary runs root, without W&B."""
    return [*TINY, f"paths.runs={runs_root}", "logger=none", f"paths.submitit={runs_root.parent / 'submitit'}"]


def child_env(**extra) -> dict:
    """The environment of a command a test starts, as a user's shell would start it. WANDB_SERVICE is emptied:
    W&B leaves it set in a process that has run W&B (an in-process test), and a child that inherits it logs
    through that process's service instead of starting its own."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true", "WANDB_SERVICE": "", **extra}


def run_cli(*args, timeout=300, env_extra=None, cwd=REPO):
    env = child_env(**(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "deepnorm_exp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


HOOKS = REPO / "tests" / "hooks"


def ctrl_c_as_in_a_terminal() -> None:
    """A command started from a terminal acts on Ctrl-C; one that a non-interactive shell put in the background
    (`make test &`) inherits SIGINT ignored, and so would the run a test starts, which then finishes instead."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class PausedRun:
    """`python -m deepnorm_exp <args>` that stops at the end of training step `step` (before any callback
    sees it) until `resume()`: the test acts at a known point instead of racing the run (tests/hooks)."""

    def __init__(self, args, step: int, directory: Path, env_extra=None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH", "")) if p)
        env = child_env(PYTHONPATH=path, DEEPNORM_TEST_PAUSE_AT=str(step), DEEPNORM_TEST_PAUSE_DIR=str(self.directory),
                        **(env_extra or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "deepnorm_exp", *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=ctrl_c_as_in_a_terminal)

    def wait_paused(self, timeout: float = 300) -> int:
        """The pid of the process that paused (a launcher's worker may be another process than ours)."""
        import time

        paused = self.directory / "paused"
        deadline = time.monotonic() + timeout
        while not paused.exists():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"the run ended before pausing:\n{err[-3000:]}")
            assert time.monotonic() < deadline, "the run never reached the pause"
            time.sleep(0.02)
        return int(paused.read_text())

    def resume(self) -> None:
        (self.directory / "go").touch()

    def __enter__(self) -> "PausedRun":
        return self

    def __exit__(self, *exc) -> None:
        """A test that failed before `finish` leaves no paused process behind (it would wait 10 minutes)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def finish(self, timeout: float = 300) -> subprocess.CompletedProcess:
        out, err = self.proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


@pytest.fixture
def record_deviation(record_property):
    """`record(what, ours, official)`: the largest |ours - official| over `scale` (by default the largest
    |official|), kept on the test's report and listed by the terminal summary, so an oracle test reports the
    figure it measured and not only that it passed."""

    def record(what: str, ours, official, scale: float | None = None) -> float:
        scale = official.abs().max().item() if scale is None else scale
        deviation = (ours - official).abs().max().item() / scale
        record_property(f"deviation: {what}", deviation)
        return deviation

    return record


def pytest_terminal_summary(terminalreporter):
    rows = [(report.nodeid.split("::")[-1], key.removeprefix("deviation: "), value)
            for report in terminalreporter.stats.get("passed", [])
            for key, value in report.user_properties if key.startswith("deviation: ")]
    if rows:
        terminalreporter.section("largest deviation from the official code, relative (oracle tests)")
        for test, what, value in rows:
            terminalreporter.write_line(f"{value:10.2e}  {what:<28} {test}")


class SimulatedCrash(Exception):
    """Raised from a callback: an in-process stand-in for a crash (a kill is tested through the CLI)."""


class CrashAt(Callback):
    """Crashes the run at the end of training step `step`."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, out):
        if out.step == self.step:
            raise SimulatedCrash


def only_run_dir(root: Path) -> Path:
    (summary,) = root.glob("*/*/summary.json")
    return summary.parent


def mount_tmpfs(path: Path, size: str, read_only: bool = False):
    """A small file system of our own (root only); None where this machine does not allow mounting."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return path if done.returncode == 0 else None


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(name, size="1m", read_only=False):
        path = mount_tmpfs(tmp_path / name, size, read_only)
        if path is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_when_paused(proc: subprocess.Popen, pause: Path, disk: Path, left: int = 300_000) -> tuple[str, str]:
    """Once `proc` has paused at its step (tests/hooks), fill `disk` up to `left` free bytes, as another
    process would, let the run go on, and return its (stdout, stderr) when it ends."""
    deadline = time.monotonic() + 300
    while not (pause / "paused").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    (disk / "filler").write_bytes(bytes(shutil.disk_usage(disk).free - left))
    (pause / "go").touch()
    return proc.communicate(timeout=300)
