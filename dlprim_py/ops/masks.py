"""Masks: the comparisons ``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge``, the logical operators
``logical_not``, ``logical_and``, ``logical_or``, ``logical_xor``, the operators ``~ & | ^`` on
bool tensors, and the dtype casts behind ``Tensor.to`` (``cast``), over the pointwise family's
generator (``PointwiseKernel``): a repeated call is the generator's plan lookup and one enqueue.

The results of comparisons and logical operators are bool tensors (``dlprim_py.bool``: one byte
per element holding 0 or 1) and record no gradient, as torch's. Operands: two tensors (numpy
broadcasting, one context) or a tensor and a Python number on either side. Operands of
different dtypes compare after torch's type promotion (bool, then the integers, then the floating
point types; within a kind the wider one): an int64 tensor and a float32 one compare in float32,
a float32 tensor and the number 3 compare with 3.0f, an int32 tensor and the number 2.5 in
float32. Two integer operands compare exactly, in 64 bits where one is a number (an int32 tensor
against a number outside int32's range gives the true answer where torch refuses it). NaN
compares unequal to everything, itself included: ``x != x`` is True where x is NaN and every
ordered comparison with NaN is False.

Logical operators take any dtype, as torch's: nonzero is True (NaN included). The operators
``~ & | ^`` are torch's bitwise operators restricted to what masks need: bool tensors and
Python bools; on other dtypes they raise DTypeError.
"""
import numpy as np

from .. import autograd
from ..context import check_same_context
from .. import program
from ..dtypes import (as_dtype, bfloat16, bfloat16_to_float32, bool_, cl_name, float16, float32,
                      int32, int64, to_bfloat16_bits)
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import launch
from ..tensor import Tensor, _checked, allocate
from .pointwise import PointwiseKernel, broadcast_shapes, template_type

COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# On the operands' truth values (0 or 1).
LOGICAL = {"logical_and": "&&", "logical_or": "||", "logical_xor": "!="}

# torch's kinds for type promotion: bool < integer < floating point.
_KIND = {bool_: 0, int32: 1, int64: 1, float16: 2, bfloat16: 2, float32: 2}


def scalar_kind(value):
    """torch's kind of a Python (or numpy) number: 0 bool, 1 integer, 2 floating point; None
    for anything else."""
    if isinstance(value, (bool, np.bool_)):
        return 0
    if isinstance(value, (int, np.integer)):
        return 1
    if isinstance(value, (float, np.floating)):
        return 2
    return None


def _not_an_operand(name, value):
    hint = "; make a tensor with dp.Tensor.from_numpy(array)" \
        if type(value).__module__ == "numpy" else ""
    return DTypeError(f"{name}: operands must be Tensors or numbers, got "
                      f"{type(value).__name__}{hint}")


def _promote(a, b):
    """The dtype two tensor dtypes meet in (torch's promotion)."""
    ka, kb = _KIND[a], _KIND[b]
    if ka != kb:
        return a if ka > kb else b
    if a != b and ka == 2 and a.itemsize == b.itemsize == 2:
        return float32       # float16 with bfloat16: neither holds the other
    return a if a.itemsize >= b.itemsize else b


def _compute_type(tensor_dtype, kind):
    """(the dtype a tensor of ``tensor_dtype`` and a number of ``kind`` compare in, the dtype
    the number is passed as)."""
    if kind == 2 or _KIND[tensor_dtype] == 2:
        compute = tensor_dtype if _KIND[tensor_dtype] == 2 else float32
        return compute, float32      # a 16-bit comparison's number is rounded on the host
    return int64, int64


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _scalar_value(name, value, dtype):
    """``value`` as a kernel argument of ``dtype`` (int64 or float32); a float beyond float32's
    range becomes an infinity, as torch converts it."""
    if dtype == int64:
        v = int(value)
        if not -2 ** 63 <= v < 2 ** 63:
            raise DTypeError(f"{name}: the number {value} does not fit in int64")
        return np.int64(v)
    try:
        v = float(value)
    except OverflowError:
        raise DTypeError(f"{name}: the number {value} does not fit in float32") from None
    if -_FLOAT32_MAX <= v <= _FLOAT32_MAX or v != v:
        return np.float32(v)
    with np.errstate(over="ignore"):
        return np.float32(v)


def _rounded_to(value, dtype):
    """A float32 number rounded to the 16-bit ``dtype`` and back (exactly): a 16-bit tensor
    compares with a number in its own type, as torch's, and the kernel compares floats."""
    if dtype == float16:
        with np.errstate(over="ignore"):
            return np.float32(np.float16(value))
    if dtype is bfloat16:
        return np.float32(bfloat16_to_float32(to_bfloat16_bits([value]))[0])
    return value


def _output(name, out, shape, tensors):
    """A new bool tensor of ``shape`` in the context of ``tensors``, or ``out`` checked to be
    one there."""
    if out is None:
        return Tensor.empty(tensors[0].ctx, shape, bool_)
    if not isinstance(out, Tensor):
        raise not_a_tensor(f"{name}: out", out)
    if out.dtype != bool_:
        raise DTypeError(f"{name}: out must be a bool tensor, got {out.dtype}")
    if out.shape != shape:
        raise ShapeError(f"{name}: out must have the operands' broadcast shape {shape}, got "
                         f"{out.shape}")
    check_same_context(*tensors, out)
    return out


# (op, a's dtype or None for a number, b's likewise, compute dtype) -> PointwiseKernel
_kernels = {}


def _tag(dtype):
    return "s" if dtype is None else template_type(dtype)


def _c_type(dtype):
    """The C type operands of ``dtype`` are in a pointwise statement: float for the 16-bit
    storage types (loaded into float, no cl_khr_fp16 needed)."""
    return "float" if dtype in _FLOATS16 else cl_name(dtype)


def _comparison_kernel(op, a, b, compute, scalar):
    key = (op, a, b, compute)
    kernel = _kernels.get(key)
    if kernel is None:
        c = _c_type(compute)
        inputs = [(n, t) for n, t in (("a", a), ("b", b)) if t is not None]
        scalars = [(n, scalar) for n, t in (("a", a), ("b", b)) if t is None]
        kernel = _kernels[key] = PointwiseKernel(
            f"{op}_{_tag(a)}_{_tag(b)}_as_{c}", inputs, [("y", bool_)],
            f"y = (({c})a {COMPARISONS[op]} ({c})b);", scalars=scalars)
    return kernel


def _truth(name, dtype):
    """C code for the truth value (0 or 1) of operand ``name`` of ``dtype`` (None: a number,
    passed as its truth value already)."""
    return name if dtype is None else f"({name} != ({_c_type(dtype)})0)"


def _logical_kernel(op, a, b):
    key = (op, a, b, None)
    kernel = _kernels.get(key)
    if kernel is None:
        inputs = [(n, t) for n, t in (("a", a), ("b", b)) if t is not None]
        scalars = [(n, int32) for n, t in (("a", a), ("b", b)) if t is None]
        statement = (f"y = !{_truth('a', a)};" if op == "logical_not" else
                     f"y = ({_truth('a', a)} {LOGICAL[op]} {_truth('b', b)});")
        kernel = _kernels[key] = PointwiseKernel(
            f"{op}_{_tag(a)}_{_tag(b)}", inputs, [("y", bool_)], statement, scalars=scalars)
    return kernel


def _binary(name, a, b, out):
    """The common path of the comparisons and the binary logical operators: the operands
    checked, then (the tensor operands, the output)."""
    a_tensor, b_tensor = isinstance(a, Tensor), isinstance(b, Tensor)
    for x, is_tensor in ((a, a_tensor), (b, b_tensor)):
        if not is_tensor and scalar_kind(x) is None:
            raise _not_an_operand(name, x)
    if not (a_tensor or b_tensor):
        raise DTypeError(f"{name}: at least one operand must be a Tensor")
    tensors = [x for x in (a, b) if isinstance(x, Tensor)]
    if len(tensors) == 2:
        check_same_context(*tensors)
    shape = tensors[0].shape if len(tensors) == 1 else broadcast_shapes(a.shape, b.shape)
    return tensors, _output(name, out, shape, tensors)


# (op, the tensor's dtype, the other operand's dtype or Python number type) -> (kernel, the
# dtype a number is passed as): the calls of the fast path below.
_common_calls = {}


def compare(op, a, b, out=None):
    """``a <op> b`` elementwise as a bool tensor (``op``: "eq", "ne", "lt", "le", "gt", "ge");
    see the module's docstring for the operands. No gradient is recorded."""
    if out is None and a.__class__ is Tensor and a.dtype not in _FLOATS16:
        # The common calls first: a tensor with one of its shape and dtype, or with a Python
        # number (the kernel's call checks the contexts).
        if b.__class__ is Tensor and b.shape == a.shape and b.dtype == a.dtype:
            call = _common_calls.get((op, a.dtype, a.dtype))
            if call is not None:
                out = _checked(a.ctx, allocate(a.ctx, max(a.size, 1)), a.shape, bool_, 0)
                call[0]([a, b], [out])
                return out
        elif b.__class__ in (int, float):
            call = _common_calls.get((op, a.dtype, b.__class__))
            if call is not None and (call[1] is int64 and -2 ** 63 <= b < 2 ** 63 or
                                     call[1] is float32 and -_FLOAT32_MAX <= b <= _FLOAT32_MAX):
                out = _checked(a.ctx, allocate(a.ctx, max(a.size, 1)), a.shape, bool_, 0)
                call[0]([a], [out], [call[1].type(b)])
                return out
    tensors, out = _binary(op, a, b, out)
    if len(tensors) == 2:
        compute = _promote(a.dtype, b.dtype)
        kernel = _comparison_kernel(op, a.dtype, b.dtype, compute, None)
        if a.dtype == b.dtype:
            _common_calls[op, a.dtype, b.dtype] = (kernel, None)
        kernel(tensors, [out])
        return out
    t, number = (a, b) if isinstance(a, Tensor) else (b, a)
    compute, passed = _compute_type(t.dtype, scalar_kind(number))
    value = _scalar_value(op, number, passed)
    if compute in _FLOATS16:
        value = _rounded_to(value, compute)
    dtypes = (t.dtype, None) if t is a else (None, t.dtype)
    kernel = _comparison_kernel(op, *dtypes, compute, passed)
    if t is a and number.__class__ in (int, float) and compute not in _FLOATS16:
        _common_calls[op, a.dtype, number.__class__] = (kernel, passed)
    kernel(tensors, [out], [value])
    return out


def eq(a, b, out=None):
    """torch.eq: ``a == b`` elementwise, a bool tensor (NaN equals nothing)."""
    return compare("eq", a, b, out)


def ne(a, b, out=None):
    """torch.ne: ``a != b`` elementwise, a bool tensor (True where either is NaN)."""
    return compare("ne", a, b, out)


def lt(a, b, out=None):
    """torch.lt: ``a < b`` elementwise, a bool tensor (False where either is NaN)."""
    return compare("lt", a, b, out)


def le(a, b, out=None):
    """torch.le: ``a <= b`` elementwise, a bool tensor (False where either is NaN)."""
    return compare("le", a, b, out)


def gt(a, b, out=None):
    """torch.gt: ``a > b`` elementwise, a bool tensor (False where either is NaN)."""
    return compare("gt", a, b, out)


def ge(a, b, out=None):
    """torch.ge: ``a >= b`` elementwise, a bool tensor (False where either is NaN)."""
    return compare("ge", a, b, out)


def _logical(op, a, b, out):
    tensors, out = _binary(op, a, b, out)
    dtypes = [x.dtype if isinstance(x, Tensor) else None for x in (a, b)]
    numbers = [np.int32(bool(x)) for x in (a, b) if not isinstance(x, Tensor)]
    _logical_kernel(op, *dtypes)(tensors, [out], numbers)
    return out


def logical_and(a, b, out=None):
    """torch.logical_and: True where both are nonzero (any dtypes, NaN is nonzero)."""
    return _logical("logical_and", a, b, out)


def logical_or(a, b, out=None):
    """torch.logical_or: True where either is nonzero (any dtypes, NaN is nonzero)."""
    return _logical("logical_or", a, b, out)


def logical_xor(a, b, out=None):
    """torch.logical_xor: True where exactly one is nonzero (any dtypes, NaN is nonzero)."""
    return _logical("logical_xor", a, b, out)


def logical_not(x, out=None):
    """torch.logical_not: True where ``x`` is zero (any dtype; NaN is nonzero)."""
    if not isinstance(x, Tensor):
        raise not_a_tensor("logical_not: input", x)
    out = _output("logical_not", out, x.shape, [x])
    _logical_kernel("logical_not", x.dtype, None)([x], [out])
    return out


# ---- the operators ~ & | ^ ----------------------------------------------------------------

_BITWISE = {"&": logical_and, "|": logical_or, "^": logical_xor}


def bitwise(symbol, a, b):
    """``a <symbol> b`` for ``symbol`` one of ``& | ^``: bool tensors and Python bools only
    (the mask operators); a DTypeError names what came otherwise."""
    for x in (a, b):
        if isinstance(x, Tensor):
            if x.dtype != bool_:
                raise DTypeError(f"{symbol} takes bool tensors (masks), got a {x.dtype} tensor; "
                                 f"bitwise operators on numbers are not supported (compare, or "
                                 f"use .bool() / dp.functional.logical_*)")
        elif not isinstance(x, (bool, np.bool_)):
            if scalar_kind(x) is None:
                raise _not_an_operand(symbol, x)
            raise DTypeError(f"{symbol} takes bool tensors and bools, got the number {x!r}")
    return _BITWISE[symbol](a, b)


def invert(x):
    """``~x`` for a bool tensor: ``logical_not``; DTypeError for any other dtype."""
    if x.dtype != bool_:
        raise DTypeError(f"~ takes a bool tensor (mask), got a {x.dtype} tensor; bitwise not on "
                         f"numbers is not supported (use dp.functional.logical_not)")
    return logical_not(x)


# ---- casts -------------------------------------------------------------------------------

def _cast_statement(source, target):
    s, t = cl_name(source), cl_name(target)
    if target == bool_:
        return f"y = (x != ({s})0);"
    if source == bool_ or (_KIND[source] == 1 and _KIND[target] == 1):
        return f"y = ({t})x;"
    if _KIND[source] == 2 and _KIND[target] == 1:
        # Toward zero, values out of range saturated and NaN to 0 (a C cast is undefined there,
        # and not every implementation's saturating conversion maps NaN to 0 as it should).
        return f"y = (x != x) ? ({t})0 : convert_{t}_sat_rtz(x);"
    return f"y = convert_{t}_rte(x);"     # to a floating point type: round to nearest even


def cast(x, dtype):
    """``x`` converted to ``dtype`` (torch's ``Tensor.to(dtype)``): ``x`` itself where it has
    that dtype already, else a new tensor. To bool: nonzero (NaN included) is True; from bool:
    1 and 0; from floating point to an integer: toward zero, NaN to 0, values out of range
    saturated; int64 to int32 keeps the low 32 bits. A cast between floating point types
    carries the gradient; any other records none.

    Casts between float32, float16 and bfloat16 need no cl_khr_fp16 (kernels/convert16.cl.mako:
    float16 through vload_half / vstore_half_rte, bfloat16 in integer operations); to a 16-bit
    type they round to nearest even, NaN and infinities kept. A cast between a 16-bit type and
    an integer or bool goes through float32 (the same result: every integer a 16-bit type holds
    exactly is exact in float32, and one that float32 rounds overflows the 16-bit type)."""
    if not isinstance(x, Tensor):
        raise not_a_tensor("to: input", x)
    dtype = as_dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype in _FLOATS16 or dtype in _FLOATS16:
        if x.dtype in _FLOAT_KINDS and dtype in _FLOAT_KINDS:
            return _convert16(x, dtype)
        return cast(cast(x, float32), dtype)
    key = ("cast", x.dtype, dtype, None)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = PointwiseKernel(
            f"cast_{cl_name(x.dtype)}_to_{cl_name(dtype)}", [("x", x.dtype)], [("y", dtype)],
            _cast_statement(x.dtype, dtype))
    out = Tensor.empty(x.ctx, x.shape, dtype)
    kernel([x], [out])
    if _KIND[dtype] == 2 and autograd.needs_grad(x):
        source = x.dtype
        return autograd.record(out, (x,), lambda g: (cast(g, source),), "to")
    return out


_FLOATS16 = (float16, bfloat16)
_FLOAT_KINDS = (float32, float16, bfloat16)
_CONVERT_NAMES = {float32: "float", float16: "half", bfloat16: "bfloat16"}


def _convert16(x, dtype):
    """``x`` converted between float32, float16 and bfloat16 (different types) by convert16."""
    out = Tensor.empty(x.ctx, x.shape, dtype)
    n = x.size
    if n:
        wide = max(n + x.offset_elements, n + out.offset_elements) >= 2 ** 31 - 1
        index = np.int64 if wide else np.int32
        built = program.build(x.ctx, "convert16", {
            "SOURCE": _CONVERT_NAMES[x.dtype], "TARGET": _CONVERT_NAMES[dtype],
            "INDEX_T": "long" if wide else "int"})
        group = min(256, x.ctx.info.max_work_group_size)
        launch(x.ctx, built, "convert16", ((n + group - 1) // group * group,), (group,),
               [index(n), x.buffer, index(x.offset_elements), out.buffer,
                index(out.offset_elements)])
    if autograd.needs_grad(x):
        source = x.dtype
        return autograd.record(out, (x,), lambda g: (cast(g, source),), "to")
    return out
