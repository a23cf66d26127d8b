"""Every environment variable the library reads, in one place.

DLPRIM_DEVICE      device to use: "P:D" (platform:device indices) or a piece of the device name
DLPRIM_CACHE_DIR   where compiled program binaries and find results are kept
DLPRIM_NO_CACHE    "1": never read or write the on-disk program cache
DLPRIM_DEBUG       "1": print each program build (and cache hits) to stderr
DLPRIM_LOG_CMD     "1": log every operator call as an equivalent dlprim-driver command line
DLPRIM_FIND_MODE   "immediate" (default) or "find" for algorithm selection
DLPRIM_CONV_ALGO   force one convolution algorithm by name
DLPRIM_GEMM_ALGO   force one GEMM kernel variant by name
DLPRIM_NORM_ALGO   force one batch-norm reduction algorithm: groups, groups_scalar, columns
DLPRIM_COPY_ALGO   force one strided-copy algorithm (permute, cat, narrow): gather, tiles
DLPRIM_POOL_ALGO   force one pooling algorithm: window, plane (global windows)
DLPRIM_ROWNORM_ALGO force one layer/group norm algorithm: rows, split (group norm)
DLPRIM_REDUCE_ALGO force one reduction variant: group, item
DLPRIM_REDUCE_PARTIALS_ALGO how a reduction of everything combines its partials: last_group, launch
DLPRIM_RANGE_CHECK_ALGO how nll_loss/cross_entropy read their target check back: pinned, pageable, queue
DLPRIM_SOFTMAX_ALGO force one softmax variant: row, column
DLPRIM_POINTWISE_ALGO force one pointwise variant: vector (where it applies), scalar
DLPRIM_DROPOUT_ALGO force one dropout variant: vector (where offsets allow), scalar
"""
import os


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def device_spec():
    return os.environ.get("DLPRIM_DEVICE") or None


def cache_dir():
    path = os.environ.get("DLPRIM_CACHE_DIR")
    if path:
        return path
    import platformdirs
    return platformdirs.user_cache_dir("dlprim_py")


def no_cache():
    return _flag("DLPRIM_NO_CACHE")


def debug():
    return _flag("DLPRIM_DEBUG")


def log_cmd():
    return _flag("DLPRIM_LOG_CMD")


def find_mode():
    return os.environ.get("DLPRIM_FIND_MODE", "immediate").strip().lower() or "immediate"


def forced_algorithm(family):
    """The algorithm forced for an operator family ("conv", "gemm"), or None."""
    return os.environ.get(f"DLPRIM_{family.upper()}_ALGO") or None
