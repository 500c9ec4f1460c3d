"""Published records (analysis/published.py): what `make results` refuses to pack, a damaged or edited
published file named in one line, and the committed records regenerating the committed results page and the
README's blocks byte for byte."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from deepnorm_exp.analysis import published
from deepnorm_exp.analysis.lr_study import TUNING
from deepnorm_exp.analysis.studies import STUDIES

from conftest import slow_beyond_first

REPO = Path(__file__).resolve().parents[1]


def fake_run(study: Path, name: str, status: str = "completed", loss: float = 3.0) -> Path:
    run_dir = study / name
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({
        "status": status, "trained": True, "eval_loss": loss, "initial_eval_loss": 6.0, "norm": "pre", "depth": 6,
        "seed": int(name[-1]), "experiment": study.name, "run_name": name, "steps": 10, "wall_s": 1.0,
        "started_at": "2026-12-01T10:00:00+00:00", "finished_at": "2026-12-01T10:00:01+00:00"}))
    (run_dir / "config.yaml").write_text(f"norm:\n  name: pre\ndepth: 6\nseed: {name[-1]}\ntrain:\n  lr: 0.001\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": "nan"}\n')
    return run_dir


def test_packing_fewer_runs_than_are_published_is_refused_and_no_raw_runs_leave_them_alone(tmp_path):
    study = tmp_path / "lr_study"
    for seed in range(3):
        fake_run(study, f"pre-L6-s{seed}")
    published.pack(study)
    before = {p.name: p.read_bytes() for p in published.published_dir(study).iterdir()}
    shutil.rmtree(study / "pre-L6-s2")  # a fresh clone where one run was made again
    with pytest.raises(published.PublishError, match="hold 3 runs and only 2 are here"):
        published.pack(study)
    for name in ("pre-L6-s0", "pre-L6-s1"):
        shutil.rmtree(study / name)
    assert published.pack(study) is None  # no raw runs: nothing to pack
    assert {p.name: p.read_bytes() for p in published.published_dir(study).iterdir()} == before
    assert published.load(study).runs()["eval_loss"].tolist() == [3.0, 3.0, 3.0]


def test_a_restored_study_whose_stopped_run_has_not_trained_again_packs_with_that_run_carried_over(tmp_path):
    """restore leaves out a run that had not ended (it trains again from the start); packing then must neither
    refuse (make results would stop for every study) nor drop the record of how far that run got."""
    study = tmp_path / "encdec_1000l"
    fake_run(study, "pre-L6-s0")
    fake_run(study, "pre-L6-s1", status="interrupted", loss=4.5)
    published.pack(study)
    shutil.rmtree(study / "pre-L6-s0")
    shutil.rmtree(study / "pre-L6-s1")
    assert published.restore(study) == (1, 1)
    published.pack(study)
    packed = published.load(study)
    assert sorted(packed.table("runs")["run_name"]) == ["pre-L6-s0", "pre-L6-s1"]
    assert packed.runs().set_index("run_name")["status"].to_dict() == {"pre-L6-s0": "completed",
                                                                       "pre-L6-s1": "interrupted"}
    assert set(packed.table("scalars")["run_name"]) == {"pre-L6-s0", "pre-L6-s1"}
    assert packed.manifest["runs"] == 2
    fake_run(study, "pre-L6-s1", loss=3.5)  # the sweep trains it again: its new records replace the old
    published.pack(study)
    assert published.load(study).runs().set_index("run_name")["eval_loss"].to_dict() == {"pre-L6-s0": 3.0,
                                                                                         "pre-L6-s1": 3.5}
    shutil.rmtree(study / "pre-L6-s0")  # an ended run missing is still refused
    with pytest.raises(published.PublishError, match="hold 2 runs and only 1 are here"):
        published.pack(study)


def test_a_stated_commit_is_recorded_as_stated_and_kept_when_packed_again(tmp_path):
    study = tmp_path / "s"
    fake_run(study, "pre-L6-s0")
    (study / "sweeps.jsonl").write_text('{"at": "2026-12-01T10:00:00+00:00", "event": "start", "overrides": '
                                        '["experiment=s"]}\n{"at": "2026-12-01T10:00:02+00:00", "event": "start", '
                                        '"overrides": ["experiment=s"], "commit": "abc1234"}\n')
    published.pack(study, stated_commit="0dd5bad")
    published.pack(study)
    manifest = published.load(study).manifest
    assert manifest["commits"] == [{"commit": "abc1234", "source": "sweep log"},
                                   {"commit": "0dd5bad", "source": "stated when packed: its sweep log predates "
                                                                  "commit logging"}]
    assert manifest["commands"] == ["python -m deepnorm_exp -m experiment=s"]


@pytest.mark.parametrize("damage", slow_beyond_first(["flip", "truncate", "delete", "extra", "manifest"]))
def test_damaged_or_edited_published_records_are_named_in_one_line(tmp_path, damage):
    root = tmp_path / "runs"
    study = root / "lr_study"
    fake_run(study, "pre-L6-s0")
    directory = published.pack(study)
    shutil.rmtree(study / "pre-L6-s0")
    target = directory / "runs.parquet"
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete":
        target.unlink()
    elif damage == "extra":
        (directory / "planted.parquet").write_bytes(b"PAR1")
    else:
        (directory / "manifest.json").write_text("{not json")
    with pytest.raises(published.PublishError, match="published"):
        published.load(study)
    proc = subprocess.run([sys.executable, "-m", "deepnorm_exp.analysis.results", str(root), "--out",
                           str(tmp_path / "docs")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "published" in proc.stderr, proc.stderr
    assert not (tmp_path / "docs" / "results.md").exists()


def _pixels(path: Path) -> np.ndarray:
    from matplotlib.image import imread

    return imread(path)


@pytest.mark.slow
def test_the_committed_records_regenerate_the_results_page_and_the_readme_byte_for_byte(tmp_path):
    """What a fresh clone has (the published records, no raw run) is enough: `make results` on a copy of them
    writes docs/results.md, the generated blocks of the README and the manual's pages, and conf/tuned_lr/
    exactly as committed, and figures of the same pixels."""
    root = tmp_path / "runs"
    studies = [s.name for s in STUDIES if published.published_dir(REPO / "runs" / s.name).is_dir()]
    assert studies, "no published records in runs/*/published/"
    for name in studies:
        shutil.copytree(published.published_dir(REPO / "runs" / name), published.published_dir(root / name))
    pages = ["README.md", *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md") if p.name != "results.md")]
    (tmp_path / "docs").mkdir()
    for page in pages:
        shutil.copy(REPO / page, tmp_path / page)
    proc = subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "results", f"PY={sys.executable}", "STAMP=",
                           "RUNS=runs", "DOCS=docs", "README=README.md", "CONF=conf"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "docs" / "results.md").read_text(encoding="utf-8")
    assert page == (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    for page in pages:
        assert (tmp_path / page).read_text(encoding="utf-8") == (REPO / page).read_text(encoding="utf-8"), page
    for study in TUNING:  # the rates of the studies that read them, written from the tuning studies' records
        tuned = f"tuned_lr/{study.name}.yaml"
        assert (tmp_path / "conf" / tuned).read_text(encoding="utf-8") == (REPO / "conf" / tuned).read_text(encoding="utf-8")
    figures = sorted(p.name for p in (tmp_path / "docs" / "results").glob("*.png"))
    assert figures == sorted(p.name for p in (REPO / "docs" / "results").glob("*.png"))
    for name in figures:
        np.testing.assert_array_equal(_pixels(tmp_path / "docs" / "results" / name),
                                      _pixels(REPO / "docs" / "results" / name), err_msg=name)
    for name in studies:  # packing found nothing raw to pack: the records are the committed ones
        for path in published.published_dir(REPO / "runs" / name).iterdir():
            assert (published.published_dir(root / name) / path.name).read_bytes() == path.read_bytes()


def test_clean_runs_deletes_raw_runs_and_keeps_the_published_records(tmp_path):
    """`make clean-runs` once deleted everything under runs/, the committed records included."""
    runs = tmp_path / "runs"
    for path in ("study/published/runs.parquet", "study/sweeps.jsonl", "study/post-L6-s0/summary.json",
                 "other/pre-L6-s0/summary.json", ".gitkeep"):
        (runs / path).parent.mkdir(parents=True, exist_ok=True)
        (runs / path).write_text("x")
    proc = subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "clean-runs"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(str(p.relative_to(runs)) for p in runs.rglob("*")) == [
        ".gitkeep", "study", "study/published", "study/published/runs.parquet"]


def test_a_sweep_run_before_the_restore_keeps_the_published_sweep_log(tmp_path):
    """The order the docs give is restore, then run; run first (a new invocation's own sweeps.jsonl) and then
    restore, and the published invocations must come back beside the new one, or packing drops them."""
    study = tmp_path / "zoo"
    fake_run(study, "pre-L6-s0")
    old = ['{"at": "2026-12-01T10:00:00+00:00", "event": "start", "id": "a", "overrides": ["experiment=zoo"]}',
           '{"at": "2026-12-01T11:00:00+00:00", "event": "end", "id": "a"}']
    (study / "sweeps.jsonl").write_text("".join(line + "\n" for line in old))
    published.pack(study)
    shutil.rmtree(study / "pre-L6-s0")
    new = ['{"at": "2026-12-03T10:00:00+00:00", "event": "start", "id": "b", "overrides": ["experiment=zoo", "seed=1"]}',
           '{"at": "2026-12-03T10:05:00+00:00", "event": "end", "id": "b"}']
    (study / "sweeps.jsonl").write_text("".join(line + "\n" for line in new))
    fake_run(study, "pre-L6-s1")
    published.restore(study)
    assert (study / "sweeps.jsonl").read_text().splitlines() == old + new
    published.restore(study)  # again: every line once
    assert (study / "sweeps.jsonl").read_text().splitlines() == old + new
    published.pack(study)
    assert published.load(study).manifest["commands"] == ["python -m deepnorm_exp -m experiment=zoo",
                                                          "python -m deepnorm_exp -m experiment=zoo seed=1"]
