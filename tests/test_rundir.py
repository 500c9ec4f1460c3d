"""The run directory's layout is spelled in one place (deepnorm_exp/rundir.py): every other module names its
files through RunDir / StudyDir, so renaming a file is one edit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import deepnorm_exp
from deepnorm_exp.rundir import RunDir, StudyDir
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.lifecycle.run import run_experiment

from conftest import LONG, write_text, TINY_MODEL, run_cli, config, only_run_dir, refused, TINY

PACKAGE = Path(deepnorm_exp.__file__).parent
SOURCES = [path for folder in ("deepnorm_exp", "hydra_plugins", "benchmarks")
           for path in sorted((PACKAGE.parent / folder).rglob("*.py"))]
# File names; the directories' bare words (layers, wandb, published) also name a sink, a package, a cache kind.
NAMES = {name for name in (*RunDir.RECORDS, *StudyDir.SWEEP_FILES) if "." in name}


def string_literals(tree: ast.AST) -> list[ast.Constant]:
    """Every str constant that is not a docstring (prose may name a file; code must not)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def spelled(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value!r}" for node in string_literals(tree)
            if node.value in NAMES]


def test_no_module_but_rundir_spells_a_file_name_of_a_run_or_study_directory():
    rundir = PACKAGE / "rundir.py"
    found = [hit for path in SOURCES if path != rundir for hit in spelled(path)]
    assert not found, found
    assert len(spelled(rundir)) == len(NAMES)  # the check reads what it should


def test_the_check_sees_a_spelled_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""summary.json in prose is fine."""\nPATH = "summary.json"\n')
    tree = ast.parse(planted.read_text())
    assert [node.value for node in string_literals(tree)] == ["summary.json"]


def test_paths_come_from_the_directory(tmp_path):
    files = RunDir(tmp_path)
    assert files.summary == tmp_path / RunDir.SUMMARY and files.sharded.parent == tmp_path
    assert not files.is_run()
    files.config.write_text("norm: {}\n")
    assert files.is_run()


def test_the_lock_is_exclusive_and_seen_from_outside(tmp_path):
    holder = RunDir(tmp_path).lock()
    assert not RunDir(tmp_path).held_elsewhere()
    assert holder.acquire()
    try:
        assert RunDir(tmp_path).held_elsewhere()
        assert not RunDir(tmp_path).lock().acquire(patience=0.1)
    finally:
        holder.release()
    assert not RunDir(tmp_path).held_elsewhere()


# -- hostile input (issue 23): every record inside paths.runs ------------------------------------------------
@pytest.mark.parametrize("name", ["../../escape", "ABSOLUTE", "..", ".", "", ".cache", "a\nb", "a/b", LONG])
def test_an_experiment_name_that_is_not_one_directory_name_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                                                 name):
    from conftest import refused

    from conftest import TINY

    root = tmp_path / "nest" / "runs"
    name = str(tmp_path / "elsewhere") if name == "ABSOLUTE" else name
    for mode in ([], ["-m"]):
        line = refused([*mode, *TINY, f"paths.runs={root}", "logger=none", f"experiment_name={name}"], capsys)
        assert "experiment_name=" in line or "override=" in line  # (a raw newline: Hydra's lexer refuses it)
        assert len(line) < 400
    assert list(tmp_path.iterdir()) == []  # nothing written, inside paths.runs or out


def test_a_run_directory_outside_paths_runs_is_refused_by_the_function_that_derives_it(tmp_path):
    from omegaconf import OmegaConf

    from deepnorm_exp.errors import ConfigError
    from deepnorm_exp.rundir import run_dir

    for name in ("../escape", "/abs", "..", "a/../.."):  # what validation refuses first, here straight to it
        cfg = OmegaConf.create({"paths": {"runs": str(tmp_path / "runs")}, "experiment_name": name})
        with pytest.raises(ConfigError, match="outside paths.runs"):
            run_dir(cfg, "post-L6-s0")
    cfg = OmegaConf.create({"paths": {"runs": str(tmp_path / "runs")}, "experiment_name": "ok"})
    assert run_dir(cfg, "post-L6-s0") == tmp_path / "runs" / "ok" / "post-L6-s0"


# -- hostile input (issue 23), found by a review -------------------------------------------------------------
def test_a_run_waits_out_a_readers_probe_of_its_lock_but_not_a_run(tmp_path):
    import threading

    holder = RunDir(tmp_path).lock()
    assert holder.acquire()
    threading.Timer(0.2, holder.release).start()
    waiting = RunDir(tmp_path).lock()
    assert waiting.acquire(patience=2.0)  # released within its patience
    waiting.release()
    assert holder.acquire()
    try:
        assert not RunDir(tmp_path).lock().acquire(patience=0.2)
    finally:
        holder.release()


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


def test_a_runs_path_that_is_a_file_or_read_only_is_refused_in_one_line(tmp_path, tmpfs, capsys):
    (tmp_path / "file").write_text("not a directory")
    for key, value in (("paths.runs", tmp_path / "file" / "runs"), ("paths.cache", tmp_path / "file")):
        line = refused([*TINY, "logger=none", f"{key}={value}"], capsys)
        assert line.startswith(f"deepnorm_exp: error: {key}=") and "is a file" in line
    read_only = tmpfs("ro", size="1m", read_only=True)
    line = refused([*TINY, "logger=none", f"paths.runs={read_only / 'runs'}"], capsys)
    assert line.startswith("deepnorm_exp: error: paths.runs=") and "not writable" in line
