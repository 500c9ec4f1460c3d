import os
import subprocess
import sys
from pathlib import Path

import pytest

# Tests never touch the network: the hub libraries read these when first imported (here, and in every
# subprocess the tests start, which inherits the environment).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent

# A model and data small enough that a run takes a second or two on 2 CPU cores.
TINY = [
    "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.max_seq_len=32",
    "train.seq_len=16", "train.batch_size=4", "train.steps=6", "train.log_every=2", "train.eval_every=3",
    "data.train_sequences=64", "data.eval_sequences=8", "data.vocab_size=32", "data.classes=4",
]


@pytest.fixture
def runs_root(tmp_path):
    return tmp_path / "runs"


@pytest.fixture
def tiny(runs_root):
    """Overrides for a tiny run recorded under a temporary runs root, without W&B."""
    return [*TINY, f"paths.runs={runs_root}", "logger=none"]


def run_cli(*args, timeout=300, env_extra=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "deepnorm_exp", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli
