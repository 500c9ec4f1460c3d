"""Preemption and Ctrl-C: SIGUSR1, SIGUSR2, SIGTERM or SIGINT during training checkpoints at the next step
boundary, then hands the signal on. A second Ctrl-C stops at once (KeyboardInterrupt).

SLURM sends a signal `signal_delay_s` before a job's time limit (submitit asks for SIGUSR2 since 1.5, or
what $SUBMITIT_PREEMPT_SIGNAL names; older setups use SIGUSR1), and SIGTERM on preemption. A signal
handler must not save in the middle of an optimizer step, so ours only records the signal; the
`Checkpointer` saves after the step in flight and stops the run, the run writes its records as
`interrupted`, and then `forward()` calls the handler that was installed before ours: under submitit its
checkpoint-and-requeue handler (the requeued job re-runs the command and resumes from the checkpoint);
in a plain process the default action, so the process still ends the way its sender expects.
"""

from __future__ import annotations

import logging
import os
import signal

from ..signals import SIGNALS, act_as_before

log = logging.getLogger("deepnorm_exp")


def submitit_signal() -> int:
    """The signal submitit's requeue handler listens to (submitit's own rule)."""
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)


class PreemptionGuard:
    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> "PreemptionGuard":
        for signum in SIGNALS:
            if signum == signal.SIGINT and signal.getsignal(signum) == signal.SIG_IGN:
                continue  # a process told to ignore Ctrl-C (a pool worker) keeps ignoring it
            try:
                self.previous[signum] = signal.signal(signum, self._record)
            except ValueError:  # not the main thread (e.g. a notebook's worker thread): no signals there
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _record(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: the user does not want to wait for the step
        if self.signum is None:
            log.warning("received %s: checkpointing after the current step, then stopping%s",
                        signal.Signals(signum).name,
                        " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else "")
        self.signum = signum

    def stop_reason(self) -> str | None:
        return None if self.signum is None else f"interrupted by {signal.Signals(self.signum).name}"

    def forward(self) -> None:
        """After the records are written: let the previous owner of the signal act on it."""
        if self.signum is None:
            return
        # Under submitit, its signal's previous handler checkpoints-and-requeues (SIGTERM's only logs):
        # every preemption signal goes there. A Ctrl-C is the user's, never a preemption.
        requeue = self.previous.get(submitit_signal())
        if callable(requeue) and self.signum != signal.SIGINT:
            requeue(submitit_signal(), None)
            return
        act_as_before(self.signum, self.previous.get(self.signum, signal.SIG_DFL))
