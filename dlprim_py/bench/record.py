"""``--json FILE``: the device, driver, library version and commit, and every figure."""
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from ..version import __version__

SCHEMA = 1


def source_commit():
    """(commit hash, dirty flag) of the checkout the library runs from, or (None, None)."""
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        commit = head.stdout.strip()
        # A copy of a working tree without its history answers "HEAD" and fails.
        if head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", commit):
            return None, None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                 "dlprim_py", "kernels"], capture_output=True, text=True,
                                timeout=10).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def geomean(values):
    """Geometric mean of the positive values (ratios of times; zeros and None, which stand for
    cases that were skipped or failed, are left out); NaN when none is left."""
    kept = [float(v) for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else float("nan")


def measured_commit(given=None):
    """The commit a benchmark script records: ``given`` (its --commit), else ``DLPRIM_COMMIT``,
    else the checkout's HEAD, else "unknown" (a copy of the tree without its history, such as
    the one a lent GPU machine receives)."""
    return given or os.environ.get("DLPRIM_COMMIT") or source_commit()[0] or "unknown"


def device_record(ctx):
    info = ctx.info
    return {
        "name": info.name, "vendor": info.vendor, "platform": info.platform_name,
        "platform_version": info.platform_version, "version": info.version,
        "driver_version": info.driver_version, "is_gpu": info.is_gpu,
        "compute_units": info.compute_units, "global_mem_bytes": info.global_mem_size,
        "local_mem_bytes": info.local_mem_size, "max_work_group_size": info.max_work_group_size,
        "profiling": ctx.profiling,
    }


def host_record():
    import numpy
    import pyopencl
    return {
        "machine": platform.machine(), "system": platform.system(), "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "numpy": numpy.__version__,
        "pyopencl": pyopencl.VERSION_TEXT,
        # Other work on the host skews CPU-device and CPU-baseline times: say how busy it was.
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def build_record(bench, rows, options, torch_info, elapsed_s, commit=None):
    """The JSON record of a run; ``commit`` names the source when the tree has no git history
    (else it is read from git)."""
    found, dirty = source_commit()
    if commit is None:
        commit = found
    elif found is not None and found != commit:
        dirty = True
    return {
        "schema": SCHEMA,
        "library": {"name": "dlprim_py", "version": __version__, "commit": commit, "dirty": dirty},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_record(bench.ctx),
        "host": host_record(),
        "torch": torch_info,
        "options": options,
        "peaks": dict(bench.peaks),
        "elapsed_s": round(elapsed_s, 2),
        "rows": [r.as_dict() for r in rows],
    }


def write_json(path, record):
    """Write ``record`` to ``path`` (atomically: a temporary file renamed into place)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=_plain) + "\n")
    os.replace(tmp, path)


def _plain(value):
    """JSON for numpy scalars and anything else a params dict may hold."""
    try:
        import numpy as np
        if isinstance(value, np.generic):
            return value.item()
    except ImportError:
        pass
    return str(value)
