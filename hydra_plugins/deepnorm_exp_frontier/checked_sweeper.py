"""`hydra/sweeper=checked`: Hydra's basic sweeper, less its second composition of jobs the pre-flight
check has already composed and checked. The command line launches a sweep of Hydra's basic sweeper (the
default) with it (`preflight.checked_sweeper_override`); a sweeper chosen otherwise is launched as it is.

Before launching a batch, Hydra's BasicSweeper composes every job's config once more to validate it (5.5 s
of the 10.7 s from `python -m deepnorm_exp -m experiment=paper_depth_sweep` to "Launching 54 jobs" here).
`deepnorm_exp/preflight.py` has done exactly that for every job of the command, with Hydra's own functions
(tests/test_preflight.py compares the two compositions), and it records the override lists it checked; a
job it did not check (a sweep started without the pre-flight, from Python) is validated as Hydra does.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from ._hydra_internals import basic_sweeper

BasicSweeper, BasicSweeperConf = basic_sweeper()  # as this module runs: Hydra's scan re-runs both modules


@dataclass
class CheckedSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.deepnorm_exp_frontier.checked_sweeper.CheckedSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="checked", node=CheckedSweeperConf,
                             provider="deepnorm_exp")


class CheckedSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch) -> None:
        from deepnorm_exp.preflight import was_checked

        unchecked = [job for job in batch if not was_checked(job)]
        if unchecked:
            super().validate_batch_is_legal(unchecked)
