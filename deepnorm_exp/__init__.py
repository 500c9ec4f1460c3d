"""deepnorm_exp: a depth-scaling experiment harness for Transformer normalization schemes."""

from .build import build_model
from .compose import compose

__all__ = ["compose", "build_model"]
