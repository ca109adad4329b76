"""Writes that survive a shared file system: one-line errors for a full disk or a read-only directory, appends
that are whole lines or nothing, and advisory locks.

- ``writing(path, what)``: a context in which an ``OSError`` from a full disk (ENOSPC, EDQUOT), a read-only file
  system (EROFS) or a permission (EACCES, EPERM) becomes ``StorageError``, one line naming the path.
- ``append_line(path, text)``: one JSON line appended under an exclusive ``flock``, in one ``os.write`` on an
  ``O_APPEND`` descriptor; a short or failed write is cut back to the file's previous length, and a file left
  unterminated by an earlier writer gets its newline first, so the next record is never glued onto a torn one.
- ``read_json_lines(path)``: the records of such a file, and the numbers of the lines that do not parse (torn by
  a killed writer), which a reader reports and skips.
- ``locked(path)``: an exclusive ``flock`` on ``path`` for the length of a ``with`` block (blocking).
- ``replace_atomically(path, text)``: ``text`` written to a temporary file beside ``path``, flushed, then renamed
  over it, so a reader sees the old file or the new one, never a part; the temporary file goes on a failure.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path

from nvil.core.errors import StorageError

# errno -> (what happened, what to do)
WRITE_FAILURES = {
    errno.ENOSPC: ("the disk is full", "free space there or write elsewhere"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space there or write elsewhere"),
    errno.EROFS: ("the file system is read-only", "write elsewhere"),
    errno.EACCES: ("permission denied", "write elsewhere or fix the directory's permissions"),
    errno.EPERM: ("operation not permitted", "write elsewhere or fix the directory's permissions"),
}


def is_write_failure(e: BaseException) -> bool:
    """An ``OSError`` that says the storage refused a write (full, read-only, not permitted)."""
    return isinstance(e, OSError) and e.errno in WRITE_FAILURES


def describe_write_failure(e: OSError, path, what: str) -> str:
    """``cannot write <what> <path>: <the reason>``, one line."""
    reason = WRITE_FAILURES.get(e.errno, (e.strerror or type(e).__name__, ""))[0]
    return f"cannot write {what} {e.filename or path}: {reason}"


@contextmanager
def writing(path, what: str, advice=""):
    """Turn a refused write inside the block into ``StorageError``. ``advice``: what to do (a string, or a function
    giving one, called only on a failure); default the errno's."""
    try:
        yield
    except OSError as e:
        if not is_write_failure(e):
            raise
        advice = (advice() if callable(advice) else advice) or WRITE_FAILURES[e.errno][1]
        raise StorageError(f"{describe_write_failure(e, path, what)}; {advice}") from None


def check_writable(path, what: str, advice: str) -> None:
    """``StorageError`` when ``path`` (or, where it does not exist yet, its nearest existing parent) is on a
    read-only file system, not writable by this process, a file, or (for a directory yet to be made) a place where
    no directory can be created, as in /proc; nothing is left behind (a probe directory is made and removed)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise StorageError(f"cannot write {what} {path}: {p} is a file, not a directory; {advice}")
    read_only = os.statvfs(p).f_flag & os.ST_RDONLY
    if read_only or not os.access(p, os.W_OK):
        code = errno.EROFS if read_only else errno.EACCES
        raise StorageError(f"cannot write {what} {path}: {WRITE_FAILURES[code][0]}; {advice}")
    if p != Path(path).absolute():  # a directory to create: can one be made here at all (/proc, /sys cannot)?
        probe = p / f".nvil-probe-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
        except OSError as e:
            raise StorageError(f"cannot write {what} {path}: no directory can be created in {p} "
                               f"({os.strerror(e.errno) if e.errno else e}); {advice}") from None
        probe.rmdir()


def append_line(path, text: str) -> None:
    """Append ``text`` and a newline to ``path`` as one record: all of it or none of it (see the module)."""
    data = text.rstrip("\n").encode() + b"\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line: end it first
            data = b"\n" + data
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)  # closing releases the lock


def read_json_lines(path) -> tuple[list[dict], list[int]]:
    """(the JSON objects of the file's lines, the 1-based numbers of the lines that are not JSON objects)."""
    records, torn = [], []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                torn.append(number)
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                torn.append(number)
    return records, torn


@contextmanager
def locked(path):
    """An exclusive advisory lock on ``path`` (created if need be) while the block runs; blocks until granted."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def lock_path(path) -> Path:
    """The lock file that guards ``path``: ``.<name>.lock`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


def replace_atomically(path, text: str) -> None:
    """Replace ``path``'s contents with ``text`` all at once (see the module)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "x") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
