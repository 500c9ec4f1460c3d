"""Hostile input (issue 23) to the run's front end: no record lands outside paths.runs, bad values are one line
before any run directory exists, the batch's layout and the world size are checked in the pre-flight, the
report and the results page read what they are given without trusting it. Each test failed on the code before
its fix. Crafted and damaged checkpoints are in test_checkpoint.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepnorm_exp.rundir import RunDir


# -- 4. every record inside paths.runs ---------------------------------------------------------------------------
LONG = "a" * 10_000


@pytest.mark.parametrize("name", ["../../escape", "ABSOLUTE", "..", ".", "", ".cache", "a\nb", "a/b", LONG])
def test_an_experiment_name_that_is_not_one_directory_name_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                                                 name):
    from test_faults import refused

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


# -- 5. hostile values: one line, no run directory ------------------------------------------------------------
@pytest.mark.parametrize("override", [f"seed={2**70}", "seed=-1", "data.seed=-1", f"train.lr={LONG}",
                                      f"norm={LONG}", f"+x{LONG}=1", f"depth={'9' * 10_000}", f"train.schedule={LONG}"])
def test_hostile_values_are_one_short_line_before_any_run_directory(tmp_path, capsys, override):
    from test_faults import refused

    from conftest import TINY

    line = refused([*TINY, f"paths.runs={tmp_path / 'runs'}", "logger=none", override], capsys)
    assert len(line) < 600, line
    assert not (tmp_path / "runs").exists()


def test_an_echoed_value_is_cut_and_its_control_characters_escaped():
    from deepnorm_exp.errors import ConfigError

    message = str(ConfigError("experiment_name", "x" * 10_000 + "\n", f"Value '{'x' * 10_000}' is bad"))
    assert "\n" not in message and len(message) < 600 and "(10,001 characters)" in message
    assert str(ConfigError("k", "a\tb\nc", "why")) == "k=a\\tb\\nc is invalid: why"


# -- 6. the batch's layout, checked in the pre-flight from the world size the launch will have -------------------
@pytest.mark.parametrize("overrides, key", [(["train.batch_size=5"], "train.batch_size"),
                                            (["train.batch_size=8", "train.micro_batch_size=8"], "train.micro_batch_size")])
def test_a_batch_that_does_not_split_over_the_ranks_is_refused_before_a_run_directory(tmp_path, monkeypatch,
                                                                                      overrides, key):
    from deepnorm_exp.errors import ConfigError
    from deepnorm_exp.preflight import preflight

    from conftest import TINY

    args = [*TINY, f"paths.runs={tmp_path / 'runs'}", "logger=none", *overrides]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node=2 starts each rank
    with pytest.raises(ConfigError, match=rf"^{key}=\d+ is invalid: must (split evenly over the 2 |divide each process.s 4 rows)"):
        preflight(args)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ConfigError, match=rf"^{key}="):  # a submitit job of 2 tasks: 2 ranks
        preflight(["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", *args])
    if key == "train.batch_size":
        preflight(args)  # one process: 5 rows are one share
    assert not (tmp_path / "runs").exists()


# -- 7. ddp or fsdp asked for on one process ------------------------------------------------------------------
def test_ddp_or_fsdp_on_one_process_says_so_in_one_line(tmp_path, caplog):
    import logging

    from deepnorm_exp.lifecycle.run import run_experiment

    from test_faults import config

    with caplog.at_level(logging.WARNING, logger="deepnorm_exp"):
        summary = run_experiment(config(tmp_path, "train.parallel=fsdp", "train.steps=2"), progress=False)
    notes = [r.getMessage() for r in caplog.records if "train.parallel=fsdp" in r.getMessage()]
    assert len(notes) == 1 and "one process" in notes[0] and "torchrun" in notes[0] and "\n" not in notes[0]
    assert (summary["status"], summary["parallel"]) == ("completed", "none")


# -- 8. the report: an unreadable config, runs in progress ---------------------------------------------------
def test_a_report_over_a_run_with_an_unreadable_config_and_runs_in_progress(tmp_path):
    from deepnorm_exp.analysis import load_runs
    from deepnorm_exp.analysis.report import build_report
    from deepnorm_exp.lifecycle.run import run_experiment

    from test_faults import config

    summary = run_experiment(config(tmp_path, "train.steps=4", "metrics.layer_every=2"), progress=False)
    done = Path(summary["run_dir"])
    (done / "config.yaml").write_text("{{{ not yaml")
    page = build_report(tmp_path / "default")  # was: KeyError 'model.d_model' from the LN-input figure
    assert "<h2>LayerNorm input norm</h2>" in page and "<h2>Runs</h2>" in page
    # A run started just now (config, no summary) and a resumed one (an earlier attempt's summary), both held.
    fresh, resumed = tmp_path / "default" / "fresh-s0", tmp_path / "default" / "resumed-s0"
    for run in (fresh, resumed):
        run.mkdir()
        (run / "config.yaml").write_text("norm:\n  name: post\ndepth: 6\nseed: 0\nexperiment_name: default\n")
    earlier = json.loads((done / "summary.json").read_text())
    (resumed / "summary.json").write_text(json.dumps({**earlier, "status": "interrupted", "run_name": resumed.name,
                                                      "run_dir": str(resumed)}))
    locks = [RunDir(fresh).lock(), RunDir(resumed).lock()]
    assert all(lock.acquire() for lock in locks)
    try:
        runs = load_runs(tmp_path / "default").set_index("run_dir")
        assert runs.loc[str(fresh), "status"] == runs.loc[str(resumed), "status"] == "running"
        assert runs.loc[str(fresh), "norm"] == "post" and runs.loc[str(done), "status"] == "completed"
        assert "2 run(s) running or unfinished" in build_report(tmp_path / "default")
    finally:
        for lock in locks:
            lock.release()
    runs = load_runs(tmp_path / "default").set_index("run_dir")
    assert (runs.loc[str(fresh), "status"], runs.loc[str(resumed), "status"]) == ("unfinished", "interrupted")


# -- 9. regenerating the results page from fewer records than it shows --------------------------------------------
def test_the_results_page_is_not_replaced_from_records_that_lack_its_studies(tmp_path, capsys):
    from deepnorm_exp.analysis.results import main

    docs, root = tmp_path / "docs", tmp_path / "runs"
    docs.mkdir()
    root.mkdir()
    page = "# Results\n\n## Quick start\n\nsome table\n\n<!-- study:quickstart runs=6 -->\n"
    (docs / "results.md").write_text(page)
    with pytest.raises(SystemExit) as exit:
        main([str(root), "--out", str(docs)])
    assert exit.value.code == 2 and "quickstart (0 of 6 runs here)" in capsys.readouterr().err
    assert (docs / "results.md").read_text() == page
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:presets -->\nthe presets' times\n<!-- /results:presets -->\n")
    with pytest.raises(SystemExit):
        main([str(root), "--out", str(docs), "--readme", str(readme)])
    assert "the presets' times" in readme.read_text()  # a block that summarizes every study waits for the page
    main([str(root), "--out", str(docs), "--allow-missing"])
    assert "<!-- study:quickstart runs=0 -->" in (docs / "results.md").read_text()


def test_a_page_written_before_the_counts_were_marked_is_read_by_its_sections():
    from deepnorm_exp.analysis.results import published_runs
    from deepnorm_exp.analysis.studies import STUDIES

    titles = {s.name: s.title for s in STUDIES}
    page = (f"# Results\n\n## {titles['quickstart']}\n\nabout\n\n| a |\n\n## {titles['zoo_depth_sweep']}\n\n"
            "about\n\nNot run yet.\n")
    assert published_runs(page) == {"quickstart": None}


# -- 10. interpolations in overrides survive the pre-flight -------------------------------------------------------
@pytest.mark.parametrize("sweeper", [[], ["hydra/sweeper=frontier"]])
def test_an_interpolation_in_an_override_is_kept_as_hydra_keeps_it(tmp_path, sweeper):
    from deepnorm_exp.preflight import preflight

    from conftest import TINY

    jobs, multirun = preflight(["-m", *sweeper, "norm=post,pre", "hydra.sweep.subdir=job${hydra.job.num}",
                                "experiment_name=x_${norm.name}", *TINY, f"paths.runs={tmp_path}", "logger=none"])
    assert multirun and len(jobs) >= 2
    assert {job.cfg.experiment_name for job in jobs} == {"x_post", "x_pre"}


# -- 11. a module name users typed before the regrouping ---------------------------------------------------------
def test_an_old_module_name_fails_in_one_line_naming_the_new_one():
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", "deepnorm_exp.report", "runs/x"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "python -m deepnorm_exp.analysis.report" in line


# -- 12. start-up: the jobs the pre-flight checked are not composed a second time --------------------------------
def test_the_default_sweeper_validates_only_the_jobs_the_preflight_did_not_check(tmp_path, monkeypatch):
    from conftest import TINY
    from deepnorm_exp.preflight import checked_sweeper_override, preflight

    jobs, _ = preflight(["-m", "norm=post,pre", *TINY, f"paths.runs={tmp_path}", "logger=none"])
    # After a pre-flight: Hydra's first plugin scan re-executes the plugin modules (and its own
    # basic_sweeper.py) in place, so classes taken before it are not the ones Hydra launches with.
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import basic_sweeper
    from hydra_plugins.deepnorm_exp_frontier.checked_sweeper import CheckedSweeper

    BasicSweeper = basic_sweeper()[0]

    assert checked_sweeper_override(jobs) == ["hydra/sweeper=checked"]  # what the command launches with
    validated = []
    monkeypatch.setattr(BasicSweeper, "validate_batch_is_legal", lambda self, batch: validated.append(batch))
    sweeper = CheckedSweeper(max_batch_size=None, params=None)
    sweeper.validate_batch_is_legal([job.overrides for job in jobs])
    assert validated == []  # Hydra's validation composes each job again: 5.5 s of 54 jobs' start-up
    unchecked = [*jobs[0].overrides, "depth=3"]
    sweeper.validate_batch_is_legal([jobs[0].overrides, unchecked])
    assert validated == [[unchecked]]
    frontier, _ = preflight(["-m", "hydra/sweeper=frontier", "norm=post,pre", *TINY, f"paths.runs={tmp_path}"])
    assert checked_sweeper_override(frontier) == []  # a sweeper chosen otherwise is launched as it is


# -- found by a review of the above ----------------------------------------------------------------------------
def test_each_preflight_checks_its_own_jobs_and_a_single_run_trains_in_this_process(tmp_path):
    from deepnorm_exp.preflight import preflight, was_checked

    from conftest import TINY

    args = [*TINY, f"paths.runs={tmp_path}", "logger=none"]
    basic, _ = preflight(["-m", "norm=post,pre", *args])
    assert all(was_checked(job.overrides) for job in basic)
    preflight(["-m", "hydra/sweeper=frontier", "norm=post,pre", *args])
    assert not any(was_checked(job.overrides) for job in basic)  # an earlier command's checks do not carry over
    # not a sweep: the launcher's 8 tasks per node do not apply to it (it trains here, on one process)
    preflight(["hydra/launcher=slurm_multigpu", *args, "train.batch_size=4"])


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
