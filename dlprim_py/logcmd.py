"""``DLPRIM_LOG_CMD=1``: each operator call logs the equivalent ``dlprim-driver`` command line
(MIOpenDriver's syntax), so that a slow or wrong call can be reproduced on its own.

A line carries every flag the driver needs to make the same call: the shapes, the options
(a convolution's bias as ``-b 1``, a forward convolution with an activation or a residual as
CBAInfer's conv_bias_activation), an algorithm the call forced (``-S``) and find mode
(``-s 1``); it ends with ``-t 1``, so that the driver times the call as well as verifying it
(drop it to verify only). What of a call no driver flag expresses (alpha/beta scaling, packed
strides a GEMM did not use) is named after a ``#``, which a shell and ``driver.split_logged``
read as a comment. The environment's call switches (DLPRIM_*_ALGO, DLPRIM_FIND_MODE) apply to
the driver as to the program that logged the line."""
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


def command_line(family, flags, not_carried=()):
    """``dlprim-driver <family> -f v ... -t 1 [# not carried: ...]``.

    ``flags``: MIOpenDriver flag letters (without the dash) or long names to values, in the
    order to print; ``-t 1`` follows unless ``flags`` has "t". ``not_carried``: phrases naming
    what of the call the flags do not express."""
    parts = ["dlprim-driver", family]
    for flag, value in dict(flags, **({} if "t" in flags else {"t": 1})).items():
        parts += [f"-{flag}" if len(flag) == 1 else f"--{flag}", str(value)]
    line = " ".join(parts)
    if not_carried:
        line += "  # not carried: " + ", ".join(not_carried)
    return line


def log_command(family, flags, not_carried=()):
    """Print ``DLPRIM_LOG_CMD: `` and ``command_line(family, flags, not_carried)`` to stderr
    when DLPRIM_LOG_CMD is set (and not inside ``quiet()``)."""
    if not config.log_cmd() or getattr(_state, "quiet", False):
        return
    print("DLPRIM_LOG_CMD: " + command_line(family, flags, not_carried), file=sys.stderr,
          flush=True)


def activation_named(desc):
    """(the name a driver flag such as --activation takes, the phrases of ``not_carried``) for
    an activation (an ActivationDesc, or None): parameters other than the mode's own defaults
    have no flag there (bnorm, gemm; CBAInfer has -A -B -G, ``activation_flags``)."""
    if desc is None:
        return "none", []
    from .activation import ActivationDesc
    default = ActivationDesc(desc.mode)
    if (desc.alpha, desc.beta, desc.gamma) == (default.alpha, default.beta, default.gamma):
        return desc.mode.value, []
    return desc.mode.value, [f"{desc.mode.value} alpha {desc.alpha:g} beta {desc.beta:g} "
                             f"gamma {desc.gamma:g}"]


def activation_flags(desc):
    """CBAInfer's flags of an activation (an ActivationDesc or None): --activation and, for
    parameters other than the mode's defaults, -A -B -G."""
    name, other = activation_named(desc)
    flags = {"activation": name}
    if other:
        flags.update(A=desc.alpha, B=desc.beta, G=desc.gamma)
    return flags
