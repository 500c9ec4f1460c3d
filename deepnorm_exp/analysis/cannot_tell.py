"""A claim check's fourth answer: the data cannot tell.

A check answers met (True), not met (False), or one of two kinds of no answer, which the page keeps apart:

* None, "not testable here": the study cannot test the claim in this setting (no run diverged, the instrument
  saturated, the budget rather than the scheme decides, a run or record is missing);
* CANNOT_TELL, "the data cannot tell": the measurements exist but the claim and its reverse both fit them (the
  seeds' ranges overlap, two bounds tie, a difference within the test's standard errors, an optimum that may
  lie past the end of the grid it was tuned on). More seeds or rates could decide it.

"Not met" is kept for the reverse shown: a reader told "not reproduced" is told the data speak against the claim.
"""

from __future__ import annotations

from typing import Optional, Union


class CannotTell:
    """The one CANNOT_TELL. It has no truth value: `if met:` on it is a bug (it would read as met or not met), so
    code compares with `is`."""
    __slots__ = ()

    def __bool__(self) -> bool:
        raise TypeError("CANNOT_TELL is neither met nor not met: compare with `is CANNOT_TELL`")

    def __repr__(self) -> str:
        return "CANNOT_TELL"


CANNOT_TELL = CannotTell()
Met = Optional[Union[bool, CannotTell]]  # a check's answer: met, not met, not testable (None) or CANNOT_TELL


def every(answers: list[Met]) -> Met:
    """Several comparisons that must all hold: one surely fails, False; all hold, True; one cannot tell,
    CANNOT_TELL; else (one not testable, or none made) None."""
    if any(a is False for a in answers):
        return False
    if answers and all(a is True for a in answers):
        return True
    return CANNOT_TELL if any(a is CANNOT_TELL for a in answers) else None
