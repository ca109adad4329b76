"""One writer per run directory: an advisory ``flock`` on ``<run dir>/.nvil.lock``, held for the life of the run.

The kernel drops a ``flock`` when its holder dies, so a killed run never leaves a stale lock; the file's text
(PID, host, start time) only names the holder in the refusal. The lock is taken before the run's config is settled
(so a new run and a resume cannot both decide on an empty directory), and released with the file removed, which
leaves a refused command's directory as it found it. Removing a lock file races with a process that opened it
just before: a holder therefore checks, once granted the lock, that the path still names the file it locked, and
tries again when it does not.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from nvil.core.errors import UserError
from nvil.core.files import writing

LOCK_NAME = ".nvil.lock"


class RunBusy(UserError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """``RunLock(run_dir).acquire()`` or ``RunBusy``; ``release()`` (idempotent) when the run ends."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.fd: int | None = None
        self.created_dir = False

    def acquire(self) -> "RunLock":
        with writing(self.run_dir, "the run directory", "choose a writable hydra.run.dir"):
            # a directory that is not there, or empty (Hydra makes the run directory before the job starts)
            self.created_dir = not self.run_dir.exists() or not any(self.run_dir.iterdir())
            while self.fd is None:
                self.run_dir.mkdir(parents=True, exist_ok=True)  # again: a refused job may have just removed it
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                except FileNotFoundError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    os.close(fd)
                    if e.errno in (errno.EAGAIN, errno.EACCES):
                        raise RunBusy(self._busy()) from None
                    raise
                if _same_file(fd, self.path):
                    self.fd = fd
                else:  # removed by its last holder after we opened it: lock the file now at the path
                    os.close(fd)
            os.ftruncate(self.fd, 0)
            os.write(self.fd, f"PID {os.getpid()} on {socket.gethostname()}, since "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        return self

    def _busy(self) -> str:
        try:
            holder = self.path.read_text().strip() or "a process that has not yet written its name"
        except OSError:
            holder = "another process"
        return (f"{self.run_dir} is in use by another job ({holder}); wait for it to end or stop it, or choose "
                "another hydra.run.dir")

    def release(self, remove_dir: bool = False) -> None:
        """Drop the lock and its file; with ``remove_dir``, also the run directory if this lock created it and it
        is empty (a refused command leaves nothing behind)."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        if remove_dir and self.created_dir:
            try:
                self.run_dir.rmdir()
            except OSError:
                pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
