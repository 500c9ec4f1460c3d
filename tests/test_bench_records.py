"""`make bench` keeps what it printed, and docs/speed.md's figures are those records (benchmarks/records.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench, records

REPO = Path(__file__).resolve().parents[1]


def test_a_finished_section_is_kept_with_its_day_commit_and_machine(tmp_path, capsys):
    with records.recorded("decoder", "2 CPU cores", tmp_path):
        print("depth 100 bare 0.299")
    assert "depth 100 bare 0.299" in capsys.readouterr().out  # still printed
    header, body = (tmp_path / "decoder.txt").read_text().split("\n", 1)
    assert header.startswith("section `decoder`, ") and header.endswith(", 2 CPU cores") and " commit " in header
    assert body == "depth 100 bare 0.299\n"


def test_a_section_that_fails_leaves_the_last_complete_record(tmp_path):
    with records.recorded("decoder", "machine", tmp_path):
        print("the complete one")
    with pytest.raises(KeyboardInterrupt):
        with records.recorded("decoder", "machine", tmp_path):
            print("half a table")
            raise KeyboardInterrupt
    assert (tmp_path / "decoder.txt").read_text().endswith("the complete one\n")
    assert [p.name for p in tmp_path.iterdir()] == ["decoder.txt"]  # no temporary left behind


def test_the_page_blocks_are_rewritten_from_the_records_and_say_what_is_missing(tmp_path):
    (tmp_path / "compile.txt").write_text("section `compile`, 2026-12-01, commit abc1234, 2 CPU cores\n"
                                          "  100 eager 1.07\n")
    page = tmp_path / "speed.md"
    page.write_text("# Speed\n\n<!-- bench:compile -->\nold\n<!-- /bench:compile -->\n\nprose\n\n"
                    "<!-- bench:threads -->\n<!-- /bench:threads -->\n")
    done = records.rewrite([page], tmp_path)
    assert done == [f"{page}:compile", f"{page}:threads"]
    text = page.read_text()
    assert ("<!-- bench:compile -->\n`make bench`, section `compile`, 2026-12-01, commit abc1234, 2 CPU cores:\n\n"
            "```text\n  100 eager 1.07\n```\n<!-- /bench:compile -->") in text
    assert "Not measured yet: `python -m benchmarks.bench --sections threads`." in text and "old" not in text


def test_the_manual_shows_the_committed_records():
    pages = sorted((REPO / "docs").glob("*.md"))
    found = {name: page for page in pages for name in records.block_names(page)}
    assert set(bench.SECTIONS) - {"gpu"} == set(found), "every CPU section has its block on a page"
    for name, page in found.items():
        text = page.read_text(encoding="utf-8")
        assert f"<!-- bench:{name} -->\n{records.render(name)}\n<!-- /bench:{name} -->" in text, (
            f"{page.name}'s {name} block is stale: python -m benchmarks.records docs/*.md")
        assert (records.RESULTS / f"{name}.txt").is_file(), f"{name}: no record; make bench"


def test_the_benchmark_children_import_no_more_than_they_measure():
    """The bare loop's memory baseline must not hold pandas or the analysis (records.py is imported by the
    parent only)."""
    code = "import sys, benchmarks.bench; print(sorted(m for m in ('pandas', 'matplotlib', 'benchmarks.records') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unknown_section_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--sections", "decoder,nope"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--sections nope: choose from decoder, memory" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_benchmark_module_loads_without_the_harness():
    """The bare child (`--child bare`) measures a plain PyTorch loop's peak memory: importing the benchmark
    must not import deepnorm_exp (torch, Hydra, every scheme) into it."""
    code = "import sys, benchmarks.bench; assert 'deepnorm_exp' not in sys.modules, 'deepnorm_exp imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
