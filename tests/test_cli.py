"""End-to-end runs of tiny models through the real command line (`python -m deepnorm_exp`)."""

import json

import pytest

pytestmark = pytest.mark.slow

SUMMARY_KEYS = {"status", "steps_completed", "final_loss", "eval_loss", "optimal_loss", "excess_loss",
                "diverged_at_step", "divergence_reason", "norm", "depth", "residual_multiplier", "branch_multiplier", "init_gain", "params",
                "tokens_per_s", "wall_s", "trained", "unigram_loss"}


def only_run(root):
    runs = list(root.glob("*/summary.json"))
    assert len(runs) == 1, runs
    return runs[0].parent


def test_single_run_writes_config_metrics_and_summary(cli, tiny, runs_root):
    result = cli("norm=deepnorm", "depth=3", *tiny)
    assert result.returncode == 0, result.stderr
    run = only_run(runs_root / "default")
    assert run.name.startswith("deepnorm-L3-") and "-model.d_model=16-" in run.name and run.name.endswith("-s0")
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "completed" and summary["steps_completed"] == 6
    assert summary["residual_multiplier"] == {"decoder": pytest.approx(6**0.25)}
    assert summary["init_gain"] == {"decoder": pytest.approx(24**-0.25)}
    assert summary["excess_loss"] == pytest.approx(summary["eval_loss"] - summary["optimal_loss"])
    assert summary["diverged_at_step"] is None and summary["params"] > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3, 4, 6]  # log_every=2, eval_every=3
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s"} <= set(records[0])
    assert "eval_loss" in records[1] and "eval_loss" in records[-1]
    assert "depth: 3" in (run / "config.yaml").read_text()
    assert "status      completed" in result.stdout + result.stderr  # the one-screen summary


def test_multirun_sweeps_norms_and_depths_and_prints_a_table(cli, tiny, runs_root):
    result = cli("-m", "norm=post,pre", "depth=1,2", "experiment_name=sweep", *tiny)
    assert result.returncode == 0, result.stderr
    names = sorted(p.parent.name for p in (runs_root / "sweep").glob("*/summary.json"))
    assert ["-".join(n.split("-")[:2]) for n in names] == ["post-L1", "post-L2", "pre-L1", "pre-L2"]
    table = result.stdout[result.stdout.index("run "):]
    assert all(name in table for name in names)


def test_a_diverging_run_exits_zero_and_says_so(cli, tiny, runs_root):
    result = cli("norm=post", "depth=2", "train.lr=1e4", "train.warmup_steps=0", "train.steps=30",
                 "train.divergence.spike_patience=2", "train.divergence.spike_factor=1.5", *tiny)
    assert result.returncode == 0, result.stderr
    run = only_run(runs_root / "default")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_at_step"] is not None
    assert summary["divergence_reason"]


@pytest.mark.parametrize("bad", [["norm=nope"], ["model=nope"], ["depth=0"], ["depth=x"], ["train.steps=-1"],
                                 ["train.batch_size=0"], ["train.seq_len=0"], ["train.lr=0"],
                                 ["model.n_heads=3"], ["train.seq_len=999"], ["-m", "norm=post,nope"]])
def test_bad_input_exits_with_one_line_before_any_run_directory(cli, tiny, runs_root, bad):
    bad_keys = {b.split("=")[0] for b in bad}
    result = cli(*bad, *[t for t in tiny if t.split("=")[0] not in bad_keys])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("deepnorm_exp: error: "), result.stderr
    assert not runs_root.exists()  # refused before anything ran: not even the runs root was made


def test_wandb_offline_run_lands_in_the_run_directory(cli, tiny, runs_root):
    overrides = [o for o in tiny if o != "logger=none"]
    result = cli("norm=pre", "depth=1", "logger=wandb", *overrides, timeout=600)
    assert result.returncode == 0, result.stderr
    run = only_run(runs_root / "default")
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_encoder_decoder_run_reports_both_stacks_and_exact_match(cli, tiny, runs_root):
    result = cli("model=encdec", "norm=deepnorm", "depth=2", "model.encoder_depth=3", "data.translation_max_len=6",
                 "data.eval_decode=4", *tiny)
    assert result.returncode == 0, result.stderr
    summary = json.loads((only_run(runs_root / "default") / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["model"] == "encdec"
    assert summary["residual_multiplier"] == {"encoder": pytest.approx(0.81 * (3**4 * 2) ** (1 / 16)),
                                              "decoder": pytest.approx(6**0.25)}
    assert set(summary["init_gain"]) == {"encoder", "decoder"}
    assert 0.0 <= summary["exact_match"] <= 1.0 and summary["optimal_loss"] > 0
    assert summary["excess_loss"] == pytest.approx(summary["eval_loss"] - summary["optimal_loss"])


def test_the_console_script_runs_from_anywhere_and_completes_overrides(tmp_path):
    """`deepnorm-exp` (pyproject's console script) = `python -m deepnorm_exp`; Hydra's bash completion works
    for it, and the job is named deepnorm_exp (SLURM job names come from it), not __main__."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(sys.executable).parent / "deepnorm-exp")
    env = {**os.environ, "COMP_LINE": "deepnorm-exp norm=p", "COMP_POINT": "19"}
    query = subprocess.run([script, "-sc", "query=bash"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert query.stdout.split() == ["norm=periln", "norm=post", "norm=post_init", "norm=pre"], query.stderr
    install = subprocess.run([script, "-sc", "install=bash"], cwd=tmp_path, capture_output=True, text=True)
    assert "-F hydra_bash_completion deepnorm-exp" in install.stdout
    for command in ([script], [sys.executable, "-m", "deepnorm_exp"]):
        shown = subprocess.run([*command, "--cfg", "hydra"], cwd=tmp_path, capture_output=True, text=True)
        assert shown.returncode == 0 and "\n    name: deepnorm_exp\n" in shown.stdout, shown.stderr
