"""How a checkpoint that cannot be read is said: one line naming it and the way out. Below both the
one-process and the sharded checkpoint, and below dcp_safety.py, which all three use."""

from __future__ import annotations

from pathlib import Path

from ..errors import RecordError


def weights_only_refusal(e: BaseException) -> str:
    """What torch's weights-only refusal says was refused: its first line is advice to load the file
    unsafely and its last a link; the line between names the global or opcode."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    middle = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation"))]
    return (middle or lines or [type(e).__name__])[0]


def damaged(path: Path, why: str) -> RecordError:
    """A checkpoint (file or sharded directory) that cannot be read, why, and the way out."""
    return RecordError(f"{path} is damaged ({why}); delete it to start this run over, or resume=false")
