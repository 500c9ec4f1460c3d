"""Every config composes; bad input fails before any compute with one line naming key, value, choices."""

import re
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import deepnorm_exp
from deepnorm_exp.compose import compose_with_hydra
from deepnorm_exp.preflight import preflight
from deepnorm_exp.config import CONF_DIR
from deepnorm_exp.data import SOURCES
from deepnorm_exp.errors import ConfigError
from deepnorm_exp.rundir import run_name
from deepnorm_exp.schemes import SCHEMES

from conftest import LONG, refused, TINY


def group_options():
    for group_dir in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        # a preset's parts too (experiment=protocols/text); hydra/'s are hydra/launcher=..., tested with sweeps
        for option in sorted(group_dir.glob("**/*.yaml" if group_dir.name == "experiment" else "*.yaml")):
            yield f"{group_dir.name}={option.relative_to(group_dir).with_suffix('').as_posix()}"


# options that only make sense with another, or that need a value no default can give
COMPANIONS = {"data=translation_hub": ["model=encdec"], "data=wmt17_en_de": ["model=encdec"],
              "data=text": [f"data.files={Path(__file__)}"], "data=hub": ["data.path=some-org/some-dataset"]}


def unmeasured(table: str) -> bool:
    """Whether conf/tuned_lr/<table>.yaml has no rates yet (make results writes them from its study)."""
    return not OmegaConf.load(CONF_DIR / "tuned_lr" / f"{table}.yaml").rates


# presets that read a table of measured rates refuse in one line until that study's records fill it
NEEDS_RATES = {"experiment=text_final": "text_lr"}


@pytest.mark.parametrize("override", list(group_options()))
def test_every_config_in_conf_composes_and_checks(override):
    if override in NEEDS_RATES and unmeasured(NEEDS_RATES[override]):
        with pytest.raises(ConfigError, match=f"{NEEDS_RATES[override]} has measured no rates yet") as err:
            deepnorm_exp.compose([override])
        assert err.value.key == "train.lr" and "\n" not in str(err.value)
        return
    cfg = deepnorm_exp.compose([override, *COMPANIONS.get(override, [])])
    OmegaConf.resolve(cfg)  # every interpolation resolves
    assert cfg.model.vocab_size == cfg.data.vocab_size


def stated_runs(preset: Path) -> int | None:
    """The run count a preset's header states ("3 x 3 x 4 = 36 runs"), if it states one."""
    header = " ".join(line.lstrip("#") for line in preset.read_text(encoding="utf-8").splitlines()
                      if line.startswith("#"))
    found = re.search(r"= (\d+) runs", header)
    return int(found.group(1)) if found else None


COUNTED_PRESETS = [p for p in sorted((CONF_DIR / "experiment").glob("*.yaml")) if stated_runs(p)]


@pytest.mark.parametrize("preset", COUNTED_PRESETS, ids=lambda p: p.stem)
def test_a_presets_sweep_has_the_runs_its_header_states(preset):
    # Sweep axes merge through a preset's defaults: text_final once inherited text_lr's rate grid (108 jobs,
    # not 27), which the pre-flight cannot see because every job is valid. Counted from the composed grid, so a
    # preset that needs measured rates is counted before they exist.
    params = compose_with_hydra([f"experiment={preset.stem}"]).hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{key}={values}" for key, values in params.items()])
    runs = 1
    for axis in parsed:
        runs *= len(list(axis.sweep_string_iterator())) if axis.is_sweep_override() else 1
    assert runs == stated_runs(preset)


def test_the_board_sweeps_scheme_by_scheme_deepest_first():
    """The board runs over many sessions: in Hydra's own order (its basic sweeper's split, the first axis
    slowest) the first 24 jobs are one scheme's whole grid, deepest first, so a stopped sweep leaves whole rows."""
    from hydra_plugins.deepnorm_exp_frontier._hydra_internals import split_sweep

    params = compose_with_hydra(["experiment=board"]).hydra.sweeper.params
    parsed = OverridesParser.create().parse_overrides([f"{key}={values}" for key, values in params.items()])
    jobs = split_sweep(parsed)
    axis = [[dict(o.split("=", 1) for o in job)[key] for job in jobs] for key in ("norm", "depth")]
    assert len(jobs) == 696 and set(axis[0][:24]) == {"post"} and axis[0][24] == "pre"
    assert axis[1][:24] == ["100"] * 8 + ["24"] * 8 + ["6"] * 8


def test_the_mitigation_study_puts_each_mitigation_beside_none_for_every_scheme(tmp_path):
    jobs = preflight(["-m", "experiment=mitigation_study", f"paths.runs={tmp_path}"])[0]
    assert len(jobs) == 3 * 5 * 2 and len({str(job.run_dir) for job in jobs}) == 30
    on = {(job.cfg.norm.name, job.cfg.model.qk_norm, job.cfg.train.z_loss, job.cfg.model.attn_softcap,
           job.cfg.train.weight_decay) for job in jobs}
    assert ("post", "none", 0.0, None, 0.0) in on and ("post", "layernorm", 0.0, None, 0.0) in on
    assert ("deepnorm", "none", 1e-4, None, 0.0) in on and ("pre", "none", 0.0, 50.0, 0.0) in on
    assert len(on) == 15 and all(job.cfg.depth == 48 for job in jobs)


def test_quickstart_sweeps_three_norms_at_two_depths(tmp_path):
    # Its own runs root: the pre-flight claims each job's directory, and the repository's runs/ may hold a
    # quick start of another config (one made before train.flush_denormal existed is refused, as it should be).
    jobs = [job.overrides for job in preflight(["-m", "experiment=quickstart", f"paths.runs={tmp_path}"])[0]]
    combos = {tuple(sorted(j for j in job if j.split("=")[0] in ("norm", "depth"))) for job in jobs}
    assert len(jobs) == 6 and len(combos) == 6
    assert {dict(x.split("=") for x in c)["norm"] for c in combos} == {"post", "pre", "deepnorm"}
    cfg = deepnorm_exp.compose(["experiment=quickstart"])
    assert cfg.experiment_name == "quickstart"


def test_command_line_overrides_win_over_preset_sweep_axes(tmp_path):
    jobs = [job.overrides for job in preflight(["-m", "experiment=quickstart", "norm=pre", f"paths.runs={tmp_path}"])[0]]
    assert len(jobs) == 2 and all("norm=pre" in job for job in jobs)


def test_defaults_are_the_documented_ones():
    cfg = deepnorm_exp.compose([])
    assert cfg.norm.name == "deepnorm" and cfg.norm.constants == "paper"
    assert list(cfg.train.betas) == [0.9, 0.98] and cfg.train.schedule == "inverse_sqrt"
    assert cfg.train.grad_clip is None and cfg.logger.mode == "offline"
    # the mitigations are off unless asked for: every published result ran without them
    assert cfg.train.z_loss == 0 and cfg.train.weight_decay == 0 and cfg.model.qk_norm == "none"
    assert cfg.model.attn_softcap is None and cfg.model.logit_softcap is None
    assert Path(cfg.paths.runs) == CONF_DIR.parent / "runs"


BAD = [
    (["norm=batchnorm"], "norm", "choose one of: " + ", ".join(SCHEMES.names())),  # the registry: every scheme
    (["model=gpt9"], "model", "decoder"),
    (["depth=0"], "depth", "positive"),
    (["depth=-3"], "depth", "positive"),
    (["depth=abc"], "depth", "Integer"),
    (["depth=2.5"], "depth", "Integer"),
    (["train.steps=0"], "train.steps", "positive"),
    (["train.batch_size=-1"], "train.batch_size", "positive"),
    (["train.seq_len=0"], "train.seq_len", "positive"),
    (["train.lr=0"], "train.lr", "positive"),
    (["train.z_loss=-1e-4"], "train.z_loss", ">= 0"),
    (["train.z_loss=nan"], "train.z_loss", ">= 0"),
    (["model.attn_softcap=0"], "model.attn_softcap", "positive finite number, or null"),
    (["model.logit_softcap=-30"], "model.logit_softcap", "positive finite number, or null"),
    (["model.logit_softcap=inf"], "model.logit_softcap", "positive finite number, or null"),
    (["train.lr=-1e-3"], "train.lr", "positive"),
    (["model.n_heads=5"], "model.n_heads", "divide model.d_model=64"),
    (["train.seq_len=512"], "train.seq_len", "model.max_seq_len=256"),
    (["train.schedule=linear"], "train.schedule", "inverse_sqrt, cosine, constant"),
    (["train.precision=fp8"], "train.precision", "auto, fp32, bf16"),
    (["logger.mode=live"], "logger.mode", "offline, online, disabled"),
    (["norm.constants=fairseq"], "norm.constants", "paper, torchscale, glm130b"),
    (["norm=post", "+norm.alpha=2"], "norm.alpha", "not in"),
    (["norm=ngpt", "train.parallel=fsdp"], "train.parallel", "auto, none, ddp"),
    (["norm=rezero", "train.parallel=fsdp"], "train.parallel", "shares one alpha"),
    (["norm=rezero", "norm.alpha_per=block"], "norm.alpha_per", "layer, sublayer"),
    (["norm=completep", "norm.depth_alpha=1.5"], "norm.depth_alpha", "[0.5, 1]"),
    (["norm=deepscalelm", "norm.k=0"], "norm.k", "positive"),
    (["norm=deepscalelm", "norm.embedding_norm=true"], "norm.embedding_norm", "only with norm.base=post"),
    (["norm=resi_dual", "norm.dual_scale=-1"], "norm.dual_scale", "positive"),
    (["model.ffn=relu"], "model.ffn", "gelu, swiglu"),
    (["train.grad_clip=0"], "train.grad_clip", "> 0"),
    (["device=tpu"], "device", "auto, cpu, cuda"),
    (["data.classes=1"], "data.classes", "[2, vocab_size - 3=253]"),
    (["data.vocab_size=32"], "data.classes", "[2, vocab_size - 3=29]"),
    (["data=translation_hub"], "data",
     "needs lm data; choose one of: " + ", ".join(n for n in SOURCES.names() if "lm" in SOURCES.get(n).tasks)),
    (["model=encdec", "data.translation_max_len=2"], "data.translation_max_len", ">= translation_min_len=4"),
    (["model=encdec", "model.encoder_depth=0"], "model.encoder_depth", "positive"),
    (["model=encdec", "data.translation_max_len=300"], "model.max_seq_len", "sequences of 301 tokens"),
    (["model=encdec", "data=translation_hub", "data.max_len=512"], "model.max_seq_len", "sequences of 513 tokens"),
]


@pytest.mark.parametrize("overrides,key,allowed", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_names_key_and_what_is_allowed(overrides, key, allowed):
    with pytest.raises(ConfigError) as err:
        deepnorm_exp.compose(overrides)
    assert err.value.key == key
    message = str(err.value)
    assert "\n" not in message and allowed in message


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError) as err:
        deepnorm_exp.compose(["train.stepz=3"])
    assert "train.stepz" in str(err.value)


def test_run_name_comes_from_overrides_not_time():
    cfg = deepnorm_exp.compose(["norm=pre", "depth=24", "seed=3"])
    assert run_name(cfg) == "pre-L24-s3"
    assert run_name(cfg, "train.lr=0.003,model.d_model=128") == "pre-L24-train.lr=0.003-model.d_model=128-s3"
    # A replaced character could make two values look alike (a/b and a_b): the exact text's hash tells them apart.
    slash, underscore = run_name(cfg, "data.name=a/b"), run_name(cfg, "data.name=a_b")
    assert slash.startswith("pre-L24-data.name=a_b~") and slash.endswith("-s3")
    assert underscore == "pre-L24-data.name=a_b-s3"


def test_long_override_lists_make_unique_names_within_file_name_limits():
    cfg = deepnorm_exp.compose([])
    a = run_name(cfg, ",".join(f"data.key{i}={i}" for i in range(40)))
    b = run_name(cfg, ",".join(f"data.key{i}={i + 1}" for i in range(40)))
    assert len(a) < 200 and len(b) < 200 and a != b


def test_the_preflight_expands_glob_and_range_as_hydra_does(tmp_path):
    jobs, _ = preflight(["-m", "norm=glob(p*,exclude=post_init)", "depth=range(2,4)", f"paths.runs={tmp_path}"])
    assert sorted((job.cfg.norm.name, job.cfg.depth) for job in jobs) == [
        ("periln", 2), ("periln", 3), ("post", 2), ("post", 3), ("pre", 2), ("pre", 3)]


def test_a_tuned_rate_is_each_schemes_own_per_depth_and_a_cell_without_one_is_refused_in_one_line():
    """`train.lr: ${tuned_lr:}` (the budget study) reads conf/tuned_lr/lr_study.yaml, the table `make results`
    writes from the learning-rate study's records: each cell's rate, and one line naming the cells it has
    for a depth it does not."""
    table = OmegaConf.load(CONF_DIR / "tuned_lr" / "lr_study.yaml")
    assert table.source == "lr_study" and table.rates
    for norm, by_depth in table.rates.items():
        for depth, rate in by_depth.items():
            cfg = deepnorm_exp.compose(["experiment=budget_study", f"norm={norm}", f"depth={depth[1:]}"])
            assert cfg.train.lr == rate
    with pytest.raises(ConfigError) as err:
        deepnorm_exp.compose(["experiment=budget_study", "depth=7"])
    assert err.value.key == "train.lr" and "lr_study measured no best rate for deepnorm at depth 7" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="needs a table"):
        deepnorm_exp.compose(["train.lr=${tuned_lr:}"])


def test_the_sweep_log_names_the_code_that_ran_it():
    from deepnorm_exp.sweeps.hydra_callbacks import code_version

    version = code_version()
    assert set(version) == {"commit", "modified"} and len(version["commit"]) == 12


def test_deleting_a_plug_in_key_is_one_line():
    """A plug-in's section is typed by its dataclass: `~data.seed` cannot delete a key it declares (the
    default applies anyway). Said in one line naming the key; this was an IndexError traceback."""
    with pytest.raises(ConfigError, match=r"^data\.seed=~ is invalid: .*does not support deletion"):
        deepnorm_exp.compose(["~data.seed"])


# -- hostile input (issue 23): hostile values: one line, no run directory ------------------------------------
@pytest.mark.parametrize("override", [f"seed={2**70}", "seed=-1", "data.seed=-1", f"train.lr={LONG}",
                                      f"norm={LONG}", f"+x{LONG}=1", f"depth={'9' * 10_000}", f"train.schedule={LONG}"])
def test_hostile_values_are_one_short_line_before_any_run_directory(tmp_path, capsys, override):
    from conftest import refused

    from conftest import TINY

    line = refused([*TINY, f"paths.runs={tmp_path / 'runs'}", "logger=none", override], capsys)
    assert len(line) < 600, line
    assert not (tmp_path / "runs").exists()


def test_an_echoed_value_is_cut_and_its_control_characters_escaped():
    from deepnorm_exp.errors import ConfigError

    message = str(ConfigError("experiment_name", "x" * 10_000 + "\n", f"Value '{'x' * 10_000}' is bad"))
    assert "\n" not in message and len(message) < 600 and "(10,001 characters)" in message
    assert str(ConfigError("k", "a\tb\nc", "why")) == "k=a\\tb\\nc is invalid: why"


def test_a_long_path_is_cut_in_its_middle_so_the_line_still_names_the_file():
    from deepnorm_exp.errors import SHOWN_CHARS, shown

    path = "/scratch/" + "project/" * 12 + "corpus.txt"
    line = shown(path)
    assert line.startswith("/scratch/project/") and line.endswith(f"/corpus.txt ({len(path):,} characters)")
    assert len(line) <= SHOWN_CHARS + 5 and shown("short/path.txt") == "short/path.txt"


@pytest.mark.parametrize("override, says", [
    ("data.num_proc=0", "must be a positive integer, or null for all cores for large corpora, else 1"),
    ("data.eval_fraction=1.0", "must be in (0, 1)"), ("data.eval_blocks=0", "must be a positive integer"),
    ("data.tokenizer=wordpiece", "choose one of: byte, bpe"),
    ("data.vocab_size=100", "the byte tokenizer has 259 tokens"),
])
def test_a_text_sources_bad_key_is_one_line_naming_it(override, says):
    with pytest.raises(ConfigError) as refused:
        deepnorm_exp.compose(["data=shakespeare", override])
    assert str(refused.value).startswith(f"{override} is invalid: {says}") and "\n" not in str(refused.value)


def test_an_unset_environment_variable_is_named(capsys):
    with pytest.raises(ConfigError) as error:
        deepnorm_exp.compose(["paths.runs=${oc.env:DEEPNORM_SURELY_UNSET}/runs"])
    assert error.value.key == "paths.runs" and "DEEPNORM_SURELY_UNSET" in str(error.value)
    line = refused([*TINY, "paths.runs=${oc.env:DEEPNORM_SURELY_UNSET}/runs"], capsys)
    assert "paths.runs" in line and "DEEPNORM_SURELY_UNSET" in line


def test_errors_survive_pickling_to_the_other_ranks():
    """The main process decides for a run directory and broadcasts the decision, a refusal included."""
    import pickle

    from deepnorm_exp.errors import ConfigError, RecordError

    refused = pickle.loads(pickle.dumps(ConfigError("train.lr", 1e-3, "the sweeper owns it")))
    assert (refused.key, refused.value, str(refused)) == ("train.lr", 1e-3, "train.lr=0.001 is invalid: the sweeper owns it")
    assert refused.exit_status == 2 and str(pickle.loads(pickle.dumps(RecordError("x is damaged")))) == "x is damaged"


def test_a_long_list_of_choices_is_listed_whole():
    """A registry's choices are not cut in their middle as a library's message is: the preset list passed 400
    characters (29 experiments) and the error hid the ones between gpu_depth and paper_depth_sweep."""
    from deepnorm_exp.errors import require_choice

    choices = [f"scheme_{i:03d}" for i in range(60)]
    with pytest.raises(ConfigError) as refusal:
        require_choice("norm", "nope", choices)
    assert str(refusal.value) == f"norm=nope is invalid: choose one of: {', '.join(choices)}"
