import os
from conftest import config
from deepnorm_exp.lifecycle.run import run_experiment

def test_env(tmp_path):
    run_experiment(config(tmp_path, "logger=wandb"), progress=False)
    assert os.environ.get("WANDB_SERVICE")
