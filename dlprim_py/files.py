"""Files shared between processes: program binaries, find results, tuning databases."""
import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path, data):
    """Write ``data`` (bytes or str) to ``path`` so that a concurrent reader sees the old file or
    the new one, never a part: a temporary file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
