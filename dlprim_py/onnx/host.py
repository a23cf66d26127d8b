"""Host (numpy) evaluation of ONNX nodes whose inputs are all known when a graph is planned:
constants, and the shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat -> Reshape ...)
that exporters write around reshapes. The planner folds these; they never run on a device.

``evaluate(node, values, opset)`` returns the outputs as numpy arrays, or None where this node
is not folded on the host (the device runs it).
"""
import numpy as np

from ..errors import UnsupportedError

# Ops worth folding on the host whatever their size; the others (Conv, Relu, ...) are folded
# only where their inputs are constants and small (``_SMALL``), else the device runs them.
_SMALL = 1 << 16


def _ints(value):
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axes(node, values, opset, since, k=1, name="axes"):
    """The axes of a node given as an attribute before opset ``since`` and as input k from it."""
    if opset >= since:
        v = values[k] if k < len(values) else None
        return None if v is None else _ints(v)
    a = node.attrs.get(name)
    return None if a is None else [int(x) for x in a]


def onnx_dtype(code):
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))


def _constant(node, values, opset, graph):
    a = node.attrs
    if "value" in a:
        return [np.array(a["value"])]
    for name, dtype in (("value_float", np.float32), ("value_int", np.int64)):
        if name in a:
            return [np.array(a[name], dtype)]
    for name, dtype in (("value_floats", np.float32), ("value_ints", np.int64)):
        if name in a:
            return [np.array(a[name], dtype)]
    raise UnsupportedError(f"Constant node {node.name!r} (opset {opset}): only value, "
                           f"value_float(s) and value_int(s) are supported, got {sorted(a)}")


def _reshape(x, shape, allowzero=0):
    shape = _ints(shape)
    out = []
    for k, s in enumerate(shape):
        if s == 0 and not allowzero:
            out.append(x.shape[k])
        else:
            out.append(s)
    return x.reshape(out)


def reshape_target(in_shape, shape, allowzero=0):
    """The output shape of ONNX Reshape from ``in_shape`` to ``shape``."""
    return _reshape(np.empty(in_shape, np.int8), shape, allowzero).shape


def _slice(x, starts, ends, axes, steps):
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a % x.ndim
        # numpy's slice clamps the way ONNX does (very large or small ends included).
        index[a] = slice(s, None if (st < 0 and e < -x.shape[a]) else e, st)
    return x[tuple(index)]


def slice_args(node, values, opset):
    """(starts, ends, axes or None, steps or None) of a Slice node."""
    if opset >= 10:
        get = lambda k: values[k] if k < len(values) else None  # noqa: E731
        return get(1), get(2), get(3), get(4)
    a = node.attrs
    return a.get("starts"), a.get("ends"), a.get("axes"), None


def split_sizes(node, values, opset, size, outputs):
    """The sizes of a Split node's pieces along its axis of length ``size``."""
    sizes = None
    if opset >= 13:
        if len(values) > 1 and values[1] is not None:
            sizes = _ints(values[1])
    elif "split" in node.attrs:
        sizes = [int(v) for v in node.attrs["split"]]
    if sizes is None:
        n = int(node.attrs.get("num_outputs", outputs))
        piece = -(-size // n)
        sizes = [min(piece, size - piece * k) for k in range(n)]
    return sizes


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return (np.trunc(a / b)).astype(np.result_type(a, b))
    return a / b


def _reduce(fn):
    def run(node, values, opset, graph):
        since = 13 if node.op == "ReduceSum" else 18
        axes = _axes(node, values, opset, since)
        keep = bool(node.attrs.get("keepdims", 1))
        if axes is None or axes == []:
            if node.attrs.get("noop_with_empty_axes", 0):
                return [values[0]]
            axes = None
        x = values[0]
        return [np.asarray(fn(x, axis=None if axes is None else tuple(axes), keepdims=keep))
                .astype(x.dtype)]
    return run


def _cast(node, values, opset, graph):
    return [values[0].astype(onnx_dtype(node.attrs["to"]))]


def _concat(node, values, opset, graph):
    return [np.concatenate([np.asarray(v) for v in values], axis=int(node.attrs["axis"]))]


def _gather(node, values, opset, graph):
    return [np.take(values[0], values[1].astype(np.int64), axis=int(node.attrs.get("axis", 0)))]


def _unsqueeze(node, values, opset, graph):
    axes = _axes(node, values, opset, 13)
    x = values[0]
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = np.expand_dims(x, a)
    return [x]


def _squeeze(node, values, opset, graph):
    axes = _axes(node, values, opset, 13)
    x = values[0]
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _shape(node, values, opset, graph):
    shape = np.array(values[0].shape, np.int64)
    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
    return [shape[start:end]]


def _flatten(node, values, opset, graph):
    x = values[0]
    axis = int(node.attrs.get("axis", 1)) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def _transpose(node, values, opset, graph):
    perm = node.attrs.get("perm")
    return [np.transpose(values[0], None if perm is None else [int(p) for p in perm])]


def _constant_of_shape(node, values, opset, graph):
    value = node.attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(_ints(values[0]), value[0], value.dtype)]


def _range(node, values, opset, graph):
    start, limit, delta = (np.asarray(v).reshape(()) for v in values)
    return [np.arange(start, limit, delta).astype(start.dtype)]


def _split(node, values, opset, graph):
    x = values[0]
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    sizes = split_sizes(node, values, opset, x.shape[axis], len(node.outputs))
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _expand(node, values, opset, graph):
    x, shape = values
    target = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return [np.broadcast_to(x, target).copy()]


def _where(node, values, opset, graph):
    return [np.where(values[0], values[1], values[2])]


def _binary(fn):
    def run(node, values, opset, graph):
        a, b = (np.asarray(v) for v in values)
        out = fn(a, b)
        if node.op not in ("Equal", "Less", "Greater"):
            out = np.asarray(out).astype(np.result_type(a, b))
        return [np.asarray(out)]
    return run


def _unary(fn):
    def run(node, values, opset, graph):
        x = np.asarray(values[0])
        return [np.asarray(fn(x)).astype(x.dtype)]
    return run


def _slice_node(node, values, opset, graph):
    starts, ends, axes, steps = slice_args(node, values, opset)
    return [np.array(_slice(values[0], starts, ends, axes, steps))]


def _reshape_node(node, values, opset, graph):
    if opset >= 5:
        return [_reshape(values[0], values[1], node.attrs.get("allowzero", 0))]
    return [_reshape(values[0], node.attrs["shape"])]


def _clip(node, values, opset, graph):
    x = values[0]
    if opset >= 11:
        lo = values[1] if len(values) > 1 and values[1] is not None else None
        hi = values[2] if len(values) > 2 and values[2] is not None else None
    else:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, x.dtype))
    return [x]


EVALUATORS = {
    "Constant": _constant,
    "Shape": _shape,
    "Size": lambda node, values, opset, graph: [np.array(values[0].size, np.int64)],
    "Gather": _gather,
    "Concat": _concat,
    "Reshape": _reshape_node,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Cast": _cast,
    "Slice": _slice_node,
    "Split": _split,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Identity": lambda node, values, opset, graph: [values[0]],
    "Dropout": lambda node, values, opset, graph: [values[0]],
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Expand": _expand,
    "Where": _where,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_div),
    "Equal": _binary(np.equal),
    "Less": _binary(np.less),
    "Greater": _binary(np.greater),
    "Min": _binary(np.minimum),
    "Max": _binary(np.maximum),
    "Neg": _unary(np.negative),
    "Floor": _unary(np.floor),
    "Ceil": _unary(np.ceil),
    "Sqrt": _unary(np.sqrt),
    "Clip": _clip,
    "Relu": _unary(lambda x: np.maximum(x, 0)),
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
    "ReduceMean": _reduce(np.mean),
}

# Shape-only ops: folded on the host whenever their inputs are known, whatever their size.
SHAPE_OPS = {"Constant", "Shape", "Size", "ConstantOfShape", "Range"}


def evaluate(node, values, opset, graph=None, *, small_only=False):
    """The node's outputs as numpy arrays, or None where it is left to the device (an op the
    host does not evaluate, or, with ``small_only``, inputs larger than a few thousand
    elements: a large constant computation is the device's)."""
    fn = EVALUATORS.get(node.op)
    if fn is None:
        return None
    if node.op in ("Min", "Max") and len(values) != 2:
        return None
    if small_only and node.op not in SHAPE_OPS:
        if any(v is not None and np.asarray(v).size > _SMALL for v in values):
            return None
    return [np.asarray(v) for v in fn(node, values, opset, graph)]
