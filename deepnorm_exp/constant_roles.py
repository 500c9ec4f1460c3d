"""The constants a scheme reports in summary.json, named by the role each plays in a block, so that a key means
one thing whatever the scheme: DeepNorm's alpha multiplies the residual stream, CompleteP's multiplies the
branch, Sub-LN's beta is an init gain. A learned one is reported at its value at init. Torch-free: the records'
schema reads it (the analysis's tables keep each record's own keys: `alpha.decoder` in records from before)."""

from __future__ import annotations

from typing import Optional

ROLES = {
    "residual_multiplier": "multiplies the residual stream x where the branch joins it (DeepNorm's alpha, "
                           "DeepScaleLM's lambda, Admin's omega)",
    "branch_multiplier": "multiplies the branch G(x) (CompleteP's m^-alpha, DeepScaleLM's beta; learned: nGPT's "
                         "eigen learning rate, ReZero's alpha, SkipInit's a_l, at init)",
    "init_gain": "scales the initialisation of the projections the scheme names (DeepNorm's beta, Sub-LN's and "
                 "T-Fixup's gains)",
}

# Records written before the names by role called the constants `alpha` and `beta`; what each meant, per scheme
# (frozen: a scheme added since never wrote them). None: a placeholder 1 the scheme did not use.
LEGACY_NAMES = ("alpha", "beta")
_LEGACY_DEFAULT = {"alpha": "residual_multiplier", "beta": "init_gain"}
_LEGACY = {"completep": {"alpha": "branch_multiplier", "beta": None},
           "depth_mup": {"alpha": "branch_multiplier", "beta": None},  # CompleteP's, inherited
           "ngpt": {"alpha": "branch_multiplier", "beta": None},
           "deepscalelm": {"alpha": "residual_multiplier", "beta": "branch_multiplier"}}


def by_role(summary: dict) -> dict[str, dict[str, float]]:
    """A summary's constants, {role: {stack: value}}, a record from before the names by role translated (a
    role the record does not give is left out)."""
    found = {role: summary[role] for role in ROLES if isinstance(summary.get(role), dict)}
    legacy = _LEGACY.get(summary.get("norm"), _LEGACY_DEFAULT)
    for old in LEGACY_NAMES:
        role: Optional[str] = legacy.get(old)
        if role is not None and role not in found and isinstance(summary.get(old), dict):
            found[role] = summary[old]
    return {role: found[role] for role in ROLES if role in found}
