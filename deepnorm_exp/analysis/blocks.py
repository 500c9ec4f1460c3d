"""The generated blocks of the README and the manual's pages (between `<!-- results:NAME -->` and
`<!-- /results:NAME -->`), written from the same records as the results page: each study's own block (its
`Study.block`), the diagnosis rules, and the blocks that summarize every study (presets, claims)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .. import records
from .claims import NOT_RUN, judge
from .evidence import Evidence
from .overview import times_table
from .studies import STUDIES
from ..lifecycle.diagnosis import rules_markdown


def generated_blocks(evidence: Evidence, every_study: bool = True) -> dict[str, str]:
    """NAME -> the block's new text: `diagnosis_rules` (the diagnosis kinds, from lifecycle/diagnosis.py), each
    study's own block once its records can fill it (a study's `block` says when: a table waits for its whole
    sweep), and, where the records hold every study the page shows (`every_study`), the blocks of the studies
    that have no runs, `presets` (every preset's command and time here) and `claims` (the verdicts' tally),
    which summarize them all."""
    blocks = {"diagnosis_rules": rules_markdown()}  # the manual's, from the code
    for study in STUDIES:
        if study.block is not None and (text := study.block(evidence, study.name)) is not None:
            blocks[study.block_name] = text
    if not every_study:
        return blocks
    for study in STUDIES:  # the records hold every study the page shows, and not this one
        if study.block is not None and study.block_name not in blocks and evidence.runs(study.name).empty:
            blocks[study.block_name] = (f"Not run yet under the current defaults and protocol: `{study.command}`. "
                                        "Figures from earlier protocols are in this page's git history; their "
                                        "records were not kept.")
    if any(not evidence.runs(study.name).empty for study in STUDIES):
        blocks["presets"] = times_table(evidence)
    verdicts = judge(evidence)
    if any(v.outcome != NOT_RUN and not c.needs for c, v in verdicts):  # some study here has run
        counts = pd.Series([v.outcome for _, v in verdicts]).value_counts()
        blocks["claims"] = (f"Of the paper's {len(verdicts)} claims checked in [docs/results.md](docs/results.md): "
                            + ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + ".")
    return blocks


def update_blocks(path: Path, blocks: dict[str, str], tag: str = "results") -> list[str]:
    """Replace each `<!-- TAG:NAME -->...<!-- /TAG:NAME -->` block that `blocks` has; the names done."""
    old = text = path.read_text(encoding="utf-8")
    done = []
    for name, body in blocks.items():
        # `.*?` may be empty: a block added before its study has run holds nothing between its markers
        pattern = re.compile(rf"(<!-- {tag}:{name} -->\n).*?(<!-- /{tag}:{name} -->)", re.S)
        text, n = pattern.subn(lambda m: m.group(1) + body + "\n" + m.group(2), text)
        if n:
            done.append(name)
    if text != old:  # a page without blocks is left untouched, its time stamp included
        records.write_text(path, text)
    return done
