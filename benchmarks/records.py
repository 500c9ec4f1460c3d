"""What `make bench` measured, kept: each section's printed lines in `benchmarks/results/<section>.txt`,
under a first line that says when, at which commit and on what machine; `docs/speed.md`'s generated blocks
(`<!-- bench:SECTION -->` ... `<!-- /bench:SECTION -->`) are rewritten from those files, so every figure in
a block is one a run printed, and a test fails when the page and the files disagree.

    python -m benchmarks.records docs/speed.md   # make bench runs it after the benchmark

A section's file is replaced only when the section finished: one that failed or was interrupted leaves the
last complete record in place.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import re
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Iterator, Optional, TextIO

from deepnorm_exp.records import atomic_path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
TAG = "bench"


class Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, *streams: TextIO):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def commit() -> str:
    """The short commit, `+changes` where the measured code differs from it ("unknown" outside git)."""
    from deepnorm_exp.sweeps.hydra_callbacks import CODE_PATHS, code_version

    version = code_version((*CODE_PATHS, "benchmarks", ":(exclude)benchmarks/results"))  # not its own records
    if not version:
        return "unknown"
    return version["commit"][:7] + ("+changes" if version["modified"] else "")


def machine(threads: int) -> str:
    import torch

    return f"{os.cpu_count()} CPU cores, {threads} torch threads, torch {torch.__version__}"


@contextmanager
def recorded(section: str, about: str, results: Path = RESULTS) -> Iterator[None]:
    """Print as usual inside; when the block ends without an exception, the printed lines become
    results/<section>.txt under a line naming the day, the commit and `about` (the machine)."""
    kept = io.StringIO()
    with redirect_stdout(Tee(sys.stdout, kept)):
        yield
    results.mkdir(parents=True, exist_ok=True)
    header = f"section `{section}`, {datetime.date.today().isoformat()}, commit {commit()}, {about}"
    with atomic_path(results / f"{section}.txt") as temporary:
        temporary.write_text(f"{header}\n{kept.getvalue()}", encoding="utf-8")


def render(section: str, results: Path = RESULTS) -> str:
    """A block's Markdown: the record's first line, then what the section printed, as printed."""
    path = results / f"{section}.txt"
    if not path.is_file():
        return f"Not measured yet: `python -m benchmarks.bench --sections {section}`."
    header, _, body = path.read_text(encoding="utf-8").partition("\n")
    return f"`make bench`, {header}:\n\n```text\n{body.rstrip()}\n```"


def block_names(page: Path) -> list[str]:
    return re.findall(rf"<!-- {TAG}:([\w-]+) -->", page.read_text(encoding="utf-8"))


def rewrite(pages: list[Path], results: Path = RESULTS) -> list[str]:
    """Every bench block of `pages` from the records; the blocks done, as page:section."""
    from deepnorm_exp.analysis.blocks import update_blocks

    done = []
    for page in pages:
        names = block_names(page)
        done += [f"{page}:{n}" for n in update_blocks(page, {n: render(n, results) for n in names}, tag=TAG)]
    return done


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.records", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="+", help="Markdown pages whose bench blocks to rewrite (docs/speed.md)")
    parser.add_argument("--results", default=str(RESULTS), help="the records' directory (benchmarks/results)")
    args = parser.parse_args(argv)
    for page in args.pages:
        if not Path(page).is_file():
            parser.error(f"{page}: no such file")
    done = rewrite([Path(p) for p in args.pages], Path(args.results))
    print(f"bench blocks from {args.results}: {', '.join(done) or 'none'}")


if __name__ == "__main__":
    main()
