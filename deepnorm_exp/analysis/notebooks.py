"""Run the analysis notebooks against a runs root: `python -m deepnorm_exp.analysis.notebooks runs/<experiment>`.

Each notebook in `notebooks/` takes its runs root from its first code cell, tagged `parameters` (the
papermill convention). This executes a copy with that value replaced, top to bottom (nbclient, a fresh
kernel), and writes it with its outputs to `<root>/notebooks/` (the committed notebooks stay output-free).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from .. import records

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
PARAMETERS_TAG = "parameters"


def with_parameters(notebook, parameters: dict):
    """A copy whose `parameters` cell is followed by one assigning `parameters` (papermill's convention)."""
    import copy

    import nbformat

    notebook = copy.deepcopy(notebook)
    index = next((i for i, cell in enumerate(notebook.cells)
                  if PARAMETERS_TAG in cell.get("metadata", {}).get("tags", [])), None)
    if index is None:
        raise ValueError(f"no cell tagged {PARAMETERS_TAG!r}")
    source = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    notebook.cells.insert(index + 1, injected)
    return notebook


def execute(path: Path, parameters: dict, out: Optional[Path] = None, timeout: int = 600):
    """Execute the notebook at `path` with `parameters`; returns the executed notebook (written to `out`)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = with_parameters(nbformat.read(path, as_version=4), parameters)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        records.write_text(out, nbformat.writes(notebook))
    return notebook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="runs/<experiment> (or any directory above run directories)")
    parser.add_argument("--only", nargs="*", help="notebook names (default: all in notebooks/)")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        if args.only and path.stem not in args.only and path.name not in args.only:
            continue
        out = root / "notebooks" / path.name
        execute(path, {"runs_root": str(root)}, out)
        print(out)


if __name__ == "__main__":
    main()
