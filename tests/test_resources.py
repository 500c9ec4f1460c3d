"""Resources the pre-flight counts before any compute (issue 38, class 6): the host memory of the data (each
data source says what its config takes: `host_bytes`, found through the data registry) and the disk a run's
records take at its intervals, against the free space where they go. Estimates are held against what real
loads and a real run allocate and write; refusals are one line naming the keys to change, exit status 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tracemalloc
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import deepnorm_exp
from conftest import REPO, TINY, TINY_MODEL, run_cli, write_text, refused
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.preflight import preflight

GIB = 2**30
# The data estimate is an upper bound of what a load allocates, by at most this factor (text: its build's
# buffers grow by doubling, 46-66 bytes a corpus byte over 1-21 MB; the bound is 72).
DATA_TOLERANCE = 1.3
TEXT_TOLERANCE = 1.6
# The disk estimate of each record is an upper bound of what a run writes, by at most this factor.
DISK_TOLERANCE = 2.0


def refusal(argv) -> ConfigError:
    """The pre-flight's refusal of `argv`: one line, exit status 2 (and nothing launched: preflight() only checks)."""
    with pytest.raises(ConfigError) as error:
        preflight(list(map(str, argv)))
    assert error.value.exit_status == 2 and "\n" not in str(error.value)
    return error.value


def small_machine(monkeypatch, gib: float) -> None:
    """This machine with `gib` of memory, for the data check and the CPU's device check alike."""
    import deepnorm_exp.train.memory as memory

    monkeypatch.setattr(memory, "host_memory", lambda: int(gib * GIB), raising=False)


def cpu_estimate(overrides):
    """The memory estimate the pre-flight makes for a CPU run of `overrides` (the estimate's own entry)."""
    from deepnorm_exp.build import check_config
    from deepnorm_exp.metrics import holds_weight_copy
    from deepnorm_exp.train.memory import estimate

    checked = check_config(deepnorm_exp.compose([*TINY_MODEL, "device=cpu", *overrides]))
    return estimate(checked.cfg, checked.scheme, checked.depths, checked.positions, holds_weight_copy(checked.cfg.metrics))


# -- memory: the data ----------------------------------------------------------------------------------------
def test_a_thousand_classes_count_their_tables_and_are_refused_where_they_cannot_fit(tmp_path, monkeypatch):
    """data.classes=1000: the trigram table is 1000^3 float64 (8 GB), built from as many random keys and their
    argsort (16 GB at once). It passed as "~0.00 GiB" and was killed by the kernel."""
    guess = cpu_estimate(["data.classes=1000", "data.vocab_size=1003"])
    assert guess.total_bytes >= 2 * 8 * 1000**3, guess.describe()
    assert "GiB of data while loading" in guess.describe()
    small_machine(monkeypatch, 8)
    argv = ["data.classes=1000", "data.vocab_size=1003", "device=cpu", f"paths.runs={tmp_path / 'runs'}"]
    error = refusal(argv)
    assert str(error).startswith("data.classes=1000 is invalid: the data would take ~14.9 GiB of host memory"), error
    assert "this machine has 8.0 GiB" in str(error) and "memory_check=false" in str(error)
    assert not (tmp_path / "runs").exists()
    jobs, _ = preflight([*argv, "memory_check=false"])  # the way to try anyway, as for the model's memory
    assert jobs[0].cfg.data.classes == 1000


def test_a_hundred_million_sequences_are_refused_naming_train_sequences(tmp_path, monkeypatch):
    """Generation holds two uniform draws and the tokens as 8-byte arrays: 24 bytes a token, 1.6e11 bytes for
    1e8 sequences of 65 tokens, beside the per-position class distributions."""
    small_machine(monkeypatch, 64)
    error = refusal(["data.train_sequences=100000000", "device=cpu", f"paths.runs={tmp_path}"])
    assert str(error).startswith("data.train_sequences=100000000 is invalid: the data would take ~"), error
    assert "lower data.train_sequences or data.classes" in str(error)


def test_on_a_gpu_the_data_is_checked_against_the_hosts_memory_alone():
    from deepnorm_exp.train.memory import check_host_memory

    guess = cpu_estimate(["data.train_sequences=100000000"])
    guess.data_on_device = False  # as on a GPU: training is the device's, the data the host's
    assert guess.total_bytes == guess.training_bytes and guess.host_bytes == guess.data.peak
    cfg = deepnorm_exp.compose([*TINY_MODEL, "data.train_sequences=100000000"])
    with pytest.raises(ConfigError, match="data.train_sequences=100000000 is invalid"):
        check_host_memory(cfg, guess)


# (section, task): each case sizes another term of the estimate: the sequences, the tables (classes), the
# within-class sampling (vocab_size / classes), and the translation pairs.
LOADS = [({"train_sequences": 8000}, "lm"), ({"train_sequences": 4000, "classes": 128}, "lm"),
         ({"train_sequences": 4000, "vocab_size": 4096}, "lm"), ({"train_sequences": 8000}, "translation"),
         ({"train_sequences": 4000, "classes": 96, "translation_max_len": 12}, "translation")]


@pytest.mark.parametrize("section, task", LOADS, ids=[f"{task}-{'-'.join(map(str, s.values()))}" for s, task in LOADS])
def test_the_synthetic_estimate_holds_what_a_load_allocates(tmp_path, section, task):
    """Against the peak of numpy's (and Python's) allocations while the source builds and loads (tracemalloc:
    every array the generation and the loading make; Arrow's buffers are outside it, see the next test)."""
    from deepnorm_exp.data import host_bytes, load_data

    warm = OmegaConf.create({"name": "synthetic", "train_sequences": 64, "eval_sequences": 8, "vocab_size": 32,
                             "classes": 4})
    load_data(warm, tmp_path / "warm", task)  # first-use allocations (imports, caches) are not the data's
    section = OmegaConf.create({"name": "synthetic", **section})
    tracemalloc.start()
    try:
        load_data(section, tmp_path / "data", task)
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimated = host_bytes(section, task).peak
    assert allocated <= estimated <= DATA_TOLERANCE * allocated, (estimated, allocated)


RESIDENT = """
import json, os, sys, tempfile
from pathlib import Path
os.environ["HF_HOME"] = tempfile.mkdtemp()  # datasets' own cache, out of the user's
from datasets.utils.logging import disable_progress_bar
from omegaconf import OmegaConf
from deepnorm_exp.data import load_data
import torch
disable_progress_bar()
section, warm, task = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
cache = Path(tempfile.mkdtemp())
load_data(OmegaConf.create(warm), cache / "warm", task)  # imports and first-use costs are not the data's

def status(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) * 1024

before = max(status("VmRSS:"), status("VmHWM:"))
load_data(OmegaConf.create(section), cache / "data", task)
print(json.dumps(status("VmHWM:") - before))
"""


def resident_peak(section: dict, warm: dict, task: str) -> int:
    """The growth of the peak resident memory of a fresh process loading `section` (after a small `warm` load)."""
    result = subprocess.run([sys.executable, "-c", RESIDENT, json.dumps(section), json.dumps(warm), task], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak resident memory from /proc")
def test_the_synthetic_estimate_holds_a_loads_resident_memory():
    """Translation pairs: the dataset conversion's Arrow buffers count too (peak RSS of a real load)."""
    from deepnorm_exp.data import host_bytes

    section = {"name": "synthetic", "train_sequences": 20000}
    warm = {"name": "synthetic", "train_sequences": 64, "eval_sequences": 8, "vocab_size": 32, "classes": 4}
    measured = resident_peak(section, warm, "translation")
    estimated = host_bytes(OmegaConf.create(section), "translation").peak
    assert measured <= estimated <= DATA_TOLERANCE * measured, (estimated, measured)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak resident memory from /proc")
def test_the_text_estimate_holds_a_loads_resident_memory(tmp_path):
    """A 3.1 MB corpus (the most bytes a byte measured), byte tokens: the estimate from the files' sizes
    against a real build and load."""
    from deepnorm_exp.data import text_size
    from deepnorm_exp.data.text import TextConfig, resolved_files

    corpus = write_text(tmp_path / "corpus.txt", 45_000, seed=3)
    section = {"name": "text", "files": str(corpus)}
    warm = {"name": "text", "files": str(write_text(tmp_path / "warm.txt", 200))}
    measured = resident_peak(section, warm, "lm")
    cfg = TextConfig(files=str(corpus))
    estimated = text_size.host_bytes(cfg, resolved_files(cfg)).peak
    assert measured <= estimated <= TEXT_TOLERANCE * measured, (estimated, measured)
    assert estimated >= corpus.stat().st_size  # at least a byte a token, whatever the build


def test_text_data_reports_its_size_through_the_registry(tmp_path):
    """data=text's registry entry reports its host memory (`TextFiles.host_bytes`, from text_size.py), so
    the memory estimate counts a corpus without reading it."""
    from deepnorm_exp.data import SOURCES, host_bytes

    if not hasattr(SOURCES.get("text"), "host_bytes"):
        pytest.skip("deepnorm_exp/data/text.py's TextFiles has no host_bytes yet (one line: see text_size.py)")
    corpus = write_text(tmp_path / "corpus.txt", 2000)
    reported = host_bytes(OmegaConf.create({"name": "text", "files": str(corpus)}), "lm")
    assert reported.peak >= 40 * corpus.stat().st_size and list(reported.parts) == ["files"]


# -- disk: the records ----------------------------------------------------------------------------------------
Usage = namedtuple("Usage", "total used free")


def free_space(monkeypatch, gib: float) -> None:
    """Every disk with `gib` free, as shutil.disk_usage reports it."""
    free = int(gib * GIB)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(1000 * GIB, 1000 * GIB - free, free))


def test_depth_1000_with_per_layer_records_every_step_is_refused_beyond_the_free_space(tmp_path, monkeypatch, capsys):
    """~170 kB a step of per-layer Parquet at 1,000 layers (the issue: 144 kB a step, 143 GB for 1e6 steps)."""
    free_space(monkeypatch, 50)
    error = refusal(["depth=1000", "metrics.layer_every=1", "train.steps=1000000", "logger=none",
                     f"paths.runs={tmp_path / 'runs'}"])
    assert str(error).startswith("metrics.layer_every=1 is invalid: the run's records would take ~"), error
    assert "layers/ 1" in str(error) and "has 50.0 GiB free" in str(error) and "raise metrics.layer_every" in str(error)
    assert not (tmp_path / "runs").exists()
    from deepnorm_exp.train import disk

    per_step = disk.LAYER_FILE_BYTES + 2000 * disk.LAYER_ROW_BYTES
    assert 140_000 <= per_step <= 200_000


def test_w_and_b_heatmaps_are_counted_and_named(tmp_path, monkeypatch):
    """The default logger draws one heatmap image per metric at every per-layer step: at depth it writes
    more than the Parquet files, and the refusal says so."""
    free_space(monkeypatch, 50)
    error = refusal(["depth=1000", "metrics.layer_every=5", "train.steps=200000", f"paths.runs={tmp_path}"])
    assert str(error).startswith("logger=wandb is invalid: the run's records would take ~"), error
    assert "logger=none" in str(error)


def test_a_sweeps_records_are_summed_over_its_jobs(tmp_path, monkeypatch):
    common = [*TINY, "logger=none", "metrics.layer_every=1", "train.steps=4000", f"paths.runs={tmp_path}"]
    (one,), _ = preflight([*common, "seed=1"])
    free_space(monkeypatch, 1.5 * one.disk.peak / GIB)
    preflight([*common, "seed=1"])  # one run fits
    error = refusal(["-m", *common, "seed=1,2"])
    assert "the 2 runs' records would take" in str(error), error


def test_the_preflight_states_the_disk_and_memory_a_command_takes(tmp_path, capsys):
    preflight([*TINY, "logger=none", f"paths.runs={tmp_path}"])
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pre-flight:")]
    assert f"records of 1 run: ~" in line and f"in {tmp_path}" in line and "free" in line
    assert "host memory ~" in line, line


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.slow
def test_the_disk_estimate_holds_a_real_runs_records(tmp_path, runs_root):
    """A tiny run through the command line (W&B offline, per-layer records, a kept checkpoint): each record's
    estimate against the bytes the run wrote, an upper bound within DISK_TOLERANCE."""
    import pyarrow.parquet as pq

    from deepnorm_exp.train import disk

    args = [*TINY, "depth=12", "train.steps=8", "train.log_every=2",
            "train.eval_every=3", "metrics.layer_every=4", "train.ckpt_every=3", "train.keep_checkpoint=true",
            "logger=wandb", f"paths.runs={runs_root}", f"paths.cache={tmp_path / 'cache'}"]
    result = run_cli(*args, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(line.startswith("pre-flight: 1 job checked; records of 1 run: ~") for line in result.stderr.splitlines())
    (run,) = [p.parent for p in (runs_root / "default").glob("*/summary.json")]
    written = {"metrics.jsonl": (run / "metrics.jsonl").stat().st_size, "layers/": directory_bytes(run / "layers"),
               "wandb/": directory_bytes(run / "wandb"), "checkpoint.pt": (run / "checkpoint.pt").stat().st_size}
    (job,), _ = preflight(args)  # the same command's estimate (the run has finished: it writes nothing more)
    estimated = job.disk.parts
    for record, size in written.items():
        assert size <= estimated[record] <= DISK_TOLERANCE * size, (record, estimated[record], size)
    total = directory_bytes(run)
    assert total <= job.disk.records <= DISK_TOLERANCE * total, (job.disk.records, total)
    # The row bytes were measured with every per-layer metric: a new one must re-measure them.
    assert all(len(pq.read_schema(path)) <= disk.LAYER_COLUMNS for path in (run / "layers").glob("step_*.parquet"))


def test_the_data_estimate_of_an_unchecked_section_names_a_key_that_breaks_its_rule():
    """host_bytes builds a checked section's dataclass directly (cheaper than parse_section), which checks no
    key's rule: an unchecked section with a bad value is refused naming the key, never estimated."""
    from deepnorm_exp.data import host_bytes

    with pytest.raises(ConfigError, match=r"^data.train_sequences=-5 is invalid: must be a positive integer"):
        host_bytes({"name": "synthetic", "train_sequences": -5})
    with pytest.raises(ConfigError, match=r"^data.trigram_weight=1.5 is invalid"):
        host_bytes({"name": "synthetic", "trigram_weight": 1.5}, "translation")
    assert host_bytes({"name": "synthetic", "train_sequences": 64}).peak > 0


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
