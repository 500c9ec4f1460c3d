"""The pre-flight check runs Hydra's own machinery: the config the user selected (--config-dir, -cn,
hydra.searchpath), the sweeper the user selected, Hydra's whole override grammar; and each job's config
is what Hydra's launcher composes (compared here with Hydra's `load_sweep_config`)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

import deepnorm_exp
from conftest import TINY, run_cli
from deepnorm_exp.__main__ import main, train
from deepnorm_exp.preflight import JobComposer, hydra_command, planned_jobs, preflight


def user_configs(root):
    """A user's own config directory: a preset of their own and a primary config of their own."""
    (root / "experiment").mkdir(parents=True)
    (root / "experiment" / "my_preset.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        defaults:
          - override /norm: pre
        experiment_name: mine
        model: {d_model: 24, n_heads: 3}
    """))
    (root / "wide.yaml").write_text(textwrap.dedent("""\
        defaults:
          - config
          - _self_
        experiment_name: wide
        model:
          d_model: 48
    """))
    return root


def args(argv):
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import args_parser

    return args_parser().parse_args(argv)


SWEEP = ["experiment=quickstart", "norm=post,pre", "depth=2,3", "+extra=1", "++seed=5", "~mitigation",
         "train.betas=[0.9,0.95]", "experiment_name='a,b'", "hydra.job.config.override_dirname.kv_sep=:",
         "data.vocab_size=range(30,32)", *TINY[:3]]


def test_each_jobs_config_is_what_hydras_launcher_composes():
    """JobComposer (composition reused across jobs) against Hydra's own per-job composition: group, value,
    +key, ++key, ~key, list, quoted-comma, hydra and range() overrides, and a preset's sweep axes."""
    with hydra_command(args(["-m", *SWEEP]), train) as command:
        from hydra.types import RunMode

        master = command.compose(command.overrides, RunMode.MULTIRUN)
        jobs, fixed = planned_jobs(command, master, train)
        assert fixed and len(jobs) == 2 * 2 * 2  # norm x depth x vocab_size; the preset's axes lose to these
        compose_job = JobComposer(command, master)
        for job in jobs:
            ours = compose_job(job)
            theirs = command.config_loader.load_sweep_config(master, job)
            assert ours.override_dirname == theirs.hydra.job.override_dirname
            assert ours.launcher == theirs.hydra.launcher._target_
            with open_dict(theirs):
                del theirs["hydra"]
            assert OmegaConf.to_container(ours.cfg) == OmegaConf.to_container(theirs)
            assert ours.cfg.experiment_name == "a,b" and ours.cfg.extra == 1 and ours.cfg.seed == 5
        assert len(compose_job.bases) == 2  # one Hydra composition per norm, not one per job


def test_a_large_sweep_is_composed_a_few_times_not_once_per_job(monkeypatch, tmp_path):
    """The 54 jobs of paper_depth_sweep: Hydra composes the mode, the master config and one config per
    norm (the work the check does, not its time: `make bench` section startup measures that)."""
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import ConfigLoaderImpl

    calls = []
    original = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    jobs, multirun = preflight(["experiment=paper_depth_sweep", f"paths.runs={tmp_path}", "-m"])
    assert multirun and len(jobs) == 54 and len({job.run_dir for job in jobs}) == 54
    assert len(calls) == 2 + 3


def test_a_users_preset_and_primary_config_through_config_dir(tmp_path):
    mine = user_configs(tmp_path / "mine")
    jobs, _ = preflight(["--config-dir", str(mine), "experiment=my_preset", f"paths.runs={tmp_path}"])
    assert (jobs[0].cfg.experiment_name, jobs[0].cfg.norm.name, jobs[0].cfg.model.d_model) == ("mine", "pre", 24)
    # hydra.searchpath finds the same preset
    jobs, _ = preflight([f"hydra.searchpath=[file://{mine}]", "experiment=my_preset", f"paths.runs={tmp_path}"])
    assert jobs[0].cfg.experiment_name == "mine"
    # -cn: the config that trains is the one checked (d_model 48 takes 3 heads; `config`'s 64 would not)
    jobs, _ = preflight(["--config-dir", str(mine), "-cn", "wide", "model.n_heads=3", f"paths.runs={tmp_path}"])
    assert (jobs[0].cfg.experiment_name, jobs[0].cfg.model.d_model, jobs[0].cfg.model.n_heads) == ("wide", 48, 3)


@pytest.mark.parametrize("argv, says", [
    (["--config-dir", "/nonexistent/mine"], "--config-dir=/nonexistent/mine is invalid: /nonexistent/mine is not a directory"),
    (["-cn", "nope"], "--config-name=nope is invalid: Cannot find primary config 'nope'"),
    (["-cn", "wide", "model.n_heads=5"], "model.n_heads=5 is invalid: must divide model.d_model=48"),
    (["experiment=my_preset", "model.n_heads=5"], "model.n_heads=5 is invalid: must divide model.d_model=24"),
    (["-m", "hydra/sweeper=frontier", "hydra.sweeper.lr_min=1", "norm=post,pre"],
     "hydra.sweeper=hydra_plugins.deepnorm_exp_frontier.frontier_sweeper.FrontierSweeper is invalid: "
     "hydra.sweeper: need 0 < lr_min < lr_max"),
    (["-m", "experiment=nope,my_preset"], "experiment=nope is invalid: choose one of: " + ", ".join(sorted(
        [path.stem for path in (Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml")] + ["my_preset"]))),
    # an override whose interpolation fails: Hydra resolves it in the run directory's name first (a traceback)
    (["train.lr=${tuned_lr:}"], "train.lr=${tuned_lr:} is invalid: ${tuned_lr:} needs a table"),
    (["-m", "train.lr=${tuned_lr:}"], "train.lr=${tuned_lr:} is invalid: ${tuned_lr:} needs a table"),
    (["data=shakespeare", "data.files=${package_dir:no_such_package}/*.md"],
     "data.files=${package_dir:no_such_package}/*.md is invalid: the package 'no_such_package' is not installed"),
])
def test_bad_input_with_a_users_config_fails_in_one_line_before_any_run(tmp_path, capsys, argv, says):
    mine = user_configs(tmp_path / "mine")
    with pytest.raises(SystemExit) as exit:
        main(["--config-dir", str(mine), *argv, f"paths.runs={tmp_path / 'runs'}"])
    assert exit.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith(f"deepnorm_exp: error: {says}"), line
    assert not (tmp_path / "runs").exists()


def test_the_frontier_sweeper_expands_glob_and_range_into_its_cells(tmp_path):
    jobs, multirun = preflight(["-m", "hydra/sweeper=frontier", "norm=glob(p*)", "depth=range(2,4)",
                                f"paths.runs={tmp_path}"])
    assert multirun and not any(job.fixed for job in jobs)  # the sweeper sets train.lr on each probe
    assert sorted((job.cfg.norm.name, job.cfg.depth) for job in jobs) == [
        ("periln", 2), ("periln", 3), ("post", 2), ("post", 3), ("post_init", 2), ("post_init", 3), ("pre", 2),
        ("pre", 3)]


@pytest.mark.slow
def test_the_issues_commands_run_as_hydra_runs_them(tmp_path, runs_root):
    """--config-dir with a user's preset, and with a user's primary config (-cn), through the real CLI."""
    mine = user_configs(tmp_path / "mine")
    tiny = [*TINY, f"paths.runs={runs_root}", "logger=none"]
    preset = run_cli("--config-dir", str(mine), "experiment=my_preset", *tiny[1:])  # the preset's d_model
    assert preset.returncode == 0, preset.stderr
    (summary,) = (runs_root / "mine").glob("*/summary.json")
    assert json.loads(summary.read_text())["status"] == "completed"
    wide = run_cli("--config-dir", str(mine), "-cn", "wide", "model.n_heads=3",
                   *[o for o in tiny if not o.startswith(("model.d_model", "model.n_heads"))])
    assert wide.returncode == 0, wide.stderr
    (config,) = (runs_root / "wide").glob("*/config.yaml")
    trained = OmegaConf.load(config)
    assert (trained.model.d_model, trained.model.n_heads) == (48, 3)


CHOOSING_SWEEPER = """
from hydra.plugins.sweeper import Sweeper


class ChoosingSweeper(Sweeper):
    # Stands in for a sweeper that picks its jobs as it goes (Optuna's, Nevergrad's): none known ahead.
    def setup(self, *, hydra_context, task_function, config):
        self.config = config

    def sweep(self, arguments):
        raise AssertionError("the pre-flight never sweeps")
"""


def test_an_adaptive_sweepers_shared_settings_are_checked_before_it_starts(tmp_path, monkeypatch):
    plugin = tmp_path / "plugins" / "hydra_plugins" / "choosing_sweeper_test"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(CHOOSING_SWEEPER)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))  # hydra_plugins is a namespace package
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    monkeypatch.delitem(Singleton._instances, Plugins, raising=False)  # rescan the plugins (restored after)
    mine = user_configs(tmp_path / "mine")
    (mine / "hydra" / "sweeper").mkdir(parents=True)
    (mine / "hydra" / "sweeper" / "choosing.yaml").write_text(
        "_target_: hydra_plugins.choosing_sweeper_test.ChoosingSweeper\n")
    common = ["-m", "--config-dir", str(mine), "hydra/sweeper=choosing", f"paths.runs={tmp_path}"]
    jobs, multirun = preflight([*common, "norm=post,pre", "depth=2"])
    assert multirun and [job.overrides for job in jobs] == [[f"paths.runs={tmp_path}", "depth=2"]]
    assert not jobs[0].fixed  # the sweeper sets norm; each job checks itself again when it starts
    with pytest.raises(Exception, match="model.n_heads=5 is invalid"):
        preflight([*common, "norm=post,pre", "model.n_heads=5"])


def test_the_multi_gpu_slurm_preset_is_checked_on_its_nodes_not_here(tmp_path):
    """hydra/launcher=slurm_multigpu: 8 tasks (ranks) and 8 GPUs per node; device=cuda is not refused on a
    machine without one (the nodes check their device when the job starts), bad values still are."""
    jobs, _ = preflight(["-m", "hydra/launcher=slurm_multigpu", "norm=post,pre", "device=cuda", f"paths.runs={tmp_path}"])
    assert len(jobs) == 2
    with hydra_command(args(["-m", "hydra/launcher=slurm_multigpu"]), train) as command:
        from hydra.types import RunMode

        launcher = command.compose(command.overrides, RunMode.MULTIRUN).hydra.launcher
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.nodes) == (8, 8, 1)
    with pytest.raises(Exception, match="model.n_heads=5 is invalid"):
        preflight(["-m", "hydra/launcher=slurm_multigpu", "norm=post,pre", "model.n_heads=5", f"paths.runs={tmp_path}"])


def test_a_key_that_does_not_change_training_neither_renames_the_run_nor_stops_its_resume():
    """One fact per key (its field's `trained`, gathered in config.UNTRAINED_KEYS) decides both: Hydra's override_dirname leaves each key out of the
    run's name, and the resume check ignores a change to it (train.peak_tflops once renamed the run
    directory while the resume check ignored it)."""
    from hydra.types import RunMode

    from deepnorm_exp.config import TRAINED_KEYS, UNTRAINED_KEYS
    from deepnorm_exp.lifecycle.claim import trained_config

    job = ["train.peak_tflops=989", "train.log_every=5", "logger.backend=none", "metrics.layer_every=0", "train.lr=0.003"]
    with hydra_command(args(job), train) as command:
        master = command.compose(command.overrides, RunMode.RUN)
        assert JobComposer(command, master)(job).override_dirname == "train.lr=0.003"
    base = OmegaConf.to_container(deepnorm_exp.compose([]), resolve=True)
    for key in UNTRAINED_KEYS:
        section, _, name = key.partition(".")
        changed = OmegaConf.create(base)
        OmegaConf.update(changed, key, "changed", force_add=True)
        assert trained_config(OmegaConf.to_container(changed)) == trained_config(base), key
        assert section not in TRAINED_KEYS or name, key  # a trained section is never untrained as a whole


def _saved_floats_per_token(cfg, depth: int) -> float:
    """Floats autograd keeps for the backward (parameters excluded), per token, at `depth` layers."""
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.depth = depth
    model = deepnorm_exp.build_model(cfg)
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.dtype.is_floating_point and t.data_ptr() not in params:
            seen[(t.data_ptr(), t.numel(), t.dtype)] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss({"tokens": torch.zeros(2, 17, dtype=torch.long)}).loss
    return sum(seen.values()) / 32


def test_mhcs_sinkhorn_rounds_are_counted_at_four_bytes_under_bf16_too():
    """Under bf16 autocast the activations are counted at 2 bytes, but mHC's Sinkhorn runs in fp32 (its gates and
    biases are fp32 and promote the logits): ten more rounds cost the same bytes in bf16 as in fp32."""
    from deepnorm_exp.build import make_scheme, model_depths
    from deepnorm_exp.train.memory import estimate

    def rounds_cost(precision):
        costs = []
        for rounds in (10, 20):
            cfg = deepnorm_exp.compose(["norm=mhc", f"norm.sinkhorn_rounds={rounds}", f"train.precision={precision}",
                                        "depth=2"])
            costs.append(estimate(cfg, make_scheme(cfg), model_depths(cfg), 16, False).activation_bytes)
        return costs[1] - costs[0]

    assert rounds_cost("bf16") == rounds_cost("fp32") > 0


@pytest.mark.slow
@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
def test_the_memory_estimate_holds_every_schemes_activations_within_a_factor_of_two(ffn):
    """Per layer, the estimate's activations are at least what autograd saves and at most twice it: the
    pre-flight must not pass a model that cannot fit, nor refuse one that can."""
    from deepnorm_exp.build import make_scheme, model_depths
    from deepnorm_exp.schemes import SCHEMES
    from deepnorm_exp.train.memory import estimate

    streams = [["norm.streams=1"], ["norm.streams=8"], ["norm.dynamic=false"]]  # its estimate grows with n
    variants = [("hyper_connections", e) for e in streams] + [("mhc", e) for e in [*streams, ["norm.sinkhorn_rounds=5"]]] \
        + [("attn_res", ["norm.blocks=1"]), ("attn_res", ["norm.blocks=2"])] \
        + [("frac_connections", e) for e in (["norm.fractions=1"], ["norm.fractions=16"], ["norm.fractions=64"],
                                                    ["norm.dynamic=false"])]
    for norm, extra in [(name, []) for name in SCHEMES.names()] + variants:
        cfg = deepnorm_exp.compose([f"norm={norm}", *extra, f"model.ffn={ffn}", "train.precision=fp32",
                                    "train.batch_size=2", "train.seq_len=16", "depth=2"])
        measured = _saved_floats_per_token(cfg, 4) - _saved_floats_per_token(cfg, 2)
        estimates = [estimate(cfg, make_scheme(cfg), {**model_depths(cfg), "decoder": depth}, 16, False).activation_bytes
                     for depth in (2, 4)]
        estimated = (estimates[1] - estimates[0]) / (2 * 16 * 4)
        assert measured <= estimated <= 2 * measured, (norm, extra, measured / 64, estimated / 64)


# -- hostile input (issue 23): the batch's layout, from the world size the launch will have ------------------
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


# -- hostile input (issue 23): interpolations in overrides survive the pre-flight ----------------------------
@pytest.mark.parametrize("sweeper", [[], ["hydra/sweeper=frontier"]])
def test_an_interpolation_in_an_override_is_kept_as_hydra_keeps_it(tmp_path, sweeper):
    from deepnorm_exp.preflight import preflight

    from conftest import TINY

    jobs, multirun = preflight(["-m", *sweeper, "norm=post,pre", "hydra.sweep.subdir=job${hydra.job.num}",
                                "experiment_name=x_${norm.name}", *TINY, f"paths.runs={tmp_path}", "logger=none"])
    assert multirun and len(jobs) >= 2
    assert {job.cfg.experiment_name for job in jobs} == {"x_post", "x_pre"}


# -- hostile input (issue 23): start-up: the jobs the pre-flight checked are not composed a second time ------
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


def test_a_sweep_in_a_checkout_without_its_published_runs_is_refused_until_they_are_restored(tmp_path):
    """A fresh clone holds runs/<study>/published/ and no run directories: the sweep would train the published
    runs again (a session did: 4 runs, 1.3 hours). Refused in one line naming the restore; after it, the
    sweep runs only what is new; resume=false still trains them again."""
    from deepnorm_exp.analysis import published
    from deepnorm_exp.preflight import UnrestoredRuns

    sweep = ["-m", "seed=0,1", *TINY, f"paths.runs={tmp_path}", "logger=none"]
    jobs, _ = preflight(sweep)
    for job in jobs:  # the runs as the sweep would have written them, packed as `make results` does
        job.run_dir.mkdir(parents=True)
        (job.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(job.cfg, resolve=True))
        (job.run_dir / "summary.json").write_text(json.dumps({
            "norm": job.cfg.norm.name, "depth": job.cfg.depth, "seed": job.cfg.seed, "status": "completed", "trained": True, "eval_loss": 3.0, "initial_eval_loss": 6.0, "steps": 10,
            "run_name": job.run_dir.name, "experiment": job.run_dir.parent.name, "wall_s": 1.0,
            "started_at": "2026-12-01T10:00:00+00:00", "finished_at": "2026-12-01T10:00:01+00:00"}))
        (job.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    study = jobs[0].run_dir.parent
    published.pack(study)
    shutil.rmtree(jobs[1].run_dir)  # one of two restored: the other would train again
    with pytest.raises(UnrestoredRuns, match=r"1 of this command's 2 runs ended .* --restore ") as refused:
        preflight(sweep)
    assert refused.value.exit_status == 2 and "\n" not in str(refused.value)
    assert preflight([*sweep, "resume=false"])  # asked to train them again
    assert published.restore(study) == (1, 0)
    assert len(preflight([*sweep, "seed=0,1,2"])[0]) == 3  # a new seed is not in the published records
