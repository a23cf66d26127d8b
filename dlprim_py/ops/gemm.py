"""General matrix multiply: C = act(alpha * op(A) @ op(B) + beta * C + bias), float32, or on
float16 / bfloat16 operands with float32 sums.

Row-major throughout: op(A) is M x K, op(B) is K x N, C is M x N, each stored in a buffer at an
element offset with a leading dimension (elements between rows). ``trans_a`` means A is stored
K x M, ``trans_b`` that B is stored N x K. A batch adds one element stride per operand; a
stride of 0 shares one matrix across the batch.

Three entries, lowest first:

* ``GemmPlan(ctx, M, N, K, a_buf, a_off, lda, ...)``: validates once, picks the solver and its
  parameters, builds its kernels, binds their arguments, allocates the split-K workspace;
  ``.enqueue()`` then only enqueues (the cheap path for networks).
* ``enqueue_gemm(ctx, M, N, K, a_buf, a_off, lda, ...)``: plan and enqueue in one call, for
  convolution, linear layers and other operators that run GEMM on sub-buffers.
* ``gemm(a, b, c=None, ...)`` and ``gemm_batched(...)`` on tensors.

Folded operands (``Fold``): an operand's contiguous dimension j of length batch * P may address
image n = j // P, position p = j % P at ``n * image_stride + row * ld + map(p)``, with map(p) = p,
or ``(p // width) * row_step + (p % width) * col_step`` for a strided sample. A 1x1
convolution on NCHW tensors is then one GEMM over all images: y (K x N*HW) = w (K x C) @
x (C x N*HW), without moving x or y.

Solvers (the "gemm" family of ``dlprim_py.solver``; one kernel template each, sharing
``kernels/gemm_common.cl.mako``): "tiled" (``gemm_tiled.cl.mako``: local-memory tiles with a
register block per work-item; slices staged through registers, or with ``pipeline`` copied two
to four slices ahead, through cp.async on NVIDIA GPUs of compute capability 8.0 and later),
"splitk" (the tiled kernel split along K, its partial sums added by
``gemm_splitk.cl.mako``'s reduction), "small" (``gemm_small.cl.mako``: one work-item per
element, for problems too small to fill the device) and "subgroup" (``gemm_subgroup.cl.mako``,
devices with Intel subgroups: a register block per work-item, A broadcast across the subgroup
with shuffles instead of local memory) and "mma" (``gemm_mma.cl.mako``: TF32 on NVIDIA tensor
cores through warp-level ``mma.sync`` in inline PTX, compute capability 8.0 and later; only where
TF32 is allowed, ``dlprim_py.backends.allow_tf32`` or ``ctx.allow_tf32``; otherwise the GEMM stays
float32). ``DLPRIM_GEMM_ALGO`` forces one; otherwise the first
rule of ``tuning_db/gemm.json`` (device -> architecture -> vendor -> default) that holds for the
problem and runs on the device names the solver and gives its tunable parameters
(``{"solver": "tiled", "tile_m": 64, ...}``).

16-bit operands (``dtype`` float16 or bfloat16, A and B of the same one; C and the bias float32
or that type): products summed in float32, a 16-bit C rounded to nearest even. Two solvers
take them: "mma" (m16n8k16 mma.sync on .f16 / .bf16 fragments, NVIDIA compute capability 8.0
and later, TF32 switch not needed; its rules and parameters carry ``"ab_bits": 16``) and
"small" (any device: the values converted to float32 as they are read). Neither needs
cl_khr_fp16. The "gemm" epilogue order only, no folded operand; the other solvers refuse them.
16-bit convolutions (``ops/conv/gemm16.py``) and linear gradients are GEMMs of this kind.
"""
import math
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from .. import backends, config, logcmd, program, solver, tuning
from ..activation import as_activation
from ..dtypes import FLOAT16_TYPES, as_dtype, bfloat16, float16, float32
from ..dtypes import name as dtype_name
from ..errors import DTypeError, DeviceError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import BoundKernel, Recording, alias_pattern, buffer_arguments, enqueue_bound
from ..tensor import Tensor, allocate

# The solvers' names: the values of DLPRIM_GEMM_ALGO and of the rules' "solver".
ALGORITHMS = ("tiled", "splitk", "small", "subgroup", "mma", "gemv")
_INT32_MAX = 2 ** 31 - 1
_TILED_KEYS = ("tile_m", "tile_n", "tile_k", "wpt_m", "wpt_n", "vec", "pad", "double_buffer")
_SMALL_KEYS = ("small_m", "small_n")
_GEMV_KEYS = ("lanes", "group")
_SUBGROUP_KEYS = ("sg_size", "wpt_m", "wpt_n", "sg_groups")
_MMA_KEYS = ("tile_m", "tile_n", "tile_k", "warps_m", "warps_n", "stages")
# The extensions the subgroup kernel is written in.
SUBGROUP_EXTENSIONS = ("cl_intel_subgroups", "cl_intel_required_subgroup_size")
# Parameters that run on any OpenCL device, for forced solvers no database rule names.
DEFAULT_SMALL = {"solver": "small", "small_m": 8, "small_n": 16}
DEFAULT_GEMV = {"solver": "gemv", "lanes": 32, "group": 8}
DEFAULT_TILED = {"solver": "tiled", "tile_m": 32, "tile_n": 32, "tile_k": 16, "wpt_m": 4,
                 "wpt_n": 4, "vec": 4, "pad": 4, "double_buffer": 1, "split_k": 1,
                 "global_vec": 1}
DEFAULT_SUBGROUP = {"solver": "subgroup", "sg_size": 16, "wpt_m": 8, "wpt_n": 1, "sg_groups": 1}
# 8 warps of 64 x 32 accumulators (4 x 4 mma tiles each), two 16-deep stages: at most 48 KiB of
# local memory in every layout.
DEFAULT_MMA = {"solver": "mma", "tile_m": 128, "tile_n": 128, "tile_k": 16, "warps_m": 2,
               "warps_n": 4, "stages": 2}
# The mma kernel emulated (DLPRIM_TF32_EMULATE, ``tf32_params``): 2 warps of 16 x 16
# accumulators, small enough to build in seconds on a CPU's OpenCL.
EMULATED_MMA = {"solver": "mma", "tile_m": 32, "tile_n": 16, "tile_k": 16, "warps_m": 2,
                "warps_n": 1, "stages": 2, "emulate": 1}
# 16-bit operands: 128 x 128 x 32 tiles, 8 warps of 64 x 32, two stages: 48 KiB of local memory
# where K is contiguous in both operands (rows of 48 values), less otherwise.
DEFAULT_MMA16 = {"solver": "mma", "tile_m": 128, "tile_n": 128, "tile_k": 32, "warps_m": 2,
                 "warps_n": 4, "stages": 2, "ab_bits": 16}
# The kernels' names of the operand types (template parameters AB_TYPE, C_TYPE).
_TYPE_NAMES = {float32: "float", float16: "half", bfloat16: "bfloat16"}
# A forced "splitk" whose rule does not split: this many chunks.
DEFAULT_SPLITS = 4


# ---- kernel parameters --------------------------------------------------------------------

def tiled_threads(params):
    return (params["tile_m"] // params["wpt_m"]) * (params["tile_n"] // params["wpt_n"])


def tiled_local_bytes(params):
    stages = params.get("pipeline", 0) or (2 if params["double_buffer"] else 1)
    pad = params["pad"]
    return 4 * stages * params["tile_k"] * (params["tile_m"] + params["tile_n"] + 2 * pad)


def solver_params(params):
    """``params`` in the solver form, ``{"solver": name, ...tunables}``, as a new dict.

    The form before the solver layer (tuning databases written then, callers' dicts) named the
    kernel instead, ``{"kernel": "tiled" | "small" | "subgroup", ...}``: its "tiled" is the
    "splitk" solver where split_k > 1."""
    if "solver" in params or "kernel" not in params:
        return dict(params)
    params = dict(params)
    kernel = params.pop("kernel")
    name = "splitk" if kernel == "tiled" and params.get("split_k", 1) > 1 else kernel
    return {"solver": name, **params}


def params_problem(params, info):
    """Why ``params`` (either form, see ``solver_params``) cannot run on the device ``info`` (a
    DeviceInfo), or None if they can."""
    params = solver_params(params)
    found = FAMILY.solvers.get(params.get("solver"))
    if found is None:
        return f"unknown solver {params.get('solver')!r} (one of {', '.join(ALGORITHMS)})"
    return found.params_problem(params, info)


def _tiled_problem(params, info):
    tm, tn, tk = params["tile_m"], params["tile_n"], params["tile_k"]
    wm, wn, vec, pad = params["wpt_m"], params["wpt_n"], params["vec"], params["pad"]
    if min(tm, tn, tk, wm, wn, vec) < 1 or pad < 0:
        return "tile sizes must be positive"
    if vec not in (1, 2, 4):
        return f"vec must be 1, 2 or 4, got {vec}"
    if tm % wm or tn % wn:
        return f"tile {tm}x{tn} is not a multiple of the work per item {wm}x{wn}"
    if wm % vec or wn % vec or pad % vec:
        return f"work per item {wm}x{wn} and pad {pad} must be multiples of vec {vec}"
    gvec = params.get("global_vec", 1)
    if gvec not in (1, 2, 4) or tm % gvec or tn % gvec or tk % gvec or pad % gvec:
        return f"global_vec {gvec} must be 1, 2 or 4 and divide the tiles and the pad"
    if any(x & (x - 1) for x in (tm, tn, tk)):
        return f"tile sizes {tm}x{tn}x{tk} must be powers of two"
    threads = tiled_threads(params)
    if threads & (threads - 1):
        return f"{threads} work-items per group is not a power of two"
    if (tm * tk) % (threads * gvec) or (tn * tk) % (threads * gvec):
        return f"{threads} work-items cannot share the {tm}x{tk} and {tk}x{tn} tile loads evenly"
    if threads > info.max_work_group_size:
        return f"{threads} work-items > device maximum {info.max_work_group_size}"
    lanes_n = params.get("lanes_n", 0)
    if lanes_n and (lanes_n not in (1, 2, 4, 8, 16, 32) or threads % 32
                    or (tn // wn) % lanes_n or (tm // wm) % (32 // lanes_n)):
        return (f"lanes_n {lanes_n} must be 0 or a power of two up to 32 whose 32-item runs "
                f"({lanes_n} x {32 // max(1, lanes_n)}) tile the {tn // wn} x {tm // wm} "
                f"work-items")
    pipeline = params.get("pipeline", 0)
    if pipeline not in (0, 2, 3, 4):
        return f"pipeline must be 0 (register-staged slices) or 2, 3, 4 stages, got {pipeline!r}"
    group = params.get("tile_group", 1)
    if not isinstance(group, int) or group < 1:
        return f"tile_group must be an int >= 1, got {group!r}"
    if tiled_local_bytes(params) > info.local_mem_size:
        return f"{tiled_local_bytes(params)} bytes of local memory > device {info.local_mem_size}"
    return None



def _subgroup_problem(params, info):
    missing = [k for k in _SUBGROUP_KEYS if k not in params]
    if missing:
        return f"subgroup kernel parameters lack {missing}"
    absent = [e for e in SUBGROUP_EXTENSIONS if e not in info.extensions]
    if absent:
        return f"the subgroup kernel needs {absent}, which the device does not report"
    if params["sg_size"] not in (8, 16):
        return f"sg_size must be 8 or 16, got {params['sg_size']!r}"
    for key, top in (("wpt_m", 16), ("wpt_n", 8), ("sg_groups", 16)):
        value = params[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            return f"{key} of the subgroup kernel must be an int from 1 to {top}, got {value!r}"
    if params["sg_size"] * params["sg_groups"] > info.max_work_group_size:
        return (f"work-group of {params['sg_size'] * params['sg_groups']} > device maximum "
                f"{info.max_work_group_size}")
    if params.get("split_k", 1) > 1:
        return f"the subgroup kernel does not split K (split_k {params['split_k']})"
    return None


def mma_device_problem(info):
    """Why the device ``info`` (a DeviceInfo) cannot run the mma kernel's PTX (TF32 and
    f16 / bf16 mma.sync and cp.async need an NVIDIA GPU of compute capability 8.0 or later), or
    None."""
    if info.vendor != "nvidia":
        return f"mma.sync runs on NVIDIA GPUs only, the device's vendor is {info.vendor!r}"
    arch = getattr(info, "architecture", None) or ""
    if not arch.startswith("nvidia:sm_") or not arch[len("nvidia:sm_"):].isdigit():
        return "the driver does not report the device's compute capability"
    digits = arch[len("nvidia:sm_"):]
    if int(digits[:-1]) < 8:
        return (f"mma.sync (TF32, f16, bf16) needs compute capability 8.0 or later, the device has "
                f"{digits[:-1]}.{digits[-1]}")
    return None


def _mma_ld(tile, k_contiguous, half=False):
    """Elements per local-memory row of a slice (as gemm_mma.cl.mako lays it out): words for
    TF32, 16-bit values for ``half``."""
    if half:
        return 2 * _mma_ld(tile // 2, True) if k_contiguous else tile + 8
    if not k_contiguous:
        return tile + 4
    ld = tile + 8
    return ld if (ld // 8) % 2 == 1 else tile + 16


def mma_local_bytes(params, trans_a=None, trans_b=None):
    """Local memory of the mma kernel: its stages (for the transposes given, else the largest
    of any; 16-bit values where ``params["ab_bits"]`` is 16) and, emulated, the warps'
    exchange words."""
    tm, tn, tk = params["tile_m"], params["tile_n"], params["tile_k"]
    half = params.get("ab_bits", 32) == 16
    a_trans, a_plain = tk * _mma_ld(tm, False, half), tm * _mma_ld(tk, True, half)
    b_trans, b_plain = tn * _mma_ld(tk, True, half), tk * _mma_ld(tn, False, half)
    if params.get("stage_mn"):
        # Staged slices stored M (N) contiguous whatever the operands' layout.
        a, b = a_trans, b_plain
    else:
        a = max(a_trans, a_plain) if trans_a is None else a_trans if trans_a else a_plain
        b = max(b_trans, b_plain) if trans_b is None else b_trans if trans_b else b_plain
    threads = 32 * params["warps_m"] * params["warps_n"]
    element = 2 if half else 4
    return (element * params["stages"] * (a + b)
            + (4 * 6 * threads if params.get("emulate") else 0))


def _mma_problem(params, info):
    tm, tn, tk = params["tile_m"], params["tile_n"], params["tile_k"]
    wm, wn, stages = params["warps_m"], params["warps_n"], params["stages"]
    values = (tm, tn, tk, wm, wn, stages)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in values):
        return f"mma tile parameters must be ints >= 1, got {dict(zip(_MMA_KEYS, values))}"
    if any(x & (x - 1) for x in (tm, tn, tk, wm, wn)):
        return f"tile {tm}x{tn}x{tk} and warps {wm}x{wn} must be powers of two"
    bits = params.get("ab_bits", 32)
    if bits not in (16, 32):
        return f"ab_bits must be 32 (float32 operands, TF32) or 16 (float16 / bfloat16), got {bits!r}"
    split = params.get("split_k", 1)
    if not isinstance(split, int) or isinstance(split, bool) or split < 1:
        return f"split_k must be an int >= 1, got {split!r}"
    if split > 1 and bits == 16:
        return "16-bit operands are not split along K (split_k 1)"
    kstep, per_copy = (16, 8) if bits == 16 else (8, 4)
    if tk % kstep or tm % (16 * wm) or tn % (8 * wn):
        return (f"tile {tm}x{tn}x{tk} must be whole mma tiles per warp: TILE_K a multiple of "
                f"{kstep}, TILE_M of 16 x warps_m {wm}, TILE_N of 8 x warps_n {wn}")
    threads = 32 * wm * wn
    if threads > info.max_work_group_size:
        return f"{threads} work-items > device maximum {info.max_work_group_size}"
    if (tm * tk) % (per_copy * threads) or (tn * tk) % (per_copy * threads):
        return (f"{threads} work-items cannot share the {tm}x{tk} and {tk}x{tn} slice copies of "
                f"16 bytes evenly")
    if stages not in (2, 3, 4):
        return f"stages must be 2, 3 or 4, got {stages}"
    group = params.get("tile_group", 1)
    if not isinstance(group, int) or group < 1:
        return f"tile_group must be an int >= 1, got {group!r}"
    emulate = params.get("emulate", 0)
    if emulate not in (0, 1):
        return f"emulate must be 0 or 1, got {emulate!r}"
    if params.get("round", "cvt") not in ("cvt", "int"):
        return f"round must be 'cvt' or 'int', got {params.get('round')!r}"
    staged = params.get("staged", 0)
    if staged not in (0, 1) or (staged and stages != 2):
        return f"staged must be 0 or 1, and staged slices take 2 stages (got {staged!r}, {stages})"
    if staged and bits == 16:
        return "staged slices (rounded to TF32 on their way) are for float32 operands only"
    stage_mn = params.get("stage_mn", 0)
    if stage_mn not in (0, 1) or (stage_mn and not staged):
        return f"stage_mn must be 0 or 1, and takes staged slices (got {stage_mn!r}, staged {staged})"
    if mma_local_bytes(params) > info.local_mem_size:
        return f"{mma_local_bytes(params)} bytes of local memory > device {info.local_mem_size}"
    return None if emulate else mma_device_problem(info)


class Fold:
    """Folded addressing of an operand's contiguous dimension: column j is position
    p = j % positions of image n = j // positions, at element ``n * image_stride + map(p)``
    (plus the row's ``row * ld``). map(p) = p, or with ``width`` given,
    ``(p // width) * row_step + (p % width) * col_step`` (a strided sample of an image whose
    rows are ``row_step`` elements apart)."""

    def __init__(self, positions, image_stride, width=None, row_step=None, col_step=None):
        for value, name in ((positions, "positions"), (image_stride, "image_stride")):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ShapeError(f"fold {name} must be an int >= 1, got {value!r}")
        self.positions = int(positions)
        self.image_stride = int(image_stride)
        self.strided = width is not None
        if self.strided:
            for value, name in ((width, "width"), (row_step, "row_step"), (col_step, "col_step")):
                if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                    raise ShapeError(f"fold {name} must be an int >= 1, got {value!r}")
            if self.positions % width:
                raise ShapeError(f"fold positions {positions} are not whole rows of width {width}")
            self.width, self.row_step, self.col_step = int(width), int(row_step), int(col_step)
        else:
            self.width, self.row_step, self.col_step = 1, 0, 0
        if self.positions > _INT32_MAX or self.image_stride * 256 > 2 ** 62:
            raise UnsupportedError(f"fold {self} exceeds the index range of the kernels")

    @property
    def mode(self):
        """The template's FOLD value: 1 dense, 2 strided."""
        return 2 if self.strided and (self.row_step != self.width or self.col_step != 1) else 1

    def map(self, p):
        if self.mode == 1:
            return p
        return (p // self.width) * self.row_step + (p % self.width) * self.col_step

    def offset(self, j):
        n, p = divmod(j, self.positions)
        return n * self.image_stride + self.map(p)

    def max_offset(self, length):
        """The largest offset of columns 0 .. length - 1."""
        last = self.offset(length - 1)
        images = (length - 1) // self.positions
        if images:   # the previous image may reach further than the last one's first columns
            last = max(last, (images - 1) * self.image_stride + self.map(self.positions - 1))
        return last

    def vector_ok(self, width):
        """Whether ``width`` consecutive columns from a multiple of it are contiguous."""
        return self.mode == 1 and self.positions % width == 0 and self.image_stride % width == 0

    def args(self, strided=True):
        i32, i64 = np.int32, np.int64
        head = [i32(self.positions), i64(self.image_stride)]
        if not strided:
            return head
        return head + [i32(self.width), i32(self.row_step), i32(self.col_step)]

    def __eq__(self, other):
        return isinstance(other, Fold) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def key(self):
        return (self.positions, self.image_stride, self.mode, self.width, self.row_step,
                self.col_step)

    def __repr__(self):
        extra = f", width={self.width}, row_step={self.row_step}, col_step={self.col_step}" \
            if self.mode == 2 else ""
        return f"Fold(positions={self.positions}, image_stride={self.image_stride}{extra})"


_NO_FOLD_ARGS = [np.int32(1), np.int64(0), np.int32(1), np.int32(0), np.int32(0)]


def _fold_args(fold, strided=True):
    if fold is None:
        return _NO_FOLD_ARGS if strided else _NO_FOLD_ARGS[:2]
    return fold.args(strided)


def features(M, N, K, batch=1, tf32=False, ab16=False, trans_a=False, trans_b=False):
    """The shape features tuning rules are written in (``tf32``: 1 where TF32 is allowed;
    ``ab16``: 1 for 16-bit operands, float16 or bfloat16; ``trans_a``/``trans_b``: bools, the
    operands' transposes, which a measured rule's shape may name: see ``tuning``)."""
    return {"m": M, "n": N, "k": K, "mn": M * N, "mnk": M * N * K, "batch": batch,
            "tf32": int(bool(tf32)), "ab16": int(bool(ab16)),
            "trans_a": bool(trans_a), "trans_b": bool(trans_b)}


@dataclass(frozen=True)
class GemmProblem:
    """What the choice of a GEMM solver and its parameters depends on: the sizes (op(A) M x K,
    op(B) K x N, ``batch`` products), whether TF32 is allowed (``tf32``: the "mma" solver
    applies only then) and the transposes (``trans_a``, ``trans_b``: the same sizes read
    along other strides may run best with other tiles, so a measured rule may be for one form).
    Offsets, folds and the epilogue do not change the choice; a plan derives its
    ``GemmConfig`` from them and the layout.
    ``dtype``: the operands' storage ("float32", "float16", "bfloat16"; TF32 is for float32
    only); ``c_dtype``: C's and the bias's ("float32" or ``dtype``)."""
    m: int
    n: int
    k: int
    batch: int = 1
    tf32: bool = False
    dtype: str = "float32"
    c_dtype: str = "float32"
    trans_a: bool = False
    trans_b: bool = False

    @property
    def ab16(self):
        return self.dtype != "float32"

    @property
    def ab_bits(self):
        return 16 if self.ab16 else 32

    def key(self):
        types = "" if not self.ab16 else f"-{self.dtype}-c{self.c_dtype}"
        form = ("-ta" if self.trans_a else "") + ("-tb" if self.trans_b else "")
        return (f"gemm-m{self.m}-n{self.n}-k{self.k}-b{self.batch}"
                f"{'-tf32' if self.tf32 else ''}{types}{form}")

    def features(self):
        return features(self.m, self.n, self.k, self.batch, self.tf32, self.ab16,
                        self.trans_a, self.trans_b)


@dataclass(frozen=True)
class GemmLayout:
    """Where a plan's operands lie, as far as the kernels' derived settings depend on it:
    transposes, offsets, leading dimensions and batch strides in elements, and folds."""
    trans_a: bool = False
    trans_b: bool = False
    a_off: int = 0
    lda: int = 0
    stride_a: int = 0
    b_off: int = 0
    ldb: int = 0
    stride_b: int = 0
    c_off: int = 0
    ldc: int = 0
    stride_c: int = 0
    fold_a: object = None
    fold_b: object = None
    fold_c: object = None

    @property
    def folds(self):
        return (self.fold_a, self.fold_b, self.fold_c)


@dataclass(frozen=True)
class GemmConfig:
    """What a plan derives from the tuned parameters, the problem, the layout and the device
    (never tuned; the tuned parameters stay as the rule or the caller gave them).

    ``global_vec``: width of the tiled kernel's global loads (the rule's, 1 where a row of A or
    B does not start on a vector boundary; the mma kernel's copies of A); ``global_vec_b``:
    the mma kernel's copies of B (0: as ``global_vec``); the gemv kernel's reads of its matrix
    (``global_vec``) and of its vectors (``global_vec_b``);
    ``gemv_a``: the gemv kernel's matrix is op(A) (its vectors op(B)'s ``gemv_vectors``
    columns; else op(B)^T, the vectors op(A)'s rows);
    ``c_vec``: width of its stores of C (``vec`` where
    every row of C starts on one, else 1); ``nv_async``: pipelined slices copied with
    cp.async; ``reqd_size``: the kernel declares its work-group size; ``block_a``/``block_b``:
    the subgroup kernel reads rows of A/B with block reads; ``splits``/``k_chunk``: the K
    chunks a split-K GEMM runs (splits 1: one pass); ``options``: build options."""
    global_vec: int = 1
    global_vec_b: int = 0
    gemv_a: int = 0
    gemv_vectors: int = 1
    c_vec: int = 1
    nv_async: int = 0
    reqd_size: int = 1
    block_a: int = 0
    block_b: int = 0
    splits: int = 1
    k_chunk: int = 0
    options: tuple = ()


class _Arguments:
    """A plan's kernel arguments in the groups every GEMM kernel takes them in: sizes and
    operands A and B (``ab``), where the product goes (``c``: C with alpha and beta), the
    epilogue's operands (``out``), the folds (``folds``; ``fold_c`` alone) and a chain's
    (``chain``)."""

    def __init__(self, ab, c, out, folds, fold_c, chain):
        self.ab, self.c, self.out, self.folds, self.fold_c, self.chain = \
            ab, c, out, folds, fold_c, chain


# ---- solvers ------------------------------------------------------------------------------

class GemmSolver(solver.Solver):
    """A GEMM solver: its kernel template (``kernels/<template>.cl.mako``), the parameters a
    rule must give it (``keys``), parameters that run on any device for a forced solver no
    rule names (``defaults``), and the solvers whose rules give its parameters when it is
    forced (``rule_solvers``: the tiled kernel's rules serve both of its solvers)."""
    template = None
    keys = ()
    defaults = {}
    rule_solvers = ()

    def missing(self, params):
        missing = [k for k in self.keys if k not in params]
        return f"{self.name} kernel parameters lack {missing}" if missing else None

    # Whether the kernel reads 16-bit operands (AB_TYPE half / bfloat16).
    takes_16bit = False

    def refusal(self, ctx, problem):
        """Why the solver cannot compute ``problem`` here, or None (``applies``)."""
        return self.dtype_refusal(problem)

    def dtype_refusal(self, problem):
        if problem.ab16 and not self.takes_16bit:
            return (f"the {self.name} kernel reads float32 operands only (the small and mma "
                    f"solvers take {problem.dtype})")
        return None

    def params_for(self, problem, params):
        """``params`` for ``problem``'s operand type (the mma solver marks 16-bit ones)."""
        return params

    def applies(self, ctx, problem):
        return self.refusal(ctx, problem) is None

    def forced(self, ctx, problem):
        """Parameters of the solver forced for ``problem``: the first rule of ``rule_solvers``
        that holds and runs here, else ``defaults``, made this solver's (``force``)."""
        info = ctx.info
        rule = tuning.first_params(
            info, "gemm", _features(ctx, problem),
            lambda p: p.get("solver") in self.rule_solvers and params_problem(p, info) is None
            and _bits_match(p, problem))
        return self.force(dict(rule or self.defaults_for(problem)))

    def defaults_for(self, problem):
        return self.defaults

    def force(self, params):
        return dict(params, solver=self.name)

    def configure(self, ctx, problem, params, layout):
        return GemmConfig()

    def workspace_size(self, ctx, problem, params=None, config=None):
        """The split-K partial sums of a plan split along K (``config.splits`` > 1):
        ``batch * splits`` M x N floats; none in one pass."""
        if config is None:
            config = self.configure(ctx, problem, params or self.forced(ctx, problem),
                                    GemmLayout())
        return _split_workspace(problem, config)

    def prepare(self, ctx, problem, params, config, common):
        """The built program of ``params`` and ``config``; ``common``: the template parameters
        of every GEMM kernel (``common_template_params``)."""
        return program.build(ctx, self.template, {**common, **self.template_params(params, config)},
                             config.options)


class SmallSolver(GemmSolver):
    name = "small"
    template = "gemm_small"
    takes_16bit = True
    keys = _SMALL_KEYS
    defaults = DEFAULT_SMALL
    rule_solvers = ("small",)

    def params_problem(self, params, info):
        missing = self.missing(params)
        if missing:
            return missing
        if params["small_m"] * params["small_n"] > info.max_work_group_size:
            return f"work-group of {params['small_m'] * params['small_n']} > device maximum"
        return None

    def template_params(self, params, config):
        return {"SMALL_M": params["small_m"], "SMALL_N": params["small_n"]}

    def launches(self, ctx, problem, params, config, args, workspace):
        sm, sn = params["small_m"], params["small_n"]
        return [("gemm_small", (_round_up(problem.n, sn), _round_up(problem.m, sm), problem.batch),
                 (sn, sm, 1), [*args.ab, *args.c, *args.out, *args.folds, *args.chain])]


class GemvSolver(GemmSolver):
    """Matrix-vector products: M or N at most ``MAX_VECTORS`` (kernels/gemm_gemv.cl.mako), the
    matrix op(A) (N the vectors) or op(B)^T (M the vectors, where N > M) read once for all of
    them: LANES work-items per output along a contiguous row, or VEC outputs per work-item
    along contiguous columns; split along K (gemm_splitk_reduce adds the chunks) where the
    outputs alone leave the device idle, unless ``split_k`` says."""
    name = "gemv"
    template = "gemm_gemv"
    takes_16bit = True
    keys = _GEMV_KEYS
    defaults = DEFAULT_GEMV
    rule_solvers = ("gemv",)
    # Work-items a split aims for per compute unit, and the least K a chunk walks per work-item
    # (per lane along rows, per k step along columns) so that a split is worth its reduction.
    ITEMS_PER_UNIT = 1024
    MIN_STEPS = 8
    # The most vectors one pass reads the matrix for (each work-item holds a sum per vector).
    MAX_VECTORS = 8

    def refusal(self, ctx, problem):
        if min(problem.m, problem.n) > self.MAX_VECTORS:
            return (f"a matrix-vector product needs M or N at most {self.MAX_VECTORS} "
                    f"(got {problem.m} x {problem.n})")
        return self.dtype_refusal(problem)

    @staticmethod
    def form(problem):
        """(the matrix is op(A), the vectors, the outputs per vector, the matrix's rows are
        contiguous): op(A) with op(B)'s N columns as vectors where N <= M, else op(B)^T with
        op(A)'s M rows."""
        if problem.n <= problem.m:
            return True, problem.n, problem.m, not problem.trans_a
        return False, problem.m, problem.n, problem.trans_b

    def params_problem(self, params, info):
        missing = self.missing(params)
        if missing:
            return missing
        lanes, group, split = params["lanes"], params["group"], params.get("split_k", 0)
        for name, value in (("lanes", lanes), ("group", group), ("split_k", split)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 \
                    or (value == 0 and name != "split_k"):
                return f"gemv {name} must be a positive int (split_k 0: chosen), got {value!r}"
        if group & (group - 1):
            return f"gemv group must be a power of two, got {group}"
        if lanes * group > info.max_work_group_size:
            return f"work-group of {lanes * group} > device maximum"
        return None

    def configure(self, ctx, problem, params, layout):
        w_is_a, vectors, outputs, rows = self.form(problem)
        # Each vector contiguous along K (with float4 reads along rows): its own row of B^T or
        # A, or the single column of a dense vector.
        if w_is_a:
            w = (layout.a_off, layout.lda, layout.stride_a)
            x = (layout.b_off, layout.stride_b) + ((layout.ldb,) if vectors > 1 else ())
            x_unit = problem.trans_b or (vectors == 1 and layout.ldb == 1)
        else:
            w = (layout.b_off, layout.ldb, layout.stride_b)
            x = (layout.a_off, layout.stride_a) + ((layout.lda,) if vectors > 1 else ())
            x_unit = not problem.trans_a or (vectors == 1 and layout.lda == 1)
        # float4 reads of W need its offset, leading dimension and batch stride in whole
        # float4s (16-bit storage and folds read element by element); along W's rows the
        # vectors are read as float4 too where each is contiguous and aligned so.
        vec = 4 if (not problem.ab16 and all(f is None for f in layout.folds)
                    and not any(v % 4 for v in w)) else 1
        x_vec = 4 if vec == 4 and rows and x_unit and not any(v % 4 for v in x) else 1
        lanes, group = params["lanes"], params["group"]
        if rows:
            per_split = _round_up(outputs, group) * lanes
            min_chunk = lanes * vec * self.MIN_STEPS
        else:
            per_split = _round_up(math.ceil(outputs / vec), lanes) * group
            min_chunk = group * self.MIN_STEPS
        split = params.get("split_k", 0)
        if not split:
            target = self.ITEMS_PER_UNIT * max(1, ctx.info.compute_units)
            split = max(1, min(target // (per_split * problem.batch), problem.k // min_chunk))
        # Chunks of a multiple of 4 keep the float4 reads along rows aligned.
        k_chunk = _round_up(math.ceil(problem.k / split), 4)
        return GemmConfig(global_vec=vec, global_vec_b=x_vec, gemv_a=int(w_is_a),
                          gemv_vectors=vectors,
                          splits=math.ceil(problem.k / k_chunk), k_chunk=k_chunk)

    def template_params(self, params, config):
        return {"W_IS_A": config.gemv_a, "NV": config.gemv_vectors, "LANES": params["lanes"],
                "GROUP": params["group"], "VEC": config.global_vec, "XVEC": config.global_vec_b,
                "SPLIT_K": int(config.splits > 1)}

    def launches(self, ctx, problem, params, config, args, workspace):
        lanes, group = params["lanes"], params["group"]
        _, _, outputs, rows = self.form(problem)
        depth = problem.batch * config.splits
        if rows:
            grid = (lanes, _round_up(outputs, group), depth)
        else:
            grid = (_round_up(math.ceil(outputs / config.global_vec), lanes), group, depth)
        local = (lanes, group, 1)
        if config.splits < 2:
            return [("gemm_gemv", grid, local,
                     [*args.ab, *args.c, *args.out, *args.folds, np.int32(1),
                      np.int32(problem.k), *args.chain])]
        return _split_launches(ctx, "gemm_gemv", grid, None, problem, config, args, workspace,
                               local)


class TiledSolver(GemmSolver):
    """The tiled kernel in one pass over K."""
    name = "tiled"
    template = "gemm_tiled"
    keys = _TILED_KEYS
    defaults = DEFAULT_TILED
    rule_solvers = ("tiled", "splitk")

    def params_problem(self, params, info):
        split = params.get("split_k", 1)
        if split != 1:
            return (f"the tiled solver runs K in one pass (split_k {split!r}); the splitk "
                    f"solver splits it")
        return self.missing(params) or _tiled_problem(params, info)

    def force(self, params):
        return dict(params, solver=self.name, split_k=1)

    def configure(self, ctx, problem, params, layout):
        gvec = params.get("global_vec", 1)
        if gvec > 1 and (any(x % gvec for x in (layout.lda, layout.ldb, layout.a_off, layout.b_off,
                                                 layout.stride_a, layout.stride_b))
                         or any(f is not None and not f.vector_ok(gvec)
                                for f in (layout.fold_a, layout.fold_b))):
            # Vector loads need every row of A and B (every image of a folded one) to start on
            # a vector boundary.
            gvec = 1
        # Vector stores of C need every row of C to start on a vector boundary.
        vec = params["vec"]
        c_aligned = vec > 1 and not any(x % vec for x in (layout.ldc, layout.c_off,
                                                          layout.stride_c))
        c_aligned = c_aligned and (layout.fold_c is None or layout.fold_c.vector_ok(vec))
        # Pipelined slices copy through cp.async where the device has it, unless a rule or a
        # caller says async_copy 0. Folded operands keep the plain copies: cp.async was checked
        # on a GPU only unfolded.
        nv_async = int(bool(params.get("pipeline", 0)) and params.get("async_copy", 1) != 0
                       and all(f is None for f in layout.folds) and _has_cp_async(ctx))
        options = ()
        if params.get("max_registers") and ctx.info.vendor == "nvidia":
            options = (f"-cl-nv-maxrregcount={int(params['max_registers'])}",)
        # NVIDIA's compiler ignores the cap for a kernel that declares its work-group size
        # (reqd_size 0 may also be forced, to test the kernel without the declaration).
        reqd_size = 0 if options else int(params.get("reqd_size", 1))
        return GemmConfig(global_vec=gvec, c_vec=vec if c_aligned else 1, nv_async=nv_async,
                          reqd_size=reqd_size, options=options,
                          **_split_config(problem, params["tile_k"], params.get("split_k", 1)))

    def template_params(self, params, config):
        return {"TILE_M": params["tile_m"], "TILE_N": params["tile_n"],
                "TILE_K": params["tile_k"], "WPT_M": params["wpt_m"], "WPT_N": params["wpt_n"],
                "VEC": params["vec"], "PAD": params["pad"],
                "DOUBLE_BUFFER": int(params["double_buffer"]), "SPLIT_K": int(config.splits > 1),
                "GVEC": config.global_vec, "CVEC": config.c_vec,
                "LANES_N": params.get("lanes_n", 0), "GROUP_M": params.get("tile_group", 1),
                "PIPELINE": params.get("pipeline", 0),
                "NV_ASYNC": int(bool(params.get("pipeline", 0) and config.nv_async)),
                "REQD_SIZE": config.reqd_size}

    def launches(self, ctx, problem, params, config, args, workspace):
        M, N, batch = problem.m, problem.n, problem.batch
        i32 = np.int32
        threads = tiled_threads(params)
        grid = (math.ceil(N / params["tile_n"]) * threads, math.ceil(M / params["tile_m"]),
                batch * config.splits)
        if config.splits < 2:
            return [("gemm_tiled", grid, (threads, 1, 1),
                     [*args.ab, *args.c, *args.out, *args.folds, i32(1), i32(problem.k),
                      *args.chain])]
        return _split_launches(ctx, "gemm_tiled", grid, threads, problem, config, args,
                               workspace)


def _split_config(problem, tile_k, split_k):
    """GemmConfig's splits and k_chunk for ``split_k`` chunks of K (a multiple of tile_k each;
    a K shorter than the chunks runs in one pass)."""
    split = max(1, int(split_k))
    k_chunk = _round_up(math.ceil(problem.k / split), tile_k)
    return {"splits": math.ceil(problem.k / k_chunk), "k_chunk": k_chunk}


def _split_workspace(problem, config):
    """Bytes of a split plan's partial sums: ``batch * splits`` M x N floats (none in one
    pass)."""
    if config.splits < 2:
        return 0
    return 4 * problem.batch * config.splits * problem.m * problem.n


def _split_launches(ctx, kernel, grid, threads, problem, config, args, workspace, local=None):
    """A GEMM split along K: ``kernel`` writes raw partial sums into the workspace
    ([batch * splits][M][N], dense: unit alpha, no beta, no fold of C), then
    gemm_splitk_reduce (gemm_splitk_reduce4 where N is a multiple of 4; both in the same
    program) adds them with the epilogue. ``local``: the
    kernel's work-group when not (threads, 1, 1)."""
    M, N, batch = problem.m, problem.n, problem.batch
    i32, i64, f32 = np.int32, np.int64, np.float32
    group = min(64, ctx.info.max_work_group_size)
    # Four columns an item where the rows of the (dense) workspace hold whole float4s.
    reduce = (("gemm_splitk_reduce4", (_round_up(N // 4, group), M, batch), (group, 1, 1))
              if N % 4 == 0 else
              ("gemm_splitk_reduce", (_round_up(N, group), M, batch), (group, 1, 1)))
    return [(kernel, grid, local or (threads, 1, 1),
             [*args.ab, workspace, i64(0), i32(N), i64(0), f32(1.0), f32(0.0), *args.out,
              *args.folds[:10], *_fold_args(None, False), i32(config.splits),
              i32(config.k_chunk), *args.chain]),
            (*reduce, [i32(M), i32(N), i32(config.splits), workspace, *args.c, *args.out,
                       *_fold_args(args.fold_c, False), *args.chain])]


class SplitKSolver(TiledSolver):
    """The tiled kernel split along K into ``split_k`` chunks (work-groups of their own), their
    partial sums added by gemm_splitk_reduce: for problems with few output tiles and a long K.
    A K shorter than the chunks runs in one pass."""
    name = "splitk"

    def params_problem(self, params, info):
        split = params.get("split_k", 1)
        if not isinstance(split, int) or isinstance(split, bool) or split < 2:
            return f"the splitk solver needs split_k >= 2, got {split!r}"
        return self.missing(params) or _tiled_problem(params, info)

    def force(self, params):
        split = params.get("split_k", 1)
        return dict(params, solver=self.name, split_k=split if split >= 2 else DEFAULT_SPLITS)


class SubgroupSolver(GemmSolver):
    name = "subgroup"
    template = "gemm_subgroup"
    keys = _SUBGROUP_KEYS
    defaults = DEFAULT_SUBGROUP
    rule_solvers = ("subgroup",)

    def refusal(self, ctx, problem):
        why = self.dtype_refusal(problem)
        if why is not None:
            return why
        absent = [e for e in SUBGROUP_EXTENSIONS if e not in ctx.info.extensions]
        if absent:
            return f"the subgroup kernel needs {absent}, which the device does not report"
        return None

    def params_problem(self, params, info):
        return _subgroup_problem(params, info)

    def configure(self, ctx, problem, params, layout):
        # Block reads take whole rows of SG_SIZE floats from 16-byte boundaries: every row
        # start of the operand must be one (a caller's block_a / block_b 0 keeps plain loads).
        def aligned(*values):
            return not any(int(x) % 4 for x in values)
        return GemmConfig(
            block_a=int(params.get("block_a", 1) != 0 and not layout.trans_a
                        and layout.fold_a is None
                        and aligned(layout.lda, layout.a_off, layout.stride_a)),
            block_b=int(params.get("block_b", 1) != 0 and not layout.trans_b
                        and layout.fold_b is None
                        and aligned(layout.ldb, layout.b_off, layout.stride_b)))

    def template_params(self, params, config):
        return {"SG_SIZE": params["sg_size"], "SG_WPT_M": params["wpt_m"],
                "SG_WPT_N": params["wpt_n"], "SG_GROUPS": params["sg_groups"],
                "BLOCK_A": config.block_a, "BLOCK_B": config.block_b}

    def launches(self, ctx, problem, params, config, args, workspace):
        sg, rows, groups = params["sg_size"], params["wpt_m"], params["sg_groups"]
        return [("gemm_subgroup",
                 (math.ceil(problem.n / (sg * params["wpt_n"])) * sg,
                  _round_up(math.ceil(problem.m / rows), groups), problem.batch),
                 (sg, groups, 1), [*args.ab, *args.c, *args.out, *args.folds, *args.chain])]


class MmaSolver(GemmSolver):
    """NVIDIA tensor cores: warp-level mma.sync in inline PTX (m16n8k8 TF32 on float32
    operands, m16n8k16 .f16 / .bf16 on 16-bit ones), slices staged in local memory through
    cp.async (``kernels/gemm_mma.cl.mako``). Applies where the device is an NVIDIA GPU of
    compute capability 8.0 or later and, for float32 operands, TF32 is allowed; every
    transpose, offset, leading dimension, batch stride and, for float32 operands, fold (a 1x1
    convolution's tensors) and epilogue (16-bit ones: the "gemm" order without folds,
    ``GemmPlan`` refuses the rest).
    Tunables: ``tile_m``, ``tile_n``, ``tile_k``, ``warps_m``, ``warps_n``, ``stages`` (the
    kernel header says what each means), optionally ``tile_group``, ``staged`` (1: slices go
    through registers and are rounded to TF32 once, 2 stages; float32 operands only),
    ``stage_mn`` (1, with ``staged``: slices stored M- and N-contiguous in local memory
    whatever the operands' layout, transposed on their way through registers: rows of
    TILE_M + 4 words instead of a K-contiguous TILE_K + 8, which lets 256 x 128 tiles fit),
    ``round`` ("cvt": cvt.rna.tf32.f32; "int": the same rounding in integer operations) and
    ``ab_bits`` (16: parameters for 16-bit operands; 32, the default, for float32) and
    ``split_k`` (float32 operands: K in that many chunks, work-groups of their own, whose raw
    sums gemm_splitk_reduce adds with the epilogue, as the splitk solver's; set where the
    output tiles leave the GPU idle and K is long, by ``_split_long_k``, or given as a plan's
    ``params``).
    Parameters with ``"emulate": 1`` compute the same mma fragments through local memory on
    any device (the kernel's addressing checked where no tensor core is); they are given as a
    plan's ``params``, never chosen."""
    name = "mma"
    template = "gemm_mma"
    keys = _MMA_KEYS
    defaults = DEFAULT_MMA
    rule_solvers = ("mma",)
    takes_16bit = True

    def defaults_for(self, problem):
        return DEFAULT_MMA16 if problem.ab16 else DEFAULT_MMA

    def params_for(self, problem, params):
        if problem.ab16 and "ab_bits" not in params:
            return dict(params, ab_bits=16)
        return params

    def refusal(self, ctx, problem):
        if problem.ab16:
            return mma_device_problem(ctx.info)
        if not problem.tf32:
            return ("TF32 is not allowed (dlprim_py.backends.allow_tf32 and the context's "
                    "allow_tf32 are False)")
        return mma_device_problem(ctx.info)

    def params_problem(self, params, info):
        return self.missing(params) or _mma_problem(params, info)

    def configure(self, ctx, problem, params, layout):
        # 16-byte copies of an operand (4 floats, 8 16-bit values) need every row of it to start
        # on a 16-byte boundary and, folded (float32 only), a copy's consecutive columns from a
        # multiple of 4 to lie in one image, contiguously (whole 4-column groups per image,
        # image strides of 4 elements).
        per_copy = 8 if problem.ab16 else 4

        def aligned(off, ld, stride, fold):
            return not any(x % per_copy for x in (off, ld, stride)) \
                and (fold is None or fold.vector_ok(per_copy))
        emulate = params.get("emulate", 0)
        nv_async = int(not emulate and params.get("async_copy", 1) != 0 and _has_cp_async(ctx))
        # Pairs of adjacent float32 accumulators stored as one float2 where every row of C
        # (every image of a folded C) starts on an 8-byte boundary.
        c_pairs = problem.c_dtype == "float32" \
            and not any(x % 2 for x in (layout.ldc, layout.c_off, layout.stride_c)) \
            and (layout.fold_c is None or layout.fold_c.vector_ok(2))
        return GemmConfig(
            global_vec=per_copy if aligned(layout.a_off, layout.lda, layout.stride_a,
                                           layout.fold_a) else 1,
            global_vec_b=per_copy if aligned(layout.b_off, layout.ldb, layout.stride_b,
                                             layout.fold_b) else 1,
            c_vec=2 if c_pairs else 1, nv_async=nv_async,
            **_split_config(problem, params["tile_k"], params.get("split_k", 1)))

    def template_params(self, params, config):
        return {"TILE_M": params["tile_m"], "TILE_N": params["tile_n"],
                "TILE_K": params["tile_k"], "WARPS_M": params["warps_m"],
                "WARPS_N": params["warps_n"], "STAGES": params["stages"],
                "GVEC_A": config.global_vec, "GVEC_B": config.global_vec_b or config.global_vec,
                "NV_ASYNC": config.nv_async,
                "GROUP_M": params.get("tile_group", 1), "EMULATE": params.get("emulate", 0),
                "CVEC": config.c_vec, "ROUND": params.get("round", "cvt"),
                "STAGED": params.get("staged", 0), "STAGE_MN": params.get("stage_mn", 0),
                "SPLIT_K": int(config.splits > 1)}

    def launches(self, ctx, problem, params, config, args, workspace):
        threads = 32 * params["warps_m"] * params["warps_n"]
        grid = (math.ceil(problem.n / params["tile_n"]) * threads,
                math.ceil(problem.m / params["tile_m"]), problem.batch * config.splits)
        if config.splits < 2:
            return [("gemm_mma", grid, (threads, 1, 1),
                     [*args.ab, *args.c, *args.out, *args.folds, np.int32(1),
                      np.int32(problem.k), *args.chain])]
        return _split_launches(ctx, "gemm_mma", grid, threads, problem, config, args,
                               workspace)


class _GemmFamily(solver.Family):
    def usable(self, ctx, problem, params):
        """A rule names parameters that run on this device (a rule measured on another one
        may not), for the problem's operand type."""
        return params_problem(params, ctx.info) is None and _bits_match(params, problem)


def _bits_match(params, problem):
    """Whether mma parameters were written for the problem's operands (``ab_bits`` 16 for
    16-bit ones, 32, the default, for float32); other solvers' parameters serve both."""
    return params.get("solver") != "mma" or params.get("ab_bits", 32) == problem.ab_bits


FAMILY = solver.register(_GemmFamily(
    "gemm", (TiledSolver(), SplitKSolver(), SmallSolver(), SubgroupSolver(), MmaSolver(),
             GemvSolver()),
    title="GEMM algorithm"))
# Rules written before the solver layer name the kernel (solver_params reads them).
tuning.upgrade_params("gemm", solver_params)


# ---- choosing -----------------------------------------------------------------------------

def _features(ctx, problem):
    """The features the solver layer matches rules with (the problem's, and the device's)."""
    return dict(problem.features(), gpu=int(ctx.info.is_gpu))


def _argument_solver(ctx, problem, name):
    """The solver a caller's ``algorithm`` names, refused as DLPRIM_GEMM_ALGO is (the solver
    layer), with the reason."""
    chosen = FAMILY.solver(name)
    why = chosen.refusal(ctx, problem)
    if why is not None:
        raise UnsupportedError(f"GEMM algorithm {name!r} does not apply to {problem.key()}: "
                               f"{why}; applicable: {', '.join(FAMILY.applicable(ctx, problem))}")
    return chosen


def select_params(ctx, M, N, K, batch=1, algorithm=None, tf32=False, dtype="float32",
                  c_dtype="float32", trans_a=False, trans_b=False):
    """Solver parameters for a problem (``{"solver": name, ...}``; ``tf32``: whether TF32 is
    allowed, which the "mma" solver needs; ``trans_a``/``trans_b``: the operands' form, which
    measured rules may be for): the solver ``algorithm``
    names, else the solver layer's choice (``solver.select``: forced by ``DLPRIM_GEMM_ALGO``,
    else tuned). A forced solver takes its parameters from the first rule that gives them
    (``GemmSolver.forced``), a tuned one from the rule that chose it (``tuning_db/gemm.json``),
    a long K then split where the rule's tiles leave a GPU idle (``_split_long_k``). Memoized
    per context."""
    forced = algorithm or config.forced_algorithm("gemm")
    tf32 = bool(tf32) and dtype == "float32"
    trans_a, trans_b = bool(trans_a), bool(trans_b)
    key = ("gemm.select", M, N, K, batch, forced, tf32, dtype, c_dtype, trans_a, trans_b,
           tuning.generation)
    found = ctx.plans.get(key)
    if found is not None:
        return dict(found)
    problem = GemmProblem(M, N, K, batch, tf32, dtype, c_dtype, trans_a, trans_b)
    if algorithm is not None:
        chosen = _argument_solver(ctx, problem, algorithm)
    else:
        chosen = solver.select(ctx, "gemm", problem)
    params = chosen.forced(ctx, problem) if forced is not None else _tuned(ctx, problem, chosen)
    ctx.plans.put(key, params)
    return dict(params)


def tf32_params(ctx, M, N, K, batch=1):
    """Parameters of the "mma" solver for a TF32 GEMM of these sizes, for operators that run
    their GEMMs in TF32 by choice (the convolution's TF32 algorithms): the first "mma" rule
    of the tuning database that holds and runs here, else ``DEFAULT_MMA``, split along a long
    K where its tiles would leave the GPU idle (``_split_long_k``); on a device without
    TF32 mma.sync, ``EMULATED_MMA`` (which such operators use only under DLPRIM_TF32_EMULATE).
    Memoized per context."""
    key = ("gemm.tf32_params", M, N, K, batch, tuning.generation)
    found = ctx.plans.get(key)
    if found is None:
        if mma_device_problem(ctx.info) is not None:
            found = dict(EMULATED_MMA)
        else:
            found = _split_long_k(
                FAMILY.solvers["mma"].forced(ctx, GemmProblem(M, N, K, batch, True)),
                ctx.info, M, N, K, batch)
        ctx.plans.put(key, found)
    return dict(found)


def _tuned(ctx, problem, chosen):
    info = ctx.info
    # The rule that chose the solver (the first that holds, runs here and names an applicable
    # solver is the first that holds, runs here and names this one), else the solver's
    # defaults where it was chosen by rank.
    params = tuning.first_params(info, "gemm", _features(ctx, problem),
                                 lambda p: p.get("solver") == chosen.name
                                 and params_problem(p, info) is None and _bits_match(p, problem))
    params = dict(params or chosen.defaults_for(problem))
    if chosen.name in ("tiled", "splitk") or (chosen.name == "mma" and not problem.ab16):
        params = _split_long_k(params, info, problem.m, problem.n, problem.k, problem.batch)
    return params


def _split_long_k(params, info, M, N, K, batch):
    """Split K when the output tiles would leave most of a GPU idle and K is long, as the
    rule of ``tuning_db/gemm_split.json`` says (its text gives the reasons): about
    ``items_per_unit`` work-items (at least ``min_groups_per_unit`` work-groups) per compute
    unit, chunks of at least ``min_chunk`` along K. A rule's own split_k stands when it already
    fills the device (a measured rule also serves shapes near the one it was measured on, with
    other tile counts). Tiled parameters split this way become the "splitk" solver's; "mma"
    parameters (float32 operands) split in the mma kernel itself."""
    solver_name = params.get("solver")
    if solver_name not in ("tiled", "splitk", "mma") or params.get("emulate") \
            or params.get("ab_bits", 32) == 16:
        return params
    rule, _ = tuning.lookup(info, "gemm_split",
                            {"m": M, "n": N, "k": K, "mn": M * N, "batch": batch,
                             "gpu": int(info.is_gpu)})
    if not rule["items_per_unit"]:
        return params
    tiles = batch * math.ceil(M / params["tile_m"]) * math.ceil(N / params["tile_n"])
    if tiles * max(1, params.get("split_k", 1)) >= info.compute_units:
        return params
    threads = 32 * params["warps_m"] * params["warps_n"] if solver_name == "mma" \
        else tiled_threads(params)
    target = info.compute_units * max(rule["min_groups_per_unit"],
                                      rule["items_per_unit"] // threads)
    split = min(math.ceil(target / tiles), K // rule["min_chunk"])
    if split < 2:
        return params
    return dict(params, split_k=split) if solver_name == "mma" else \
        dict(params, solver="splitk", split_k=split)


_PER = {None: 0, "n": 1, "m": 2, "position": 3}


def common_template_params(trans_a=False, trans_b=False, bias_per=None, activation_code="",
                           folds=(None, None, None), order="gemm", scale_per=None,
                           residual=False, chain=(), chain_per="m", dtype=float32,
                           c_dtype=float32):
    """The template parameters every GEMM kernel takes (kernels/gemm_common.cl.mako)."""
    base = {"TRANS_A": int(trans_a), "TRANS_B": int(trans_b), "BIAS": _PER[bias_per],
            "ACTIVATION": activation_code, "EPILOGUE": order, "SCALE": _PER[scale_per],
            "RESIDUAL": int(residual), "CHAIN": [tuple(link) for link in chain],
            "CHAIN_CHANNEL": _PER[chain_per], "AB_TYPE": _TYPE_NAMES[as_dtype(dtype)],
            "C_TYPE": _TYPE_NAMES[as_dtype(c_dtype)]}
    base.update({f"FOLD_{name}": 0 if fold is None else fold.mode
                 for name, fold in zip("ABC", folds)})
    return base


def render_params(params, config=GemmConfig(), **common):
    """(template, template parameters) of the kernel of ``params`` (either form) with the
    derived ``config``; ``common`` as ``common_template_params``. For the tuner and
    benchmarks that render a kernel's source."""
    params = solver_params(params)
    chosen = FAMILY.solver(params["solver"])
    return chosen.template, {**common_template_params(**common),
                             **chosen.template_params(params, config)}


def kernel_source(params, config=GemmConfig(), **common):
    """The OpenCL source of ``render_params``'s kernel."""
    template, values = render_params(params, config, **common)
    return program.render(template, **values)


# ---- validation ---------------------------------------------------------------------------

def gemm_dtypes(dtype, c_dtype=None):
    """(A and B's dtype, C's) checked: float32, float16 or bfloat16 operands; C float32 or the
    operands' type (None: float32). DTypeError otherwise."""
    dtype = as_dtype(dtype)
    if dtype not in _TYPE_NAMES:
        raise DTypeError(f"GEMM operands must be float32, float16 or bfloat16, got "
                         f"{dtype_name(dtype)}")
    c_dtype = float32 if c_dtype is None else as_dtype(c_dtype)
    if c_dtype not in (float32, dtype):
        raise DTypeError(f"GEMM on {dtype_name(dtype)} operands writes float32 or "
                         f"{dtype_name(dtype)}, got C of {dtype_name(c_dtype)}")
    return dtype, c_dtype


def _positive_int(value, name):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ShapeError(f"{name} must be an int >= 1, got {value!r}")
    if value > _INT32_MAX:
        raise UnsupportedError(f"{name} = {value} exceeds the 32-bit index range of the kernels")
    return int(value)


def _non_negative_int(value, name):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ShapeError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def _check_buffer(ctx, buf, name):
    if not isinstance(buf, cl.MemoryObjectHolder):
        raise DeviceError(f"{name} must be a pyopencl Buffer, got {type(buf).__name__}")
    if buf.context != ctx.cl_context:
        raise DeviceError(f"{name} belongs to another OpenCL context than {ctx!r}")


def _check_operand(ctx, name, buf, off, ld, rows, cols, batch, stride, itemsize, fold=None):
    """A rows x cols row-major matrix (times batch) at element offset ``off`` in ``buf``; with
    ``fold`` its columns are folded (``Fold``)."""
    _check_buffer(ctx, buf, f"{name} buffer")
    off = _non_negative_int(off, f"{name} offset")
    stride = _non_negative_int(stride, f"{name} batch stride")
    if fold is not None:
        if not isinstance(fold, Fold):
            raise ShapeError(f"fold of {name} must be a Fold, got {type(fold).__name__}")
        if not isinstance(ld, (int, np.integer)) or isinstance(ld, bool) or ld < 0:
            raise ShapeError(f"leading dimension of folded {name} must be an int >= 0, got {ld!r}")
        if ld * 256 > _INT32_MAX:
            raise UnsupportedError(f"leading dimension of {name} ({ld}) is too large for the kernels")
        needed = off + (batch - 1) * stride + (rows - 1) * ld + fold.max_offset(cols) + 1
        have = buf.size // itemsize
        if needed > have:
            raise ShapeError(f"{name} buffer holds {have} elements but the folded {rows}x{cols} "
                             f"matrix ({fold}, leading dimension {ld}, offset {off}) needs {needed}")
        return off, int(ld), stride
    if not isinstance(ld, (int, np.integer)) or isinstance(ld, bool) or ld < cols:
        raise ShapeError(f"leading dimension of {name} must be an int >= {cols} (its stored "
                         f"{rows}x{cols} row length), got {ld!r}")
    if ld * 256 > _INT32_MAX:
        raise UnsupportedError(f"leading dimension of {name} ({ld}) is too large for the kernels")
    needed = off + (batch - 1) * stride + (rows - 1) * ld + cols
    have = buf.size // itemsize
    if needed > have:
        raise ShapeError(f"{name} buffer holds {have} elements but a {'%d x ' % batch if batch > 1 else ''}"
                         f"{rows}x{cols} matrix with leading dimension {ld}, offset {off}"
                         f"{f' and batch stride {stride}' if batch > 1 else ''} needs {needed}")
    return off, int(ld), stride


# ---- the plan -----------------------------------------------------------------------------

class GemmPlan:
    """One GEMM on fixed buffers: validated, solver chosen and built, arguments bound once.

    Arguments as ``enqueue_gemm``; keyword-only extras: ``algorithm`` (a solver name of
    ``ALGORITHMS``) and ``params`` (a full solver parameter dict, as the tuner uses; the form
    before the solver layer, ``{"kernel": ...}``, is read as well) override the database's
    choice (the "subgroup" solver only where the device reports ``SUBGROUP_EXTENSIONS``, and
    never split along K); ``allow_tf32`` (default False: float32) lets the choice take the
    TF32 "mma" solver where it applies (``algorithm="mma"`` needs it; ``params`` naming "mma"
    do not, being the kernel asked for); ``dtype``: A's and B's storage, float32, float16 or
    bfloat16 (16-bit: "gemm" order, no folds; the module docstring); ``c_dtype``: C's and the
    bias's, float32 (the default) or ``dtype``; ``fold_a``, ``fold_b``, ``fold_c``:
    ``Fold`` addressing of an operand's contiguous dimension (A along K only, C densely only).
    ``params`` keeps the parameters as chosen; ``config`` (a ``GemmConfig``) what the plan
    derived from them; ``solver`` the solver; ``algorithm`` what runs ("splitk" only where K
    is split into ``splits`` > 1 chunks).

    ``order="conv"`` applies the convolution's epilogue instead,
    ``C = act(alpha * acc * scale + bias + residual_alpha * R) + beta * C``, with
    ``scale_buf``/``scale_off``/``scale_per`` (as the bias) and ``residual_buf``/
    ``residual_off`` (R laid out like C: C's leading dimension, fold and batch stride).
    ``bias_per``/``scale_per`` may then also be ``"position"``: one value per row and column
    of an image, at ``row * Q + q`` (q the column within its image, Q the columns per image:
    the fold's positions when C is folded, else N).
    ``chain``/``chain_args`` (``order="conv"``, no scale nor bias): a fusion plan's bias /
    batch-norm-inference chain ``((kind, per_position), ...)`` and its kernel arguments
    (kernels/fusion_fold.cl.mako's chain_params order); the epilogue computes the chain's
    scale and shift itself, per channel (rows for ``chain_per="m"``, columns for ``"n"``) or,
    for per_position links, per position as a ``"position"`` bias is addressed.
    """

    def __init__(self, ctx, M, N, K, a_buf, a_off, lda, b_buf, b_off, ldb, c_buf, c_off, ldc, *,
                 trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias_buf=None, bias_off=0,
                 bias_per="n", activation=None, batch=1, stride_a=0, stride_b=0, stride_c=0,
                 fold_a=None, fold_b=None, fold_c=None, order="gemm", scale_buf=None,
                 scale_off=0, scale_per="m", residual_buf=None, residual_off=0,
                 residual_alpha=1.0, chain=(), chain_args=(), chain_per="m", dtype=np.float32,
                 c_dtype=None, algorithm=None, params=None, allow_tf32=False):
        dtype, c_dtype = gemm_dtypes(dtype, c_dtype)
        half = dtype in FLOAT16_TYPES
        if half and (order != "gemm" or any(f is not None for f in (fold_a, fold_b, fold_c))
                     or scale_buf is not None or residual_buf is not None or chain):
            raise UnsupportedError(f"GEMM on {dtype_name(dtype)} operands takes the 'gemm' "
                                   f"epilogue order without folds, scale, residual or chain")
        ab_size, itemsize = dtype.itemsize, c_dtype.itemsize
        self.ctx = ctx
        M = _positive_int(M, "M")
        N = _positive_int(N, "N")
        K = _positive_int(K, "K")
        batch = _positive_int(batch, "batch")
        self.shape = (M, N, K)
        self.batch = batch
        a_rows, a_cols = (K, M) if trans_a else (M, K)
        b_rows, b_cols = (N, K) if trans_b else (K, N)
        if fold_a is not None and trans_a:
            raise UnsupportedError("A can be folded only along K (trans_a=False)")
        if fold_c is not None and (not isinstance(fold_c, Fold) or fold_c.mode != 1):
            raise UnsupportedError(f"C can be folded only densely (a Fold without a stride), "
                                   f"got {fold_c!r}")
        a_off, lda, stride_a = _check_operand(ctx, "A", a_buf, a_off, lda, a_rows, a_cols, batch,
                                              stride_a, ab_size, fold_a)
        b_off, ldb, stride_b = _check_operand(ctx, "B", b_buf, b_off, ldb, b_rows, b_cols, batch,
                                              stride_b, ab_size, fold_b)
        c_off, ldc, stride_c = _check_operand(ctx, "C", c_buf, c_off, ldc, M, N, batch, stride_c,
                                              itemsize, fold_c)
        if fold_c is not None and (ldc < min(N, fold_c.positions)
                                   or fold_c.image_stride < (M - 1) * ldc + min(N, fold_c.positions)):
            raise ShapeError(f"folded C ({fold_c}, leading dimension {ldc}) makes the {M} rows "
                             f"of an image overlap")
        folds = (fold_a, fold_b, fold_c)
        if batch > 1 and stride_c < M * ldc - (ldc - N) and fold_c is None:
            raise ShapeError(f"C batch stride {stride_c} makes the {M}x{N} outputs of a batch "
                             f"overlap (needs >= {(M - 1) * ldc + N})")
        if order not in ("gemm", "conv"):
            raise UnsupportedError(f"epilogue order must be 'gemm' or 'conv', got {order!r}")
        per_image = fold_c.positions if fold_c is not None else N
        lengths = {"n": N, "m": M, "position": M * per_image}

        def vector(buf, off, per, name):
            if buf is None:
                return None, 0
            if per not in lengths or (per == "position" and order != "conv"):
                raise ShapeError(f"{name}_per must be 'n' ({name}[N] per row), 'm' ({name}[M] "
                                 f"per column){' or position' if order == 'conv' else ''}, got "
                                 f"{per!r}")
            _check_buffer(ctx, buf, f"{name} buffer")
            off = _non_negative_int(off, f"{name} offset")
            length = lengths[per]
            if off + length > buf.size // itemsize:
                raise ShapeError(f"{name} buffer holds {buf.size // itemsize} elements but "
                                 f"{name}[{length}] at offset {off} needs {off + length}")
            return per, off

        if order == "gemm" and (scale_buf is not None or residual_buf is not None):
            raise UnsupportedError("a scale or a residual needs order='conv' (the convolution's "
                                   "epilogue)")
        bias_kind, bias_off = vector(bias_buf, bias_off, bias_per, "bias")
        scale_kind, scale_off = vector(scale_buf, scale_off, scale_per, "scale")
        if residual_buf is not None:
            residual_off, _, _ = _check_operand(ctx, "residual", residual_buf, residual_off, ldc,
                                                M, N, batch, stride_c, itemsize, fold_c)
        else:
            residual_off = 0
        chain = tuple(tuple(link) for link in chain)
        if chain and (order != "conv" or scale_buf is not None or bias_buf is not None
                      or chain_per not in ("m", "n")):
            raise UnsupportedError("a chain needs order='conv', no scale nor bias, and chain_per "
                                   f"'m' or 'n' (got {chain_per!r})")
        chain_args = list(chain_args)
        epilogue = dict(order=order, scale_per=scale_kind, residual=residual_buf is not None,
                        chain=chain, chain_per=chain_per, dtype=dtype, c_dtype=c_dtype)
        act = as_activation(activation)
        act_code = act.forward_code("x") if act is not None else ""

        allow_tf32 = bool(allow_tf32) and not half
        problem = GemmProblem(M, N, K, batch, allow_tf32, dtype_name(dtype), dtype_name(c_dtype),
                              bool(trans_a), bool(trans_b))
        layout = GemmLayout(bool(trans_a), bool(trans_b), a_off, lda, stride_a, b_off, ldb,
                            stride_b, c_off, ldc, stride_c, fold_a, fold_b, fold_c)
        if params is None:
            params = select_params(ctx, M, N, K, batch, algorithm, allow_tf32, problem.dtype,
                                   problem.c_dtype, problem.trans_a, problem.trans_b)
        params = solver_params(params)
        chosen = FAMILY.solvers.get(params.get("solver"))
        if chosen is not None:
            params = chosen.params_for(problem, params)
            why = chosen.dtype_refusal(problem)
            if why is not None:
                raise UnsupportedError(f"GEMM algorithm {chosen.name!r} does not run this call: "
                                       f"{why}")
            if not _bits_match(params, problem):
                raise UnsupportedError(f"mma parameters {params} are for "
                                       f"{params.get('ab_bits', 32)}-bit operands, the GEMM's "
                                       f"are {dtype_name(dtype)}")
        why = params_problem(params, ctx.info)
        if why is not None:
            raise UnsupportedError(f"GEMM kernel parameters {params} do not run here: {why}")
        # The tuned parameters as given; what this plan derives from them is self.config.
        self.params = params
        self.solver = chosen
        self.config = chosen.configure(ctx, problem, params, layout)

        f32 = np.float32
        i32 = np.int32
        i64 = np.int64
        bias_arg = bias_buf if bias_buf is not None else c_buf
        # Buffers of absent epilogue operands: any valid one (never read).
        epilogue_args = [scale_buf if scale_buf is not None else c_buf, i64(scale_off),
                         residual_buf if residual_buf is not None else c_buf, i64(residual_off),
                         f32(residual_alpha)]
        self._launches = []
        # Every kernel's arguments: sizes and operands A and B, then where the product goes (C,
        # or split-K's workspace) with alpha and beta, then the epilogue's operands and folds.
        args = _Arguments(ab=[i32(M), i32(N), i32(K), a_buf, i64(a_off), i32(lda), i64(stride_a),
                              b_buf, i64(b_off), i32(ldb), i64(stride_b)],
                          c=[c_buf, i64(c_off), i32(ldc), i64(stride_c), f32(alpha), f32(beta)],
                          out=[bias_arg, i64(bias_off), *epilogue_args],
                          folds=[*_fold_args(fold_a), *_fold_args(fold_b),
                                 *_fold_args(fold_c, False)],
                          fold_c=fold_c, chain=chain_args)
        size = chosen.workspace_size(ctx, problem, params, self.config)
        self.workspace = allocate(ctx, size) if size else None
        built = chosen.prepare(ctx, problem, params, self.config, common_template_params(
            trans_a, trans_b, bias_kind, act_code, folds, **epilogue))
        for name, global_size, local_size, kernel_args in chosen.launches(
                ctx, problem, params, self.config, args, self.workspace):
            self._add_launch(built, name, global_size, local_size, kernel_args)
        self.splits = self.config.splits
        # What runs: a "splitk" plan whose K fits one chunk runs the tiled kernel alone.
        self.algorithm = "splitk" if self.splits > 1 and chosen.name in ("tiled", "splitk") \
            else "tiled" if chosen.name == "splitk" else chosen.name

    def _add_launch(self, built, name, global_size, local_size, args):
        """A launch of kernel ``name`` with ``args`` bound once, on a kernel object of its own."""
        kernel = BoundKernel(program.new_kernel(built.program, name))
        kernel.set_all(args)
        # The plan holds its buffers (a recording of it takes the handles from here).
        self._launches.append((kernel, global_size, local_size, buffer_arguments(args)))

    def enqueue(self):
        """Enqueue the GEMM on the context's queue (recorded when a recording is open)."""
        queue = self.ctx.queue
        for kernel, global_size, local_size, buffers in self._launches:
            enqueue_bound(queue, kernel, global_size, local_size, buffers=buffers)

    def __repr__(self):
        M, N, K = self.shape
        return f"GemmPlan({M}x{N}x{K}, batch={self.batch}, {self.algorithm}, {self.params})"


def _has_cp_async(ctx):
    """Whether the device runs PTX cp.async (NVIDIA, compute capability 8.0 and later)."""
    found = ctx.memo.get("gemm.cp_async")
    if found is None:
        found = False
        if ctx.info.vendor == "nvidia" and "cl_nv_device_attribute_query" in ctx.info.extensions:
            try:
                found = int(ctx.device.compute_capability_major_nv) >= 8
            except (cl.Error, AttributeError):
                found = False
        ctx.memo["gemm.cp_async"] = found
    return found


def _round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def _log_call(M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta, bias_buf, bias_per,
              activation, batch, stride_a, stride_b, stride_c, algorithm):
    """The ``dlprim-driver gemm`` command of an ``enqueue_gemm`` call (DLPRIM_LOG_CMD=1): sizes,
    transposes, alpha, beta, batch, bias, activation; -S names a solver the call or
    DLPRIM_GEMM_ALGO forced. The driver's operands are packed: leading dimensions or batch
    strides other than packed ones are named as not carried."""
    flags = {"m": M, "n": N, "k": K, "u": int(bool(trans_a)), "v": int(bool(trans_b)),
             "A": alpha, "B": beta, "b": batch}
    missing = []
    if bias_buf is not None:
        flags["bias"] = bias_per
    act = as_activation(activation)
    if act is not None:
        flags["activation"], missing = logcmd.activation_named(act)
    forced = algorithm or config.forced_algorithm("gemm")
    if forced:
        flags["S"] = forced
    a_rows, a_cols = (K, M) if trans_a else (M, K)
    b_rows, b_cols = (N, K) if trans_b else (K, N)
    packed = {"lda": (lda, a_cols), "ldb": (ldb, b_cols), "ldc": (ldc, N)}
    if batch > 1:
        packed.update(stride_a=(stride_a, a_rows * a_cols), stride_b=(stride_b, b_rows * b_cols),
                      stride_c=(stride_c, M * N))
    missing += [f"{name} {got}" for name, (got, dense) in packed.items() if got != dense]
    logcmd.log_command("gemm", flags, missing)


def enqueue_gemm(ctx, M, N, K, a_buf, a_off, lda, b_buf, b_off, ldb, c_buf, c_off, ldc, *,
                 trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias_buf=None, bias_off=0,
                 bias_per="n", activation=None, batch=1, stride_a=0, stride_b=0, stride_c=0,
                 checked=False, allow_tf32=None, dtype=float32, c_dtype=None, **extra):
    """Enqueue C = act(alpha * op(A) @ op(B) + beta * C + bias) on ``ctx.queue``.

    Row-major float32 (``dtype``: A's and B's storage, float32, float16 or bfloat16;
    ``c_dtype``: C's and the bias's, float32 or ``dtype``, None for float32); offsets, leading
    dimensions and batch strides in elements. op(A) is
    M x K (A stored K x M when ``trans_a``), op(B) is K x N (B stored N x K when ``trans_b``),
    C is M x N. ``bias_per="n"``: bias[N] added to every row (linear layers); ``"m"``: bias[M]
    added to every column (convolution, M = output channels). ``activation``: None, a name or
    an ``ActivationDesc``. beta == 0 never reads C. ``allow_tf32``: None follows the context's
    and the module's switch (``dlprim_py.backends``), read here, at every call, into the plan's
    key. Keyword-only extras as ``GemmPlan``.

    The first call with given sizes, offsets, scalars and options builds a ``GemmPlan`` and
    records it; later calls replay the recording on their own buffers (after checking that each
    buffer is one of this context and holds what the sizes need; ``checked=True``: the caller
    has checked that, as the tensor API does).
    """
    if config.log_cmd():
        _log_call(M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta, bias_buf, bias_per,
                  activation, batch, stride_a, stride_b, stride_c, extra.get("algorithm"))
    operands = (a_buf, b_buf, c_buf, bias_buf)
    tf32 = backends.tf32_allowed(ctx) if allow_tf32 is None else bool(allow_tf32)
    dtype, c_dtype = gemm_dtypes(dtype, c_dtype)
    key = None
    if set(extra) <= {"algorithm"}:
        act = activation.key if hasattr(activation, "key") else activation
        key = ("gemm", M, N, K, a_off, lda, b_off, ldb, c_off, ldc, bool(trans_a),
               bool(trans_b), alpha, beta, bias_off, bias_per if bias_buf is not None else None,
               act, batch, stride_a, stride_b, stride_c, extra.get("algorithm"),
               config.forced_algorithm("gemm"), tf32, alias_pattern(operands), dtype, c_dtype)
        try:
            entry = ctx.plans.get(key)
        except TypeError:   # an unhashable argument: checked and refused by GemmPlan below
            entry = key = None
        if entry is not None:
            plan, needs = entry
            if not checked:
                for buf, need, name in zip(operands, needs, ("A", "B", "C", "bias")):
                    if buf is not None:
                        _check_buffer(ctx, buf, f"{name} buffer")
                        if buf.size < need:
                            raise ShapeError(f"{name} buffer holds {buf.size} bytes, the GEMM "
                                             f"needs {need}")
            plan.run(operands)
            return
    gemm_plan = GemmPlan(ctx, M, N, K, a_buf, a_off, lda, b_buf, b_off, ldb, c_buf, c_off, ldc,
                         trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta,
                         bias_buf=bias_buf, bias_off=bias_off, bias_per=bias_per,
                         activation=activation, batch=batch, stride_a=stride_a,
                         stride_b=stride_b, stride_c=stride_c, allow_tf32=tf32, dtype=dtype,
                         c_dtype=c_dtype, **extra)
    if key is None:
        gemm_plan.enqueue()
        return
    with Recording() as recording:
        gemm_plan.enqueue()
    plan = recording.plan(ctx.queue, operands)
    a_rows, a_cols = (K, M) if trans_a else (M, K)
    b_rows, b_cols = (N, K) if trans_b else (K, N)
    ab_size, itemsize = dtype.itemsize, c_dtype.itemsize
    needs = ((a_off + (batch - 1) * stride_a + (a_rows - 1) * lda + a_cols) * ab_size,
             (b_off + (batch - 1) * stride_b + (b_rows - 1) * ldb + b_cols) * ab_size,
             (c_off + (batch - 1) * stride_c + (M - 1) * ldc + N) * itemsize,
             (bias_off + (N if bias_per == "n" else M)) * itemsize)
    ctx.plans.put(key, (plan, needs))


# ---- tensor API ---------------------------------------------------------------------------

def _check_tensor(t, name, ndim, dtypes=(float32,)):
    if not isinstance(t, Tensor):
        raise not_a_tensor(name, t)
    if t.dtype not in dtypes:
        raise DTypeError(f"gemm: {name} must be {' or '.join(dtype_name(d) for d in dtypes)}, "
                         f"got {dtype_name(t.dtype)}")
    if t.ndim != ndim:
        raise ShapeError(f"{name} must be {ndim}-d, got shape {t.shape}")


def _gemm_tensors(a, b, c, alpha, beta, trans_a, trans_b, bias, activation, bias_per, batched,
                  algorithm, out_dtype=None):
    ndim = 3 if batched else 2
    _check_tensor(a, "a", ndim, tuple(_TYPE_NAMES))
    dtype = a.dtype
    if isinstance(b, Tensor) and b.dtype != dtype:
        raise DTypeError(f"gemm: a and b must have the same dtype, got {dtype_name(dtype)} and "
                         f"{dtype_name(b.dtype)}")
    _check_tensor(b, "b", ndim, (dtype,))
    if c is not None and isinstance(c, Tensor):
        c_dtype = c.dtype
    else:
        c_dtype = dtype if out_dtype is None else as_dtype(out_dtype)
    _, c_dtype = gemm_dtypes(dtype, c_dtype)
    for value, name in ((alpha, "alpha"), (beta, "beta")):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise DTypeError(f"{name} must be a real number, got {value!r}")
    ctx = a.ctx
    for t, name in ((b, "b"), (c, "c"), (bias, "bias")):
        if t is not None and isinstance(t, Tensor) and t.ctx.cl_context != ctx.cl_context:
            raise DeviceError(f"{name} lives in another OpenCL context than a")
    a_batch, a_rows, a_cols = (a.shape if batched else (1,) + a.shape)
    b_batch, b_rows, b_cols = (b.shape if batched else (1,) + b.shape)
    M, K = (a_cols, a_rows) if trans_a else (a_rows, a_cols)
    Kb, N = (b_cols, b_rows) if trans_b else (b_rows, b_cols)
    if K != Kb:
        raise ShapeError(f"inner dimensions differ: op(a) is {M}x{K} and op(b) is {Kb}x{N} "
                         f"(a {a.shape}, trans_a={trans_a}; b {b.shape}, trans_b={trans_b})")
    if a_batch != b_batch and 1 not in (a_batch, b_batch):
        raise ShapeError(f"batch sizes of a ({a_batch}) and b ({b_batch}) differ and neither is 1")
    batch = max(a_batch, b_batch)
    out_shape = (batch, M, N) if batched else (M, N)
    if c is None:
        if beta != 0:
            raise ShapeError(f"beta = {beta} needs c")
        c = Tensor.empty(ctx, out_shape, c_dtype)
    else:
        _check_tensor(c, "c", ndim, (c_dtype,))
        if c.shape != out_shape:
            raise ShapeError(f"c must have shape {out_shape}, got {c.shape}")
    bias_buf, bias_off = None, 0
    if bias is not None:
        _check_tensor(bias, "bias", 1, (c_dtype,))
        length = N if bias_per == "n" else M
        if bias.shape != (length,):
            raise ShapeError(f"bias must have shape ({length},) for bias_per={bias_per!r}, "
                             f"got {bias.shape}")
        bias_buf, bias_off = bias.buffer, bias.offset_elements
    if min(M, N, K, batch) == 0:
        raise ShapeError(f"GEMM needs M, N, K and batch >= 1, got M={M} N={N} K={K} batch={batch}")
    enqueue_gemm(ctx, M, N, K, a.buffer, a.offset_elements, a_cols,
                 b.buffer, b.offset_elements, b_cols, c.buffer, c.offset_elements, N,
                 trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, bias_buf=bias_buf,
                 bias_off=bias_off, bias_per=bias_per, activation=activation, batch=batch,
                 stride_a=a_rows * a_cols if a_batch > 1 else 0,
                 stride_b=b_rows * b_cols if b_batch > 1 else 0,
                 stride_c=M * N, algorithm=algorithm, checked=True, dtype=dtype,
                 c_dtype=c_dtype)
    return c


def gemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, bias=None,
         activation=None, *, bias_per="n", algorithm=None, out_dtype=None):
    """``act(alpha * op(a) @ op(b) + beta * c + bias)``, written into ``c`` when given.

    a: (M, K) float32, or (K, M) with ``trans_a``; b: (K, N), or (N, K) with ``trans_b``;
    c: (M, N) (needed when beta != 0). bias: (N,) added to every row (``bias_per="n"``) or
    (M,) added to every column (``bias_per="m"``). activation: None, a name ("relu", ...) or an
    ``ActivationDesc``. Returns the (M, N) result tensor. ``algorithm``: a solver of
    ``ALGORITHMS`` to force (an error where it does not apply).

    Float32 unless TF32 is allowed (``dlprim_py.backends.allow_tf32``, or ``a.ctx.allow_tf32``
    where not None; read at each call): on NVIDIA GPUs of compute capability 8.0 and later the
    product then runs on tensor cores in TF32 (operands rounded to 10 mantissa bits, float32
    sums), as ``torch.backends.cuda.matmul.allow_tf32`` does; elsewhere it stays float32.

    16-bit operands: a and b both float16 or both bfloat16 (DTypeError otherwise); products
    summed in float32. The result (and c, bias) is of ``out_dtype``: None takes c's dtype
    where c is given, else a's (as torch.matmul), or float32. On NVIDIA GPUs of compute
    capability 8.0 and later the "mma" solver runs it on tensor cores (m16n8k16 mma.sync),
    elsewhere "small" converts the values as it reads them; neither needs cl_khr_fp16.

    A matrix-vector product (M or N is 1) takes the "gemv" solver, which reads the matrix once
    with every work-item busy, as a bandwidth-bound product needs.
    """
    return _gemm_tensors(a, b, c, alpha, beta, trans_a, trans_b, bias, activation, bias_per,
                         False, algorithm, out_dtype)


def gemm_batched(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, bias=None,
                 activation=None, *, bias_per="n", algorithm=None, out_dtype=None):
    """Strided-batched ``gemm``: a (B, M, K), b (B, K, N) (transposed per matrix as in
    ``gemm``), c (B, M, N). A batch size of 1 in a or b shares that matrix across the batch.
    The bias is the same for every batch entry. dtypes as ``gemm``."""
    return _gemm_tensors(a, b, c, alpha, beta, trans_a, trans_b, bias, activation, bias_per,
                         True, algorithm, out_dtype)
