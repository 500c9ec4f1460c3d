"""The package's seams: its import graph, read from the source with `ast` (every import, those inside
functions included), has no circle between modules and none between the package's parts (a subpackage
or a top-level module), so the parts stack in layers and no import runs from a lower one up to a higher."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "deepnorm_exp"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports (`from . import x` of a module counts as importing it)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if node.module:  # `from . import x` imports x, not the package (which is imported already)
                found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def part(module: str) -> str:
    """deepnorm_exp.train.trainer -> train; deepnorm_exp.config -> config; the package itself -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def a_circle(edges: dict[str, set[str]]) -> list[str]:
    """One circle of `edges` (a path that comes back to its start), or [] when there is none."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_module_imports_itself_back_through_others():
    assert a_circle(graph()) == []


def test_the_parts_of_the_package_stack_in_layers():
    """Between parts: the package's own `__init__` (the public API, imported lazily) is left out, as it is
    the top; a subpackage's modules may import each other, as the module test above allows."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        if part(module):
            edges.setdefault(part(module), set()).update(part(t) for t in targets if part(t) not in ("", part(module)))
    assert a_circle(edges) == []


@pytest.mark.parametrize("edges, circle", [({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
                                           ({"a": {"b"}, "b": {"c"}, "c": set()}, [])])
def test_a_circle_is_found_where_there_is_one(edges, circle):
    assert a_circle(edges) == circle


def test_relative_imports_are_resolved_to_the_modules_they_name(tmp_path):
    graph_now = graph()
    assert "deepnorm_exp.config" in graph_now["deepnorm_exp.build"]  # from .config import ...
    assert "deepnorm_exp.train.damage" in graph_now["deepnorm_exp.train.sharded"]  # from .damage import ...
    assert "deepnorm_exp.errors" in graph_now["deepnorm_exp.train.damage"]  # from ..errors import ...
