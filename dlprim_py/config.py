"""Every environment variable the library reads, in one place.

The call switches (DLPRIM_LOG_CMD, DLPRIM_FIND_MODE, DLPRIM_*_ALGO, DLPRIM_CHECK_NUMERICS,
DLPRIM_WORKSPACE_LIMIT, DLPRIM_TF32_EMULATE, DLPRIM_DETERMINISTIC, DLPRIM_BUILD_OPTIONS) are
read once, at the first call that needs one, and again on ``dlprim_py.config.reload()``; the
others where they are used.

DLPRIM_DEVICE      device to use: "P:D" (platform:device indices) or a piece of the device name
DLPRIM_CACHE_DIR   where compiled program binaries and find results are kept
DLPRIM_NO_CACHE    "1": never read or write the on-disk program cache
DLPRIM_DEBUG       "1": print each program build (and cache hits) to stderr
DLPRIM_BUILD_OPTIONS OpenCL build options added to every program build (they enter the program
                   cache's key), e.g. "-cl-opt-disable": kernels compile several times faster
                   and run slower, which suits a test suite of small problems on a CPU device
                   (tests/conftest.py sets that there unless the variable is set). Read with the
                   call switches: set it before the first call, or call reload() after
DLPRIM_BUILD_THREADS how many programs a planner that meets several at once (dp.onnx's, per
                   input shape) builds concurrently (default: the host's cores, 8 at most);
                   "1": one at a time, as they are met
DLPRIM_LOG_CMD     "1": log every operator call as an equivalent dlprim-driver command line
DLPRIM_CHECK_NUMERICS "1": raise at the first dlprim_py.functional call that makes a NaN/inf
                   from finite inputs (a debugging mode: every call waits and reads back)
DLPRIM_FIND_MODE   "immediate" (default) or "find" for algorithm selection
DLPRIM_WORKSPACE_LIMIT MiB of workspace a convolution call may use (default: 256 MiB or the
                   size of the call's output, whichever is larger; 2 GiB at most): an algorithm
                   that needs more runs on the batch in parts that fit
DLPRIM_CONV_ALGO   force one convolution algorithm by name
DLPRIM_TF32_EMULATE "1": the convolution's TF32 algorithms (gemm_tf32, winograd_tf32, ...) apply
                   on devices without TF32 tensor cores too, their mma kernels emulated in
                   portable OpenCL (slow: for testing their addressing and rounding anywhere);
                   TF32 must still be allowed (dlprim_py.backends). Likewise the attention
                   family's "mma" solver (3xTF32, fp32-accurate: no TF32 permission needed)
DLPRIM_DETERMINISTIC "1": no algorithm whose result's last bits vary from run to run (sums in
                   the order atomics land: the attention backward's fused dQ on NVIDIA); the
                   same inputs then give the same bits on every run
DLPRIM_CONV3D_ALGO force one 3-D convolution solver: vol2col_gemm, direct
DLPRIM_GEMM_ALGO   force one GEMM solver: tiled, splitk, small, subgroup, mma, gemv (where it
                   applies: gemv to M == 1 or N == 1)
DLPRIM_NORM_ALGO   force one batch-norm reduction algorithm: groups, groups_scalar, columns
DLPRIM_COPY_ALGO   force one strided-copy solver (permute, cat, narrow): gather, tiles (transpositions)
DLPRIM_POOL_ALGO   force one pooling solver: window, plane (global windows; an error elsewhere)
DLPRIM_ROWNORM_ALGO force one layer/group/rms norm algorithm: rows, rows4 (layer and rms norm on aligned rows of a multiple of 4), split (group norm)
DLPRIM_FUSION_ALGO force one fused solver of FusionPlan.compile: pointwise_chain, conv_chain,
                   horizontal_convs, batchnorm_train_forward, batchnorm_train_backward
DLPRIM_REDUCE_ALGO force one reduction solver: group, item
DLPRIM_REDUCE_PARTIALS_ALGO how a reduction of everything combines its partials: last_group (where it
                   folds them), launch
DLPRIM_RANGE_CHECK_ALGO when nll_loss/cross_entropy raise on a bad target: deferred (next sync), immediate
DLPRIM_SOFTMAX_ALGO force one softmax solver: row, column
DLPRIM_POINTWISE_ALGO force one pointwise solver: vector (aligned layouts; an error elsewhere), scalar
DLPRIM_DROPOUT_ALGO force one dropout solver: vector (offsets of whole blocks; an error elsewhere), scalar
DLPRIM_INDEX_ADD_ALGO force how index_add sums repeated indices: sorted, loop
DLPRIM_CUMSUM_ALGO force how cumsum scans along the last dimension: lookback (in-order queues), chunks
DLPRIM_TOPK_ALGO   force one topk solver: radix (k up to 1024), bitonic
DLPRIM_ATTENTION_ALGO force one scaled_dot_product_attention solver: rows, tiled (head dims up to 128)
"""
import os
import shlex

# The switches a call consults (logging, find mode, forced algorithms) are read once, into this
# snapshot, the first time one is needed, and again on reload(): a call does no environment
# lookups (each cost about a microsecond, several per call). MIOpen reads its variables once as
# well. The variables of building and of context creation (DLPRIM_DEVICE, DLPRIM_CACHE_DIR,
# DLPRIM_NO_CACHE, DLPRIM_DEBUG) are read where they are used, as they are off the call path.
_snapshot = None


class _Switches:
    __slots__ = ("log_cmd", "find_mode", "forced", "check_numerics", "workspace_limit",
                 "tf32_emulate", "deterministic", "build_options")

    def __init__(self, environ):
        self.log_cmd = _truthy(environ.get("DLPRIM_LOG_CMD", ""))
        self.check_numerics = _truthy(environ.get("DLPRIM_CHECK_NUMERICS", ""))
        self.find_mode = environ.get("DLPRIM_FIND_MODE", "immediate").strip().lower() or "immediate"
        self.workspace_limit = _mebibytes(environ, "DLPRIM_WORKSPACE_LIMIT")
        self.tf32_emulate = _truthy(environ.get("DLPRIM_TF32_EMULATE", ""))
        self.deterministic = _truthy(environ.get("DLPRIM_DETERMINISTIC", ""))
        # Every kernel lookup passes through program.build, on the call path too.
        self.build_options = tuple(shlex.split(environ.get("DLPRIM_BUILD_OPTIONS", "")))
        # DLPRIM_<FAMILY>_ALGO -> {"family": value}
        self.forced = {name[len("DLPRIM_"):-len("_ALGO")].lower(): value
                       for name, value in environ.items()
                       if name.startswith("DLPRIM_") and name.endswith("_ALGO") and value}


def reload():
    """Read the call switches (DLPRIM_LOG_CMD, DLPRIM_FIND_MODE, DLPRIM_<FAMILY>_ALGO) from the
    environment again; set them before the library's first call, or call this after changing
    them. Returns the snapshot."""
    global _snapshot
    _snapshot = _Switches(os.environ)
    for hook in _reload_hooks:
        hook(_snapshot)
    return _snapshot


# Called with the new snapshot on every reload (dlprim_py.functional installs or removes its
# numerics checks).
_reload_hooks = []


def switches():
    """The call switches as read last (``forced``: {family: solver}, ``find_mode``, ...)."""
    return _snapshot or reload()



def _truthy(value):
    return value.strip().lower() in ("1", "true", "yes", "on")


def _flag(name):
    return _truthy(os.environ.get(name, ""))


def device_spec():
    return os.environ.get("DLPRIM_DEVICE") or None


def cache_dir():
    path = os.environ.get("DLPRIM_CACHE_DIR")
    if path:
        return path
    import platformdirs
    return platformdirs.user_cache_dir("dlprim_py")


def build_options():
    """The options of DLPRIM_BUILD_OPTIONS (read with the call switches), split as a shell
    splits them (a tuple)."""
    return switches().build_options


def no_cache():
    return _flag("DLPRIM_NO_CACHE")


def debug():
    return _flag("DLPRIM_DEBUG")


def build_threads():
    """DLPRIM_BUILD_THREADS, else min(8, cores): 1 builds programs one at a time."""
    value = os.environ.get("DLPRIM_BUILD_THREADS", "").strip()
    if not value:
        return max(1, min(8, os.cpu_count() or 1))
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        from .errors import ShapeError
        raise ShapeError(f"DLPRIM_BUILD_THREADS must be a positive integer, got {value!r}")
    return threads


def log_cmd():
    return switches().log_cmd


def find_mode():
    return switches().find_mode


def check_numerics():
    return switches().check_numerics


def workspace_limit():
    """DLPRIM_WORKSPACE_LIMIT in bytes, or None (the default rule of
    ``ops.conv.algorithms.workspace_limit``)."""
    return switches().workspace_limit


def _mebibytes(environ, name):
    value = environ.get(name, "").strip()
    if not value:
        return None
    try:
        mib = float(value)
    except ValueError:
        mib = -1
    if not mib > 0:
        from .errors import ShapeError
        raise ShapeError(f"{name} must be a positive number of MiB, got {value!r}")
    return int(mib * (1 << 20))


def tf32_emulate():
    """DLPRIM_TF32_EMULATE: whether the convolution's TF32 algorithms run emulated mma kernels
    on devices without TF32 tensor cores."""
    return switches().tf32_emulate


def forced_algorithm(family):
    """The algorithm forced for an operator family ("conv", "gemm"), or None."""
    return switches().forced.get(family)
