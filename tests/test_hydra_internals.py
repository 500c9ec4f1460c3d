"""Hydra's internals are read in one module (hydra_plugins/deepnorm_exp_frontier/_hydra_internals.py), for the
Hydra version pyproject pins: these tests fail on another version, or where a name it reads has changed."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import hydra
import pytest
from hydra_plugins.deepnorm_exp_frontier import _hydra_internals as internals

from conftest import REPO

INTERNAL = "hydra." + "_internal"  # spelled so that this file does not count itself


def test_hydra_is_the_version_the_module_was_read_from_and_the_one_pyproject_pins():
    assert hydra.__version__.startswith(internals.SUPPORTED_HYDRA + "."), hydra.__version__
    major, minor = map(int, internals.SUPPORTED_HYDRA.split("."))
    pin = re.search(r'"hydra-core([^"]*)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert pin == f">={major}.{minor},<{major}.{minor + 1}", pin


@pytest.mark.parametrize("function, parameters", [
    (internals.Hydra.create_main_hydra2, ["task_name", "config_search_path"]),
    (internals.create_automatic_config_search_path, ["calling_file", "calling_module", "config_path"]),
    (internals.detect_calling_file_or_module_from_task_function, ["task_function"]),
    (internals.detect_task_name, ["calling_file", "calling_module"]),
    (internals.ConfigLoaderImpl._parse_overrides_and_create_caching_repo, ["config_name", "overrides"]),
    (internals.ConfigLoaderImpl._apply_overrides_to_config, ["overrides", "cfg"]),
    (internals.get_overrides_dirname, ["overrides", "exclude_keys", "item_sep", "kv_sep"]),
    (internals.basic_sweeper()[0]._parse_config, []),
    (internals.basic_sweeper()[0].split_arguments, ["overrides", "max_batch_size"]),
    (internals.basic_sweeper()[0].validate_batch_is_legal, ["batch"]),
    (internals.Overrides.__init__, ["repo", "overrides_list"]),
])
def test_each_internal_name_has_the_parameters_the_module_passes(function, parameters):
    """The leading parameters, in order (self aside; a bound classmethod's signature omits cls)."""
    names = [name for name in inspect.signature(function).parameters if name != "self"]
    assert names[:len(parameters)] == parameters, names


def test_the_basic_sweeper_target_is_what_hydra_configures():
    from hydra.core.config_store import ConfigStore

    node = ConfigStore.instance().load("hydra/sweeper/basic.yaml").node
    assert node._target_ == internals.BASIC_SWEEPER


def test_no_other_module_reads_hydras_internals():
    own = {Path(internals.__file__).resolve(), Path(__file__).resolve()}
    readers = [str(path.relative_to(REPO)) for folder in ("deepnorm_exp", "hydra_plugins", "benchmarks", "tests")
               for path in sorted((REPO / folder).rglob("*.py"))
               if path.resolve() not in own and INTERNAL in path.read_text()]
    assert readers == []


def test_the_checked_sweeper_constructs_after_hydras_plugin_scan_re_runs_its_modules():
    """The command imports this module before Hydra's first plugin scan, which re-executes basic_sweeper.py and
    the plugin modules in place; the sweeper Hydra then launches with must still construct (a base class kept
    from before the scan fails in `super(BasicSweeper, self)`). A fresh process, for the import order."""
    import subprocess
    import sys

    script = """
from hydra_plugins.deepnorm_exp_frontier import _hydra_internals, checked_sweeper  # before the scan
from hydra.core.plugins import Plugins
sweeper = Plugins.instance().class_name_to_class[f"{checked_sweeper.__name__}.CheckedSweeper"]
sweeper(max_batch_size=None)
print("constructed")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "constructed", result.stderr[-2000:]
