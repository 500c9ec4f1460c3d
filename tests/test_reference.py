"""One source for every default: the typed schema. docs/configuration.md is generated from it, and the
group files in conf/ hold only what each option changes."""

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from deepnorm_exp import config as schema
from deepnorm_exp import reference
from deepnorm_exp.data import SOURCES
from deepnorm_exp.metrics import INSTRUMENTS, metrics_schema
from deepnorm_exp.schemes import SCHEMES

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


@pytest.mark.slow
def test_the_configuration_page_is_generated_from_the_schema():
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference.page(), "stale: python -m deepnorm_exp.reference docs/configuration.md"


def test_every_key_of_the_schema_has_a_meaning_on_the_page():
    classes = [schema.Config, *(SCHEMES.get(n).Config for n in SCHEMES.names()),
               *(SOURCES.get(n).Config for n in SOURCES.names())]
    for cls in classes:
        for key, _, _, meaning in reference.key_rows(cls, ""):
            assert meaning or key in ("name", "norm", "data"), f"{cls.__name__}.{key} has no comment"


def test_field_comments_come_from_the_line_or_the_lines_above():
    @dataclasses.dataclass
    class Example:
        a: int = 1  # the line's own comment
        # two lines
        # above
        b: str = "x#y"
        c: int = 3
        d: str = "${x}"  # type: ignore[assignment]  # after the marker

    assert reference.field_comments(Example) == {"a": "the line's own comment", "b": "two lines above",
                                                 "d": "after the marker"}


def flat(node, prefix=""):
    """Dotted key -> value of a YAML mapping (unresolved) or of a dataclass's defaults."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def schema_defaults(cls) -> dict:
    return flat(OmegaConf.to_container(OmegaConf.structured(cls), resolve=False, throw_on_missing=False))


def group_files():
    """(file, its section's dataclass): the options of the groups the root schema types (train, model,
    logger, paths), and each plug-in's own option (every scheme, every data source, the instruments), whose
    defaults list names its dataclass (`- /schemas/norm@_here_: deepnorm`). The hub presets (`wikitext2` and
    the like) set values of their own on purpose."""
    for group, cls in (("train", schema.TrainConfig), ("logger", schema.LoggerConfig),
                       ("paths", schema.PathsConfig), ("model", schema.ModelConfig)):
        for path in sorted((CONF / group).glob("*.yaml")):
            yield path, cls
    for path in sorted((CONF / "metrics").glob("*.yaml")):
        yield path, metrics_schema()
    for name in SCHEMES.names():
        yield CONF / "norm" / f"{name}.yaml", SCHEMES.get(name).Config
    for name in SOURCES.names():
        yield CONF / "data" / f"{name}.yaml", SOURCES.get(name).Config


@pytest.mark.parametrize("path, cls", list(group_files()), ids=lambda v: getattr(v, "name", ""))
def test_a_group_file_holds_only_what_it_changes(path, cls):
    """The schema holds every default once: an option file sets only keys of its schema (a typo is caught
    here, not at the first run), and none at the schema's own default (a second copy of a default, which
    would drift). `name` selects the plug-in; an interpolation (`seq_len: ${train.seq_len}`) ties a key to
    another: a change."""
    written = flat(OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {})
    written.pop("defaults", None)
    defaults = schema_defaults(cls)
    assert set(written) <= set(defaults), f"{path.relative_to(REPO)}: unknown {sorted(set(written) - set(defaults))}"
    repeated = sorted(key for key, value in written.items() if key != "name" and value == defaults[key])
    assert not repeated, f"{path.relative_to(REPO)} repeats the schema's default of {repeated}"


def test_a_plug_in_option_names_its_own_dataclass_first():
    for path, cls in group_files():
        if path.parent.name in ("norm", "data", "metrics"):
            entries = OmegaConf.load(path)["defaults"]
            name = "instruments" if path.parent.name == "metrics" else path.stem
            assert entries[0] == {f"/schemas/{path.parent.name}@_here_": name} and entries[-1] == "_self_", path


def test_the_root_config_repeats_no_root_default():
    written = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"), resolve=False)
    defaults = OmegaConf.to_container(OmegaConf.structured(schema.Config), resolve=False, throw_on_missing=False)
    assert not [k for k, v in written.items() if k in defaults and v == defaults[k]]


def test_a_key_the_group_files_leave_out_composes_at_its_default_and_takes_an_override():
    import deepnorm_exp

    cfg = deepnorm_exp.compose(["train.warmup_steps=7", "model=encdec"])
    assert cfg.train.betas == [0.9, 0.98] and cfg.train.warmup_steps == 7 and cfg.depth == 6
    assert cfg.model.kind == "encdec" and cfg.model.d_model == 64 and cfg.logger.mode == "offline"
    cfg = deepnorm_exp.compose(["norm=deepnorm", "norm.alpha=2", "data=hub", "data.path=some-org/some-dataset"],
                               check=False)
    assert cfg.norm.constants == "paper" and cfg.norm.alpha == 2.0 and cfg.data.text_column == "text"
    assert cfg.metrics.layer_every == 50


@pytest.mark.slow
def test_the_presets_table_says_what_each_preset_composes_to():
    """Read from the composition, not the YAML's text: an inherited preset shows its parent's keys, and the
    keys a chosen group option sets are that option's, not the preset's."""
    rows = {name.strip("`"): (purpose, sweep, changes) for name, purpose, sweep, changes in reference.preset_rows()}
    assert set(rows) == set(reference.group_options("experiment"))
    purpose, sweep, changes = rows["model_update_low_lr"]
    assert purpose.startswith("model_update at a tenth of its learning rate") and purpose.endswith(".")
    assert sweep == "depth: 100,50,18,6; norm: post,pre,deepnorm; seed: 0,1"
    assert "`train.lr=0.0001`" in changes and "`train.log_every=1`" in changes  # its own, and model_update's
    assert "`logger=none`" in changes and "logger.backend" not in changes
    assert rows["quickstart"][2] == ""  # the defaults are the quick start's training
    assert "lr_max: 0.3" in rows["frontier_depth"][1]  # the sweeper's own settings
