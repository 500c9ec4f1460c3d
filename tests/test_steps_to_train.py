"""Steps-to-train (issue 39, slow or unstable): the first evaluation at which a run had trained, recorded
in every summary, and `train.stop_when_trained`, which ends the run there."""

import pytest

from deepnorm_exp.lifecycle.run import run_experiment
from deepnorm_exp.train.callbacks import TrainedAt

from test_faults import config


class Steps:
    def __init__(self):
        self.record, self.reason = {}, None

    def request_stop(self, reason):
        self.reason = self.reason or reason


class Out:
    def __init__(self, step):
        self.step = step


@pytest.mark.parametrize("stop", [False, True])
def test_the_first_evaluation_that_trained_is_kept_and_stops_the_run_only_when_asked(stop):
    watch, trainer = TrainedAt(lambda loss: loss < 3.0, stop), Steps()
    for step, loss in ((1, None), (2, 3.5), (3, None), (4, 2.9), (5, None), (6, 2.5)):
        trainer.record = {} if loss is None else {"eval_loss": loss}
        watch.on_step_end(trainer, Out(step))
    assert watch.step == 4 and watch.state_dict() == {"step": 4}
    assert trainer.reason == ("trained at step 4 (train.stop_when_trained)" if stop else None)
    resumed = TrainedAt(lambda loss: True, stop)
    resumed.load_state_dict({"step": 4})
    trainer.record = {"eval_loss": 1.0}
    resumed.on_step_end(trainer, Out(8))
    assert resumed.step == 4  # the first time it trained, not the latest


def test_a_run_that_trains_records_when_and_stops_there_when_asked(tmp_path):
    common = ["train.steps=60", "train.eval_every=5", "train.lr=1e-2", "train.warmup_steps=10"]
    full = run_experiment(config(tmp_path / "full", *common), progress=False)
    assert full["status"] == "completed" and full["steps_completed"] == 60
    trained_at = full["trained_at_step"]
    assert trained_at is not None and trained_at % 5 == 0 and trained_at < 60
    stopped = run_experiment(config(tmp_path / "stopped", *common, "train.stop_when_trained=true"), progress=False)
    assert stopped["status"] == "completed" and stopped["trained"]
    assert stopped["trained_at_step"] == stopped["steps_completed"] == stopped["eval_step"] == trained_at
