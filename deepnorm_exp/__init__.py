"""deepnorm_exp: a depth-scaling experiment harness for Transformer normalization schemes."""

from . import moved
from .build import build_model
from .compose import compose

moved.install()

__all__ = ["compose", "build_model", "load_runs"]


def __getattr__(name: str):
    # deepnorm_exp.load_runs without importing pandas and matplotlib on every command-line start
    if name == "load_runs":
        from .analysis import load_runs

        return load_runs
    raise AttributeError(f"module 'deepnorm_exp' has no attribute {name!r}")
