"""Environment and portability (issue 38, class 7): a run needs no HOME unless it launches through submitit;
every cache a run fills (datasets', the hub's) lies under `paths.cache`, never the user's $HF_HOME; the
launcher configs (conf/hydra/launcher/) resolve in any Hydra app, and Hydra's own launcher suites pass on
them, while submitit's pickles stay out of `paths.runs`."""

import json
import os
import pwd
import shutil
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import deepnorm_exp
from deepnorm_exp.compose import compose_with_hydra
from deepnorm_exp.config import CONF_DIR
from deepnorm_exp.data import load_data
from deepnorm_exp.errors import ConfigError

from conftest import write_text

LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
SUBMITIT = [name for name in LAUNCHERS if "submitit" in (CONF_DIR / "hydra" / "launcher" / f"{name}.yaml").read_text()]


def passwd_home() -> Path:
    """The home directory the system's user database gives this user (what `~` means without HOME)."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


# -- HOME unset -----------------------------------------------------------------------------------------
def test_a_run_config_composes_checks_and_resolves_with_home_unset(monkeypatch, tmp_path):
    """Every run was refused (`paths.submitit=${oc.env:HOME}/...: Environment variable 'HOME' not found`)
    though only submitit reads the key. The checked config resolves whole, as run.py saves it and W&B logs it."""
    monkeypatch.delenv("HOME", raising=False)
    cfg = deepnorm_exp.compose(["logger=none", f"paths.runs={tmp_path / 'runs'}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert not Path(resolved["paths"]["submitit"]).expanduser().is_relative_to(tmp_path / "runs")


@pytest.mark.parametrize("launcher", SUBMITIT)
def test_with_home_unset_submitit_still_gets_a_folder_of_the_users_own_outside_the_run_tree(
        monkeypatch, tmp_path, launcher):
    """A submitit launch without HOME: the folder is the user's own home (from the user database, as `~`
    means to submitit), not a shared directory, and not under paths.runs (submitit unpickles its files)."""
    from submitit.core.utils import JobPaths

    monkeypatch.delenv("HOME", raising=False)
    cfg = compose_with_hydra([f"hydra/launcher={launcher}", f"paths.runs={tmp_path / 'runs'}"])
    folder = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)["submitit_folder"]
    where = JobPaths(folder, job_id="1").folder  # what submitit writes its pickles into
    assert where == passwd_home() / ".cache" / "deepnorm_exp" / "submitit" / "default" / "1"
    assert not where.is_relative_to(tmp_path / "runs")


def test_the_submitit_folder_is_paths_submitit_per_experiment(tmp_path):
    cfg = compose_with_hydra(["hydra/launcher=submitit_local", f"paths.runs={tmp_path / 'runs'}",
                              f"paths.submitit={tmp_path / 'own'}", "experiment_name=study"])
    assert OmegaConf.to_container(cfg.hydra.launcher, resolve=True)["submitit_folder"] == \
        f"{tmp_path / 'own'}/study/%j"


# -- launcher configs in a foreign app ------------------------------------------------------------------
def foreign_app(root: Path) -> Path:
    """A Hydra app of someone else's: a primary config without this project's keys (no paths, no
    experiment_name), and this project's launcher configs copied as they are."""
    conf = root / "conf"
    shutil.copytree(CONF_DIR / "hydra" / "launcher", conf / "hydra" / "launcher")
    (conf / "config.yaml").write_text("x: 1\n")
    return conf


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_launcher_config_resolves_in_a_foreign_app(tmp_path, launcher):
    """`${paths.submitit}` and `${experiment_name}` in the submitit configs failed every other app
    (InterpolationKeyError): there the folder falls back to Hydra's own place, under the app's sweep dir."""
    conf = foreign_app(tmp_path)
    with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="their_app"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      return_hydra_config=True)
    resolved = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    if launcher in SUBMITIT:
        assert resolved["submitit_folder"] == f"{tmp_path / 'sweep'}/.submitit/their_app/%j"
        assert resolved["name"] == "their_app"


# -- every cache under paths.cache ------------------------------------------------------------------------
@pytest.fixture
def foreign_caches(tmp_path, monkeypatch):
    """The user's own Hugging Face caches (what $HF_HOME or ~ would give), moved somewhere the test can
    watch: nothing may be written there."""
    import datasets
    import huggingface_hub

    home = tmp_path / "home" / ".cache" / "huggingface"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(datasets.config, "DOWNLOADED_DATASETS_PATH", home / "datasets" / "downloads")
    monkeypatch.setattr(datasets.config, "EXTRACTED_DATASETS_PATH", home / "datasets" / "downloads" / "extracted")
    monkeypatch.setattr(datasets.config, "HF_MODULES_CACHE", home / "modules")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    return tmp_path / "home"


def written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def loads_under_paths_cache(cache: Path, foreign_caches: Path, *overrides: str) -> None:
    """The data `overrides` name loads, and what `datasets` cached of it lies under `cache`, nothing elsewhere."""
    cfg = deepnorm_exp.compose([*overrides, f"paths.cache={cache}", "train.seq_len=16"])
    load_data(cfg.data, cache)
    assert written(foreign_caches) == []
    assert any(p.endswith(".arrow") for p in written(cache / "huggingface"))


def test_text_files_are_read_through_a_cache_under_paths_cache(tmp_path, foreign_caches):
    """`data=text` read the files through datasets' cache in $HF_HOME: a read-only home failed the run."""
    corpus = write_text(tmp_path / "corpus.txt", lines=200)
    loads_under_paths_cache(tmp_path / "cache", foreign_caches, "data=text", f"data.files={corpus}")


def test_a_hub_layout_copy_is_read_through_a_cache_under_paths_cache(tmp_path, foreign_caches):
    root = tmp_path / "hub"
    root.mkdir()
    for split, n in (("train", 120), ("validation", 20)):
        pd.DataFrame({"text": [f"document {i} of the {split} split" for i in range(n)]}).to_parquet(
            root / f"{split}.parquet")
    loads_under_paths_cache(tmp_path / "cache", foreign_caches, "data=hub", f"data.path={root}")


def test_translation_pairs_are_read_through_a_cache_under_paths_cache(tmp_path, foreign_caches):
    root = tmp_path / "corpus"
    root.mkdir()
    for split, n in (("train", 20), ("validation", 5)):
        with open(root / f"{split}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"translation": {"de": f"Satz {i}", "en": f"sentence {i}"}}) + "\n")
    cache = tmp_path / "cache"
    load_data({"name": "translation_hub", "path": str(root), "config": None, "max_len": 16}, cache,
              task="translation")
    assert written(foreign_caches) == []
    assert any(p.endswith(".arrow") for p in written(cache / "huggingface"))


def test_a_hub_download_would_land_under_paths_cache(tmp_path, foreign_caches, monkeypatch):
    """What `datasets` downloads from the hub goes through huggingface_hub's own cache (HF_HUB_CACHE,
    not a `cache_dir` argument): while a hub dataset loads, that cache too is under paths.cache. No
    download here: `load_dataset` is replaced by one that records where the caches point."""
    import datasets
    import huggingface_hub

    seen = {}

    def record(path, config, split, **kwargs):
        seen.update(hub=huggingface_hub.constants.HF_HUB_CACHE, cache_dir=kwargs.get("cache_dir"),
                    xet=os.environ.get("HF_XET_CACHE"))
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", record)
    monkeypatch.delenv("HF_XET_CACHE", raising=False)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError) as err:
        load_data({"name": "translation_hub", "path": "some-org/some-corpus", "config": None}, cache,
                  task="translation")
    assert all(value and Path(value).is_relative_to(cache / "huggingface") for value in seen.values()), seen
    assert str(cache) in str(err.value) and "\n" not in str(err.value)
    # and afterwards the process's own settings again
    assert huggingface_hub.constants.HF_HUB_CACHE == str(foreign_caches / ".cache" / "huggingface" / "hub")
    assert "HF_XET_CACHE" not in os.environ


# -- Hydra's own launcher suites, on this project's launcher configs ---------------------------------------
# Hydra's example apps (hydra.test_utils) with conf/ on their search path, parametrized as the
# hydra-submitit-launcher plugin's own tests are: `hydra/launcher=submitit_local` is this project's YAML
# there, as in any app that adds conf/ to its search path. Before the fallbacks, 18 of the 20 failed
# (InterpolationKeyError: paths.submitit). Each submitit job takes 7-15 s of polling here, so by default one
# case of each suite runs (~25 s); DEEPNORM_HYDRA_SUITES=all runs all 20 (~5 min on 2 cores).
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite  # noqa: E402

ON_PROJECT_CONFIGS = f"hydra.searchpath=[file://{CONF_DIR}]"
SUITE_SAMPLE = ("test_sweep_1_job", "test_get_orig_dir_multirun")


@pytest.fixture
def suite_sample(request):
    """The sample of the suites' cases, each as Hydra runs it: its example apps state no version_base, so
    they get Hydra's compatibility defaults (a job runs in its output dir), unless a composition earlier in
    this process (deepnorm_exp.compose: version_base 1.3) left its base set. Unset for the case, then put back."""
    from hydra.core.singleton import Singleton
    from hydra.version import VersionBase

    if os.environ.get("DEEPNORM_HYDRA_SUITES") != "all" and request.function.__name__ not in SUITE_SAMPLE:
        pytest.skip("one case per suite by default; DEEPNORM_HYDRA_SUITES=all runs every case")
    saved = Singleton._instances.pop(VersionBase, None)
    yield
    Singleton._instances.pop(VersionBase, None)
    if saved is not None:
        Singleton._instances[VersionBase] = saved


@pytest.mark.slow
@pytest.mark.usefixtures("suite_sample")
@pytest.mark.parametrize("launcher_name, overrides",
                         [("submitit_local", [ON_PROJECT_CONFIGS, "hydra.launcher.timeout_min=2"])])
class TestHydraLauncherSuiteOnTheProjectsSubmititLocal(LauncherTestSuite):
    pass


@pytest.mark.slow
@pytest.mark.usefixtures("suite_sample")
@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, [
    "-m", ON_PROJECT_CONFIGS, "hydra/hydra_logging=disabled", "hydra/job_logging=disabled",
    "hydra/launcher=submitit_local", "hydra.launcher.gpus_per_node=0", "hydra.launcher.timeout_min=1"])])
class TestHydraIntegrationSuiteOnTheProjectsSubmititLocal(IntegrationTestSuite):
    pass
