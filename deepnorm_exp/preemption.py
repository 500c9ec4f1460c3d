"""Preemption: SIGUSR1 or SIGTERM during training checkpoints at the next step boundary, then hands the
signal on.

SLURM (through submitit's `signal_delay_s`) sends SIGUSR1 shortly before a job's time limit, and SIGTERM on
preemption. A signal handler must not save in the middle of an optimizer step, so ours only records the
signal; the `Checkpointer` saves after the step in flight and stops the run, the run writes its records as
`interrupted`, and then `forward()` calls the handler that was installed before ours: under submitit its
checkpoint-and-requeue handler (the requeued job re-runs the command and resumes from the checkpoint);
in a plain process the default action, so the process still ends the way its sender expects.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("deepnorm_exp")

SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class PreemptionGuard:
    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> "PreemptionGuard":
        for signum in SIGNALS:
            try:
                self.previous[signum] = signal.signal(signum, self._record)
            except ValueError:  # not the main thread (e.g. a notebook's worker thread): no signals there
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _record(self, signum: int, frame) -> None:
        if self.signum is None:
            log.warning("received %s: checkpointing after the current step, then stopping",
                        signal.Signals(signum).name)
        self.signum = signum

    def stop_reason(self) -> str | None:
        return None if self.signum is None else f"interrupted by {signal.Signals(self.signum).name}"

    def forward(self) -> None:
        """After the records are written: let the previous owner of the signal act on it."""
        if self.signum is None:
            return
        # Under submitit SIGUSR1's previous handler requeues; SIGTERM's only logs, so both go to SIGUSR1's.
        requeue = self.previous.get(signal.SIGUSR1)
        if callable(requeue):
            requeue(signal.SIGUSR1, None)
            return
        handler = self.previous.get(self.signum, signal.SIG_DFL)
        if callable(handler):
            handler(self.signum, None)
        elif handler == signal.SIG_DFL:
            signal.signal(self.signum, signal.SIG_DFL)
            os.kill(os.getpid(), self.signum)
