"""The host memory a text-files source (`data=text`) takes, from the sizes of its files: nothing is read.

Tokens are bounded by the files' bytes: the byte tokenizer makes one token per UTF-8 byte of the decoded
text plus an end-of-document token where the line break was (a UTF-8 file: at most its bytes, plus one per
file); a file in another encoding re-encodes to at most 2 (latin-1) or 3 (any other) UTF-8 bytes a byte; BPE
makes fewer tokens than bytes. Building the cache entry (tokenizing, the token stream, packing, counting,
`datasets` hashing the in-memory blocks) peaks at 46-66 bytes of resident memory a byte of a UTF-8 corpus,
not in proportion: buffers grow by doubling (measured over 1-21 MB corpora: 62 at 1 MB, 55 at 2 MB, 66 at
3.1 MB, 56 at 4.2 MB, 52 at 7 MB, 46 at 21 MB; tests/test_resources.py holds the bound at 3.1 MB). Training
then reads the training blocks memory-mapped (the page cache, not the run's memory) and holds only the eval
blocks as int64 tensors.
"""

from __future__ import annotations

import codecs
import os
from typing import Any

from . import HostBytes

BUILD_BYTES_PER_TOKEN = 72  # resident bytes while the entry is built, a token (the most measured: 66)


def utf8_bytes_per_byte(encoding: str) -> int:
    name = codecs.lookup(encoding).name
    if name in ("utf-8", "ascii"):
        return 1
    return 2 if name == "iso8859-1" else 3


def token_bound(paths: list[str], encoding: str) -> int:
    """At most how many tokens the files make (their bytes, re-encoded to UTF-8, plus one a file)."""
    return sum(os.path.getsize(path) for path in paths) * utf8_bytes_per_byte(encoding) + len(paths)


def host_bytes(cfg: Any, paths: list[str]) -> HostBytes:
    """What `TextFiles.host_bytes` returns for its config and its resolved files: building the cache entry,
    and the eval blocks a run holds (a cached entry is only memory-mapped: the estimate is the build's, an
    upper bound)."""
    tokens = token_bound(paths, cfg.encoding)
    held = 8 * (cfg.seq_len + 1) * min(cfg.eval_blocks, tokens // cfg.seq_len + 1)
    build = BUILD_BYTES_PER_TOKEN * tokens
    return HostBytes(peak=max(build, held), held=held, parts={"files": build})
