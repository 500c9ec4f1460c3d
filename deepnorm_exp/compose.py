"""Config composition outside a Hydra app (notebooks, tests, the benchmark), and Hydra's composition
errors said as one-line ConfigErrors (also for the pre-flight check, deepnorm_exp/preflight.py)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterable, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

# conf/hydra/launcher/{joblib,submitit_local,submitit_slurm}.yaml share their names with the plugins'
# schemas on purpose (`hydra/launcher=joblib` is what users type), so Hydra validates our YAML against the
# plugin's schema (what we want) and warns, at every composition, that this matching is deprecated.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name",
                        category=UserWarning)

from hydra.core.config_store import ConfigStore  # noqa: E402

from .build import check_config  # noqa: E402
from .config import CONF_DIR
from .data import SOURCES
from .errors import ConfigError, choice_error, first_line
from .metrics import metrics_schema
from .schemes import SCHEMES

SCHEMAS = "schemas"  # the ConfigStore group under which each plug-in's dataclass is stored


def store_plug_in_schemas() -> None:
    """Each plug-in's dataclass in Hydra's ConfigStore, as `schemas/<group>/<name>`, which its option file
    names first in its defaults list (conf/norm/deepnorm.yaml: `- /schemas/norm@_here_: deepnorm`): Hydra
    then knows every key of the section, with its type and default, and the file holds only what it
    changes. Done at import, before anything composes (deepnorm_exp/__init__ imports this module)."""
    store = ConfigStore.instance()
    for group, registry in (("norm", SCHEMES), ("data", SOURCES)):
        for name in registry.names():
            store.store(group=f"{SCHEMAS}/{group}", name=name, node=registry.get(name).Config)
    store.store(group=f"{SCHEMAS}/metrics", name="instruments", node=metrics_schema())


store_plug_in_schemas()


def _compose(overrides: Sequence[str], hydra_config: bool = False) -> DictConfig:
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=hydra_config)
    except MissingConfigException as e:
        raise missing_option(e) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise composition_error(e, overrides) from None
    except (OSError, ValueError) as e:
        raise unreadable_override(e, overrides) from None


def compose(overrides: Iterable[str] = (), check: bool = True) -> DictConfig:
    """The config `python -m deepnorm_exp <overrides>` would run, checked; e.g. compose(["norm=pre"])."""
    cfg = _compose(list(overrides))
    if check:
        check_config(cfg)
    return cfg


def compose_with_hydra(overrides: Iterable[str] = ()) -> DictConfig:
    """The same composition with its `hydra` node (launcher, sweeper, the groups chosen), unchecked."""
    return _compose(list(overrides), hydra_config=True)


def missing_option(e: MissingConfigException) -> ConfigError:
    missing = (e.missing_cfg_file or "").strip("/")
    group, _, option = missing.rpartition("/")
    if group and e.options is not None:
        return choice_error(group, option, sorted(e.options))
    return ConfigError("config", missing or "?", first_line(e))


def composition_error(e: Exception, overrides: Sequence[str]) -> ConfigError:
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    key = getattr(cause, "full_key", None)
    if key:
        value = next(((o.split("=", 1) + [o[:len(o) - len(o.lstrip("+~"))]])[1]  # `~key`: the deletion
                      for o in overrides if o.lstrip("+~").split("=", 1)[0] == key), "?")
        return ConfigError(key, value, first_line(cause))
    # Hydra's own message names the override ("Could not override 'x'. ..."); keep its first sentence, and
    # show the override it could not parse where one is (Hydra's lexer names only where it stopped).
    return ConfigError("override", unparsable(overrides) or " ".join(overrides) or "-", first_line(e))


def unparsable(overrides: Sequence[str]) -> str | None:
    """The first override Hydra's grammar cannot parse on its own, if any."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except (HydraException, ValueError):  # ValueError: an integer past Python's 4,300 digits
            return override
    return None


def unreadable_override(e: Exception, overrides: Sequence[str]) -> ConfigError:
    """An OSError or ValueError from inside Hydra's composition (a group option too long to be a file name,
    an integer too long to parse) as a ConfigError naming the override at fault."""
    if isinstance(e, OSError):
        name = Path(e.filename or "").name
        culprit = next((o for o in overrides if name and name in o), max(overrides, key=len, default="-"))
        return ConfigError("override", culprit, f"{e.strerror or type(e).__name__} (Hydra looks for a config "
                                                f"file of that name)")
    return ConfigError("override", unparsable(overrides) or " ".join(overrides) or "-", first_line(e))
