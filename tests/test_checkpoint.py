"""Checkpoints as hostile input (issue 23) and their round trip: checkpoint.pt and trainer.pt are read by the
weights-only loader, a sharded checkpoint's metadata, values and shards are checked before DCP reads them, and a
crafted file never runs its code (the crafted-pickle tests plant code that writes a marker file and assert that
it never appears). Each test failed on the code before its fix. deepnorm_exp/train/checkpoint.py, sharded.py,
dcp_safety.py; the faults a sharded save meets are in test_sharded_faults.py."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from deepnorm_exp import records
from deepnorm_exp.errors import RecordError
from deepnorm_exp.rundir import RunDir
from deepnorm_exp.runtime import Runtime
from deepnorm_exp.train import checkpoint, sharded

from conftest import TINY, PausedRun, run_cli, REPO, fill_when_paused, only_run_dir
from conftest import one_error_line

class Planted:
    """Unpickling this runs a shell command that creates `marker`: what a crafted file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# -- 1. checkpoint.pt and trainer.pt are read by the weights-only loader --------------------------------------
def test_a_crafted_checkpoint_is_refused_in_one_line_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 3, "model": {}, "rng": Planted(marker)}, path)  # a valid torch zip: its CRCs pass
    checkpoint.verify(path)
    with pytest.raises(RecordError) as refused:
        checkpoint.load(path)
    message = str(refused.value)
    assert str(path) in message and "resume=false" in message and "\n" not in message
    assert "posix.system" in message or "system" in message  # says what it refused, not torch's advice
    assert not marker.exists()


def test_the_rng_states_a_checkpoint_holds_load_weights_only_and_restore_every_generator():
    import random

    import numpy as np

    state = checkpoint.rng_state()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    expected = (torch.rand(3), random.random(), np.random.rand(3), np.random.randn())
    buffer.seek(0)
    checkpoint.set_rng_state(torch.load(buffer, weights_only=True))
    again = (torch.rand(3), random.random(), np.random.rand(3), np.random.randn())
    assert torch.equal(expected[0], again[0]) and expected[1] == again[1]
    assert np.array_equal(expected[2], again[2]) and expected[3] == again[3]


# -- 2 and 3. a sharded checkpoint: the metadata, the values, the shards' bytes --------------------------------
def model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture
def saved(tmp_path):
    """A sharded checkpoint as one process writes it (DCP without a process group), and its model."""
    model, optimizer = model_and_optimizer()
    directory = tmp_path / RunDir.SHARDED
    with pytest.warns(UserWarning):  # DCP's "assuming the intent is to save in a single process"
        sharded.save(directory, model, optimizer, {"step": 1, "rng": checkpoint.rng_state()},
                     Runtime(torch.device("cpu")), checkpoint.save)
    return directory, model


def restored_weights(directory: Path) -> torch.Tensor:
    model, optimizer = model_and_optimizer(seed=1)
    sharded.load_model_and_optimizer(directory, model, optimizer)
    return model[0].weight.detach().clone()


def test_a_sharded_checkpoint_lists_every_file_dcp_wrote_and_resumes_the_same_weights(saved):
    directory, model = saved
    state = checkpoint.load_run(directory.parent)
    assert set(state["files"]) == {p.name for p in directory.iterdir()} - {sharded.TRAINER_STATE}
    assert ".metadata" in state["files"] and any(name.endswith(".distcp") for name in state["files"])
    assert torch.equal(restored_weights(directory), model[0].weight)


def test_crafted_dcp_metadata_is_refused_in_one_line_and_its_code_never_runs(saved, tmp_path):
    directory, _ = saved
    marker = tmp_path / "pwned"
    (directory / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(RecordError) as refused:
        restored_weights(directory)  # as the run does after verifying: straight to DCP's reader
    assert str(directory) in str(refused.value) and "refused global" in str(refused.value)
    assert not marker.exists()


def test_torchs_own_metadata_reader_would_run_the_planted_code(saved, tmp_path):
    """What the reader above guards against (if torch ever reads metadata safely, this test says so)."""
    directory, _ = saved
    marker = tmp_path / "pwned"
    (directory / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(BaseException):
        dcp.load({"x": torch.zeros(1)}, checkpoint_id=str(directory))
    assert marker.exists()


def test_a_crafted_value_inside_a_shard_is_refused_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    model, optimizer = model_and_optimizer()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    optimizer_state["param_groups"][0]["lr"] = Planted(marker)  # a non-tensor value: DCP torch.saves it
    directory = tmp_path / RunDir.SHARDED
    with pytest.warns(UserWarning):
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory))
    assert not marker.exists()
    with pytest.raises(RecordError, match="weights-only"):
        restored_weights(directory)
    assert not marker.exists()


def flip_byte(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def shard(directory: Path) -> Path:
    return next(directory.glob("*.distcp"))


@pytest.mark.parametrize("damage", ["flipped", "truncated", "deleted", "metadata", "extra"])
def test_a_damaged_shard_is_named_in_one_line_before_dcp_reads_it(saved, damage):
    directory, _ = saved
    if damage == "flipped":
        flip_weight_byte(directory, saved[1][0].weight)
    elif damage == "truncated":
        shard(directory).write_bytes(shard(directory).read_bytes()[:100])
    elif damage == "deleted":
        shard(directory).unlink()
    elif damage == "metadata":
        flip_byte(directory / ".metadata")
    else:
        (directory / "__7_0.distcp").write_bytes(b"not written with it")
    with pytest.raises(RecordError) as refused:
        checkpoint.load_run(directory.parent)
    message = str(refused.value)
    assert str(directory) in message and "resume=false" in message and "\n" not in message


def flip_weight_byte(directory: Path, weight: torch.Tensor) -> None:
    """Flip a bit inside `weight`'s raw bytes in the shard (found by its bytes)."""
    path = shard(directory)
    data = bytearray(path.read_bytes())
    at = data.find(weight.detach().numpy().tobytes())
    assert at >= 0
    data[at + 5] ^= 0x01
    path.write_bytes(bytes(data))


def test_what_the_manifest_guards_against_dcp_loads_a_flipped_weight_without_a_word(saved):
    directory, model = saved
    flip_weight_byte(directory, model[0].weight)
    model2, optimizer2 = model_and_optimizer(seed=1)
    dcp.load({"model": get_state_dict(model2, optimizer2)[0]}, checkpoint_id=str(directory))
    with pytest.raises(RecordError, match="differs from what was written"):
        checkpoint.load_run(directory.parent)


def test_a_sharded_checkpoint_without_its_trainer_state_is_refused_not_started_over(saved):
    directory, _ = saved
    (directory / sharded.TRAINER_STATE).unlink()
    assert checkpoint.exists(directory.parent)  # a re-run resumes (and is refused) instead of starting over
    with pytest.raises(RecordError, match="trainer.pt is missing"):
        checkpoint.load_run(directory.parent)


def test_a_dcp_failure_inside_the_load_is_one_line(saved):
    directory, _ = saved
    model = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.LayerNorm(3))  # shards that do not fit it
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(RecordError) as refused:
        sharded.load_model_and_optimizer(directory, model, optimizer)
    assert str(directory) in str(refused.value) and "\n" not in str(refused.value)


# -- found by a review of the above ----------------------------------------------------------------------------
def test_dcp_metadata_that_names_a_file_outside_its_directory_is_refused(saved, tmp_path):
    from deepnorm_exp.train.dcp_safety import MetadataUnpickler

    directory, _ = saved
    metadata = MetadataUnpickler(io.BytesIO((directory / ".metadata").read_bytes())).load()
    torch.save({"w": torch.zeros(3)}, tmp_path / "victim.pt")
    for info in metadata.storage_data.values():
        info.relative_path = "../victim.pt"
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(RecordError, match="names a file outside it"):
        restored_weights(directory)


def test_a_checkpoint_file_cannot_point_the_restore_at_another_directory(tmp_path):
    torch.save({"step": 3, "sharded": str(tmp_path / "elsewhere")}, tmp_path / "checkpoint.pt")
    assert "sharded" not in checkpoint.load(tmp_path / "checkpoint.pt")


@pytest.mark.parametrize("files, why", [({"a": 3}, "malformed"), ([1], "malformed"),
                                        ({"../x": [1, "00"]}, "outside")])
def test_a_malformed_manifest_is_damage_not_a_traceback(saved, files, why):
    directory, _ = saved
    with pytest.raises(RecordError, match=why):
        sharded.verify(directory, files)


# -- a damaged checkpoint (issue 13's fifth fault) ------------------------------------------------------------------------------------
def flip_tensor_byte(path: Path) -> None:
    """Flip one bit in the middle of the largest tensor's bytes, where torch.load alone reads it without a
    word. (The middle of the file can fall in the zip's alignment padding, which no CRC covers and no reader
    reads: a flip there damages nothing.)"""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        largest = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    header = largest.header_offset
    name_length, extra_length = int.from_bytes(data[header + 26:header + 28], "little"), \
        int.from_bytes(data[header + 28:header + 30], "little")
    data[header + 30 + name_length + extra_length + largest.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_checkpoint_with_a_flipped_bit_is_refused_instead_of_training_from_wrong_weights(tmp_path):
    state = {"step": 3, "w": torch.randn(200, 200)}
    torch.save(state, tmp_path / "checkpoint.pt")
    flip_tensor_byte(tmp_path / "checkpoint.pt")
    loaded = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert not torch.equal(loaded["w"], state["w"])  # what verification guards against
    with pytest.raises(RecordError, match="fails its CRC check"):
        checkpoint.load(tmp_path / "checkpoint.pt")
    (tmp_path / "checkpoint.pt").write_bytes((tmp_path / "checkpoint.pt").read_bytes()[:1000])
    with pytest.raises(RecordError, match="checkpoint.pt is damaged"):
        checkpoint.load(tmp_path / "checkpoint.pt")


@pytest.mark.slow
def test_a_damaged_checkpoint_is_one_line_every_time_and_resume_false_starts_over(tmp_path):
    args = [*TINY, "train.steps=40", "train.ckpt_every=10", "logger=none", f"paths.runs={tmp_path}"]
    run = PausedRun(args, step=25, directory=tmp_path / "pause")
    run.wait_paused()
    run.proc.kill()
    run.finish()
    (saved,) = tmp_path.glob("default/*/checkpoint.pt")  # step 20's
    run_dir = saved.parent
    flip_tensor_byte(saved)  # (a truncated file: the unit test above)
    for _ in range(2):  # the same one line on every re-run, never a traceback
        again = run_cli(*args)
        assert again.returncode == 1
        line = one_error_line(again)
        assert str(saved) in line and "resume=false" in line
        assert records.read_json(run_dir / "summary.json")["status"] == "failed"
    fresh = run_cli(*args, "resume=false")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert records.read_json(run_dir / "summary.json")["status"] == "completed"


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
