"""Records under faults: collisions, damaged files, full and read-only disks, kills, Ctrl-C, a dying W&B
service, hostile input. Each test names the numbered point of issue 13 it covers; each failed before the
fix it guards."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import deepnorm_exp
from deepnorm_exp import records
from deepnorm_exp.errors import ConfigError, RecordError
from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.train.trainer import Callback

from conftest import REPO, TINY, TINY_MODEL, PausedRun, config, one_error_line, refused, run_cli, write_text


class SimulatedCrash(Exception):
    pass


class CrashAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, out):
        if out.step == self.step:
            raise SimulatedCrash


def only_run_dir(root: Path) -> Path:
    (summary,) = root.glob("*/*/summary.json")
    return summary.parent


def losses(run_dir) -> list:
    return [(r["step"], r["loss"]) for r in records.read_jsonl(Path(run_dir) / "metrics.jsonl") if "loss" in r]


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


# -- 1. a run directory belongs to one trained config ---------------------------------------------------
@pytest.mark.slow
def test_values_that_sanitise_alike_get_their_own_run_directories(tmp_path):
    (tmp_path / "corp" / "a").mkdir(parents=True)
    first = write_text(tmp_path / "corp" / "a" / "b.txt", lines=300, seed=1)
    second = write_text(tmp_path / "corp" / "a_b.txt", lines=300, seed=2)
    args = [*TINY_MODEL, "data=text", f"paths.runs={tmp_path / 'runs'}", "logger=none"]
    for corpus in (first, second):
        result = run_cli(*args, f"data.files={corpus.relative_to(tmp_path)}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "already completed" not in result.stdout + result.stderr
    summaries = sorted((tmp_path / "runs" / "default").glob("*/summary.json"))
    assert len(summaries) == 2  # two corpora, two runs, two results
    from omegaconf import OmegaConf

    assert {OmegaConf.load(p.parent / "config.yaml").data.files for p in summaries} == {"corp/a/b.txt", "corp/a_b.txt"}


def test_a_finished_run_of_another_config_is_never_taken_as_the_result(tmp_path):
    first = run_experiment(config(tmp_path, "data.seed=1"), progress=False)
    assert first["status"] == "completed"
    # Through the API there is no override list to name the directory by: the same directory, another config.
    with pytest.raises(ConfigError) as refused:
        run_experiment(config(tmp_path, "data.seed=2"), progress=False)
    assert refused.value.key == "data.seed" and "data.seed=1" in str(refused.value)
    replaced = run_experiment(config(tmp_path, "data.seed=2", "resume=false"), progress=False)
    assert replaced["status"] == "completed" and replaced["wall_s"] != first["wall_s"]


def test_a_run_stored_before_a_config_key_existed_is_still_its_configs(tmp_path):
    """A key added to the schema later (train.deterministic here) is absent from older runs' config.yaml; at
    its default it trains what they trained, so they are still found finished, and only another value is
    another config."""
    from omegaconf import OmegaConf

    first = run_experiment(config(tmp_path), progress=False)
    stored = Path(first["run_dir"]) / "config.yaml"
    older = OmegaConf.load(stored)
    del older.train["deterministic"]
    OmegaConf.save(older, stored)
    again = run_experiment(config(tmp_path), progress=False)
    assert again["status"] == "completed" and again["wall_s"] == first["wall_s"]  # not trained again
    with pytest.raises(ConfigError) as refused:
        run_experiment(config(tmp_path, "train.deterministic=true"), progress=False)
    assert refused.value.key == "train.deterministic"


@pytest.mark.slow
def test_the_command_line_refuses_a_directory_claimed_by_another_config(tmp_path, capsys):
    args = [*TINY, f"paths.runs={tmp_path}", "logger=none"]
    assert run_cli(*args).returncode == 0
    stored = only_run_dir(tmp_path) / "config.yaml"  # another config trained here (e.g. an older version's)
    stored.write_text(stored.read_text().replace("train_sequences: 64", "train_sequences: 65"))
    line = refused(args, capsys)
    assert "data.train_sequences=64" in line and "65" in line and "resume=false" in line


# -- 2. a record file that does not match its checkpoint ----------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "deleted", "overwritten"])
def test_resume_rebuilds_a_metrics_file_that_no_longer_matches_the_checkpoint(tmp_path, damage):
    overrides = ["train.steps=12", "train.log_every=1", "train.ckpt_every=6", "train.eval_every=4"]
    straight = run_experiment(config(tmp_path / "a", *overrides), progress=False)
    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path / "b", *overrides), progress=False, callbacks=[CrashAt(9)])
    run_dir = only_run_dir(tmp_path / "b")
    metrics = run_dir / "metrics.jsonl"
    if damage == "truncated":
        metrics.write_bytes(metrics.read_bytes()[:40])
    elif damage == "deleted":
        metrics.unlink()
    else:
        metrics.write_text('{"step": 1, "loss": 99.0}\n' * 3)
    resumed = run_experiment(config(tmp_path / "b", *overrides), progress=False)
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == 6
    assert b"\x00" not in metrics.read_bytes()
    assert losses(run_dir) == losses(straight["run_dir"]) and len(losses(run_dir)) == 12


# -- 3. non-finite values in records: test_records.py --------------------------------------------------------


# -- 4. a full disk -------------------------------------------------------------------------------------------
def test_a_failed_write_leaves_no_temporary(tmp_path):
    target = tmp_path / "checkpoint.pt"
    with pytest.raises(OSError):
        with records.atomic_path(target) as temporary:
            temporary.write_bytes(b"half")
            raise OSError(28, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_new_start_removes_what_a_killed_write_left(tmp_path):
    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path, "train.ckpt_every=2"), progress=False, callbacks=[CrashAt(3)])
    run_dir = only_run_dir(tmp_path)
    left = [run_dir / ".checkpoint.pt.4242.tmp", run_dir / "layers" / ".step_0000002.parquet.4242.tmp"]
    for path in left:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"\0" * 1000)
    assert run_experiment(config(tmp_path, "train.ckpt_every=2"), progress=False)["status"] == "completed"
    assert not any(path.exists() for path in left)


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


@pytest.mark.slow
def test_a_full_disk_fails_in_one_line_with_a_summary_and_the_rerun_is_not_blocked(tmp_path, tmpfs):
    """The disk is filled by someone else once the run has passed the pre-flight (which refuses a disk too
    small for the records and checkpoints: test_resources.py): at step 1 it is left 300 kB, room for the
    records but not for the 3.6 MB checkpoint of step 2."""
    from test_distributed import pause_env

    disk = tmpfs("disk", size="16m")
    args = ["depth=6", "train.steps=4", "train.ckpt_every=2", "train.log_every=1", "logger=none",
            f"paths.runs={disk}", f"paths.cache={tmp_path / 'cache'}", "metrics.layer_every=0"]
    pause = tmp_path / "pause"
    pause.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **pause_env(pause, 1)}
    proc = subprocess.Popen([sys.executable, "-m", "deepnorm_exp", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = fill_when_paused(proc, pause, disk)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert result.returncode == 1
    assert "No space left on device" in one_error_line(result)
    run_dir = only_run_dir(disk)
    summary = records.read_json(run_dir / "summary.json")
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    assert summary["steps_completed"] == 2  # step 2 trained; its checkpoint is what failed
    assert not list(disk.rglob("*.tmp"))  # the failed write gave its space back
    rerun = run_cli(*args[:2], "train.ckpt_every=0", *args[3:])  # without checkpoints it fits
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert records.read_json(run_dir / "summary.json")["status"] == "completed"


# -- 5. a damaged checkpoint: test_checkpoint.py ------------------------------------------------------------


# -- 6. a damaged data-cache entry: test_data.py -------------------------------------------------------------


# -- 7. another run's damaged summary (a damaged jsonl line: test_records.py) -----------------------------------------------------------------------
@pytest.mark.slow
def test_a_damaged_summary_is_named_and_does_not_stop_the_sweep_table_or_the_analysis(tmp_path):
    args = [*TINY, f"paths.runs={tmp_path}", "logger=none"]
    assert run_cli("-m", "norm=post,pre", *args).returncode == 0
    (post,) = tmp_path.glob("default/post-*/summary.json")
    post.write_text('{"status": "compl')  # cut short
    result = run_cli("-m", "norm=deepnorm", *args)  # another run of the same experiment
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout[result.stdout.index("run "):]
    assert "deepnorm-L6" in table and "pre-L6" in table and f"unreadable: {post}" in table
    runs = deepnorm_exp.load_runs(tmp_path / "default")
    assert sorted(runs["norm"]) == ["deepnorm", "pre"]


# -- 8. Ctrl-C, and W&B's service dying ----------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_checkpoints_records_interrupted_and_the_rerun_continues(tmp_path):
    """(That a resumed run equals an uninterrupted one, bit for bit, test_resume.py shows for SIGTERM and kill -9.)"""
    args = [*TINY, "train.steps=60", "train.log_every=1", "train.ckpt_every=50", "logger=none", f"paths.runs={tmp_path}"]
    run = PausedRun(args, step=23, directory=tmp_path / "pause")
    run.wait_paused()
    run.proc.send_signal(signal.SIGINT)
    run.resume()
    result = run.finish()
    assert result.returncode == 130 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == "deepnorm_exp: interrupted"
    run_dir = only_run_dir(tmp_path)
    summary = records.read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["steps_completed"] == 23
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["step"] == 23
    rerun = run_cli(*args)
    assert rerun.returncode == 0
    summary = records.read_json(run_dir / "summary.json")
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 23
    assert [step for step, _ in losses(run_dir)] == list(range(1, 61))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has stopped; only its parent's wait is missing


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_reaches_its_workers_which_checkpoint_and_stop(tmp_path):
    """`kill <sweep pid>` signals the launcher's process alone; joblib's workers, which train the runs, are
    its children and would train on to the end of their runs. The sweep hands the signal on to them."""
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY, "train.steps=100000",
            "train.ckpt_every=0", "logger=none", f"paths.runs={tmp_path}"]
    run = PausedRun(args, step=7, directory=tmp_path / "pause")
    worker = None
    try:
        worker = run.wait_paused()
        assert worker != run.proc.pid  # the run trains in a worker process
        run.proc.send_signal(signal.SIGTERM)
        run.proc.wait(timeout=60)  # the sweep's own process ends as SIGTERM's sender expects
        run.resume()
        deadline = time.monotonic() + 120
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker), "the worker trained on after the sweep was stopped"
        summary = records.read_json(only_run_dir(tmp_path) / "summary.json")
        assert summary["status"] == "interrupted" and summary["steps_completed"] == 7
    finally:
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)
        run.__exit__()


def wandb_service_pids(parent: int) -> list[int]:
    """Processes started below `parent` whose command line names W&B's service."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ancestor = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "wandb" in command and ancestor == parent:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_wandb_service_dying_mid_run_is_one_warning_and_the_run_completes(tmp_path):
    args = [*TINY, "train.steps=30", "logger=wandb", f"paths.runs={tmp_path}"]
    with PausedRun(args, step=10, directory=tmp_path / "pause") as run:
        pid = run.wait_paused()
        services = wandb_service_pids(pid)
        assert services, "no W&B service process found"
        for service in services:
            os.kill(service, signal.SIGKILL)
        run.resume()
        result = run.finish()
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert sum("W&B" in line and "continuing with the local records only" in line for line in output.splitlines()) == 1
    summary = records.read_json(only_run_dir(tmp_path) / "summary.json")
    assert summary["status"] == "completed" and summary["steps_completed"] == 30


# -- 9-13. input the command refuses in one line, before any compute ------------------------------------------
LATIN1 = b"plain ascii line\n" * 10 + b"caf\xe9 au lait\n" * 200  # the first non-UTF-8 byte at offset 173


@pytest.mark.slow
def test_text_that_is_not_utf8_is_named_with_its_offset_and_reads_with_an_encoding(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(LATIN1)
    args = [*TINY_MODEL, "data=text", f"data.files={corpus}", f"paths.runs={tmp_path / 'runs'}", "logger=none"]
    refused_run = run_cli(*args)
    assert refused_run.returncode == 2
    line = one_error_line(refused_run)
    assert "data.files" in line and str(corpus) in line and "byte offset 173" in line and "utf-8" in line
    assert not (tmp_path / "runs").exists()
    accepted = run_cli(*args, "data.encoding=latin-1")
    assert accepted.returncode == 0, accepted.stderr[-3000:]


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_the_offset_of_the_first_undecodable_byte_is_exact_across_read_chunks(tmp_path, cut):
    from deepnorm_exp.data.text import first_undecodable

    # A 3-byte character cut by the 1 MiB read boundary at `cut` bytes in, then a byte that never decodes.
    prefix = b"a" * ((1 << 20) - cut) + "\u20ac".encode() + b"ok\n"
    path = tmp_path / "big.txt"
    path.write_bytes(prefix + b"\xff" + b"tail\n")
    assert first_undecodable(str(path), 0, 0, "utf-8") == f"byte offset {len(prefix)} (b'\\xfftai') does not decode"
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert first_undecodable(str(binary), 0, 0, "utf-8").startswith("byte offset 128 ")
    assert first_undecodable(str(binary), 0, 0, "latin-1") is None  # reads any bytes


def test_a_runs_path_that_is_a_file_or_read_only_is_refused_in_one_line(tmp_path, tmpfs, capsys):
    (tmp_path / "file").write_text("not a directory")
    for key, value in (("paths.runs", tmp_path / "file" / "runs"), ("paths.cache", tmp_path / "file")):
        line = refused([*TINY, "logger=none", f"{key}={value}"], capsys)
        assert line.startswith(f"deepnorm_exp: error: {key}=") and "is a file" in line
    read_only = tmpfs("ro", size="1m", read_only=True)
    line = refused([*TINY, "logger=none", f"paths.runs={read_only / 'runs'}"], capsys)
    assert line.startswith("deepnorm_exp: error: paths.runs=") and "not writable" in line


def test_an_unset_environment_variable_is_named(capsys):
    with pytest.raises(ConfigError) as error:
        deepnorm_exp.compose(["paths.runs=${oc.env:DEEPNORM_SURELY_UNSET}/runs"])
    assert error.value.key == "paths.runs" and "DEEPNORM_SURELY_UNSET" in str(error.value)
    line = refused([*TINY, "paths.runs=${oc.env:DEEPNORM_SURELY_UNSET}/runs"], capsys)
    assert "paths.runs" in line and "DEEPNORM_SURELY_UNSET" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is missing")
def test_a_sweep_on_a_missing_device_is_refused_before_any_job(tmp_path, capsys):
    line = refused(["-m", "device=cuda", "norm=post,pre", *TINY, f"paths.runs={tmp_path / 'runs'}", "logger=none"],
                   capsys)
    assert "device=cuda" in line and not (tmp_path / "runs").exists()


def test_a_model_too_big_for_memory_is_refused_from_its_estimate(tmp_path, capsys):
    line = refused(["depth=100000", f"paths.runs={tmp_path / 'runs'}", "logger=none"], capsys)
    assert "depth=100000" in line and "GiB" in line and "memory_check=false" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("overrides", [[], ["model=encdec", "model.encoder_depth=3"], ["norm=admin"],
                                       ["norm=rezero"], ["norm=sigma_reparam"], ["norm=subln"], ["norm=mixln"],
                                       ["model.tie_embeddings=false", "model.positions=learned"]])
def test_the_parameter_estimate_is_exact(overrides):
    from deepnorm_exp.build import make_scheme, model_depths
    from deepnorm_exp.data import check_data_config
    from deepnorm_exp.models import MODELS, count_params
    from deepnorm_exp.train.memory import estimate

    cfg = deepnorm_exp.compose(["depth=5", *overrides])
    positions = check_data_config(cfg.data, MODELS.get(cfg.model.kind).task)
    guess = estimate(cfg, make_scheme(cfg), model_depths(cfg), positions, weight_copy=True)
    assert guess.params == count_params(deepnorm_exp.build_model(cfg))


# -- also: which weights eval_loss used; callbacks by name; metrics switched on for a resumed run -------------
def test_the_summary_says_which_weights_the_eval_loss_measured(tmp_path):
    spiked = run_experiment(config(tmp_path / "a", "norm=post", "depth=2", "train.lr=1", "train.warmup_steps=0",
                                   "train.steps=30", "train.divergence.spike_patience=2",
                                   "train.divergence.spike_factor=1.5"), progress=False)
    assert spiked["status"] == "diverged" and spiked["divergence_reason"].startswith("loss above")
    assert spiked["eval_step"] == spiked["diverged_at_step"] - 1 and "include the updates of the 1 step" in \
        spiked["eval_weights"]
    nan = run_experiment(config(tmp_path / "b", "norm=post", "depth=2", "train.lr=1e30", "train.warmup_steps=0"),
                         progress=False)
    assert nan["eval_weights"].startswith("the last healthy weights")
    done = run_experiment(config(tmp_path / "c"), progress=False)
    assert done["eval_step"] == 6 and done["eval_weights"] == "the final weights (step 6)"


def test_callbacks_with_one_name_are_refused():
    from deepnorm_exp.train.trainer import Trainer

    with pytest.raises(ValueError, match="distinct names"):
        Trainer(model=None, optimizer=None, scheduler=None, batches=None, steps=1, device=None,
                callbacks=[Callback(), Callback()])


def test_a_metric_switched_on_for_a_resumed_run_measures_what_an_uninterrupted_run_does(tmp_path):
    overrides = ["train.steps=12", "train.log_every=1", "train.ckpt_every=6", "model.dropout=0.1"]
    straight = run_experiment(config(tmp_path / "a", *overrides), progress=False)
    with pytest.raises(SimulatedCrash):
        run_experiment(config(tmp_path / "b", *overrides, "metrics.model_update=false"), progress=False,
                       callbacks=[CrashAt(8)])
    resumed = run_experiment(config(tmp_path / "b", *overrides), progress=False)
    assert resumed["resumed_from_step"] == 6

    def model_update(run_dir):
        return {r["step"]: r["model_update"] for r in records.read_jsonl(Path(run_dir) / "metrics.jsonl")
                if "model_update" in r}

    after = model_update(resumed["run_dir"])
    assert sorted(after) == list(range(7, 13))  # measured from the resumption on
    expected = model_update(straight["run_dir"])
    assert all(after[step] == pytest.approx(expected[step], rel=1e-6) for step in after)


def test_errors_survive_pickling_to_the_other_ranks():
    """The main process decides for a run directory and broadcasts the decision, a refusal included."""
    import pickle

    from deepnorm_exp.errors import ConfigError, RecordError

    refused = pickle.loads(pickle.dumps(ConfigError("train.lr", 1e-3, "the sweeper owns it")))
    assert (refused.key, refused.value, str(refused)) == ("train.lr", 1e-3, "train.lr=0.001 is invalid: the sweeper owns it")
    assert refused.exit_status == 2 and str(pickle.loads(pickle.dumps(RecordError("x is damaged")))) == "x is damaged"
