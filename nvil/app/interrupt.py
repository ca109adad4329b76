"""Ctrl-C during training: finish the step, save a checkpoint, then stop (``nvil.app.loop.fit``)."""

from __future__ import annotations

import signal
import threading


class InterruptFlag:
    """Ctrl-C (SIGINT) during training sets a flag that the loop reads between steps, so the checkpoint it then
    writes is of a whole step; a second Ctrl-C interrupts at once. Off under torchrun, where the ranks could read
    the flag at different steps, and off the main thread, where Python allows no signal handlers."""

    def __init__(self, enabled: bool = True) -> None:
        self.requested = False
        self.previous = None
        if enabled and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
