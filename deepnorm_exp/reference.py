"""docs/configuration.md, generated from the typed schema: every key with its type, its default and the
meaning its field's comment in the code gives, for the root config, each section, each scheme's and each
data source's own keys (found by their registries), and each config group's options (`conf/<group>/`).

    python -m deepnorm_exp.reference docs/configuration.md

A test fails when the committed page differs from what this writes, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any, Iterator, Optional

from omegaconf import MISSING

from . import config as schema
from .config import REPO_ROOT
from .records import write_text

GROUPS_DIR = REPO_ROOT / "conf"
# Config groups the root config selects (conf/<group>/<option>.yaml), with what choosing one does.
GROUPS = {
    "norm": "the normalization scheme (its own keys: below)",
    "model": "the architecture (`model.kind`)",
    "data": "the data source (its own keys: below)",
    "train": "optimisation, precision, parallelism, checkpoints",
    "metrics": "instrumentation; `off` keeps only the loop's own scalars",
    "logger": "W&B or none (the local records are always written)",
    "paths": "where records, caches and submitit's files go",
    "mitigation": "one stability mitigation at its documented example (`none`: all off)",
    "tuned_lr": "a table of measured best rates that `train.lr: ${tuned_lr:}` reads",
    "experiment": "a preset (`# @package _global_`): may set anything",
    "hydra/launcher": "how a sweep's jobs run (Hydra's joblib and submitit plugins)",
    "hydra/sweeper": "how a sweep's jobs are chosen (`frontier`: the stability frontier)",
}


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its meaning: the comment on the field's line, else the comment lines right above it
    (a `type: ignore[...]` marker is not a meaning)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))  # a class defined in a function is indented
    except (OSError, TypeError):  # made at run time (metrics_schema): its bases hold the comments
        return {}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    comments: dict[int, str] = {}
    starts: dict[int, str] = {}  # line -> the field that line defines
    line_start = True
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            text = re.sub(r"^#\s*(type:\s*ignore\[[^\]]*\]\s*#?\s*)?", "", tok.string).strip()
            if text:
                comments[tok.start[0]] = text
        elif line_start and tok.type == tokenize.NAME and tok.start[1] == 4 and tokens[i + 1].string == ":":
            starts[tok.start[0]] = tok.string
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            line_start = True
        elif tok.type != tokenize.COMMENT:
            line_start = False
    lines = source.splitlines()
    meanings = {}
    for line, name in starts.items():
        if line in comments and "#" in lines[line - 1][lines[line - 1].index(":"):]:
            meanings[name] = comments[line]
            continue
        above, k = [], line - 1
        while k in comments and lines[k - 1].lstrip().startswith("#"):
            above.insert(0, comments[k])
            k -= 1
        if above:
            meanings[name] = " ".join(above)
    return meanings


def type_name(hint: Any) -> str:
    """`Optional[int]` -> `int or null`; containers as written."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in rest) + " or null"
    if origin in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if value == MISSING:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return re.sub(r"e(-?)0*(\d)", r"e\1\2", f"{value:g}")  # 1e-05 -> 1e-5, as the YAML writes it
    if dataclasses.is_dataclass(value):
        return ""
    return f"`{value}`" if isinstance(value, str) else str(value)


def key_rows(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every field of the dataclass `cls` and of the dataclasses inside it."""
    hints = typing.get_type_hints(cls)
    meanings = {}
    for klass in reversed(cls.__mro__):  # a subclass's comment wins over its base's
        if dataclasses.is_dataclass(klass):
            meanings.update(field_comments(klass))
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint = hints[f.name]
        inner = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Union else hint
        if dataclasses.is_dataclass(inner) and f.default is not None:
            yield from key_rows(inner, f"{prefix}{f.name}.")
        elif dataclasses.is_dataclass(inner):  # an optional section, filled by its group (tuned_lr)
            yield f"{prefix}{f.name}", "section or null", "null", meanings.get(f.name, "")
        else:
            yield f"{prefix}{f.name}", type_name(hint), default_text(f), meanings.get(f.name, "")


def group_options(group: str) -> list[str]:
    """The options of a config group: its files in conf/, and those plug-ins store in Hydra's ConfigStore
    (the sweepers of hydra_plugins/, Hydra's own `basic`)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # imports the plug-ins, which store their configs
    node = ConfigStore.instance().repo
    for part in group.split("/"):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    stored = {name.removesuffix(".yaml") for name, item in node.items() if not isinstance(item, dict)}
    return sorted(stored | {p.stem for p in (GROUPS_DIR / group).glob("*.yaml")})


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    escape = lambda cell: str(cell).replace("|", "\\|")  # noqa: E731 - a cell's own bars
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def keys_table(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> str:
    return table([(f"`{k}`", t, d, m) for k, t, d, m in key_rows(cls, prefix, skip)],
                 ("key", "type", "default", "meaning"))


def plugin_sections(title: str, registry, prefix: str, common: Optional[type]) -> list[str]:
    """One table per registered plug-in (scheme, data source): its own keys, those of `common` left out."""
    shared = {f.name for f in dataclasses.fields(common)} if common else {"name"}
    out = []
    for name in registry.names():
        cls = registry.get(name).Config
        own = [f.name for f in dataclasses.fields(cls) if f.name not in shared]
        out.append(f"### `{prefix}={name}`\n\n" + (keys_table(cls, f"{prefix}.", skip=tuple(shared)) if own
                                                     else "No keys of its own."))
    return out


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of a container, interpolations unresolved."""
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_leaves(value, f"{prefix}{key}."))
    return out


def _value(value: Any) -> str:
    return default_text(dataclasses.field(default=value)) if not isinstance(value, str) else value


def preset_purpose(name: str) -> str:
    """The first sentence of the preset's own header comment (after `# @package`)."""
    lines = []
    for line in (GROUPS_DIR / "experiment" / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    end = re.search(r"\.(\s+[A-Z(`]|$)", text)
    return text[: end.start() + 1] if end else text


def preset_rows() -> list[tuple[str, str, str, str]]:
    """(preset, what it is for, what it sweeps, what it changes): each preset composed as the command line
    composes it, and compared key by key with the composition without it, so the table says what the YAML does,
    inherited presets included, and cannot drift from it."""
    from omegaconf import OmegaConf

    from .compose import compose_with_hydra

    def parts(overrides: list[str]) -> tuple[dict, dict, dict]:
        cfg = OmegaConf.to_container(compose_with_hydra(overrides), resolve=False)
        hydra = cfg.pop("hydra")
        return _leaves(cfg), hydra["runtime"]["choices"], hydra["sweeper"]

    _, base_choices, _ = parts([])
    rows = []
    for name in group_options("experiment"):
        keys, choices, sweeper = parts([f"experiment={name}"])
        groups = [f"{g}={c}" for g, c in choices.items() if g != "experiment" and c != base_choices.get(g)]
        base = parts(groups)[0]  # the keys the chosen group options set are theirs, not the preset's
        changed = groups + [f"{k}={_value(v)}" for k, v in keys.items()
                            if k != "experiment_name" and base.get(k) != v]
        sweep = "; ".join(f"{k}: {v}" for k, v in (sweeper.get("params") or {}).items())
        settings = {k: v for k, v in sweeper.items() if k not in ("_target_", "params", "max_batch_size")}
        sweep += "".join(f"; {k}: {_value(v)}" for k, v in settings.items())
        rows.append((f"`{name}`", preset_purpose(name), sweep or "one run", ", ".join(f"`{c}`" for c in changed)))
    return rows


def page() -> str:
    from .data import SOURCES
    from .schemes import SCHEMES
    from .schemes.base import SchemeConfig

    groups = [(f"`{g}`", ", ".join(f"`{o}`" for o in group_options(g)), what) for g, what in GROUPS.items()]
    root = [f.name for f in dataclasses.fields(schema.Config)  # sections and groups have their own tables
            if f.name not in GROUPS and not dataclasses.is_dataclass(typing.get_type_hints(schema.Config)[f.name])]
    from .metrics import metrics_schema

    sections = [("model", schema.ModelConfig), ("train", schema.TrainConfig), ("metrics", metrics_schema()),
                ("logger", schema.LoggerConfig), ("paths", schema.PathsConfig)]
    parts = [
        "# Configuration",
        "<!-- Generated by `python -m deepnorm_exp.reference docs/configuration.md` from the typed schema "
        "(deepnorm_exp/config.py, each scheme's and data source's Config); do not edit: a test compares. -->",
        "Composed by Hydra from `conf/` (one group per concern) and checked against the dataclasses below before "
        "any compute: a key that does not exist, a value of the wrong type or outside its choices is one line "
        "naming the key, exit status 2. Every key can be set on the command line (`train.lr=3e-4`); "
        "`python -m deepnorm_exp --cfg job [overrides]` prints the composed config. The defaults are the "
        "schema's (a plug-in's option file names its dataclass first in its defaults list); the group files in "
        "`conf/` hold only what each option changes.",
        "## Config groups",
        table(groups, ("group", "options", "what it selects")),
        "## Root keys",
        keys_table(schema.Config, "", skip=tuple(f.name for f in dataclasses.fields(schema.Config)
                                                 if f.name not in root)),
    ]
    for name, cls in sections:
        doc = inspect.getdoc(cls)
        parts += [f"## `{name}`"] + ([doc] if doc and not doc.startswith(cls.__name__) else []) + [keys_table(cls, f"{name}.")]
    shared = list(key_rows(SchemeConfig, "norm.", skip=("name",)))
    parts += ["## `norm`: every scheme",
              "Keys each scheme has (`name` selects it through the group)"
              + (":" if shared else ": none beyond `name`; each scheme's own keys follow."),
              *([keys_table(SchemeConfig, "norm.", skip=("name",))] if shared else []),
              "## `norm`: each scheme's own keys"]
    parts += plugin_sections("norm", SCHEMES, "norm", SchemeConfig)
    parts += ["## `data`: each source's keys"]
    parts += plugin_sections("data", SOURCES, "data", None)
    parts += ["## `tuned_lr`", inspect.getdoc(schema.TunedLrConfig) or "",
              keys_table(schema.TunedLrConfig, "tuned_lr.")]
    parts += ["## Presets",
              "`python -m deepnorm_exp -m experiment=<preset>`: each preset composed as that command composes it, "
              "what it sweeps and every key it changes from the defaults above (the first sentence of its YAML's "
              "comment says what it is for; the rest of that comment says why each choice).",
              table(preset_rows(), ("preset", "what it is for", "sweeps", "changes"))]
    return "\n\n".join(parts) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="deepnorm_exp.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the page to write (docs/configuration.md)")
    args = parser.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text(Path(args.out), page())
    print(f"{args.out}: every configuration key, from the schema")


if __name__ == "__main__":
    main()
