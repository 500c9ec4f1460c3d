"""The manual: docs/*.md build into a site with MkDocs in strict mode (a broken link or anchor fails), the
strict settings catch what they are there for, and the README stays a front door."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not a warning of ours


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=ENV, timeout=600)


@pytest.mark.slow
def test_the_manual_builds_with_strict_link_and_anchor_checks(tmp_path):
    proc = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    for page in ("running", "records", "configuration", "results"):
        assert (tmp_path / "site" / page / "index.html").is_file()


def test_every_page_of_the_manual_is_in_the_navigation():
    """A page left out of `nav` builds but nobody finds it (MkDocs says so only at INFO level)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    listed = {page for entry in nav for page in entry.values()}
    assert listed == {p.name for p in (REPO / "docs").glob("*.md")}


@pytest.mark.parametrize("broken", ["[a page](nowhere.md)", "[a section](index.md#no-such-heading)"])
def test_the_strict_build_fails_on_a_broken_link_or_anchor(tmp_path, broken):
    """The repository's own settings (its `validation` block), on a two-page copy with one broken link."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## A heading\n\nSee [the other page](other.md#a-heading).\n")
    (docs / "other.md").write_text(f"# Other\n\n## A heading\n\nBack to {broken}.\n")
    config.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"Other": "other.md"}])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert broken.split("(")[1].rstrip(")").split("#")[-1] in proc.stderr
    shutil.rmtree(tmp_path / "site", ignore_errors=True)
    (docs / "other.md").write_text("# Other\n\n## A heading\n\nBack to [home](index.md#a-heading).\n")
    assert mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site").returncode == 0  # the fixed copy builds


def test_the_readme_is_a_front_door():
    """At most 15 kB, the two set-up commands first, and a link to every page of the manual."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 15_000
    assert readme.index("make run") < readme.index("make test") < readme.index("## ")
    for page in (REPO / "docs").glob("*.md"):
        if page.name != "index.md":
            assert f"(docs/{page.name}" in readme, page.name


def test_the_printed_refusal_of_an_unknown_scheme_lists_every_registered_scheme():
    """README and docs/running.md show the line `norm=batchnorm` prints; it listed 21 schemes while 23 were
    registered (post_init and derf missing) until this test."""
    from deepnorm_exp.schemes import SCHEMES

    line = "deepnorm_exp: error: norm=batchnorm is invalid: choose one of: " + ", ".join(SCHEMES.names())
    for page in (REPO / "README.md", REPO / "docs" / "running.md"):
        shown = [row for row in page.read_text().splitlines() if "norm=batchnorm is invalid" in row]
        assert shown == [line], page.name


def test_the_readmes_presets_table_names_every_preset():
    """board, board_frontier and scorecard were missing from it: a preset a reader cannot find from the door."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Presets"):readme.index("## ", readme.index("## Presets") + 3)]
    for preset in (REPO / "conf" / "experiment").glob("*.yaml"):
        assert f"`{preset.stem}`" in table, preset.stem
