"""Claiming a run directory: whether this config's run there is finished (skip it), unfinished (resume it)
or absent (start it), and refusing a directory that holds a run trained with another config. The keys
that decide what is trained are config.py's (TRAINED_KEYS, UNTRAINED_KEYS), read also for run names."""

from __future__ import annotations

import copy
import functools
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..config import ABSENT_MEANS, TRAINED_KEYS, UNTRAINED_KEYS, Config, absent_means
from ..errors import ConfigError, RecordError
from ..locks import FileLock
from ..records import read_yaml, remove_temporaries
from ..rundir import RunDir
from ..schemes import SCHEMES
from ..train import checkpoint
from .summary import has_ended, has_finished, summary_of

log = logging.getLogger("deepnorm_exp")

@dataclass(frozen=True)
class Claim:
    """What the main process decided for a run directory, sent to every rank: train it (resuming or from
    step 0), skip it (with the summary to return), or fail with `error`."""

    action: str  # "train", "skip" or "error"
    resuming: bool = False
    summary: dict | None = None
    error: BaseException | None = None


def claim_directory(cfg: DictConfig, out_dir: Path, lock: FileLock) -> Claim:
    """The main process's decision for a run directory, under its lock, so that every rank can act on it."""
    try:
        if not lock.acquire(patience=1.0):
            log.warning("%s: another process is running it; leaving it to that one", out_dir)
            return Claim("skip", summary={"status": "skipped", "reason": "running in another process",
                                          "run_dir": str(out_dir)})
        check_claim(out_dir, cfg)
        previous = summary_of(out_dir)
        if cfg.resume and has_ended(previous):
            log.info("%s: already %s, not run again (resume=false starts over)", out_dir, previous["status"])
            if not cfg.train.keep_checkpoint:  # a kill after the summary, before its checkpoint was removed
                checkpoint.remove(out_dir)
            return Claim("skip", summary=previous)
        for temporary in remove_temporaries(out_dir):  # a write that a kill interrupted
            log.info("removed %s, left by an interrupted write", temporary)
        resuming = cfg.resume and checkpoint.exists(out_dir)
        if not resuming:
            for stale in RunDir.RECORDS:  # starting over: nothing of an earlier attempt survives
                path = out_dir / stale
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return Claim("train", resuming=resuming)
    except Exception as e:  # noqa: BLE001 - said on every rank
        return Claim("error", error=e)


def trained_config(container: dict) -> dict:
    """The part of a resolved config that decides what is trained (config.py: TRAINED_KEYS, less the
    UNTRAINED_KEYS inside those sections; metrics, logging, paths do not)."""
    out = {key: copy.deepcopy(container.get(key)) for key in TRAINED_KEYS}
    for key in UNTRAINED_KEYS:
        section, _, name = key.partition(".")
        if name and isinstance(out.get(section), dict):
            out[section].pop(name, None)
    return out


def first_difference(before: Any, now: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    """(dotted key, value before, value now) of the first place two config trees differ, or None."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in list(before) + [k for k in now if k not in before]:
            found = first_difference(before.get(key, "<unset>"), now.get(key, "<unset>"), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if before == now else (prefix.rstrip("."), before, now)


def with_schema_defaults(stored: Any, defaults: Any) -> Any:
    """`stored` with the keys the schema gained after it was written, at `defaults` (`schema_defaults`: what
    a key's absence means, the behaviour runs had before it existed), so a run stored before it compares as
    it trained."""
    if not (isinstance(stored, dict) and isinstance(defaults, dict)):
        return stored
    filled = {key: with_schema_defaults(value, defaults.get(key)) for key, value in stored.items()}
    filled.update({key: value for key, value in defaults.items() if key not in stored and value != "???"})
    return filled


@functools.cache
def schema_defaults() -> dict:
    """What a stored config is completed with: the typed config's defaults, but where a key's absence
    means other than its default (config.ABSENT_MEANS), that; as plain containers (11 ms to build; the
    pre-flight checks every job's run directory). Read-only: `with_schema_defaults` shares its values,
    `trained_config` copies them."""
    defaults = OmegaConf.merge(OmegaConf.structured(Config), ABSENT_MEANS)  # what stored configs lacked
    return OmegaConf.to_container(defaults, resolve=False, throw_on_missing=False)


def with_scheme_absent_means(stored: Any) -> Any:
    """`stored` with its scheme's keys added after it was written, where the scheme's Config says what their
    absence means (a field's `absent`: the behaviour runs had before the key existed). A key a scheme gained whose
    absence matches no value (the behaviour changed with it) is left absent: such a run never compares as
    current."""
    norm = stored.get("norm") if isinstance(stored, dict) else None
    if not isinstance(norm, dict) or norm.get("name") not in SCHEMES.names():
        return stored
    absent = absent_means(SCHEMES.get(norm["name"]).Config)
    return {**stored, "norm": {**{k: v for k, v in absent.items() if k not in norm}, **norm}}


def check_same_training(stored: dict, cfg: DictConfig, out_dir: Path) -> None:
    """ConfigError unless `stored` (a resolved config) trains what `cfg` asks for."""
    stored = with_scheme_absent_means(stored)
    found = first_difference(trained_config(with_schema_defaults(stored, schema_defaults())),
                             trained_config(OmegaConf.to_container(cfg, resolve=True)))
    if found is not None:
        key, before, now = found
        raise ConfigError(key, now, f"{out_dir} holds a run trained with {key}={before}; give this run its own "
                                    f"experiment_name, or resume=false to replace that run")


def check_claim(out_dir: Path, cfg: DictConfig) -> None:
    """A run directory belongs to the one trained config that wrote it: a finished run or a checkpoint
    there is never taken as this config's unless the config it stored (config.yaml) trains the same."""
    if not cfg.resume:
        return  # the old run is replaced
    finished = has_finished(out_dir)
    if not finished and not checkpoint.exists(out_dir):
        return  # nothing to take over: an unfinished run without a checkpoint starts over
    try:
        stored = read_yaml(RunDir(out_dir).config)
        if not isinstance(stored, dict):
            raise ValueError("not a mapping")
    except Exception as e:  # noqa: BLE001 - missing, or whatever YAML raises on a damaged file
        if finished:
            raise RecordError(f"{RunDir(out_dir).config} is missing or damaged ({type(e).__name__}), so the "
                              f"finished run there cannot be matched to this config; resume=false replaces it") from None
        return  # the checkpoint carries its own config, checked when it is loaded
    check_same_training(stored, cfg, out_dir)
