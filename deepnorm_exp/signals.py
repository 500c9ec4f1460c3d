"""The signals that ask a process to stop, and handing one on to the handler that was there before ours.

Below everything that catches them: a run's preemption guard (lifecycle/preemption.py), a sweep's joblib
workers (sweeps/hydra_callbacks.py), a tokenizer being trained (data/tokenizer.py).
"""

from __future__ import annotations

import os
import signal

# SLURM's time-limit warnings (submitit asks for SIGUSR2; older setups SIGUSR1), preemption, and Ctrl-C
SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def act_as_before(signum: int, handler) -> None:
    """What `handler` (a signal's handler before ours) would have done with `signum`: call it, or for the
    default action, take it (the process ends as its sender expects); an ignored signal stays ignored."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
