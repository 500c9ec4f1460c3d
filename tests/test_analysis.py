"""Analysis: loaders on a real tiny sweep, every plot on synthetic frames, the notebooks, the report."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import deepnorm_exp
from deepnorm_exp.analysis.claims import CLAIMS
from deepnorm_exp.analysis import (comparison_table, load_events, load_layer_records, load_scalars,
                                   plots)
from deepnorm_exp.analysis.report import write_report
from deepnorm_exp.rundir import RunDir, StudyDir
from deepnorm_exp.analysis.blocks import generated_blocks
from deepnorm_exp.analysis.evidence import Evidence

from conftest import REPO, TINY, run_cli

NORMS = ["post", "pre", "deepnorm"]


# -- synthetic frames ---------------------------------------------------------------------------------
def fake_runs(lrs=(1e-3,)) -> pd.DataFrame:
    """3 norms x depths 6, 24, 100 x 3 seeds; Post-LN diverges at depth 100 in seeds 0 and 1."""
    rows = []
    for norm in NORMS:
        for depth in (6, 24, 100):
            for seed in range(3):
                for lr in lrs:
                    diverged = norm == "post" and depth == 100 and seed < 2
                    loss = 3.0 + 0.1 * seed + (0.01 * depth if norm == "post" else 0.0)
                    rows.append({"experiment": "x", "run_name": f"{norm}-L{depth}-lr{lr}-s{seed}", "norm": norm,
                                 "depth": depth, "seed": seed, "train.lr": lr, "model.d_model": 16,
                                 "status": "diverged" if diverged else "completed", "trained": not diverged,
                                 "final_loss": np.nan if diverged else loss, "eval_loss": np.nan if diverged else loss,
                                 "excess_loss": np.nan if diverged else loss - 2.0})
    return pd.DataFrame(rows)


def fake_scalars(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, run in runs.iterrows():
        for step in range(1, 21):
            rows.append({"experiment": "x", "run_name": run["run_name"], "norm": run["norm"], "depth": run["depth"],
                         "seed": run["seed"], "step": step, "loss": 5.0 / step ** 0.5,
                         "model_update": 0.1 * run["depth"] * step})
    return pd.DataFrame(rows)


def fake_layers(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, run in runs.iterrows():
        for step in (0, 10):
            for position in range(run["depth"]):
                rows.append({"experiment": "x", "run_name": run["run_name"], "norm": run["norm"], "depth": run["depth"],
                             "seed": run["seed"], "step": step, "position": position, "stack": "decoder",
                             "layer": position, "ln_input_norm": 8.0 * (1 + position),
                             "grad_norm": np.nan if step == 0 else 1.0 + position, "update_ratio": 1e-3})
    return pd.DataFrame(rows)


def diverged_marks(ax) -> list:
    return [line for line in ax.lines if line.get_gid() == "diverged"]


def test_depth_stability_has_a_panel_per_loss_a_line_per_norm_and_marks_divergence():
    runs = fake_runs()
    fig = plots.depth_stability(runs)
    axes = fig.axes
    assert isinstance(fig, Figure) and [ax.get_title() for ax in axes] == ["final_loss", "eval_loss", "excess_loss"]
    for ax in axes:
        assert ax.get_xscale() == "log" and len(ax.containers) == 3  # one errorbar series per norm
        (mark,) = diverged_marks(ax)  # Post-LN at depth 100 only
        assert list(mark.get_xdata()) == [100]
    post = axes[1].containers[0]  # eval_loss, post: at depth 100 only seed 2 counts (the others diverged)
    x, y = post.lines[0].get_data()
    assert list(x) == [6, 24, 100] and y[-1] == pytest.approx(3.0 + 0.2 + 1.0)
    assert y[0] == pytest.approx(3.0 + 0.1 + 0.06)  # mean over seeds 0..2


def test_stability_map_places_every_run_and_draws_the_frontier():
    runs = fake_runs(lrs=(1e-3, 1e-2))
    frontier = pd.DataFrame({"norm": ["post", "post"], "depth": ["6", "24"], "max_stable_lr": [1e-2, 1e-3]})
    fig = plots.stability_map(runs, frontier)
    assert [ax.get_title() for ax in fig.axes] == NORMS
    post = fig.axes[0]
    points = sum(len(line.get_xdata()) for line in post.lines if line.get_linestyle() == "None")
    assert points == 3 * 3 * 2 and len(diverged_marks(post)[0].get_xdata()) == 4  # 2 seeds x 2 lrs at depth 100
    (frontier_line,) = [line for line in post.lines if line.get_linestyle() == "--"]
    assert list(frontier_line.get_xdata()) == [6, 24]


def test_model_update_and_training_curves_have_a_line_per_depth_or_run():
    runs = fake_runs()
    scalars = fake_scalars(runs)
    fig = plots.model_update(scalars)
    assert [ax.get_title() for ax in fig.axes] == NORMS and all(len(ax.lines) == 3 for ax in fig.axes)
    _, y = fig.axes[0].lines[0].get_data()  # depth 6, mean over seeds
    assert y[0] == pytest.approx(0.6) and fig.axes[0].get_yscale() == "log"
    curves = plots.training_curves(scalars, runs)
    post = curves.axes[0]
    assert len([line for line in post.lines if line.get_gid() != "diverged"]) == 9  # every run
    assert len(diverged_marks(post)) == 2 and not diverged_marks(curves.axes[2])


def test_layer_profiles_use_relative_position_and_the_last_measured_step():
    runs = fake_runs()
    layers = fake_layers(runs)
    fig = plots.layer_profile(layers, "grad_norm")
    for ax in fig.axes:
        assert len(ax.lines) == 3
        for line in ax.lines:
            x, y = line.get_data()
            assert x[0] == 0 and x[-1] == 1 and y[0] == pytest.approx(1.0)  # step 10 (step 0 has no gradients)
    ln = plots.ln_input_norm(layers, runs)
    _, y = ln.axes[0].lines[0].get_data()
    assert y[0] == pytest.approx(8.0 / 4.0)  # ||x|| / sqrt(16)
    assert any(line.get_linestyle() == "--" for line in ln.axes[0].lines)  # the sqrt(d) reference


def test_plots_of_missing_records_say_so_instead_of_failing():
    for fig in (plots.depth_stability(pd.DataFrame()), plots.model_update(pd.DataFrame()),
                plots.layer_profile(pd.DataFrame()), plots.ln_input_norm(pd.DataFrame(), pd.DataFrame()),
                plots.training_curves(pd.DataFrame(), pd.DataFrame()), plots.stability_map(pd.DataFrame())):
        assert isinstance(fig, Figure) and fig.axes[0].texts


def test_comparison_table_reports_mean_spread_and_divergence():
    table = comparison_table(fake_runs())
    assert list(table.index) == NORMS and list(table.columns) == [6, 24, 100]
    assert table.loc["post", 100] == "4.200 (2/3 diverged)" and table.loc["pre", 6] == "3.100 ± 0.100"


def test_a_stopped_or_failed_run_is_left_out_of_the_tables_and_the_depth_figure_and_counted():
    """A run stopped mid-sweep keeps its last eval in its summary; read as final, it moved the paper sweep's
    DeepNorm L200 mean from 4.365 to 4.433 on this project's own results page."""
    runs = fake_runs()
    stopped = runs[(runs["norm"] == "pre") & (runs["depth"] == 6)].iloc[:1].assign(status="interrupted", eval_loss=9.0,
                                                                                  final_loss=9.0, seed=7)
    failed = stopped.assign(status="failed", seed=8)
    table = comparison_table(pd.concat([runs, stopped, failed], ignore_index=True))
    assert table.loc["pre", 6] == "3.100 ± 0.100 (2/5 failed or unfinished)"
    fig = plots.depth_stability(pd.concat([runs, stopped, failed], ignore_index=True), metrics=("eval_loss",))
    (pre,) = [bars for bars in fig.axes[0].containers if bars.get_label() == "pre"]
    assert pre.lines[0].get_ydata()[0] == pytest.approx(3.1)  # depth 6: the two completed seeds' mean


# -- a real tiny sweep --------------------------------------------------------------------------------
def tiny_sweep(root: Path) -> list[str]:
    """The command line of the fixture's sweep (12 runs), its grid last."""
    return ["-m", *TINY, f"paths.runs={root}", "logger=none", "experiment_name=tiny", "metrics.layer_every=2",
            "train.log_every=1", "norm=post,pre,deepnorm", "depth=2,6", "seed=0,1"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """post, pre, deepnorm x depth 2, 6 x seeds 0, 1 through the CLI, plus one run whose loss goes NaN at the
    sweep's learning rate (an absurd residual scale; so the curves and profiles, which plot one learning
    rate, include it): its records hold "nan", which the notebooks and the report must read."""
    root = tmp_path_factory.mktemp("analysis")
    common = tiny_sweep(root)[1:-3]
    proc = run_cli(*tiny_sweep(root), timeout=600)
    assert proc.returncode == 0, proc.stderr
    boom = run_cli(*common, "norm=deepnorm", "depth=6", "norm.alpha=1e30", "train.steps=12")
    assert boom.returncode == 0, boom.stderr
    return root / "tiny"


@pytest.mark.slow
def test_load_runs_gives_a_row_per_run_with_summary_and_flattened_config(sweep):
    runs = deepnorm_exp.load_runs(sweep)
    assert len(runs) == 13 and runs["run_name"].is_unique
    assert {"status", "eval_loss", "residual_multiplier.decoder", "train.lr", "model.d_model", "data.seed", "run_dir"} <= set(runs)
    assert (runs["model.d_model"] == 16).all() and set(runs["depth"]) == {2, 6}
    nan_run = runs.loc[runs["norm.alpha"] == 1e30]
    assert nan_run["status"].item() == "diverged" and nan_run["divergence_reason"].item() == "non-finite loss"
    scalars, layers = load_scalars(runs), load_layer_records(runs)
    boom = scalars[scalars["run_name"] == nan_run["run_name"].item()]
    assert scalars["loss"].dtype.kind == "f" and boom["loss"].isna().iloc[-1]  # "nan" in the file, a float here
    assert set(scalars["run_name"]) == set(runs["run_name"]) and {"loss", "model_update", "step"} <= set(scalars)
    assert {"grad_norm", "ln_input_norm", "position", "norm", "depth"} <= set(layers)
    assert len(load_events(runs)) == 1
    assert len(deepnorm_exp.load_runs(sweep.parent)) == 13  # the runs root works too (.cache skipped)


@pytest.mark.slow
def test_a_study_restored_from_its_published_records_packs_the_same_and_its_sweep_trains_nothing_again(sweep, tmp_path):
    """A checkout holds only what was committed: a sweep stopped in one session continues in the next from its
    published records. restore -> pack gives the same bytes; a run that had not ended is not restored, and the
    sweep's command then trains that one and skips every other."""
    from deepnorm_exp.analysis import published

    study = tmp_path / "runs" / "tiny"
    shutil.copytree(sweep, study)
    directory = published.pack(study)
    files = {p.name: p.read_bytes() for p in directory.iterdir()}

    def delete_raw_runs():
        for run_dir in deepnorm_exp.load_runs(study)["run_dir"]:
            shutil.rmtree(run_dir)
        (study / StudyDir.SWEEP_LOG).unlink()

    delete_raw_runs()
    assert published.restore(study) == (13, 0)
    assert published.restore(study) == (0, 0)  # what exists is left alone
    published.pack(study)
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == files

    victim = next(study.glob("post-L2-*s0")).name  # stopped before its end
    summary = json.loads((study / victim / "summary.json").read_text())
    (study / victim / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    published.pack(study)
    delete_raw_runs()
    assert published.restore(study) == (12, 1)
    assert not (study / victim).exists() and (study / StudyDir.SWEEP_LOG).is_file()
    published.pack(study)  # the stopped run's record is carried over until the sweep has trained it again
    assert published.load(study).runs().set_index("run_name")["status"][victim] == "interrupted"

    before = {p.parent.name: p.read_bytes() for p in study.glob("*/summary.json")}
    proc = run_cli(*tiny_sweep(tmp_path / "runs"), timeout=600)
    assert proc.returncode == 0, proc.stderr
    after = {p.parent.name: p.read_bytes() for p in study.glob("*/summary.json")}
    rewritten = {name for name in after if after[name] != before.get(name)}
    assert rewritten == {victim}, rewritten  # only the run that had not ended was trained
    assert json.loads(after[victim])["status"] == "completed"
    published.pack(study)
    assert len(published.load(study).table("runs")) == 13


@pytest.mark.slow
@pytest.mark.parametrize("name", ["depth_stability", "model_update", "gradients", "training_curves"])
def test_notebooks_execute_top_to_bottom_and_draw(sweep, tmp_path, name):
    from deepnorm_exp.analysis.notebooks import execute

    executed = execute(REPO / "notebooks" / f"{name}.ipynb", {"runs_root": str(sweep)}, tmp_path / f"{name}.ipynb")
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)


@pytest.mark.slow
def test_the_board_notebook_says_why_a_sweep_of_one_rate_is_not_ranked(sweep, tmp_path):
    from deepnorm_exp.analysis.notebooks import execute

    executed = execute(REPO / "notebooks" / "board.ipynb", {"runs_root": str(sweep)}, tmp_path / "board.ipynb")
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("not ranked: one learning rate" in o.get("text", "") for o in outputs)


def test_committed_notebooks_have_no_outputs_and_a_parameters_cell():
    import nbformat

    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert all(not cell.outputs and cell.execution_count is None for cell in code), path.name
        assert "parameters" in code[0].metadata.get("tags", []) and "runs_root" in code[0].source
        assert notebook.cells[0].cell_type == "markdown" and "paper found" in notebook.cells[0].source


@pytest.mark.slow
def test_report_is_self_contained(sweep, tmp_path):
    path = write_report(sweep, tmp_path / "report.html")
    text = path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # no CDN, nothing fetched
    assert text.count("data:image/png;base64,") >= 6 and text.count('<tr class="') == 13
    assert 'id="comparison"' in text and "diverged" in text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("DEEPNORM_REQUIRE_CHROMIUM") == "1"  # .ci/run sets it: in CI this test never skips


def chromium(*args, timeout=120) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--enable-logging=stderr", "--v=0"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM and not REQUIRED, reason="chromium not installed (CI installs Debian's package)")
def test_report_renders_in_headless_chromium_without_console_errors(sweep, tmp_path):
    assert CHROMIUM, "DEEPNORM_REQUIRE_CHROMIUM=1 but no chromium on PATH"
    report = write_report(sweep, tmp_path / "report.html")
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    url = report.as_uri() + "#sort=eval_loss:desc"
    dom = chromium(*profile, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console  # nothing logged: no errors, no warnings
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert 'data-ready="1"' in body and "data-errors" not in body
    # the #sort= link sorted the runs table by eval loss, descending; the NaN-diverged run has no eval loss
    # (its weights give NaN from the start), shown blank and sorted last
    table = dom.stdout[dom.stdout.index('id="runs"'):]
    head = re.findall(r'data-key="([^"]+)"', table)
    column = head.index("eval_loss")
    rows = re.findall(r"<tr class=\"([^\"]*)\"[^>]*>(.*?)</tr>", table)
    evals = [re.findall(r"<td[^>]*>(.*?)</td>", row)[column] for _, row in rows]
    shown = [float(v) for v in evals if v]
    assert len(evals) == 13 and shown == sorted(shown, reverse=True) and len(shown) == 12
    assert evals[-1] == "" and rows[-1][0] == "diverged"
    shot = chromium(*profile, f"--screenshot={tmp_path / 'report.png'}", "--window-size=1400,2400", report.as_uri())
    assert shot.returncode == 0 and (tmp_path / "report.png").stat().st_size > 10_000, shot.stderr


@pytest.mark.slow
def test_make_results_writes_the_page_and_the_generated_blocks_from_a_tiny_sweep(sweep, tmp_path):
    """`make results` on studies made of the tiny sweep's runs: every section that has runs is written from
    them (checked against the summaries read here), the others say how to run them, every figure exists and
    is small, and the README's generated blocks are rewritten from the same records."""
    root = tmp_path / "runs"
    for study in ("paper_depth_sweep", "model_update", "quickstart", "lr_study", "steps_to_train"):
        shutil.copytree(sweep, root / study)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:quickstart -->\nold table\n<!-- /results:quickstart -->\nmiddle\n"
                      "<!-- results:claims -->\nold tally\n<!-- /results:claims -->\n<!-- results:zoo -->\nkept\n"
                      "<!-- /results:zoo -->\n<!-- results:presets -->\nold times\n<!-- /results:presets -->\n")
    proc = subprocess.run(["make", "-s", "results", f"PY={sys.executable}", "STAMP=", f"RUNS={root}",
                           f"DOCS={tmp_path / 'docs'}", f"README={readme}", f"CONF={tmp_path / 'conf'}",
                           "RECORDS_ONLY=1"],  # the tiny sweep under presets' names, not their grids
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # The configuration page is generated too: a scheme's YAML edited without it left CI's stop 54 red.
    from deepnorm_exp import reference
    assert (tmp_path / "docs" / "configuration.md").read_text() == reference.page()
    page = (tmp_path / "docs" / "results.md").read_text()
    sections = dict(re.findall(r"\n## ([^\n]+)\n(.*?)(?=\n## |\Z)", page, re.S))
    assert "Not run yet." not in sections["Depth sweep, decoder-only"] + sections["Quick start"]
    assert "Not run yet." in sections["Depth sweep, encoder-decoder (a second view, not judged)"] and "Not run yet." in sections["The zoo"]
    images = re.findall(r"!\[[^\]]*\]\((results/[^)]+\.png)\)", page)
    # depth stability, model update, LN inputs, per-layer gradients, loss against lr, steps to train against depth
    assert len(images) == 6 and "results/steps_to_train.png" in images
    for image in images:
        assert 1_000 < (tmp_path / "docs" / image).stat().st_size < 150_000
    # The decoder table's (pre, depth 2) cell, against the summaries read here
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    losses = [s["eval_loss"] for s in summaries if (s["norm"], s["depth"]) == ("pre", 2)]
    row = re.search(r"\n\| pre \| ([^|]+) \|", sections["Depth sweep, decoder-only"]).group(1).strip()
    assert row.startswith(f"{np.mean(losses):.3f} ± {np.std(losses, ddof=1):.3f}")
    # The claims: one row each; "DeepNorm trains at every depth" as the summaries say
    rows = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in sections["The paper's claims"].splitlines() if line.startswith("| ")][1:]
    claims = [(text, study.strip("`"), outcome.strip("*")) for text, _, study, _, outcome, _ in rows]
    assert len(claims) == len(CLAIMS)
    verdict = {text.strip(): outcome for text, study, outcome in claims if study == "steps_to_train"}
    all_trained = all(s["trained_at_step"] is not None for s in summaries if s["norm"] == "deepnorm")
    # a crashed run, or runs of two budgets, the rules cannot read (steps_to_train.unreadable): not testable
    unreadable = any(s["status"] == "failed" for s in summaries) or len({s["steps"] for s in summaries}) > 1
    assert verdict["DeepNorm trains at every depth."] == (
        "not testable here" if unreadable else "reproduced at this scale" if all_trained else "not reproduced")
    assert dict((s, o) for _, s, o in claims)["paper_1000l"] == "not testable here"
    # the tiny sweep's own sweeps.jsonl: its one invocation, timed, with its launcher
    assert re.search(r"\| `quickstart` \| `[^`]+` \| \d+ steps, warm-up \d+[^|]* \| \d+ (s|min \d\d s) elapsed; 13 runs, \d+ (s|min \d\d s) of run "
                     r"time; BasicLauncher \(with ", sections["Presets: commands and times"])
    text = readme.read_text()
    assert "old table" not in text and "old tally" not in text and "old times" not in text
    # the records hold every study the page shows, and no zoo: its block says so instead of keeping old figures
    assert "\nkept\n" not in text and ("<!-- results:zoo -->\nNot run yet under the current defaults and protocol: "
                                   "`python -m deepnorm_exp -m experiment=zoo_depth_sweep`.") in text
    assert "| `paper_depth_sweep_encdec` | `python -m deepnorm_exp -m experiment=paper_depth_sweep_encdec` |  | not run yet |" in text
    assert all(s["run_name"] in text for s in summaries)
    assert re.search(rf"Of the paper's {len(CLAIMS)} claims checked in \[docs/results.md\]", text)


@pytest.mark.slow
def test_the_readme_zoo_block_is_the_zoo_sweeps_table_with_its_time_and_reference_levels(sweep, tmp_path):
    """The README's zoo table comes from runs/zoo_depth_sweep (here the tiny sweep's runs): each cell checked
    against the summaries read here, the untrained count against their `trained` flags."""
    root = tmp_path / "runs"
    shutil.copytree(sweep, root / "zoo_depth_sweep")
    blocks = generated_blocks(Evidence(root, presets=lambda name: None))  # the tiny sweep, not the zoo's grid
    assert blocks["quickstart"].startswith("Not run yet under the current defaults")  # no records of it here
    block = blocks["zoo"]
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert block.startswith("**Measured** (`python -m deepnorm_exp -m experiment=zoo_depth_sweep`, 2 seeds; ")
    assert re.search(r"; \d+ (s|min \d\d s) elapsed; 13 runs", block)
    unigram = {round(s["unigram_loss"], 3) for s in summaries}
    assert len(unigram) == 1 and f"(unigram {unigram.pop():.3f} = learned nothing" in block
    rows = {line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in block.splitlines() if line.startswith("| ") and not line.startswith("| norm")}
    assert set(rows) == {"post", "pre", "deepnorm"}
    for norm in rows:
        for column, depth in enumerate((2, 6)):
            group = [s for s in summaries if (s["norm"], s["depth"]) == (norm, depth) and s["status"] != "diverged"]
            losses = [s["eval_loss"] for s in group]
            assert rows[norm][column].startswith(f"{np.mean(losses):.3f} ± {np.std(losses, ddof=1):.3f}")
            stuck = sum(not s["trained"] for s in group)
            assert (f"({stuck}/" in rows[norm][column]) == bool(stuck)


@pytest.mark.slow
def test_published_records_give_back_exactly_what_the_raw_runs_give(sweep, tmp_path):
    """pack -> load is lossless for everything the analysis reads (runs, scalars, per-layer vectors, events,
    the sweep's log), packing the same runs again writes the same bytes, and the published records take
    under half the bytes of the raw directories."""
    from deepnorm_exp.analysis import published
    from deepnorm_exp.analysis.claims import Evidence

    study = tmp_path / "runs" / "tiny"
    shutil.copytree(sweep, study)
    directory = published.pack(study)
    files = {p.name: p.read_bytes() for p in directory.iterdir()}
    assert {"runs.parquet", "scalars.parquet", "layers.parquet", "events.parquet", "sweeps.jsonl",
            "manifest.json"} <= set(files)
    raw = deepnorm_exp.load_runs(study)
    packed = published.load(study)
    pd.testing.assert_frame_equal(packed.runs(), raw)
    for name, read in (("scalars", load_scalars), ("layers", load_layer_records), ("events", load_events)):
        pd.testing.assert_frame_equal(packed.of_runs(name, raw), read(raw))
        some = raw.iloc[[7, 2, 11]]  # a subset in another order, as at_one_lr hands it over
        pd.testing.assert_frame_equal(packed.of_runs(name, some), read(some))
    # Evidence reads the published records when they exist: the same frames with the raw runs gone
    for run_dir in raw["run_dir"]:
        shutil.rmtree(run_dir)
    evidence = Evidence(tmp_path / "runs")
    pd.testing.assert_frame_equal(evidence.runs("tiny"), raw)
    assert evidence.finished("tiny") and evidence.study_dir("tiny") == directory
    # packing the same runs again changes no byte (the page does not churn in git)
    shutil.rmtree(study)
    shutil.copytree(sweep, study)
    published.pack(study)
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == files
    raw_bytes = sum(p.stat().st_size for p in sweep.rglob("*") if p.is_file())
    assert sum(map(len, files.values())) < raw_bytes / 2  # 69 kB of 215 kB for these 13 tiny runs


# -- hostile input (issue 23): the report: an unreadable config, runs in progress ----------------------------
def test_a_report_over_a_run_with_an_unreadable_config_and_runs_in_progress(tmp_path):
    from deepnorm_exp.analysis import load_runs
    from deepnorm_exp.analysis.report import build_report
    from deepnorm_exp.lifecycle.run import run_experiment

    from conftest import config

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


def test_the_zoos_stream_gain_table_reads_each_multi_stream_run_and_escapes_what_it_prints():
    """Per norm x depth: the largest of either gain over blocks and steps, the largest distance from doubly
    stochastic in brackets; a single-stream run's rows (no gain) are not in it; text where a number belongs
    reads as missing; a norm name that is markup is printed as text."""
    import pandas as pd

    from deepnorm_exp.analysis.depth_sweep import stream_gain_table
    from deepnorm_exp.analysis.page import markdown_table

    rows = [
        {"norm": "hyper_connections", "depth": 6, "step": 0, "mix_gain_forward": 1.0, "mix_gain_backward": 1.0, "mix_ds_distance": 0.0},
        {"norm": "hyper_connections", "depth": 6, "step": 50, "mix_gain_forward": 2.5, "mix_gain_backward": 7.25, "mix_ds_distance": 0.3},
        {"norm": "mhc", "depth": 24, "step": 50, "mix_gain_forward": 1.0, "mix_gain_backward": "x", "mix_ds_distance": 1e-7},
        {"norm": "<script>alert(1)</script>", "depth": 6, "step": 0, "mix_gain_forward": 3.0, "mix_gain_backward": 1.0, "mix_ds_distance": 0.0},
        {"norm": "pre", "depth": 6, "step": 0, "token_cosine": 0.4},
    ]
    table = stream_gain_table(pd.DataFrame(rows))
    assert list(table.columns) == ["L6", "L24"] and "pre" not in table.index
    assert table.loc["hyper_connections", "L6"] == "7.25 (0.3)" and table.loc["mhc", "L24"] == "1 (1e-07)"
    text = markdown_table(table)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert stream_gain_table(pd.DataFrame([{"norm": "pre", "depth": 6, "token_cosine": 0.4}])).empty


def test_a_report_of_a_study_with_only_its_published_records_says_how_to_restore_them(tmp_path):
    """A fresh clone holds each study's packed records, not its run directories: the report names the command
    that unpacks them rather than only "no runs"."""
    from deepnorm_exp.analysis.report import build_report

    (tmp_path / "study" / "published").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"published --restore .*study` unpacks them"):
        build_report(tmp_path / "study")
    with pytest.raises(SystemExit) as bare:
        build_report(tmp_path / "empty")
    assert "restore" not in str(bare.value)
