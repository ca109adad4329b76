"""A per-user secret key kept outside the files it authenticates: the key of the HMAC-SHA256 (RFC 2104) that caches
beside a checkpoint put on their entries, so that an entry anyone could edit and re-digest is not trusted.

The key lives in ``$NVIL_CACHE_KEY_FILE``, else ``log_z.key`` in the project's cache directory (``$NVIL_CACHE``,
default ``~/.cache/nvil``): ``KEY_BYTES`` random
bytes, mode 0600, owned by the user, made on first use (never on import). Each creator writes its own temporary
file (``os.open`` with ``O_CREAT | O_EXCL``, mode 0600) and publishes it with ``os.link``, which fails where a key
already exists: a reader never sees a half-written key, and two processes that create it at once both end with
the one that landed first.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

KEY_BYTES = 32


class KeyUnavailable(Exception):
    """The key cannot be made or read, or may not be trusted (its file is open to others): one line saying why."""


def key_file() -> Path:
    """``$NVIL_CACHE_KEY_FILE``, else ``log_z.key`` in ``$NVIL_CACHE`` (default ``~/.cache/nvil``)."""
    explicit = os.environ.get("NVIL_CACHE_KEY_FILE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("NVIL_CACHE") or Path.home() / ".cache" / "nvil") / "log_z.key"


def user_key(path: Path | None = None) -> bytes:
    """The key in ``path`` (default ``key_file()``), made there first when there is none; ``KeyUnavailable`` when
    it cannot be made or read, or its file is not the user's alone."""
    path = Path(path) if path is not None else key_file()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        _create(path)
        return _read(path)
    except OSError as e:
        raise KeyUnavailable(f"cannot create the cache key {path}: {e.strerror or e}") from None


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise KeyUnavailable(f"cannot read the cache key {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyUnavailable(f"the cache key {path} is not a regular file")
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise KeyUnavailable(f"the cache key {path} is open to other users (owner {st.st_uid}, mode "
                                 f"{stat.S_IMODE(st.st_mode):o}); remove it, and a new one is made with mode 600")
        data = os.read(fd, 4 * KEY_BYTES)
    finally:
        os.close(fd)
    if len(data) < KEY_BYTES:
        raise KeyUnavailable(f"the cache key {path} holds {len(data)} bytes, fewer than {KEY_BYTES}; remove it, "
                             "and a new one is made")
    return data


def _create(path: Path) -> None:
    """Publish a fresh key at ``path`` unless one is there already (see the module)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            key = secrets.token_bytes(KEY_BYTES)
            if os.write(fd, key) != len(key):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))  # a short write
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process's key landed first: this one uses it too
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
