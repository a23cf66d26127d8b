"""Normalization: batch norm (training and inference, spatial and per-activation, with the
running-statistics update), layer norm, group norm and local response norm, forward and backward.

Two layers, as elsewhere in the library:

* MIOpen-style functions on caller-owned tensors, which the fusion plans reuse:
  ``batch_norm_forward_training``, ``batch_norm_forward_inference``, ``batch_norm_backward``
  (training batch norm with an activation, forward and backward, is these with ``activation``:
  the library's one training batch norm).
* torch.nn.functional names (``batch_norm``, ``layer_norm``, ``group_norm``,
  ``local_response_norm``) that allocate outputs and record the backward on the autograd tape.

Kernels: ``kernels/norm.cl.mako``. Statistics are reduced by work-group trees over chunks of each
channel, so a channel of 10^7 elements never accumulates in one running float sum; sizes are
run-time arguments, so a compile serves every shape. Layout: NC* (channels second), float32.

Algorithms are the solvers of two families (``dlprim_py.solver``), chosen when a call's plan is
made: the channel reductions ("norm") run as work groups per chunk of a channel with float4 or
scalar loads, or as a work item per channel for (N, C) inputs (DLPRIM_NORM_ALGO = groups,
groups_scalar, columns; rules and chunk tunables in tuning_db/norm.json); layer, group and rms
norm ("rownorm") run a work group per row, or, for group norm with few long rows, the
batch-norm kernels on the rows (DLPRIM_ROWNORM_ALGO = rows, rows4, split; rules in
tuning_db/rownorm.json). rms_norm is the row kernels' uncentred variant ("rows" and "rows4").

float16 / bfloat16 inputs (16-bit storage, torch's result type): ``layer_norm``, ``group_norm``
(the "rows" solver, whatever the rules would choose for float32), ``instance_norm``,
``rms_norm`` and ``batch_norm`` load and store them in their kernels, statistics and the
weight gradients' sums in float32, each result rounded once. The row kernels and batch norm's
move four 16-bit values per access (converted to float4) where the lengths and offsets allow
(``row_vector_width``, ``vector_width``), scalars otherwise. Weights, biases and running
statistics may be float32 or the input's type (batch norm's running statistics of two types
go through float32 copies, ``_batch_norm16_through_float32``); each gradient comes back in its
tensor's type.
"""
import math
import weakref
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, logcmd, program, solver, tuning
from ..activation import as_activation
from ..context import PlanCache, check_same_context
from ..dtypes import float32, is_float16_type, name as dtype_name
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor, output
from ..launch import bind, run_planned_on
from .pointwise import PointwiseKernel, group_size

BN_MODES = ("spatial", "per_activation")
_INT32_LIMIT = 2 ** 31 - 1


# ctx -> {(part, mode, vector): BuiltProgram} for builds without an activation: a call finds its
# program without freezing the template parameters into the program cache's key again.
_plain_programs = weakref.WeakKeyDictionary()


def _program(ctx, part="other", mode="stats", activation=None, vector=1, derivative=False):
    """The built ``part`` of norm.cl.mako; parameters a part does not use are left at their
    defaults, so that they do not multiply its builds. ``derivative``: the backward of the
    activation as well (the "grad" sums and channel_apply_batch_grad)."""
    if activation is None:
        memo = _plain_programs.get(ctx)
        if memo is None:
            memo = _plain_programs[ctx] = {}
        key = (part, mode, vector)
        built = memo.get(key)
        if built is None:
            built = memo[key] = _build_program(ctx, part, mode, None, vector, False)
        return built
    return _build_program(ctx, part, mode, activation, vector, derivative)


def _build_program(ctx, part, mode, activation, vector, derivative):
    desc = as_activation(activation)
    identity = desc is None or desc.is_identity
    code = "v_act" if identity else desc.forward_code("v_act")
    if part != "sums":
        mode = "stats"
    backward = derivative and not identity and (part == "apply" or mode == "grad")
    if part != "apply" and not backward:
        code = "v_act"
    if part == "other":
        vector = 1
    return program.build(ctx, "norm", dict(
        part=part, group_size=group_size(ctx), mode=mode, activation=code, vector=vector,
        derivative=desc.derivative_code("z", "a") if backward else ""))


def _row_program(ctx, dtype, wdtype, row_vector=1, rms=False):
    """The "other" part of norm.cl.mako with row_norm_forward / row_norm_backward on 16-bit
    storage (``dtype``: the data's, ``wdtype``: the weight's and bias's, float32 or dtype;
    ``row_vector`` 4: four elements per access, ``row_vector_width``), or with ``rms``
    rms_norm's uncentred row kernels (alone in their build) on float32 or 16-bit storage.
    Layer and group norm's float32 kernels are ``_program(ctx)``'s."""
    from .pointwise import template_type
    memo = _plain_programs.get(ctx)
    if memo is None:
        memo = _plain_programs[ctx] = {}
    key = ("rows_other", dtype, wdtype, row_vector, rms)
    built = memo.get(key)
    if built is None:
        params = dict(part="other", group_size=group_size(ctx), mode="stats",
                      activation="v_act", vector=1, derivative="")
        if dtype != float32:
            params.update(dtype=template_type(dtype),
                          wdtype="float" if wdtype == float32 else template_type(wdtype))
        if row_vector != 1:
            params["row_vector"] = row_vector
        if rms:
            params["rms"] = True
        built = memo[key] = program.build(ctx, "norm", params)
    return built


def _bn_program16(ctx, part, mode, vector, dtype, wdtype=float32, sdtype=float32):
    """The "sums" or "apply" part of norm.cl.mako for batch norm on 16-bit ``dtype`` data
    (``wdtype``: weight, bias and their gradients; ``sdtype``: the running statistics; each
    float32 or dtype), ``vector`` elements per access."""
    from .pointwise import template_type
    if part == "sums":
        wdtype = sdtype = float32     # the sums read neither
    memo = _plain_programs.get(ctx)
    if memo is None:
        memo = _plain_programs[ctx] = {}
    key = ("bn16", part, mode, vector, dtype, wdtype, sdtype)
    built = memo.get(key)
    if built is None:
        def name(t):
            return "float" if t == float32 else template_type(t)
        built = memo[key] = program.build(ctx, "norm", dict(
            part=part, group_size=group_size(ctx), mode=mode if part == "sums" else "stats",
            activation="v_act", vector=vector, derivative="", dtype=name(dtype),
            wdtype=name(wdtype), sdtype=name(sdtype)))
    return built


def row_vector_width(D, G, Cg, S, data, affine):
    """4 where the 16-bit row kernels can move four elements per access, else 1: rows of D a
    multiple of 4, every tensor of ``data`` at an offset that is a multiple of 4, and the
    weights of four consecutive elements either consecutive (S == 1: Cg == D, a multiple of
    4, and each tensor of ``affine`` (None for none) at an offset that is a multiple of 4)
    or one (S a multiple of 4). ``G``: the groups per sample (the weights' layout)."""
    if D % 4 or any(t.offset_elements % 4 for t in data):
        return 1
    if S == 1:
        return 4 if all(t is None or t.offset_elements % 4 == 0 for t in affine) else 1
    return 4 if S % 4 == 0 else 1


def vector_width(S, *tensors, algorithm=None):
    """4 (float4 loads) when rows of S elements and every tensor's offset allow it, else 1.
    The algorithm "groups_scalar" forces 1."""
    if algorithm == "groups_scalar":
        return 1
    if S % 4 == 0 and all(t is None or t.offset_elements % 4 == 0 for t in tensors):
        return 4
    return 1


def _buf(t):
    """(buffer, element offset) of an optional tensor; (None, 0) passes a NULL pointer."""
    return (None, np.int64(0)) if t is None else (t.buffer, np.int64(t.offset_elements))


def _check_float(what, t, required=True):
    if t is None:
        if required:
            raise ShapeError(f"{what} is required")
        return
    if not isinstance(t, Tensor):
        raise not_a_tensor(what, t)
    if t.dtype != float32:
        raise DTypeError(f"{what} must be float32, got {t.dtype}")


def _through_float32(name, fn, input, *others):
    """``fn(input, *others)`` for a float16 / bfloat16 ``input``: the 16-bit tensors among
    them (``others``: optional tensors, float32 or the input's type) converted to float32 with
    their gradients (``masks.cast``), the float32 result rounded to the input's type once."""
    from .masks import cast
    for k, t in enumerate(others):
        if t is not None and (not isinstance(t, Tensor) or
                              (t.dtype != float32 and t.dtype != input.dtype)):
            what = f"{name}: operand {k + 1}"
            if not isinstance(t, Tensor):
                raise not_a_tensor(what, t)
            raise DTypeError(f"{what} must be float32 or the input's {dtype_name(input.dtype)}, "
                             f"got {dtype_name(t.dtype)}")
    wide = [None if t is None else cast(t, float32) for t in others]
    return cast(fn(cast(input, float32), *wide), input.dtype)


def _check_size(what, t, size):
    if t is not None and t.size != size:
        raise ShapeError(f"{what} must have {size} elements (one per channel), got shape {t.shape}")


def _bn_view(x, mode):
    """(N, C, S) of batch norm on ``x`` in ``mode``."""
    if mode not in BN_MODES:
        raise UnsupportedError(f"batch norm mode must be one of {', '.join(BN_MODES)}, got {mode!r}")
    if x.ndim < 2:
        raise ShapeError(f"batch norm expects an (N, C, ...) input, got shape {x.shape}")
    N, C = x.shape[0], x.shape[1]
    S = math.prod(x.shape[2:])
    if mode == "per_activation":
        C, S = C * S, 1
    if max(N * C * S + x.offset_elements, C * S) >= _INT32_LIMIT // 2 or N * S >= _INT32_LIMIT:
        raise UnsupportedError(f"batch norm of {x.shape}: more than 2^30 elements")
    return N, C, S


# ---- channel statistics (batch norm, and the weight gradients of layer/group norm) --------
#
# The solvers of the "norm" family (dlprim_py.solver): "groups", a work group per (channel,
# chunk) with float4 loads where they apply; "groups_scalar", the same with scalar loads;
# "columns", a work item per (channel, chunk of rows), for S == 1. DLPRIM_NORM_ALGO forces one;
# otherwise the first rule of tuning_db/norm.json that names an applicable one, whose params
# also give the solver's split of a channel into chunks.

ALGORITHMS = ("groups", "groups_scalar", "columns")


@dataclass(frozen=True)
class ChannelSumsProblem:
    """Per-channel sums of x seen as (N, C, S) (``mode``: "stats", "grad", "grad_affine"; see
    kernels/norm.cl.mako); ``aligned``: S and the operands' offsets allow float4 loads;
    ``chunks``: a forced split of each channel (None: the solver's); ``activation``: the
    activation whose derivative the "grad" sums go through (fused training batch norm), or
    None; ``storage``: x's and dy's type, float32 or a 16-bit type (read into float, four
    elements per access where aligned)."""
    mode: str
    n: int
    c: int
    s: int
    aligned: bool
    chunks: object = None
    activation: object = None
    storage: object = float32

    def key(self):
        act = "" if self.activation is None else f" act={self.activation.key}"
        split = "" if self.chunks is None else f" chunks={self.chunks}"
        storage = "" if self.storage == float32 else f" storage={dtype_name(self.storage)}"
        return (f"norm {self.mode} n={self.n} c={self.c} s={self.s} "
                f"aligned={int(self.aligned)}{split}{act}{storage}")

    def features(self):
        return {"mode": self.mode, "n": self.n, "c": self.c, "s": self.s,
                "aligned": int(self.aligned)}


class ChannelSums:
    """A prepared channel reduction: its kernel, split and launch, fixed for one problem.
    ``run`` enqueues it and returns the (chunks, C, 2) partial sums; ``scalar_loads``: the
    elementwise step after it keeps to scalar loads too (groups_scalar)."""

    def __init__(self, ctx, problem, kernel_name, vector, chunks, per_chunk, global_size,
                 local_size, sizes, scalar_loads, apply_groups_per_unit):
        self.ctx = ctx
        # How many work groups per compute unit the elementwise step that finalizes these sums
        # needs before it gives a row fewer of them (``batch_apply_geometry``).
        self.apply_groups_per_unit = apply_groups_per_unit
        self.problem = problem
        self.vector = vector
        self.chunks = chunks
        self.scalar_loads = scalar_loads
        derivative = problem.activation is not None
        if problem.storage == float32:
            built = _program(ctx, "sums", problem.mode, problem.activation, vector, derivative)
        else:
            built = _bn_program16(ctx, "sums", problem.mode, vector, problem.storage)
        self.kernel = bind(built.kernel(kernel_name))
        self.global_size, self.local_size = global_size, local_size
        self.head = tuple(np.int32(v) for v in sizes) + (np.int32(per_chunk),)

    def run(self, x, dy=None, mean=None, row_mean=None, row_rstd=None, G=1, Cg=1, weight=None,
            bias=None, invstd=None):
        p = self.problem
        extra = []
        if p.mode != "stats":
            extra += [dy.buffer, np.int64(dy.offset_elements)]
        if p.mode == "grad":
            extra += [mean.buffer, np.int64(mean.offset_elements)]
            if p.activation is not None:
                extra += [*_buf(weight), *_buf(bias), *_buf(invstd)]
        elif p.mode == "grad_affine":
            extra += [row_mean.buffer, row_rstd.buffer, np.int32(G), np.int32(Cg)]
        partials = Tensor.empty(self.ctx, (self.chunks, p.c, 2), float32)
        self.kernel(self.ctx.queue, self.global_size, self.local_size, *self.head, x.buffer,
                    np.int64(x.offset_elements), *extra, partials.buffer)
        return partials


class _ChannelSolver(solver.Solver):
    def tunables(self, ctx, problem):
        """This solver's params in tuning_db/norm.json: of the rules naming it that hold, each
        value from the first that gives it (a device's rule may give only what it changes)."""
        features = dict(problem.features(), gpu=int(ctx.info.is_gpu))
        return tuning.merged_params(ctx.info, "norm", features,
                                    lambda params: params.get("solver") == self.name)


class GroupSums(_ChannelSolver):
    """A work group per (channel, chunk); float4 loads where the problem is aligned, unless
    ``scalar``."""

    def __init__(self, name, scalar):
        self.name = name
        self.scalar = scalar

    def prepare(self, ctx, problem):
        vector = 4 if problem.aligned and not self.scalar else 1
        M = problem.n * (problem.s // vector)
        chunks = problem.chunks
        params = self.tunables(ctx, problem)
        if chunks is None:
            group = group_size(ctx)
            chunks = max(-(-params["groups_per_unit"] * ctx.info.compute_units // problem.c),
                         -(-M // (params["positions_per_item"] * group)))
            chunks = min(chunks, -(-M // group), params["max_chunks"])
        chunks, per_chunk = _split(M, chunks)
        group = group_size(ctx)
        return ChannelSums(ctx, problem, "channel_partial_sums", vector, chunks, per_chunk,
                           (group * chunks, problem.c), (group, 1),
                           (problem.n, problem.c, problem.s // vector), self.scalar,
                           params["apply_groups_per_unit"])


class ColumnSums(_ChannelSolver):
    """A work item per (channel, chunk of rows), S == 1: a warp reads consecutive channels of a
    row where a work group per channel would read a column with stride C."""
    name = "columns"

    def applies(self, ctx, problem):
        return problem.s == 1

    def prepare(self, ctx, problem):
        chunks = problem.chunks
        params = self.tunables(ctx, problem)
        if chunks is None:
            chunks = min(params["max_chunks"],
                         -(-ctx.info.compute_units * params["items_per_unit"] // problem.c),
                         -(-problem.n // params["min_rows_per_chunk"]))
        chunks, per_chunk = _split(problem.n, chunks)
        local = min(64, ctx.info.max_work_group_size)
        return ChannelSums(ctx, problem, "channel_column_sums", 1, chunks, per_chunk,
                           (-(-problem.c // local) * local, chunks), (local, 1),
                           (problem.n, problem.c), False, params["apply_groups_per_unit"])


def _split(M, chunks):
    """(chunks, positions per chunk) cutting M positions into about ``chunks`` pieces."""
    chunks = max(1, min(chunks, M))
    per_chunk = -(-M // chunks)
    return -(-M // per_chunk), per_chunk


FAMILY = solver.register(solver.Family(
    "norm", [GroupSums("groups", False), GroupSums("groups_scalar", True), ColumnSums()],
    title="normalization algorithm"))


def select_algorithm(ctx, problem, forced=None):
    """The channel-reduction solver for ``problem``: ``forced`` (a name; an error where it does
    not apply), else ``solver.select`` (DLPRIM_NORM_ALGO, else tuning_db/norm.json)."""
    if forced is None:
        return solver.select(ctx, "norm", problem)
    chosen = FAMILY.solver(forced)
    if not chosen.applies(ctx, problem):
        raise UnsupportedError(f"normalization algorithm {forced!r} does not apply to "
                               f"{problem.key()}; applicable: "
                               f"{', '.join(FAMILY.applicable(ctx, problem))}")
    return chosen


def prepared_sums(ctx, mode, N, C, S, operands, chunks=None, algorithm=None, activation=None,
                  storage=float32):
    """The prepared reduction (``ChannelSums``) of x seen as (N, C, S) whose float4 alignment
    ``operands`` (x, and dy where read) decide: made once per problem and context.
    ``storage``: their type (float32, float16 or bfloat16)."""
    aligned = S % 4 == 0 and all(t is None or t.offset_elements % 4 == 0 for t in operands)
    problem = ChannelSumsProblem(mode, N, C, S, aligned, chunks, activation, storage)
    chosen = select_algorithm(ctx, problem, algorithm)
    key = ("norm.sums", chosen.name, problem, tuning.generation)
    prepared = ctx.plans.get(key)
    if prepared is None:
        prepared = ctx.plans.put(key, chosen.prepare(ctx, problem))
    return prepared


def channel_partial_sums(ctx, mode, N, C, S, x, dy=None, mean=None, row_mean=None, row_rstd=None,
                         G=1, Cg=1, chunks=None, algorithm=None):
    """Per-channel partial sums of x seen as (N, C, S); see ``kernels/norm.cl.mako``.
    Returns (partials, chunks) with partials a (chunks, C, 2) float32 tensor. ``chunks`` forces
    the split of each channel (None: chosen for the device); ``algorithm`` one of ALGORITHMS."""
    sums = prepared_sums(ctx, mode, N, C, S, (x, dy), chunks, algorithm)
    return sums.run(x, dy, mean, row_mean, row_rstd, G, Cg), sums.chunks


def _per_channel_launch(ctx, kernel, C, *args):
    group = min(64, ctx.info.max_work_group_size)
    kernel(ctx.queue, (-(-C // group) * group,), (group,), *args)


def _apply_local_size(positions, limit):
    """(local0, local1) for channel_apply: local0 work items along a row of ``positions``, the
    largest power of two that leaves at most 1/8 of them idle past the row's end (rows of 784
    float4s take 4 x 64-wide groups, not 4 x 256 with a quarter idle), local1 rows."""
    local0 = 1
    while local0 < min(positions, limit):
        local0 *= 2
    local0 = min(local0, limit)
    while local0 > 32:
        padded = -(-positions // local0) * local0
        if (padded - positions) * 8 <= padded:
            break
        local0 //= 2
    return local0, max(1, limit // local0)


def batch_apply_geometry(ctx, sums, N, C, S, *tensors):
    """(vector width, positions per row, global size, local size) of channel_apply_batch_stats
    and channel_apply_batch_grad after the sums ``sums``: every work group of theirs sums its
    channel's partials before its elementwise work, so where the rows alone give the device
    enough work groups (``apply_groups_per_unit`` per compute unit) a row gets fewer of them,
    each item looping over more of it."""
    vector = 1 if sums.scalar_loads else vector_width(S, *tensors)
    positions = S // vector
    local0, local1 = _apply_local_size(positions, min(256, ctx.info.max_work_group_size))
    per_row, row_groups = -(-positions // local0), -(-(N * C) // local1)
    enough = sums.apply_groups_per_unit * ctx.info.compute_units
    while per_row > 1 and -(-per_row // 2) * row_groups >= enough:
        per_row = -(-per_row // 2)
    return vector, positions, (per_row * local0, row_groups * local1), (local0, local1)


def _apply(ctx, N, C, S, coef, u, v, out, scalar_loads=False):
    rows = N * C
    if rows == 0 or S == 0:
        return
    vector = 1 if scalar_loads else vector_width(S, u, v, out)
    positions = S // vector
    local0, local1 = _apply_local_size(positions, min(256, ctx.info.max_work_group_size))
    kernel = bind(_program(ctx, "apply", vector=vector).kernel("channel_apply"))
    gsize = (-(-positions // local0) * local0, -(-rows // local1) * local1)
    kernel(ctx.queue, gsize, (local0, local1), np.int32(rows), np.int32(C), np.int32(positions),
           coef.buffer, u.buffer, np.int64(u.offset_elements), *_buf(v), out.buffer,
           np.int64(out.offset_elements))


# ---- batch norm, MIOpen style -------------------------------------------------------------

def _log_bnorm(x, mode, forw, back=0, save=0, run=0, activation=None, eps=1e-5, momentum=0.1):
    """The ``dlprim-driver bnorm`` command of this call (DLPRIM_LOG_CMD=1); an input of another
    rank than 4 is logged as (N, C, prod(spatial), 1), which has the same statistics. The
    driver's eps is 1e-5 and its momentum 0.1: others are named as not carried, as are an
    activation's parameters."""
    if not config.log_cmd():
        return
    n, c = x.shape[:2]
    h, w = (x.shape[2], x.shape[3]) if x.ndim == 4 else (math.prod(x.shape[2:]), 1)
    flags = {"n": n, "c": c, "H": h, "W": w, "m": int(mode == "spatial"), "F": forw, "b": back,
             "s": save, "r": run}
    missing = []
    desc = as_activation(activation)
    if desc is not None and not desc.is_identity:
        flags["activation"], missing = logcmd.activation_named(desc)
    if float(eps) != 1e-5:
        missing.append(f"eps {float(eps):g}")
    if run and forw == 1 and float(momentum) != 0.1:
        missing.append(f"momentum {float(momentum):g}")
    logcmd.log_command("bnorm", flags, missing)


def _check_bn(x, y, mode, named, y_name="y"):
    _check_float("x", x)
    _check_float(y_name, y)
    N, C, S = _bn_view(x, mode)
    if y.shape != x.shape:
        raise ShapeError(f"{y_name} must have x's shape {x.shape}, got {y.shape}")
    for what, t in named.items():
        _check_float(what, t, required=False)
        _check_size(what, t, C)
    check_same_context(x, y, *named.values())
    return N, C, S


def batch_norm_forward_training(x, y, weight=None, bias=None, running_mean=None, running_var=None,
                                save_mean=None, save_invstd=None, momentum=0.1, eps=1e-5,
                                mode="spatial", activation=None, chunks=None, algorithm=None):
    """Batch norm with batch statistics: y = act((x - mean) / sqrt(var + eps) * weight + bias).

    x, y: (N, C, ...) float32. mode "spatial": statistics per channel over N and every spatial
    position; "per_activation": per element of x[0] over N (weight etc. then have x[0].size
    elements). weight, bias: per-channel or None (1 and 0). running_mean/running_var (both or
    neither) are updated in place with ``momentum`` (running_var with the unbiased variance).
    save_mean/save_invstd (both or neither) receive the batch mean and 1/sqrt(var + eps), which
    ``batch_norm_backward`` takes. ``activation``: an optional fused activation (descriptor or
    name). ``chunks`` forces how many work groups reduce one channel, ``algorithm`` the
    reduction's solver (one of ALGORITHMS; else DLPRIM_NORM_ALGO, else tuning_db/norm.json).

    As torch, one value per channel (N * S == 1) is refused, and an empty batch computes
    nothing (the running statistics stay as they are).
    """
    N, C, S = _check_bn(x, y, mode, dict(weight=weight, bias=bias, running_mean=running_mean,
                                         running_var=running_var, save_mean=save_mean,
                                         save_invstd=save_invstd))
    if (running_mean is None) != (running_var is None) or (save_mean is None) != (save_invstd is None):
        raise ShapeError("give running_mean with running_var, and save_mean with save_invstd")
    _check_count(x, N * S, mode)
    _log_bnorm(x, mode, 1, save=int(save_mean is not None), run=int(running_mean is not None),
               activation=activation, eps=eps, momentum=momentum)
    if N * S == 0:
        return
    ctx = x.ctx
    sums = prepared_sums(ctx, "stats", N, C, S, (x,), chunks, algorithm)
    partials = sums.run(x)
    # The statistics are finalized inside the elementwise step (channel_apply_batch_stats).
    vector, positions, gsize, lsize = batch_apply_geometry(ctx, sums, N, C, S, x, y)
    kernel = bind(_program(ctx, "apply", activation=activation, vector=vector)
                  .kernel("channel_apply_batch_stats"))
    kernel(ctx.queue, gsize, lsize, np.int32(N * C), np.int32(C), np.int32(positions),
           np.int32(N), np.int32(S), np.int32(sums.chunks), np.float32(eps),
           np.float32(momentum), partials.buffer, *_buf(weight), *_buf(bias),
           *_buf(running_mean), *_buf(running_var), *_buf(save_mean), *_buf(save_invstd),
           x.buffer, np.int64(x.offset_elements), y.buffer, np.int64(y.offset_elements))


def _check_count(x, count, mode):
    """torch's refusal of training statistics over one value per channel (its message:
    "Expected more than 1 value per channel when training"); an empty batch passes."""
    if count == 1:
        raise ShapeError(f"batch norm training: expected more than one value per channel, got "
                         f"input shape {x.shape} in {mode} mode")


def batch_norm_forward_inference(x, y, weight=None, bias=None, running_mean=None, running_var=None,
                                 eps=1e-5, mode="spatial", activation=None):
    """Batch norm with given statistics: y = act((x - running_mean) / sqrt(running_var + eps)
    * weight + bias). Shapes as in ``batch_norm_forward_training``; the statistics are required."""
    N, C, S = _check_bn(x, y, mode, dict(weight=weight, bias=bias, running_mean=running_mean,
                                         running_var=running_var))
    if running_mean is None or running_var is None:
        raise ShapeError("batch norm inference needs running_mean and running_var")
    _log_bnorm(x, mode, 2, activation=activation, eps=eps)
    ctx = x.ctx
    rows = N * C
    if rows == 0 or S == 0:
        return
    vector = vector_width(S, x, y, algorithm=config.forced_algorithm("norm"))
    positions = S // vector
    local0, local1 = _apply_local_size(positions, min(256, ctx.info.max_work_group_size))
    kernel = bind(_program(ctx, "apply", activation=activation, vector=vector)
                  .kernel("channel_apply_inference"))
    gsize = (-(-positions // local0) * local0, -(-rows // local1) * local1)
    kernel(ctx.queue, gsize, (local0, local1), np.int32(rows), np.int32(C), np.int32(positions),
           np.float32(eps), *_buf(running_mean), *_buf(running_var), *_buf(weight), *_buf(bias),
           x.buffer, np.int64(x.offset_elements), y.buffer, np.int64(y.offset_elements))


def batch_norm_backward(x, dy, dx, weight=None, mean=None, invstd=None, dweight=None, dbias=None,
                        mode="spatial", training=True, chunks=None, bias=None, activation=None,
                        algorithm=None):
    """Gradients of batch norm, or of act(batch norm) with ``activation``.

    ``mean``/``invstd``: the statistics the forward used: save_mean/save_invstd of a training
    forward (``training=True``: the statistics depend on x, which the gradient includes), or the
    running mean and 1/sqrt(running_var + eps) of inference (``training=False``). Writes dx
    (may be None), and dweight/dbias when given (per channel). x, dy, dx: (N, C, ...) float32.
    ``activation`` (descriptor or name): dy is the gradient at act's output, and the kernels
    recompute act's input (x - mean) * invstd * weight + bias per element (``bias``: the
    forward's). ``chunks``/``algorithm`` as in ``batch_norm_forward_training``.
    """
    N, C, S = _check_bn(x, dy, mode, dict(weight=weight, bias=bias, mean=mean, invstd=invstd,
                                          dweight=dweight, dbias=dbias), y_name="dy")
    if mean is None or invstd is None:
        raise ShapeError("batch norm backward needs the mean and invstd its forward used")
    desc = as_activation(activation)
    if desc is not None and desc.is_identity:
        desc = None
    _log_bnorm(x, mode, 0, back=1, activation=desc)
    if dx is not None:
        _check_float("dx", dx)
        if dx.shape != x.shape:
            raise ShapeError(f"dx must have x's shape {x.shape}, got {dx.shape}")
        check_same_context(x, dx)
    if training:
        _check_count(x, N * S, mode)
    if N * S == 0:
        # Nothing flows back from an empty batch: zero weight and bias gradients, as torch's.
        for t in (dweight, dbias):
            if t is not None:
                t.fill_(0.0)
        return
    ctx = x.ctx
    sums = prepared_sums(ctx, "grad", N, C, S, (x, dy), chunks, algorithm, desc)
    partials = sums.run(x, dy=dy, mean=mean, weight=weight, bias=bias, invstd=invstd)
    # The weight and bias gradients and dx's coefficients are finalized inside the elementwise
    # step (channel_apply_batch_grad), which runs without dx too, for them.
    operands = (dy, x) if dx is None else (dy, x, dx)
    vector, positions, gsize, lsize = batch_apply_geometry(ctx, sums, N, C, S, *operands)
    kernel = bind(_program(ctx, "apply", activation=desc, vector=vector, derivative=True)
                  .kernel("channel_apply_batch_grad"))
    kernel(ctx.queue, gsize, lsize, np.int32(N * C), np.int32(C), np.int32(positions),
           np.int32(N), np.int32(S), np.int32(sums.chunks), np.int32(bool(training)),
           partials.buffer, *_buf(mean), *_buf(invstd), *_buf(weight), *_buf(bias),
           *_buf(dweight), *_buf(dbias), dy.buffer, np.int64(dy.offset_elements), x.buffer,
           np.int64(x.offset_elements), *_buf(dx))


_invstd_kernel = PointwiseKernel("bn_invstd", [("var", float32)], [("invstd", float32)],
                                 "invstd = rsqrt(var + eps);", scalars=[("eps", np.float32)])


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm on (N, C, ...) float32 (statistics per channel C).

    training=True normalizes with the batch statistics and updates running_mean/running_var in
    place (when given); training=False uses them. Gradients flow to input, weight and bias.
    """
    # A call with the arguments of an earlier one (whose checks passed) takes that call's entry
    # from the plan cache: its output size, channel count and replay plans (by how the buffers
    # alias). The numbers' types are in the key: True == 1, but only 1 passes the checks.
    if isinstance(input, Tensor) and is_float16_type(input.dtype):
        return _batch_norm16(input, running_mean, running_var, weight, bias, training, momentum,
                             eps)
    params = (input, weight, bias, running_mean, running_var)
    try:
        # The input's fields flat, the optional tensors' in a tuple each (or None).
        key = ("batch_norm", bool(training), momentum, momentum.__class__, eps, eps.__class__,
               config.switches().forced.get("norm"), input.shape, input.dtype, input.offset,
               None if weight is None else (weight.shape, weight.dtype, weight.offset),
               None if bias is None else (bias.shape, bias.dtype, bias.offset),
               None if running_mean is None else (running_mean.shape, running_mean.dtype,
                                                  running_mean.offset),
               None if running_var is None else (running_var.shape, running_var.dtype,
                                                 running_var.offset))
        ctx = input.ctx
        entry = ctx.plans.hit(key) or ctx.plans.get(key)
    except (AttributeError, TypeError):   # not tensors, or unhashable arguments: checked below
        key = entry = None
    first = entry is None
    if first:
        _check_float("input", input)
        _check_momentum_eps(momentum, eps)
        ctx = input.ctx
        channels = _bn_view(input, "spatial")[1] if training else 0
        entry = (max(input.nbytes, 4), channels, PlanCache(4))
    nbytes, channels, plans = entry
    y = output(ctx, input.shape, nbytes)
    # No closures in this function (its variables would be cells, made on every call): the
    # runs are called with their arguments where there is no plan, the backward is made by
    # _batch_norm_backward.
    if training:
        mean = output(ctx, (channels,), 4 * channels)
        invstd = output(ctx, (channels,), 4 * channels)
        run_planned_on(ctx, None, (*params, y, mean, invstd), batch_norm_forward_training, plans,
                       (input, y, weight, bias, running_mean, running_var, mean, invstd,
                        momentum, eps))
    else:
        run_planned_on(ctx, None, (*params, y), batch_norm_forward_inference, plans,
                       (input, y, weight, bias, running_mean, running_var, eps))
        mean, invstd = running_mean, None
    if first and key is not None:
        # Kept only now: the first call's checks passed (the run raises on bad operands).
        ctx.plans.put(key, entry)
    # autograd.needs_grad inlined: the input is a tensor (its checks passed).
    if not ((input.requires_grad or (weight is not None and weight.requires_grad)
             or (bias is not None and bias.requires_grad)) and autograd.grad_enabled()):
        return y
    return autograd.record(y, (input, weight, bias),
                           _batch_norm_backward(ctx, key, params, training, eps, mean, invstd),
                           "batch_norm")


def _check_momentum_eps(momentum, eps):
    """batch_norm's momentum and eps: numbers (momentum=None, the module's cumulative average,
    is refused)."""
    if momentum is None:
        raise UnsupportedError("momentum=None (cumulative average) belongs to the module's "
                               "batch counter; pass a float")
    for name, value in (("momentum", momentum), ("eps", eps)):
        if not isinstance(value, (int, float, np.number)) or isinstance(value, bool):
            raise DTypeError(f"batch_norm: {name} must be a number, got {value!r}")


def _batch_norm16(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """batch_norm of a float16 / bfloat16 input in the kernels: the 16-bit data read into
    float (four elements per access where S and the offsets allow), float32 statistics, the
    output and the gradients rounded once to their tensors' types. The weight and bias are
    float32 or the input's type (one of them 16-bit and the other float32: the 16-bit one is
    cast first), so are the running statistics, updated in place; running statistics of two
    types take ``_batch_norm16_through_float32``."""
    from .masks import cast
    dt = input.dtype
    named = (("weight", weight), ("bias", bias), ("running_mean", running_mean),
             ("running_var", running_var))
    for what, t in named:
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise not_a_tensor(f"batch_norm: {what}", t)
        if t.dtype != float32 and t.dtype != dt:
            raise DTypeError(f"batch_norm: {what} must be float32 or the input's "
                             f"{dtype_name(dt)}, got {dtype_name(t.dtype)}")
    if (running_mean is not None and running_var is not None
            and running_mean.dtype != running_var.dtype):
        return _batch_norm16_through_float32(input, running_mean, running_var, weight, bias,
                                             training, momentum, eps)
    _check_momentum_eps(momentum, eps)
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        # One type for both in the kernels: the 16-bit one in float32 (with its gradient).
        weight, bias = (cast(t, float32) for t in (weight, bias))
    N, C, S = _bn_view(input, "spatial")
    for what, t in named:
        _check_size(what, t, C)
    ctx = check_same_context(input, weight, bias, running_mean, running_var)
    wdt = next((t.dtype for t in (weight, bias) if t is not None), float32)
    sdt = running_mean.dtype if running_mean is not None else (
        running_var.dtype if running_var is not None else float32)
    i32, i64 = np.int32, np.int64
    y = Tensor.empty(ctx, input.shape, dt)
    mean = invstd = None
    if training:
        if (running_mean is None) != (running_var is None):
            raise ShapeError("give running_mean with running_var")
        _check_count(input, N * S, "spatial")
        mean = Tensor.empty(ctx, (C,), float32)
        invstd = Tensor.empty(ctx, (C,), float32)
        if N * S and C:
            sums = prepared_sums(ctx, "stats", N, C, S, (input,), storage=dt)
            partials = sums.run(input)
            vector, positions, gsize, lsize = batch_apply_geometry(ctx, sums, N, C, S, input, y)
            kernel = bind(_bn_program16(ctx, "apply", "stats", vector, dt, wdt, sdt)
                          .kernel("channel_apply_batch_stats"))
            kernel(ctx.queue, gsize, lsize, i32(N * C), i32(C), i32(positions), i32(N), i32(S),
                   i32(sums.chunks), np.float32(eps), np.float32(momentum), partials.buffer,
                   *_buf(weight), *_buf(bias), *_buf(running_mean), *_buf(running_var),
                   *_buf(mean), *_buf(invstd), input.buffer, i64(input.offset_elements),
                   y.buffer, i64(y.offset_elements))
    else:
        if running_mean is None or running_var is None:
            raise ShapeError("batch norm inference needs running_mean and running_var")
        if N * C and S:
            vector = vector_width(S, input, y, algorithm=config.forced_algorithm("norm"))
            positions = S // vector
            local0, local1 = _apply_local_size(positions, min(256, ctx.info.max_work_group_size))
            kernel = bind(_bn_program16(ctx, "apply", "stats", vector, dt, wdt, sdt)
                          .kernel("channel_apply_inference"))
            gsize = (-(-positions // local0) * local0, -(-(N * C) // local1) * local1)
            kernel(ctx.queue, gsize, (local0, local1), i32(N * C), i32(C), i32(positions),
                   np.float32(eps), *_buf(running_mean), *_buf(running_var), *_buf(weight),
                   *_buf(bias), input.buffer, i64(input.offset_elements), y.buffer,
                   i64(y.offset_elements))

    def backward(g):
        from .pointwise import convert
        if g.dtype != dt:
            g = convert(g, dt)     # the kernels read the gradient as the input's type
        dx = Tensor.empty(ctx, input.shape, dt)
        dweight = Tensor.empty(ctx, weight.shape, wdt) if weight is not None else None
        dbias = Tensor.empty(ctx, bias.shape, wdt) if bias is not None else None
        if N * S == 0 or C == 0:
            # Nothing flows back from an empty batch: zero weight and bias gradients.
            for t in (dweight, dbias):
                if t is not None:
                    t.fill_(0.0)
            return dx, dweight, dbias
        stats_mean, stats_invstd = mean, invstd
        if not training:
            # The running statistics' C values in float32 (the saved statistics' type).
            stats_mean = running_mean if sdt == float32 else convert(running_mean, float32)
            var = running_var if sdt == float32 else convert(running_var, float32)
            stats_invstd = Tensor.empty(ctx, (C,), float32)
            _invstd_kernel([var], [stats_invstd], [eps])
        sums = prepared_sums(ctx, "grad", N, C, S, (input, g), storage=dt)
        partials = sums.run(input, dy=g, mean=stats_mean)
        vector, positions, gsize, lsize = batch_apply_geometry(ctx, sums, N, C, S, g, input, dx)
        kernel = bind(_bn_program16(ctx, "apply", "stats", vector, dt, wdt, sdt)
                      .kernel("channel_apply_batch_grad"))
        kernel(ctx.queue, gsize, lsize, i32(N * C), i32(C), i32(positions), i32(N), i32(S),
               i32(sums.chunks), i32(bool(training)), partials.buffer, *_buf(stats_mean),
               *_buf(stats_invstd), *_buf(weight), *_buf(bias), *_buf(dweight), *_buf(dbias),
               g.buffer, i64(g.offset_elements), input.buffer, i64(input.offset_elements),
               *_buf(dx))
        return dx, dweight, dbias

    return autograd.record(y, (input, weight, bias), backward, "batch_norm")


def _batch_norm16_through_float32(input, running_mean, running_var, weight, bias, training,
                                  momentum, eps):
    """batch_norm of a 16-bit input through float32 (``_through_float32``), for running
    statistics of two types; 16-bit running statistics are updated in place, rounded once."""
    from .masks import cast
    running = []
    for what, t in (("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and isinstance(t, Tensor) and is_float16_type(t.dtype) \
                and t.dtype != input.dtype:
            raise DTypeError(f"batch_norm: {what} must be float32 or the input's "
                             f"{dtype_name(input.dtype)}, got {dtype_name(t.dtype)}")
        running.append(cast(t, float32) if isinstance(t, Tensor) and t.dtype != float32 else t)
    y = _through_float32("batch_norm", lambda x, w, b: batch_norm(
        x, running[0], running[1], w, b, training, momentum, eps), input, weight, bias)
    if training:
        from .pointwise import convert
        for t, wide in zip((running_mean, running_var), running):
            if t is not None and wide is not t:
                t.copy_(convert(wide, t.dtype))
    return y


def _batch_norm_backward(ctx, key, params, training, eps, mean, invstd):
    """The backward of F.batch_norm (``params``: its input, weight, bias, running mean and
    var; ``mean``/``invstd``: the statistics the forward used), replayed as one plan per
    forward key and gradient layout."""
    input, weight, bias, running_mean, running_var = params

    def backward(g):
        dx = Tensor.empty(ctx, input.shape, float32)
        dweight = Tensor.empty(ctx, weight.shape, float32) if weight is not None else None
        dbias = Tensor.empty(ctx, bias.shape, float32) if bias is not None else None
        stats_invstd = invstd
        if not training:
            stats_invstd = Tensor.empty(ctx, running_var.shape, float32)

        def run():
            if not training:
                _invstd_kernel([running_var], [stats_invstd], [eps])
            batch_norm_backward(input, g, dx, weight, mean, stats_invstd, dweight, dbias,
                                training=training)

        run_planned_on(ctx, ("backward", key, g.shape, g.dtype, g.offset),
                       (*params, g, dx, dweight, dbias, mean, stats_invstd), run)
        return dx, dweight, dbias

    return backward


# ---- layer norm and group norm --------------------------------------------------------------

# Layer, group and rms norm: the solvers of the "rownorm" family. "rows" runs a work group per
# row; "rows4" a group sized to the row, its 4-vectors in registers; "split" (group norm) cuts
# each row over many work groups through the batch-norm kernels, for few long rows.
# DLPRIM_ROWNORM_ALGO forces one; otherwise tuning_db/rownorm.json's rules. rms_norm runs the
# row kernels' uncentred variant (template parameter rms) in "rows" and "rows4"; "split" is
# group norm's alone (its batch-norm kernels sum centred statistics and rms_norm's rows are
# never a group norm's), so a forced "split" does not apply to rms_norm, as to layer_norm.
ROW_ALGORITHMS = ("rows", "rows4", "split")


@dataclass(frozen=True)
class RowNormProblem:
    """Statistics of ``rows`` rows of ``d`` elements; ``splittable``: group norm's (N, C, ...)
    input, which "split" takes; ``units``: the device's compute units, which the rules compare
    the rows with (``rows_per_unit``); ``vector4``: layer norm whose rows, input offset and
    weight and bias offsets are multiples of 4 elements, which "rows4" takes; ``rms``:
    rms_norm's uncentred rows (feature "rms", which a rule may name)."""
    rows: int
    d: int
    splittable: bool
    units: int
    vector4: bool = False
    rms: bool = False

    def key(self):
        return (f"rownorm rows={self.rows} d={self.d} splittable={int(self.splittable)} "
                f"units={self.units} vector4={int(self.vector4)}"
                + (" rms=1" if self.rms else ""))

    def features(self):
        return {"rows": self.rows, "d": self.d, "splittable": int(self.splittable),
                "rows_per_unit": self.rows // max(self.units, 1),
                "vector4": int(self.vector4), "rms": int(self.rms)}


class _Rows:
    """row_norm_forward / row_norm_backward: a work group per row (on float32, or on 16-bit
    ``dtype`` data with ``wdtype`` weights, ``row_vector`` elements per access; ``rms``: the
    uncentred kernels of rms_norm)."""

    def __init__(self, ctx, dtype=float32, wdtype=float32, row_vector=1, rms=False):
        prog = _program(ctx) if dtype == float32 and not rms else \
            _row_program(ctx, dtype, wdtype, row_vector, rms)
        self.ctx = ctx
        self.group = group_size(ctx)
        self.forward_kernel = bind(prog.kernel("row_norm_forward"))
        self.backward_kernel = bind(prog.kernel("row_norm_backward"))

    def forward(self, x, y, rows, D, G, Cg, S, weight, bias, eps, save_mean, save_rstd):
        i32 = np.int32
        self.forward_kernel(
            self.ctx.queue, (self.group * rows,), (self.group,), i32(D), i32(G), i32(Cg), i32(S),
            np.float32(eps), x.buffer, np.int64(x.offset_elements), *_buf(weight), *_buf(bias),
            y.buffer, np.int64(y.offset_elements), save_mean.buffer, save_rstd.buffer)

    def backward(self, x, g, dx, rows, D, G, Cg, S, weight, save_mean, save_rstd):
        i32 = np.int32
        self.backward_kernel(
            self.ctx.queue, (self.group * rows,), (self.group,), i32(D), i32(G), i32(Cg), i32(S),
            x.buffer, np.int64(x.offset_elements), g.buffer, np.int64(g.offset_elements),
            *_buf(weight), save_mean.buffer, save_rstd.buffer, dx.buffer,
            np.int64(dx.offset_elements))


# Float4s of a row per work item in "rows4" (registers per item: 4 * ROWS4_PER in the forward,
# twice that in the backward); rows longer than 4 * ROWS4_PER * the largest group are the
# "rows" solver's.
ROWS4_PER = 4


def rows4_group(ctx, D):
    """Work-group size of "rows4" for rows of D elements: the smallest power of two from 32 that
    leaves each item at most ROWS4_PER float4s, or None where the device's groups are too small."""
    group = 32
    while group * ROWS4_PER * 4 < D:
        group *= 2
    return group if group <= min(ctx.info.max_work_group_size, 1024) else None


class _Rows4:
    """row_norm_forward4 / row_norm_backward4 (layer norm, rows of a multiple of 4 elements on
    4-element boundaries; float32 or 16-bit ``dtype`` data with ``wdtype`` weights): a work
    group sized to the row, each item's 4-vectors kept in registers. A backward whose gradient
    is not on a 4-element boundary runs the "rows" kernels. ``rms``: rms_norm's uncentred
    kernels."""

    def __init__(self, ctx, D, dtype=float32, wdtype=float32, rms=False):
        from .pointwise import template_type
        self.ctx = ctx
        self.dtype, self.wdtype, self.rms = dtype, wdtype, rms
        self.group = rows4_group(ctx, D)
        per = -(-D // (4 * self.group))
        params = dict(part="rows4", group_size=self.group, mode="stats", activation="v_act",
                      vector=4, derivative="", row_per=per)
        if dtype != float32:
            params.update(dtype=template_type(dtype),
                          wdtype="float" if wdtype == float32 else template_type(wdtype))
        if rms:
            params["rms"] = True
        prog = program.build(ctx, "norm", params)
        self.forward_kernel = bind(prog.kernel("row_norm_forward4"))
        self.backward_kernel = bind(prog.kernel("row_norm_backward4"))
        self.fallback = None

    def forward(self, x, y, rows, D, G, Cg, S, weight, bias, eps, save_mean, save_rstd):
        self.forward_kernel(
            self.ctx.queue, (self.group * rows,), (self.group,), np.int32(D // 4),
            np.float32(eps), x.buffer, np.int64(x.offset_elements), *_buf(weight), *_buf(bias),
            y.buffer, np.int64(y.offset_elements), save_mean.buffer, save_rstd.buffer)

    def backward(self, x, g, dx, rows, D, G, Cg, S, weight, save_mean, save_rstd):
        if g.offset_elements % 4 or dx.offset_elements % 4:
            if self.fallback is None:
                self.fallback = _Rows(self.ctx, self.dtype, self.wdtype, rms=self.rms)
            self.fallback.backward(x, g, dx, rows, D, G, Cg, S, weight, save_mean, save_rstd)
            return
        self.backward_kernel(
            self.ctx.queue, (self.group * rows,), (self.group,), np.int32(D // 4),
            x.buffer, np.int64(x.offset_elements), g.buffer, np.int64(g.offset_elements),
            *_buf(weight), save_mean.buffer, save_rstd.buffer, dx.buffer,
            np.int64(dx.offset_elements))


class _Split:
    """Group norm through the batch-norm kernels on the view (1, rows, D)."""

    def forward(self, x, y, rows, D, G, Cg, S, weight, bias, eps, save_mean, save_rstd):
        _split_forward(x, rows, D, G, weight, bias, eps, y, save_mean, save_rstd)

    def backward(self, x, g, dx, rows, D, G, Cg, S, weight, save_mean, save_rstd):
        _split_backward(x, g, dx, rows, D, weight, save_mean, save_rstd)


class RowsSolver(solver.Solver):
    name = "rows"

    def prepare(self, ctx, problem):
        return _Rows(ctx, rms=problem.rms)


class Rows4Solver(solver.Solver):
    """Layer norm on 4-vectors (float32 or 16-bit storage): a work group sized to the row
    (``rows4_group``), the row read once into registers."""
    name = "rows4"

    def applies(self, ctx, problem):
        return problem.vector4 and rows4_group(ctx, problem.d) is not None

    def prepare(self, ctx, problem):
        return _Rows4(ctx, problem.d, rms=problem.rms)


class SplitSolver(solver.Solver):
    name = "split"

    def applies(self, ctx, problem):
        return problem.splittable and not problem.rms

    def prepare(self, ctx, problem):
        return _Split()


ROW_FAMILY = solver.register(solver.Family("rownorm", [RowsSolver(), Rows4Solver(), SplitSolver()],
                                           title="layer/group norm algorithm"))


def row_algorithm(ctx, rows, D, splittable, vector4=False, rms=False):
    """The solver for ``rows`` rows of D elements (``solver.select``: DLPRIM_ROWNORM_ALGO, an
    error where it does not apply; else tuning_db/rownorm.json: "split" for group norm with too
    few rows to fill the device and rows long enough to share, "rows4" for aligned layer
    and rms norm where its rule says, else "rows"). ``rms``: rms_norm's rows."""
    return solver.select(ctx, "rownorm", RowNormProblem(rows, D, bool(splittable),
                                                        ctx.info.compute_units, bool(vector4),
                                                        bool(rms)))


def _prepared_rows(ctx, rows, D, splittable, vector4=False, rms=False):
    chosen = row_algorithm(ctx, rows, D, splittable, vector4, rms)
    # "rows4" builds per row length (its registers per item are the row's).
    key = ("rownorm.prepared", chosen.name, ctx.info.compute_units,
           D if chosen.name == "rows4" else None, bool(rms))
    prepared = ctx.plans.get(key)
    if prepared is None:
        prepared = ctx.plans.put(key, chosen.prepare(
            ctx, RowNormProblem(rows, D, bool(splittable), ctx.info.compute_units, vector4,
                                bool(rms))))
    return prepared


def _split_forward(x, rows, D, G, weight, bias, eps, y, save_mean, save_rstd):
    """Group norm forward on the view (1, rows, D) with the batch-norm kernels."""
    ctx = x.ctx
    N, C = x.shape[:2]
    S = D * G // C
    i32 = np.int32
    sums = prepared_sums(ctx, "stats", 1, rows, D, (x,))
    partials = sums.run(x)
    prog = _program(ctx)
    row_coef = Tensor.empty(ctx, (rows, 5), float32)
    _per_channel_launch(ctx, bind(prog.kernel("channel_finalize_stats")), rows, i32(1), i32(rows), i32(D),
                        i32(sums.chunks), np.float32(eps), np.float32(0.0), x.buffer,
                        np.int64(x.offset_elements), partials.buffer, *_buf(None), *_buf(None),
                        *_buf(None), *_buf(None), *_buf(save_mean), *_buf(save_rstd),
                        row_coef.buffer)
    coef = Tensor.empty(ctx, (N * C, 5), float32)
    _per_channel_launch(ctx, bind(prog.kernel("group_norm_coef")), N * C, i32(N), i32(C), i32(G),
                        save_mean.buffer, save_rstd.buffer, *_buf(weight), *_buf(bias), coef.buffer)
    _apply(ctx, 1, N * C, S, coef, x, None, y, scalar_loads=sums.scalar_loads)


def _split_backward(x, g, dx, rows, D, weight, save_mean, save_rstd):
    """Group norm's dx on the view (1, rows, D): with g = dy * weight, dx = rstd * (g - mean(g))
    - (x - mean) * rstd^3 * mean(g * (x - mean)), batch norm's training backward per row."""
    ctx = x.ctx
    i32 = np.int32
    if weight is not None:
        from .pointwise import binary
        g = binary("mul", g, weight.reshape((weight.size,) + (1,) * (x.ndim - 2)))
    sums = prepared_sums(ctx, "grad", 1, rows, D, (x, g))
    partials = sums.run(x, dy=g, mean=save_mean)
    coef = Tensor.empty(ctx, (rows, 5), float32)
    _per_channel_launch(ctx, bind(_program(ctx).kernel("channel_finalize_grad")), rows, i32(1), i32(rows),
                        i32(D), i32(sums.chunks), i32(1), partials.buffer, *_buf(save_mean),
                        *_buf(save_rstd), *_buf(None), *_buf(None), *_buf(None), coef.buffer)
    _apply(ctx, 1, rows, D, coef, g, x, dx, scalar_loads=sums.scalar_loads)


def _vector4(D, G, S, x, weight, bias):
    """Whether "rows4" takes the rows: layer norm's layout (one group, a weight per element),
    rows of a multiple of 4 and x, weight and bias at offsets that are multiples of 4."""
    return G == 1 and S == 1 and D % 4 == 0 and all(
        t is None or t.offset_elements % 4 == 0 for t in (x, weight, bias))


def _row_norm(x, rows, D, G, Cg, S, weight, bias, eps, grad_view, name, splittable=False,
              rms=False):
    """Normalize ``rows`` rows of D elements; the affine weight of element d of row r is
    w[(r % G) * Cg + d // S]. ``grad_view`` = (N, C, S) for the weight gradients.
    ``splittable``: the input is group norm's (N, C, ...), which the "split" algorithm takes.
    ``rms``: rms_norm's rows (uncentred, no bias; the kernels save a mean of 0, so the weight
    gradient's sums of g * (x - mean) * rstd below serve as they are)."""
    ctx = x.ctx
    dtype = x.dtype
    y = Tensor.empty(ctx, x.shape, dtype)
    save_mean = Tensor.empty(ctx, (max(rows, 1),), float32)
    save_rstd = Tensor.empty(ctx, (max(rows, 1),), float32)
    storage16 = is_float16_type(dtype)
    if storage16:
        # 16-bit storage: the rows solver (a work group per row) loads and stores it, four
        # elements per access where the layout allows (row_vector_width).
        wdtype = next((t.dtype for t in (weight, bias) if t is not None), float32)

        def rows16(*data):
            width = row_vector_width(D, G, Cg, S, data, (weight, bias))
            key = ("rownorm.prepared16", dtype, wdtype, width, rms)
            return ctx.plans.get(key) or ctx.plans.put(key, _Rows(ctx, dtype, wdtype, width,
                                                                  rms))

        rows_solver = None
        if rows and D:
            if _vector4(D, G, S, x, weight, bias) and \
                    row_algorithm(ctx, rows, D, splittable, True, rms).name == "rows4":
                key = ("rownorm.prepared16_rows4", dtype, wdtype, D, rms)
                rows_solver = ctx.plans.get(key) or ctx.plans.put(
                    key, _Rows4(ctx, D, dtype, wdtype, rms))
            else:
                rows_solver = rows16(x, y)
    else:
        vector4 = _vector4(D, G, S, x, weight, bias)
        rows_solver = _prepared_rows(ctx, rows, D, splittable, vector4, rms) \
            if rows and D else None
    if rows_solver is not None:
        rows_solver.forward(x, y, rows, D, G, Cg, S, weight, bias, eps, save_mean, save_rstd)

    def backward(g):
        if g.dtype != dtype:
            from .pointwise import convert
            g = convert(g, dtype)     # the kernels read the gradient as the input's type
        dx = Tensor.empty(ctx, x.shape, dtype)
        if rows_solver is not None:
            solver_ = rows16(x, g, dx) if storage16 and not isinstance(rows_solver, _Rows4) \
                else rows_solver
            solver_.backward(x, g, dx, rows, D, G, Cg, S, weight, save_mean, save_rstd)
        if storage16:
            return (dx,) + _affine_grads16(x, g, weight, bias, grad_view, G, Cg, save_mean,
                                           save_rstd)
        dweight = dbias = None
        if weight is not None or bias is not None:
            N, C, S_ = grad_view
            dweight = Tensor.empty(ctx, weight.shape, float32) if weight is not None else None
            dbias = Tensor.empty(ctx, bias.shape, float32) if bias is not None else None
            if N * S_:
                partials, chunks = channel_partial_sums(ctx, "grad_affine", N, C, S_, x, dy=g,
                                                        row_mean=save_mean, row_rstd=save_rstd,
                                                        G=G, Cg=Cg)
                _per_channel_launch(ctx, bind(_program(ctx).kernel("channel_finalize_sums")), C,
                                    np.int32(C), np.int32(chunks), partials.buffer, *_buf(dweight),
                                    *_buf(dbias))
            else:
                for t in (dweight, dbias):
                    if t is not None:
                        t.fill_(0.0)
        return dx, dweight, dbias

    return autograd.record(y, (x, weight, bias), backward, name)


def _affine_grads16(x, g, weight, bias, grad_view, G, Cg, save_mean, save_rstd):
    """Layer / group norm's weight and bias gradients for 16-bit ``x`` and ``g``: sums over
    the batch and positions of g * xhat and g, in float32 (a reduce kernel reading the 16-bit
    tensors), each rounded once to its tensor's type."""
    from .pointwise import convert
    from .reduce import ReduceKernel
    if weight is None and bias is None:
        return None, None
    ctx = x.ctx
    N, C, S = grad_view
    dt = x.dtype
    sums = Tensor.empty(ctx, (2, 1, G, Cg, 1), float32)
    dweight, dbias = _view(sums, (1, G, Cg, 1)), Tensor(ctx, sums.buffer, (1, G, Cg, 1), float32,
                                                        offset=sums.offset + 4 * C)
    if N * S:
        # x and g as (N, G, Cg, S): row n * G + group holds the statistics of (n, group).
        stats = (N, G, 1, 1)
        _compose_kernel(("affine_grads16", dt), lambda: ReduceKernel(
            "norm_affine_grads", [("x", dt), ("g", dt), ("m", float32), ("r", float32)],
            [("dw", float32), ("db", float32)], "dw = g * (x - m) * r; db = g;", "sum"))(
            [_view(x, (N, G, Cg, S)), _view(g, (N, G, Cg, S)), _view(save_mean, stats),
             _view(save_rstd, stats)], [dweight, dbias], axes=(0, 3))
    else:
        sums.fill_(0.0)
    out = []
    for t, total in ((weight, dweight), (bias, dbias)):
        if t is None:
            out.append(None)
            continue
        total = _view(total, t.shape)
        out.append(total if t.dtype == float32 else convert(total, t.dtype))
    return tuple(out)


def _check_affine16(name, input, *tensors):
    """DTypeError unless each tensor is None, float32 or the 16-bit input's type."""
    for what, t in tensors:
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise not_a_tensor(what, t)
        if t.dtype != float32 and t.dtype != input.dtype:
            raise DTypeError(f"{name}: {what} must be float32 or the input's "
                             f"{dtype_name(input.dtype)}, got {dtype_name(t.dtype)}")
    (first_name, first), (second_name, second) = tensors
    if first is not None and second is not None and first.dtype != second.dtype:
        raise DTypeError(f"{name}: {first_name} and {second_name} must have one dtype, got "
                         f"{dtype_name(first.dtype)} and {dtype_name(second.dtype)}")


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm: normalize over the trailing ``normalized_shape``
    dimensions; weight and bias (optional) have that shape."""
    storage16 = isinstance(input, Tensor) and is_float16_type(input.dtype)
    if storage16:
        _check_affine16("layer_norm", input, ("weight", weight), ("bias", bias))
    else:
        _check_float("input", input)
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or k > input.ndim or input.shape[input.ndim - k:] != normalized_shape:
        raise ShapeError(f"layer_norm: normalized_shape {normalized_shape} must be the trailing "
                         f"dimensions of the input shape {input.shape}")
    for what, t in (("weight", weight), ("bias", bias)):
        if not storage16:
            _check_float(what, t, required=False)
        if t is not None and t.shape != normalized_shape:
            raise ShapeError(f"layer_norm: {what} must have shape {normalized_shape}, got {t.shape}")
    check_same_context(input, weight, bias)
    D = math.prod(normalized_shape)
    rows = input.size // D if D else 0
    return _row_norm(input, rows, D, 1, D, 1, weight, bias, eps, (rows, D, 1), "layer_norm")


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm on (N, C, ...): statistics per sample and group of
    C / num_groups channels; weight and bias (optional) are per channel."""
    storage16 = isinstance(input, Tensor) and is_float16_type(input.dtype)
    if storage16:
        _check_affine16("group_norm", input, ("weight", weight), ("bias", bias))
    else:
        _check_float("input", input)
    if input.ndim < 2:
        raise ShapeError(f"group_norm expects an (N, C, ...) input, got shape {input.shape}")
    N, C = input.shape[:2]
    if not isinstance(num_groups, (int, np.integer)) or num_groups <= 0 or C % num_groups:
        raise ShapeError(f"group_norm: {C} channels do not split into {num_groups} groups")
    for what, t in (("weight", weight), ("bias", bias)):
        if not storage16:
            _check_float(what, t, required=False)
        _check_size(what, t, C)
    check_same_context(input, weight, bias)
    S = math.prod(input.shape[2:])
    G, Cg = int(num_groups), C // num_groups
    if N * Cg * S == 1:
        # torch's check (its batch-size check on the (N * C / G, G, ...) view): one sample whose
        # groups each hold a single value.
        raise ShapeError(f"group_norm: expected more than one value per group over the batch, "
                         f"got input {input.shape} with {G} groups")
    return _row_norm(input, N * G, Cg * S, G, Cg, S, weight, bias, eps, (N, C, S), "group_norm",
                     splittable=True)


# ---- local response norm --------------------------------------------------------------------

def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """torch.nn.functional.local_response_norm across channels of (N, C, ...) (3-d or more):
    y = x / (k + alpha / size * sum of x^2 over the ``size`` neighbouring channels) ** beta."""
    _check_float("input", input)
    if input.ndim < 3:
        raise ShapeError(f"local_response_norm expects a 3-d or higher (N, C, ...) input, got "
                         f"shape {input.shape}")
    if not isinstance(size, (int, np.integer)) or size <= 0:
        raise ShapeError(f"local_response_norm: size must be a positive int, got {size!r}")
    ctx = input.ctx
    C = input.shape[1]
    S = math.prod(input.shape[2:])
    total = input.size
    y = Tensor.empty(ctx, input.shape, float32)
    needs_grad = autograd.needs_grad(input)
    scale = Tensor.empty(ctx, input.shape, float32) if needs_grad else None
    prog = _program(ctx)
    from .pointwise import launch_size
    params = (np.int32(C), np.int32(S), np.int32(size), np.float32(alpha), np.float32(beta))
    if total:
        gsize, lsize = launch_size(ctx, total)
        bind(prog.kernel("lrn_forward"))(ctx.queue, gsize, lsize, np.int64(total), *params, np.float32(k),
                                   input.buffer, np.int64(input.offset_elements), y.buffer,
                                   np.int64(y.offset_elements), scale.buffer if scale is not None else None)

    def backward(g):
        dx = Tensor.empty(ctx, input.shape, float32)
        if total:
            bind(prog.kernel("lrn_backward"))(ctx.queue, gsize, lsize, np.int64(total), *params,
                                        input.buffer, np.int64(input.offset_elements), y.buffer,
                                        np.int64(y.offset_elements), g.buffer,
                                        np.int64(g.offset_elements), scale.buffer, dx.buffer,
                                        np.int64(dx.offset_elements))
        return (dx,)

    return autograd.record(y, (input,), backward, "local_response_norm")


# ---- normalize, rms_norm (the row kernels, uncentred), instance_norm (compositions) ----

_compose_kernels = {}


def _compose_kernel(key, factory):
    k = _compose_kernels.get(key)
    if k is None:
        k = _compose_kernels[key] = factory()
    return k


def _view(t, shape):
    return Tensor(t.ctx, t.buffer, shape, t.dtype, offset=t.offset)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """torch.nn.functional.normalize: input / max(||input||_p over ``dim``, ``eps``). ``dim``
    an int or a sequence of ints. Gradient to the input (none through the clamp where the norm
    is below eps, as torch's)."""
    from .reduce import ReduceKernel, norm
    _check_float("input", input)
    if out is not None:
        raise UnsupportedError("normalize: out= is not supported; use the returned tensor")
    eps = float(eps)
    norms = norm(input, p, dim, keepdim=True)
    y = Tensor.empty(input.ctx, input.shape, float32)
    divide = _compose_kernel("normalize", lambda: PointwiseKernel(
        "normalize_divide", [("x", float32), ("n", float32)], [("y", float32)],
        "y = x / fmax(n, eps);", scalars=[("eps", float32)]))
    divide([input, norms], [y], [eps])
    if not autograd.needs_grad(input):
        return y
    source, norms_source, keep = input.detach(), norms.detach(), norms.shape

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape, float32)
        dn = Tensor.empty(g.ctx, keep, float32)
        _compose_kernel("normalize_dx", lambda: PointwiseKernel(
            "normalize_dx", [("g", float32), ("n", float32)], [("dx", float32)],
            "dx = g / fmax(n, eps);", scalars=[("eps", float32)]))([g, norms_source], [dx], [eps])
        if g.size:
            _compose_kernel("normalize_dn", lambda: ReduceKernel(
                "normalize_dn", [("g", float32), ("x", float32), ("n", float32)],
                [("dn", float32)], "dn = n >= eps ? -g * x / (n * n) : 0.0f;", "sum",
                scalars=[("eps", float32)]))([g, source, norms_source], [dn], [eps])
        else:
            dn.fill_(0.0)
        return dx, dn

    return autograd.record(y, (input, norms), backward, "normalize")


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm: input / sqrt(mean(input^2) + eps) over the trailing
    ``normalized_shape`` dimensions, times ``weight`` (that shape, optional); ``eps`` None is
    float32's machine epsilon, as torch's. Gradients to input and weight.

    float32, float16 or bfloat16 input (the result in its type); the weight float32 or the
    input's type. Runs on layer norm's row kernels, uncentred (the "rownorm" solvers "rows"
    and "rows4", chosen by the same rules and DLPRIM_ROWNORM_ALGO): 16-bit tensors are loaded
    into float32 in the kernels, the statistics and the weight's gradient accumulate in
    float32, and results are rounded once."""
    from .pointwise import is_floating
    if not isinstance(input, Tensor):
        raise not_a_tensor("input", input)
    if not is_floating(input.dtype):
        raise DTypeError(f"input must be float32, float16 or bfloat16, got "
                         f"{dtype_name(input.dtype)}")
    dt = input.dtype
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or k > input.ndim or input.shape[input.ndim - k:] != normalized_shape:
        raise ShapeError(f"rms_norm: normalized_shape {normalized_shape} must be the trailing "
                         f"dimensions of the input shape {input.shape}")
    if weight is not None:
        if not isinstance(weight, Tensor):
            raise not_a_tensor("weight", weight)
        if weight.dtype != float32 and weight.dtype != dt:
            raise DTypeError(f"weight must be float32 or the input's {dtype_name(dt)}, got "
                             f"{dtype_name(weight.dtype)}")
    if weight is not None and weight.shape != normalized_shape:
        raise ShapeError(f"rms_norm: weight must have shape {normalized_shape}, got {weight.shape}")
    check_same_context(input, weight)
    eps = float(np.finfo(np.float32).eps) if eps is None else float(eps)
    D = math.prod(normalized_shape)
    rows = input.size // D if D else 0
    return _row_norm(input, rows, D, 1, D, 1, weight, None, eps, (rows, D, 1), "rms_norm",
                     rms=True)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """torch.nn.functional.instance_norm on (N, C, ...): statistics per sample and channel
    (group norm with a group per channel), ``weight`` and ``bias`` per channel. With
    ``running_mean``/``running_var`` given, they move toward the batch's average of the
    instances' means and unbiased variances by ``momentum`` (in place). With
    ``use_input_stats=False`` the running statistics normalize instead (as batch norm in
    evaluation). Gradients to input, weight and bias."""
    from .reduce import ReduceKernel
    storage16 = isinstance(input, Tensor) and is_float16_type(input.dtype)
    if storage16:
        # Group norm's 16-bit kernels; the running statistics' sums read the input as it is.
        _check_affine16("instance_norm", input, ("weight", weight), ("bias", bias))
        _check_affine16("instance_norm", input, ("running_mean", running_mean),
                        ("running_var", running_var))
    else:
        _check_float("input", input)
    if input.ndim < 2:
        raise ShapeError(f"instance_norm expects an (N, C, ...) input, got shape {input.shape}")
    N, C = input.shape[:2]
    S = math.prod(input.shape[2:])
    for what, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if not storage16:
            _check_float(what, t, required=False)
        _check_size(what, t, C)
    if (running_mean is None) != (running_var is None):
        raise ShapeError("instance_norm: running_mean and running_var go together; got one")
    if not isinstance(momentum, (int, float, np.number)) or isinstance(momentum, bool):
        raise DTypeError(f"instance_norm: momentum must be a number, got {momentum!r}")
    ctx = check_same_context(input, running_mean, running_var, weight, bias)
    if not use_input_stats:
        if running_mean is None:
            raise ShapeError("instance_norm: use_input_stats=False needs running_mean and "
                             "running_var")
        return batch_norm(input, running_mean, running_var, weight, bias, training=False,
                          eps=eps)
    if S <= 1:
        raise ShapeError(f"instance_norm: expected more than 1 spatial element when using "
                         f"the input's statistics, got input {input.shape}")
    y = group_norm(input, C, weight, bias, eps)
    if running_mean is not None and N:
        x = _view(input, (N, C, S))
        dt = input.dtype
        means = Tensor.empty(ctx, (N, C, 1), float32)
        variances = Tensor.empty(ctx, (N, C, 1), float32)
        # Keyed by the input's type (a 16-bit input is read as it is, summed in float32).
        _compose_kernel(("instance_mean", dt), lambda: ReduceKernel(
            "instance_mean", [("x", dt)], [("m", float32)], "m = x;", "sum",
            finalize="acc_m = acc_m / (float)reduce_size;"))([x], [means])
        _compose_kernel(("instance_var", dt), lambda: ReduceKernel(
            "instance_var", [("x", dt), ("m", float32)], [("v", float32)],
            "float d = x - m; v = d * d;", "sum",
            finalize="acc_v = acc_v / (float)(reduce_size - 1);"))([x, means], [variances])
        # The batch's average folded into the running values: each instance adds its share.
        new_mean = Tensor.empty(ctx, (1, C), float32)
        new_var = Tensor.empty(ctx, (1, C), float32)
        rdt = running_mean.dtype
        _compose_kernel(("instance_running", rdt), lambda: ReduceKernel(
            "instance_running", [("m", float32), ("v", float32), ("rm", rdt), ("rv", rdt)],
            [("nm", float32), ("nv", float32)],
            "nm = (momentum * m + (1.0f - momentum) * rm) / batch;"
            "nv = (momentum * v + (1.0f - momentum) * rv) / batch;", "sum",
            scalars=[("momentum", float32), ("batch", float32)]))(
            [_view(means, (N, C)), _view(variances, (N, C)), _view(running_mean, (1, C)),
             _view(running_var, (1, C))], [new_mean, new_var], [float(momentum), float(N)])
        if rdt != float32:
            # Updated in their own type, rounded once.
            from .pointwise import convert
            new_mean, new_var = convert(new_mean, rdt), convert(new_var, rdt)
        running_mean.copy_(_view(new_mean, (C,)))
        running_var.copy_(_view(new_var, (C,)))
    return y
