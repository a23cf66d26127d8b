"""Files shared between processes: program binaries, find results, tuning databases."""
import contextlib
import os
import secrets
import warnings
from pathlib import Path

from .errors import CacheWarning


def atomic_write(path, data):
    """Write ``data`` (bytes or str) to ``path`` so that a concurrent reader sees the old file or
    the new one, never a part: a temporary file in the same folder, then a rename.

    The file gets the permissions ``open`` gives (0666 less the umask), not ``mkstemp``'s 0600,
    so that a cache folder shared by a group is usable by the group when its umask says so.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    # O_EXCL and a random name: the temporary file is this writer's alone.
    tmp = path.parent / f".tmp-{secrets.token_hex(12)}{path.suffix}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_warned = set()


def warn_once(path, message):
    """Warn (``CacheWarning``) about the cache file or folder ``path``, once per process and
    path: the library carries on without it, and a warning per build would drown the rest."""
    key = os.fspath(path)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, CacheWarning, stacklevel=3)
