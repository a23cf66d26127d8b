"""``DLPRIM_LOG_CMD=1``: each operator call logs the equivalent ``dlprim-driver`` command line
(MIOpenDriver's syntax), so that a slow or wrong call can be reproduced on its own."""
import contextlib
import sys
import threading

from . import config

_state = threading.local()


@contextlib.contextmanager
def quiet():
    """Log nothing inside: an operator made of others (a fusion plan running its convolution)
    logs its own line only, the same on every call."""
    outer = getattr(_state, "quiet", False)
    _state.quiet = True
    try:
        yield
    finally:
        _state.quiet = outer


def log_command(family, flags):
    """Print ``dlprim-driver <family> -f v ...`` to stderr when DLPRIM_LOG_CMD is set.

    ``flags``: MIOpenDriver flag letters (without the dash) to values, in the order to print.
    """
    if not config.log_cmd() or getattr(_state, "quiet", False):
        return
    parts = ["dlprim-driver", family]
    for flag, value in flags.items():
        parts += [f"-{flag}" if len(flag) == 1 else f"--{flag}", str(value)]
    print("DLPRIM_LOG_CMD: " + " ".join(parts), file=sys.stderr, flush=True)
