"""The find-db: per-device records of which algorithm won a benchmark for a problem.

One JSON file per device (``ctx.info.key()``, hashed into the file name) under
``config.cache_dir()/finddb``, mapping canonical problem strings to ``{"algo": name,
"time_ms": t}``. Writes merge with what is on disk under an exclusive lock file and land through
a temporary file and ``os.replace``, so concurrent processes never read half a file and do not
drop each other's entries; readers take no lock.
"""
import contextlib
import hashlib
import json
from pathlib import Path

from . import config
from .files import atomic_write, warn_once

try:
    import fcntl
except ImportError:      # Windows: the merge is still atomic, only a racing write may be lost
    fcntl = None


def path_for(ctx):
    """The find-db file of ``ctx``'s device and driver."""
    digest = hashlib.sha256(ctx.info.key().encode("utf-8")).hexdigest()[:24]
    return Path(config.cache_dir()) / "finddb" / f"{digest}.json"


@contextlib.contextmanager
def _locked(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _read(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class FindDb:
    """Records for one device. ``lookup(key)`` -> algorithm name or None;
    ``store(key, algo, time_ms)`` merges one record into the file."""

    def __init__(self, ctx):
        self.path = path_for(ctx)
        self.device = ctx.info.key()
        self._records = None
        self._mtime = None

    def _load(self):
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            mtime = None
        if self._records is None or mtime != self._mtime:
            self._records = _read(self.path).get("records", {})
            self._mtime = mtime
        return self._records

    def lookup(self, key):
        record = self._load().get(key)
        return record.get("algo") if isinstance(record, dict) else None

    def records(self):
        return dict(self._load())

    def store(self, key, algo, time_ms):
        if config.no_cache():
            self._records = dict(self._load(), **{key: {"algo": algo, "time_ms": time_ms}})
            return
        try:
            with _locked(self.path):
                data = _read(self.path)
                records = data.get("records", {})
                records[key] = {"algo": algo, "time_ms": float(time_ms)}
                atomic_write(self.path, json.dumps({"device": self.device, "records": records},
                                                   indent=1, sort_keys=True))
        except OSError as e:
            # A read-only cache folder costs a re-find next time, never a failure; said once.
            warn_once(self.path.parent, f"dlprim_py: find-db folder {self.path.parent} cannot "
                                        f"be written ({e}); find results are not kept")
        self._records = None


def for_context(ctx):
    """The FindDb of a context (one per context)."""
    db = ctx.memo.get("finddb")
    if db is None:
        db = ctx.memo["finddb"] = FindDb(ctx)
    return db
