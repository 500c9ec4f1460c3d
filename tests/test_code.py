"""The shape of the code itself: no function takes more than MAX_PARAMETERS parameters (issue 41: a run was a
chain of 7- to 13-parameter signatures; what travels together is a typed record: RunPlan, CheckedConfig,
AttentionSettings)."""

from __future__ import annotations

import ast

from conftest import REPO

MAX_PARAMETERS = 6  # self and cls aside; *args and **kwargs count one each
FOLDERS = ("deepnorm_exp", "hydra_plugins", "benchmarks")


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
    return names + [f"*{a.arg}" for a in (args.vararg,) if a] + [f"**{a.arg}" for a in (args.kwarg,) if a]


def long_signatures(source: str, where: str) -> list[str]:
    return [f"{where}:{node.lineno} {node.name} ({len(parameters(node))})" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(parameters(node)) > MAX_PARAMETERS]


def test_no_function_takes_more_than_six_parameters():
    found = [line for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))
             for line in long_signatures(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []


def test_the_count_sees_every_kind_of_parameter():
    source = "def f(a, /, b, *c, d, e=1, **f): pass\nclass K:\n    def g(self, a, b, c, d, e, f): pass\n"
    assert long_signatures(source, "x") == []
    assert long_signatures(source.replace("**f", "g, **f"), "x") == ["x:1 f (7)"]
    assert long_signatures(source.replace("e, f)", "e, f, g)"), "x") == ["x:3 g (7)"]


def test_the_code_map_names_every_module():
    """docs/code.md maps the package: every module is named there, except a scheme's own module (one per
    registered scheme: the registry lists them) and a package's __init__.py (named by its folder)."""
    page = (REPO / "docs" / "code.md").read_text()
    unnamed = [str(path.relative_to(REPO)) for path in sorted((REPO / "deepnorm_exp").rglob("*.py"))
               if path.name != "__init__.py" and path.name not in page
               and not (path.parent.name == "schemes" and "\n@register(" in path.read_text())]
    assert unnamed == []


# -- hostile input (issue 23): a module name users typed before the regrouping -------------------------------
def test_an_old_module_name_fails_in_one_line_naming_the_new_one():
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", "deepnorm_exp.report", "runs/x"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "python -m deepnorm_exp.analysis.report" in line
