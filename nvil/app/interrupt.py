"""Stopping a training run on a signal: finish the step, save a checkpoint, then stop (``nvil.app.loop.fit``).

Ctrl-C (SIGINT), SIGTERM (how SLURM preempts a job, and how ``scancel``, torchrun's agent and submitit stop one)
and SIGUSR1 (the warning that SLURM's ``--signal`` sends before a time limit) all set a flag that the loop reads
between steps, so the checkpoint written then is of a whole step. Under submitit, its preemption signal
(``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default) is caught the same way, and once the checkpoint is on disk the
launcher's own handler is called, which requeues the job (``scontrol requeue`` on SLURM, exit code 144 for
submitit's local executor) and exits.

Otherwise the run exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1), what a
shell, SLURM and torchrun report for a process stopped by that signal. A second Ctrl-C at least a second after the
first interrupts at once; a repeat within the second is the same keypress forwarded by a launcher (torchrun's agent
passes its own SIGINT on to the workers).

Under torchrun every rank may see the signal at a different step, so the ranks agree on the stop with one
all-reduce of the flag every ``SYNC_EVERY`` steps (``agree``) and all stop at the same step.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from nvil.core import distributed
from nvil.core.errors import UserError

SYNC_EVERY = 10  # steps between the ranks' agreements on a stop, under torchrun
REPEAT_WINDOW = 1.0  # seconds: a second SIGINT sooner than this is the first one forwarded
log = logging.getLogger("nvil")


class Stopped(UserError):
    """A signal stopped training after a checkpoint was saved: exit code 128 + the signal's number. ``quiet``: the
    line is rank 0's to print (under torchrun the other ranks stop without repeating it)."""

    def __init__(self, message: str, signum: int, quiet: bool = False) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
        self.quiet = quiet


def launcher_signal() -> int | None:
    """The signal submitit's job environment handles as preemption (it requeues the job), when under submitit."""
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


class StopRequest:
    """The signals of the module's docstring, caught while the training loop runs (``restore`` gives the previous
    handlers back). ``signum``: the first signal received (None: none yet)."""

    def __init__(self, enabled: bool = True) -> None:
        self.signum: int | None = None
        self.agreed: int | None = None  # under torchrun: the signal some rank received, once the ranks agree
        self.received_at = 0.0
        self.previous: dict[int, object] = {}
        if not enabled or threading.current_thread() is not threading.main_thread():
            return  # Python allows signal handlers on the main thread only
        for signum in {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, launcher_signal()} - {None}:
            self.previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.received_at = signum, now
        elif signum == signal.SIGINT == self.signum and now - self.received_at >= REPEAT_WINDOW:
            raise KeyboardInterrupt

    def requested(self, step: int, d: distributed.Dist) -> int | None:
        """The signal to stop on before step ``step + 1`` (None: go on). Under torchrun the ranks' flags are
        combined at every ``SYNC_EVERY``-th step (a collective: every rank calls this at every step)."""
        if not d.enabled:
            return self.signum
        if self.agreed is None and step % SYNC_EVERY == 0:
            flag = torch.tensor([self.signum or 0], dtype=torch.int64)
            distributed.all_reduce_max(flag)
            self.agreed = int(flag.item()) or None
        return self.agreed

    def name(self, signum: int) -> str:
        return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name

    def hand_over(self, signum: int) -> None:
        """For the launcher's preemption signal, call the handler it had installed (submitit's requeue), which
        exits; otherwise nothing."""
        previous = self.previous.get(signum)
        self.restore()
        if signum == launcher_signal() and callable(previous):
            previous(signum, None)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}


def stopped(stop: StopRequest, signum: int, step: int, last_path: Path, run_dir: Path, d: distributed.Dist,
            last: bool = False) -> None:
    """After a signal's checkpoint: say how to continue, hand the signal to the launcher that asked for it
    (submitit requeues the job and exits), or raise ``Stopped`` (exit code 128 + the signal's number)."""
    where = f"step {step}, the run's last" if last else f"step {step}"
    line = (f"stopped by {stop.name(signum)} at {where}; saved {last_path}; continue with: python train.py "
            f"hydra.run.dir={run_dir} trainer.resume=true")
    log.warning(line)
    if signum == launcher_signal():
        if d.is_main:
            print(f"{line} (requeued by the launcher)", file=sys.stderr, flush=True)
        stop.hand_over(signum)
    raise Stopped(line, signum, quiet=not d.is_main)
