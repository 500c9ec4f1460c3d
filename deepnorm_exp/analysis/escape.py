"""Text from records, made safe for where it is shown: one function per target.

Records are input anyone can change in a pull request (a packed summary, a sweep log, a config), and what
is built from them is read in a browser: `docs/results.md` through the docs site, the README on a forge,
`report.html` directly. So every value read from a record reaches a page through one of these:

* `md_text`: a value inside Markdown prose or a table cell. HTML's specials become character references
  (no tag, attribute or entity survives), and so do the Markdown characters that could start a link, an
  image, code, emphasis or a table cell (`[`, `]`, backticks, `*`, `|`, a word-edge `_`, `\\`). What
  renders is the value's own text, on the docs site (Python-Markdown) and on GitHub alike.
* `md_code`: a value shown as code (a command, an override): `<code>` around `md_text`, which no backtick,
  pipe or newline in the value can leave.
* `md_fence`: a block of preformatted text (the quick start's table), in a fence longer than any run of
  backticks inside it.
* `html_text`: a value in HTML text or a quoted attribute (`report.html`).

`markdown_table` (page.py) escapes every cell with `md_text` but in the columns it is told the code
composed as Markdown from escaped parts.
"""

from __future__ import annotations

import html
import re


# A Markdown character that can change what follows it, as a character reference: Python-Markdown and
# GitHub both render "&#91;" as "[" and never parse it as syntax. `_` only matters at a word's edge
# (intraword underscores are literal in both), so "collapsed_at_init" stays readable in the source.
_MARKDOWN_SPECIAL = re.compile(r"[\\`*|\[\]~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def html_text(value: object) -> str:
    """`value` as HTML text or a quoted attribute's value."""
    return html.escape(str(value), quote=True)


def md_text(value: object) -> str:
    """`value` as Markdown that renders as exactly its text, on one line (a newline would end a table row)."""
    text = html.escape(str(value), quote=False).replace("\r", " ").replace("\n", " ")  # quotes: not in a tag
    return _MARKDOWN_SPECIAL.sub(lambda m: f"&#{ord(m.group())};", text)


def md_code(value: object) -> str:
    """`value` as inline code."""
    return f"<code>{md_text(value)}</code>"


def md_fence(text: str, info: str = "") -> str:
    """`text` as a fenced block, whatever it holds: the fence is longer than its longest run of backticks."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"
