"""deepnorm_exp/records.py: one encoding for non-finite values in every record file, damaged lines of a jsonl
record skipped and named (issue 13's points 3 and 7), and atomic writes (a failed write leaves no temporary; a
new start removes what a killed one left)."""

import json
import math
from pathlib import Path

import deepnorm_exp
from deepnorm_exp import records
from deepnorm_exp.lifecycle.run import run_experiment
import pytest

from conftest import config, SimulatedCrash, CrashAt, only_run_dir


# -- 3. non-finite values: one encoding for every record file --------------------------------------------------
def test_records_encode_non_finite_values_as_strings_at_any_depth_and_read_them_back(tmp_path):
    value = {"loss": math.nan, "divergence": {"loss": math.inf, "last_healthy": {"grad_norm": -math.inf}},
             "history": [1.0, math.nan]}
    records.write_json(tmp_path / "r.json", value)

    def refuse(constant):
        raise ValueError(constant)

    strict = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)  # no bare NaN / Infinity
    assert strict["divergence"]["loss"] == "inf" and strict["history"][1] == "nan"
    back = records.read_json(tmp_path / "r.json")
    assert math.isnan(back["loss"]) and back["divergence"]["loss"] == math.inf
    assert back["divergence"]["last_healthy"]["grad_norm"] == -math.inf and math.isnan(back["history"][1])


def test_a_nan_diverged_run_records_nan_and_analysis_reads_it_as_a_float(tmp_path):
    summary = run_experiment(config(tmp_path, "norm=post", "depth=2", "train.lr=1e30", "train.warmup_steps=0",
                                    "train.log_every=1"), progress=False)
    assert summary["status"] == "diverged" and summary["divergence_reason"].startswith("non-finite")
    raw = (Path(summary["run_dir"]) / "summary.json").read_text()
    assert "NaN" not in raw and "Infinity" not in raw  # strict JSON
    runs = deepnorm_exp.load_runs(tmp_path)
    from deepnorm_exp.analysis import load_scalars

    scalars = load_scalars(runs)
    assert scalars["loss"].dtype.kind == "f" and scalars["loss"].isna().any()


def test_damaged_lines_of_a_jsonl_record_are_skipped_and_named(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "lo\x00\x00\n{"step": 3, "loss": "nan"}\n')
    with caplog.at_level("WARNING", logger="deepnorm_exp"):
        got = records.read_jsonl(path)
    assert [r["step"] for r in got] == [1, 3] and math.isnan(got[1]["loss"])
    assert "line 2" in caplog.text and str(path) in caplog.text


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
