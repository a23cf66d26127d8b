"""The device side of each supported ONNX operator, over ``dlprim_py.functional``, the operator
modules and the fusion API.

A handler ``handler(planner, node, values)`` gets the node's input values (a ``dp.Tensor`` on
the device, a numpy array known on the host, or None for an absent optional input) and returns
its outputs. ``check_node(node, opset)`` is the load-time check of the attributes; a value
that only planning can check raises ``planner.unsupported(node, why)``.
"""
import math

import numpy as np

from .. import functional as F
from ..activation import Activation, ActivationDesc
from ..errors import ShapeError, UnsupportedError
from ..tensor import Tensor
from . import host

_F32_SIXTH = np.float32(1.0 / 6.0)


# ---- load-time checks -------------------------------------------------------------------------

def _check_conv(node, opset):
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad={node.attr('auto_pad')!r} is not supported"
    ks = node.attr("kernel_shape")
    if ks is not None and len(ks) not in (1, 2):
        return f"only 1-D and 2-D convolutions are supported, got kernel_shape {list(ks)}"
    return None


def _check_conv_transpose(node, opset):
    why = _check_conv(node, opset)
    if why:
        return why
    if node.attr("auto_pad", "NOTSET") != "NOTSET":
        return f"auto_pad={node.attr('auto_pad')!r} is not supported (only NOTSET)"
    if node.attr("output_shape") is not None:
        return "the output_shape attribute is not supported (give pads and output_padding)"
    return None


def _check_pool(node, opset):
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad={node.attr('auto_pad')!r} is not supported"
    if len(node.attr("kernel_shape", ())) != 2:
        shape = list(node.attr("kernel_shape", ()))
        return f"only 2-D pooling is supported, got kernel_shape {shape}"
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        return "the Indices output is not supported"
    if node.op == "AveragePool" and any(d != 1 for d in node.attr("dilations", (1, 1))):
        return f"dilations {list(node.attr('dilations'))} are not supported (only 1)"
    return None


def _check_resize(node, opset):
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        return f"mode={mode!r} is not supported"
    if node.attr("axes") is not None:
        return "the axes attribute is not supported"
    return None


def _check_pad(node, opset):
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return f"mode={mode!r} is not supported (constant, reflect, edge)"
    return None


def _check_gelu(node, opset):
    if node.attr("approximate", "none") not in ("none", "tanh"):
        return f"approximate={node.attr('approximate')!r} is not supported"
    return None


def _check_outputs(count):
    def check(node, opset):
        extra = [o for o in node.outputs[count:] if o]
        if extra:
            return f"outputs beyond the first {count} ({', '.join(extra)}) are not supported"
        return None
    return check


_CHECKS = {
    "Conv": _check_conv,
    "ConvTranspose": _check_conv_transpose,
    "MaxPool": _check_pool,
    "AveragePool": _check_pool,
    "Resize": _check_resize,
    "Pad": _check_pad,
    "Gelu": _check_gelu,
    "BatchNormalization": _check_outputs(1),
    "Dropout": _check_outputs(1),
}


def check_node(node, opset):
    """What is not supported in ``node`` (a string), or None."""
    check = _CHECKS.get(node.op)
    return check(node, opset) if check else None


# ---- activations --------------------------------------------------------------------------------

def _scalar(value):
    return None if value is None else float(np.asarray(value).reshape(()))


def clip_bounds(node, constants, opset):
    """(min, max) of a Clip node (None where absent), or False where a bound is not constant."""
    if opset >= 11:
        bounds = []
        for k in (1, 2):
            name = node.input(k)
            if not name:
                bounds.append(None)
            elif name in constants:
                bounds.append(_scalar(constants[name]))
            else:
                return False
        return tuple(bounds)
    return (node.attr("min"), node.attr("max"))


def activation_of(node, constants, opset):
    """The ActivationDesc that computes ``node`` on its first input (with parameters known at
    load time), or None where the node is not such an activation."""
    op = node.op
    if op == "Relu":
        return ActivationDesc("relu")
    if op == "LeakyRelu":
        return ActivationDesc(Activation.LEAKYRELU, alpha=float(node.attr("alpha", 0.01)))
    if op == "Sigmoid":
        return ActivationDesc(Activation.LOGISTIC)
    if op == "Tanh":
        return ActivationDesc(Activation.TANH)
    if op == "Elu":
        return ActivationDesc(Activation.ELU, alpha=float(node.attr("alpha", 1.0)))
    if op == "HardSwish":
        return ActivationDesc(Activation.HARDSWISH)
    if op == "HardSigmoid":
        # torch's hardsigmoid is ONNX's with alpha 1/6 and beta 1/2 (ONNX's defaults differ).
        if (np.float32(node.attr("alpha", 0.2)) == _F32_SIXTH
                and float(node.attr("beta", 0.5)) == 0.5):
            return ActivationDesc(Activation.HARDSIGMOID)
        return None
    if op == "Gelu":
        return ActivationDesc(Activation.GELU_TANH if node.attr("approximate", "none") == "tanh"
                              else Activation.GELU)
    if op == "Clip":
        bounds = clip_bounds(node, constants, opset)
        if bounds is False:
            return None
        lo, hi = bounds
        if lo is None and hi is None:
            return ActivationDesc(Activation.PASTHRU)
        if lo == 0.0 and hi is None:
            return ActivationDesc("relu")
        if lo == 0.0 and hi is not None and hi > 0:
            return ActivationDesc(Activation.CLIPPEDRELU, alpha=hi)
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
            return ActivationDesc(Activation.HARDTANH, alpha=lo, beta=hi)
        return None
    return None


def _activation_node(planner, node, values):
    x = planner.device(values[0])
    desc = activation_of(node, planner.constants_for(node, values), planner.opset)
    if desc is not None:
        if desc.is_identity:
            return [x]
        return [F.activation(x, desc)]
    if node.op == "HardSigmoid":
        alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
        return [F.hardtanh(x * alpha + beta, 0.0, 1.0)]
    if node.op == "Clip":
        bounds = clip_bounds(node, planner.constants_for(node, values), planner.opset)
        if bounds is False:
            raise planner.unsupported(node, "min and max must be constants")
        lo, hi = bounds
        if lo is not None:
            x = F.maximum(x, float(lo))
        if hi is not None:
            x = F.minimum(x, float(hi))
        return [x]
    raise planner.unsupported(node, "this activation's parameters are not supported")


# ---- convolution --------------------------------------------------------------------------------

def _same_pads(in_sizes, kernel, strides, dilations, mode):
    begins, ends = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begins.append(small if mode == "SAME_UPPER" else total - small)
        ends.append(total - small if mode == "SAME_UPPER" else small)
    return begins, ends


def _pads(node, in_sizes, kernel, strides, dilations):
    """(begins, ends) of a Conv/pool node on spatial sizes ``in_sizes``."""
    auto = node.attr("auto_pad", "NOTSET")
    n = len(kernel)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pads(in_sizes, kernel, strides, dilations, auto)
    if auto == "VALID":
        return [0] * n, [0] * n
    pads = list(node.attr("pads", [0] * (2 * n)))
    return pads[:n], pads[n:]


def _torch_pad(begins, ends):
    """ONNX spatial (begins, ends) as torch.nn.functional.pad's list, last dimension first."""
    out = []
    for b, e in zip(reversed(begins), reversed(ends)):
        out += [int(b), int(e)]
    return out


def _conv(planner, node, values):
    return _prepared_conv(planner, node, values)[1]()


def _prepared_conv(planner, node, values):
    """(output shape, or None where the convolution cannot write into a caller's tensor;
    ``run(out=None)`` -> [y]) of a Conv node: what is needed before it runs (an asymmetric pad,
    the weights on the device) is done here, once."""
    from ..fusion import conv_bias_activation
    from ..ops.conv import ConvolutionDesc
    x = planner.device(values[0])
    w = values[1]
    one_d = x.ndim == 3
    if x.ndim not in (3, 4):
        raise planner.unsupported(node, f"only 1-D and 2-D convolutions, got input shape {x.shape}")
    if one_d:
        x = x.reshape(x.shape[:2] + (1, x.shape[2]))
        w = w.reshape(w.shape[:2] + (1, w.shape[2]))
    kernel = tuple(w.shape[2:])
    n = 2
    strides = list(node.attr("strides", [1] * (n - one_d)))
    dilations = list(node.attr("dilations", [1] * (n - one_d)))
    if one_d:
        strides, dilations = [1] + strides, [1] + dilations
    begins, ends = _pads(node, x.shape[2:] if not one_d else x.shape[3:], kernel[one_d:],
                         strides[one_d:], dilations[one_d:])
    if one_d:
        begins, ends = [0] + list(begins), [0] + list(ends)
    if list(begins) != list(ends):
        common = [min(b, e) for b, e in zip(begins, ends)]
        x = F.pad(x, _torch_pad([b - c for b, c in zip(begins, common)],
                                [e - c for e, c in zip(ends, common)]))
        begins = common
    groups = int(node.attr("group", 1))
    bias = values[2] if len(values) > 2 else None
    wt = planner.device(w, node.inputs[1] + ("::2d" if one_d else ""))
    bt = None if bias is None else planner.device(bias, node.input(2))
    desc = ConvolutionDesc(padding=tuple(begins), stride=tuple(strides),
                           dilation=tuple(dilations), groups=groups)
    act = node.fused.get("activation")
    z = node.fused.get("residual")
    z = None if z is None else planner.device(planner.value(z))
    ho = [(s + 2 * p - d * (k - 1) - 1) // st + 1
          for s, p, d, k, st in zip(x.shape[2:], begins, dilations, kernel, strides)]
    y_shape = (x.shape[0], wt.shape[0]) + tuple(ho)
    if z is not None and (tuple(z.shape) != y_shape or z.dtype != x.dtype or one_d):
        def run_unfused(out=None):
            # The Add broadcasts: run it (and the activation) after the convolution.
            y = conv_bias_activation(x, wt, bt, None, 1.0, 0.0, None, conv_desc=desc)
            if one_d:
                y = y.reshape(y.shape[:2] + (y.shape[3],))
            y = F.add(y, z)
            return [y if act is None else F.activation(y, act)]
        return None, run_unfused

    def run(out=None):
        y = conv_bias_activation(x, wt, bt, z, 1.0, 1.0 if z is not None else 0.0, act,
                                 conv_desc=desc, out=out)
        if one_d:
            y = y.reshape(y.shape[:2] + (y.shape[3],))
        return [y]
    return (None if one_d or x.dtype != np.float32 else y_shape), run


def _conv_transpose(planner, node, values):
    x = planner.device(values[0])
    if x.ndim != 4:
        raise planner.unsupported(node, f"only 2-D transposed convolutions, got input shape "
                                        f"{x.shape}")
    w = planner.device(values[1], node.inputs[1])
    bias = values[2] if len(values) > 2 else None
    bt = None if bias is None else planner.device(bias, node.input(2))
    strides = list(node.attr("strides", [1, 1]))
    dilations = list(node.attr("dilations", [1, 1]))
    pads = list(node.attr("pads", [0, 0, 0, 0]))
    if pads[:2] != pads[2:]:
        raise planner.unsupported(node, f"asymmetric pads {pads} are not supported")
    out_pad = list(node.attr("output_padding", [0, 0]))
    groups = int(node.attr("group", 1))
    y = F.conv_transpose2d(x, w, bt, tuple(strides), tuple(pads[:2]), tuple(out_pad), groups,
                           tuple(dilations))
    act = node.fused.get("activation")
    return [y if act is None else F.activation(y, act)]


def _batch_norm(planner, node, values):
    from ..ops.norm import batch_norm_forward_inference
    x = planner.device(values[0])
    params = [planner.device(v, node.input(k + 1)) for k, v in enumerate(values[1:5])]
    scale, shift, mean, var = params
    y = Tensor.empty(x.ctx, x.shape, x.dtype)
    batch_norm_forward_inference(x, y, scale, shift, mean, var,
                                 eps=float(node.attr("epsilon", 1e-5)),
                                 activation=node.fused.get("activation"))
    return [y]


# ---- pooling ----------------------------------------------------------------------------------

def _pool(planner, node, values):
    x = planner.device(values[0])
    if x.ndim != 4:
        raise planner.unsupported(node, f"only 2-D pooling, got input shape {x.shape}")
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides = list(node.attr("strides", [1, 1]))
    dilations = list(node.attr("dilations", [1, 1]))
    begins, ends = _pads(node, x.shape[2:], kernel, strides, dilations)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    is_max = node.op == "MaxPool"
    include_pad = bool(node.attr("count_include_pad", 0))
    torch_ok = all(b == e and b <= k // 2 for b, e, k in zip(begins, ends, kernel))
    if not torch_ok:
        if not is_max and not include_pad and any(begins + ends):
            raise planner.unsupported(node, f"pads {begins + ends} with count_include_pad=0 "
                                            f"are not supported where they differ per side or "
                                            f"exceed half the kernel")
        x = F.pad(x, _torch_pad(begins, ends), value=float("-inf") if is_max else 0.0)
        begins = [0, 0]
    if is_max:
        return [F.max_pool2d(x, tuple(kernel), tuple(strides), tuple(begins), tuple(dilations),
                             ceil_mode)]
    return [F.avg_pool2d(x, tuple(kernel), tuple(strides), tuple(begins), ceil_mode, include_pad)]


def _global_pool(planner, node, values):
    x = planner.device(values[0])
    if x.ndim == 4:
        fn = F.adaptive_avg_pool2d if node.op == "GlobalAveragePool" else F.adaptive_max_pool2d
        return [fn(x, (1, 1))]
    dims = tuple(range(2, x.ndim))
    return [(F.mean if node.op == "GlobalAveragePool" else F.amax)(x, dims, True)]


# ---- matrix products -----------------------------------------------------------------------------

def _gemm(planner, node, values):
    from ..ops.gemm import gemm
    a, b = values[0], values[1]
    c = values[2] if len(values) > 2 else None
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    ta, tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    at = planner.device(a, node.inputs[0])
    bt = planner.device(b, node.inputs[1])
    m = at.shape[1] if ta else at.shape[0]
    n = bt.shape[0] if tb else bt.shape[1]
    bias, bias_per, ct = None, "n", None
    if c is not None and beta != 0.0:
        if isinstance(c, np.ndarray) and c.size in (1, n) and (c.ndim < 2 or c.shape[0] == 1):
            bias = planner.device(np.broadcast_to(c.reshape(-1) * np.float32(beta),
                                                  (n,)).astype(np.float32),
                                  f"{node.input(2)}::bias*{beta}:{n}")
        elif isinstance(c, np.ndarray) and c.ndim == 2 and c.shape == (m, 1) and m != 1:
            bias = planner.device((c.reshape(-1) * np.float32(beta)).astype(np.float32),
                                  f"{node.input(2)}::mbias*{beta}")
            bias_per = "m"
        else:
            # C as a full (M, N) addend: a copy of it receives the product.
            cfull = planner.device(c)
            if tuple(cfull.shape) != (m, n):
                cfull = F.add(Tensor.zeros(at.ctx, (m, n)), cfull)
            else:
                cfull = F.mul(cfull, 1.0)
            ct = cfull
    act = node.fused.get("activation")
    if ct is not None:
        y = gemm(at, bt, ct, alpha, beta, ta, tb)
        return [y if act is None else F.activation(y, act)]
    return [gemm(at, bt, None, alpha, 0.0, ta, tb, bias, act, bias_per=bias_per)]


def _matmul(planner, node, values):
    from ..ops.gemm import gemm, gemm_batched
    a = planner.device(values[0], node.inputs[0])
    b = planner.device(values[1], node.inputs[1])
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    if a_vec:
        a = a.reshape((1, a.shape[0]))
    if b_vec:
        b = b.reshape((b.shape[0], 1))
    if b.ndim == 2:
        lead = a.shape[:-1]
        y = gemm(a.reshape((-1, a.shape[-1])) if a.ndim != 2 else a, b)
        y = y.reshape(lead + (b.shape[1],))
    else:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        count = int(np.prod(batch))

        def as3(t):
            lead = tuple(t.shape[:-2])
            if int(np.prod(lead)) == 1:
                return t.reshape((1,) + tuple(t.shape[-2:]))
            if (1,) * (len(batch) - len(lead)) + lead != batch:
                # Broadcast over some batch dimensions: materialised (adding zeros).
                t = F.add(t, planner.device(np.zeros(batch + (1, 1), np.float32)))
            return t.reshape((count,) + tuple(t.shape[-2:]))
        y = gemm_batched(as3(a), as3(b))
        y = y.reshape(batch + tuple(y.shape[-2:]))
    shape = tuple(y.shape)
    if a_vec:
        shape = shape[:-2] + shape[-1:]
    if b_vec:
        shape = shape[:-1]
    return [y.reshape(shape)]


# ---- pointwise ----------------------------------------------------------------------------------

_BINARY = {"Add": F.add, "Sub": F.sub, "Mul": F.mul, "Div": F.div, "Max": F.maximum,
           "Min": F.minimum}


def _binary(planner, node, values):
    if len(values) != 2:
        raise planner.unsupported(node, f"{len(values)} inputs (only 2 are supported)")
    a, b = values
    fn = _BINARY[node.op]
    ref = a if isinstance(a, Tensor) else b
    # A constant of one element on a float tensor's side is a number in the kernel call.
    if (isinstance(b, np.ndarray) and b.size == 1 and b.ndim <= ref.ndim
            and ref.dtype == np.float32):
        return [fn(ref, float(b.reshape(())))]
    if (isinstance(a, np.ndarray) and a.size == 1 and a.ndim <= ref.ndim
            and ref.dtype == np.float32):
        return [fn(float(a.reshape(())), ref)]
    at = planner.device(a, node.inputs[0])
    bt = planner.device(b, node.inputs[1])
    return [fn(at, bt)]


def _softmax(planner, node, values):
    x = planner.device(values[0])
    fn = F.softmax if node.op == "Softmax" else F.log_softmax
    if planner.opset >= 13:
        return [fn(x, int(node.attr("axis", -1)) % max(x.ndim, 1))]
    axis = int(node.attr("axis", 1)) % max(x.ndim, 1)
    rows = int(np.prod(x.shape[:axis]))
    y = fn(x.reshape((rows, -1)), 1)
    return [y.reshape(x.shape)]


def _gelu(planner, node, values):
    return [F.activation(planner.device(values[0]), activation_of(node, {}, planner.opset))]


# ---- shapes and data movement -----------------------------------------------------------------

def _reshape(planner, node, values):
    x = planner.device(values[0])
    shape = planner.host(node, values[1], "shape") if planner.opset >= 5 else node.attr("shape")
    return [x.reshape(host.reshape_target(x.shape, shape, node.attr("allowzero", 0)))]


def _flatten(planner, node, values):
    x = planner.device(values[0])
    axis = int(node.attr("axis", 1)) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape((int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))]


def _squeeze(planner, node, values):
    x = planner.device(values[0])
    if planner.opset >= 13:
        axes = (None if len(values) < 2 or values[1] is None
                else planner.host(node, values[1], "axes"))
    else:
        axes = node.attr("axes")
    if axes is None:
        shape = tuple(s for s in x.shape if s != 1)
    else:
        drop = {int(a) % x.ndim for a in np.asarray(axes).reshape(-1)}
        for a in drop:
            if x.shape[a] != 1:
                raise ShapeError(f"{node.op} node {node.name!r}: axis {a} of shape {x.shape} is "
                                 f"not 1")
        shape = tuple(s for k, s in enumerate(x.shape) if k not in drop)
    return [x.reshape(shape)]


def _unsqueeze(planner, node, values):
    x = planner.device(values[0])
    axes = (planner.host(node, values[1], "axes") if planner.opset >= 13 else node.attr("axes"))
    shape = list(x.shape)
    rank = x.ndim + len(np.asarray(axes).reshape(-1))
    for a in sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)):
        shape.insert(a, 1)
    return [x.reshape(tuple(shape))]


def _transpose(planner, node, values):
    x = planner.device(values[0])
    perm = node.attr("perm")
    perm = tuple(reversed(range(x.ndim))) if perm is None else tuple(int(p) for p in perm)
    if perm == tuple(range(x.ndim)):
        return [x]
    return [F.permute(x, perm)]


def _concat(planner, node, values):
    producers = node.fused.get("producers")
    if producers:
        return [_concat_in_place(planner, node, producers)]
    tensors = [planner.device(v, node.inputs[k]) for k, v in enumerate(values) if v is not None]
    axis = int(node.attr("axis"))
    family = node.fused.get("family")
    if family is not None and len(tensors) == len(node.inputs):
        out = _concat_family(planner, tensors, axis % tensors[0].ndim, family)
        if out is not None:
            return [out]
    tensors = [t for t in tensors if t.size or len(tensors) == 1]
    if len(tensors) == 1:
        return [tensors[0]]
    return [planner.concat(tensors, axis % tensors[0].ndim)]


def _concat_family(planner, tensors, axis, family):
    """A member of a Concat family (``Graph.concat_families``) at batch 1: a prefix of the
    family's buffer, which holds the largest member; the inputs this member adds are copied
    into their slices (each input once for the whole family). None where the layout does not
    allow it (something before the axis is not 1) or a shape differs from what inference said:
    the member is then concatenated on its own."""
    from ..ops.tensor_ops import dense_strides, strided_copy
    from ..tensor import _checked
    key, sizes = family
    first = tensors[0]
    if (math.prod(first.shape[:axis]) != 1 or any(
            t.dtype != first.dtype or t.shape[axis] != sizes[k]
            or not _same_outside(t.shape, first.shape, axis) for k, t in enumerate(tensors))):
        return None
    state = planner.families.get(key)
    if state is None:
        shape = list(first.shape)
        shape[axis] = sum(sizes)
        buffer = Tensor.empty(planner.ctx, tuple(shape), first.dtype)
        state = planner.families[key] = [buffer, 0]
    buffer, written = state
    if buffer.dtype != first.dtype or not _same_outside(buffer.shape, first.shape, axis):
        return None
    inner = math.prod(first.shape[axis + 1:])
    strides = dense_strides(buffer.shape)
    for k in range(written, len(tensors)):
        t = tensors[k]
        strided_copy(planner.ctx, t.shape, t.dtype, t.buffer, t.offset_elements,
                     dense_strides(t.shape), buffer.buffer,
                     buffer.offset_elements + sum(sizes[:k]) * inner, strides)
    state[1] = max(written, len(tensors))
    shape = list(buffer.shape)
    shape[axis] = sum(sizes[:len(tensors)])
    return _checked(planner.ctx, buffer.buffer, tuple(shape), buffer.dtype, buffer.offset)


def _same_outside(shape, other, axis):
    """Whether two shapes have one rank and agree everywhere but along ``axis``."""
    return len(shape) == len(other) and all(
        a == b for d, (a, b) in enumerate(zip(shape, other)) if d != axis)


def _concat_in_place(planner, node, producers):
    """A Concat whose inputs are all convolutions it alone reads: where each input is one
    contiguous slice of the output (nothing before the axis but ones: batch 1 on channels),
    the convolutions write straight into their slices; else they run and the inputs are
    copied."""
    from ..tensor import _checked
    prepared = []
    for name in node.inputs:
        conv = producers[name]
        prepared.append(_prepared_conv(planner, conv, [planner.value(n) for n in conv.inputs]))
    shapes = [shape for shape, _ in prepared]
    axis = int(node.attr("axis"))
    if all(shape is not None for shape in shapes):
        rank = len(shapes[0])
        axis %= rank
        out_shape = list(shapes[0])
        out_shape[axis] = sum(shape[axis] for shape in shapes)
        fits = all(_same_outside(shape, shapes[0], axis) for shape in shapes)
        if fits and int(np.prod(out_shape[:axis])) == 1:
            out = Tensor.empty(planner.ctx, tuple(out_shape))
            offset = 0
            for shape, run in prepared:
                run(_checked(planner.ctx, out.buffer, tuple(shape), out.dtype, offset))
                offset += int(np.prod(shape)) * out.dtype.itemsize
            return out
    tensors = [run()[0] for _, run in prepared]
    axis %= tensors[0].ndim
    return planner.concat(tensors, axis)


def _split(planner, node, values):
    x = planner.device(values[0])
    axis = int(node.attr("axis", 0)) % x.ndim
    if planner.opset >= 13 and len(values) > 1 and values[1] is not None:
        values = [values[0], planner.host(node, values[1], "split")]
    sizes = host.split_sizes(node, values, planner.opset, x.shape[axis], len(node.outputs))
    if sum(sizes) != x.shape[axis]:
        raise ShapeError(f"Split node {node.name!r}: sizes {sizes} do not add up to "
                         f"{x.shape[axis]}")
    outs, start = [], 0
    for s in sizes:
        outs.append(F.narrow(x, axis, start, s))
        start += s
    return outs


def _slice(planner, node, values):
    x = planner.device(values[0])
    args = host.slice_args(node, values, planner.opset)
    starts, ends, axes, steps = (None if v is None else planner.host(node, v, "slice argument")
                                 for v in args)
    starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
    axes = range(len(starts)) if axes is None else np.asarray(axes).reshape(-1)
    steps = [1] * len(starts) if steps is None else np.asarray(steps).reshape(-1)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) % x.ndim
        begin, stop, step = slice(int(s), int(e), int(st)).indices(x.shape[a])
        if step != 1:
            raise planner.unsupported(node, f"steps other than 1 on a device tensor (got {step})")
        length = max(stop - begin, 0)
        if begin == 0 and length == x.shape[a]:
            continue
        x = F.narrow(x, a, begin, length)
    return [x]


def _gather(planner, node, values):
    x = planner.device(values[0])
    indices = planner.host(node, values[1], "indices").astype(np.int64)
    axis = int(node.attr("axis", 0)) % x.ndim
    size = x.shape[axis]
    flat = [int(i) % size for i in indices.reshape(-1)]
    pieces = [F.narrow(x, axis, i, 1) for i in flat]
    y = pieces[0] if len(pieces) == 1 else F.cat(pieces, axis)
    shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]
    return [y.reshape(tuple(shape))]


def _pad(planner, node, values):
    x = planner.device(values[0])
    if planner.opset >= 11:
        pads = planner.host(node, values[1], "pads").reshape(-1)
        value = values[2] if len(values) > 2 and values[2] is not None else 0.0
        value = float(np.asarray(planner.host(node, value, "constant_value")).reshape(()))
        axes = values[3] if len(values) > 3 and values[3] is not None else None
    else:
        pads = np.asarray(node.attr("pads")).reshape(-1)
        value = float(node.attr("value", 0.0))
        axes = None
    axes = (list(range(x.ndim)) if axes is None
            else [int(a) % x.ndim for a in planner.host(node, axes, "axes").reshape(-1)])
    k = len(axes)
    begins, ends = [0] * x.ndim, [0] * x.ndim
    for j, a in enumerate(axes):
        begins[a], ends[a] = int(pads[j]), int(pads[j + k])
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[
        node.attr("mode", "constant")]
    first = next((a for a in range(x.ndim) if begins[a] or ends[a]), None)
    if first is None:
        return [x]
    torch_pads = _torch_pad(begins[first:], ends[first:])
    return [F.pad(x, torch_pads, mode, value if mode == "constant" else None)]


def _cast(planner, node, values):
    from ..ops.masks import cast
    dtype = host.onnx_dtype(node.attr("to"))
    x = planner.device(values[0])
    if np.dtype(x.dtype) == dtype:
        return [x]
    try:
        return [cast(x, dtype)]
    except Exception as exc:
        raise planner.unsupported(node, f"cast to {dtype}: {exc}") from exc


def _shape(planner, node, values):
    return host.evaluate(node, [np.empty(planner.device(values[0]).shape, np.int8)],
                         planner.opset)


def _identity(planner, node, values):
    return [values[0]]


def _reduce(planner, node, values):
    x = planner.device(values[0])
    since = 13 if node.op == "ReduceSum" else 18
    if planner.opset >= since:
        axes = (None if len(values) < 2 or values[1] is None
                else planner.host(node, values[1], "axes"))
    else:
        axes = node.attr("axes")
    keep = bool(node.attr("keepdims", 1))
    if axes is None or len(np.asarray(axes).reshape(-1)) == 0:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        dims = tuple(range(x.ndim))
    else:
        dims = tuple(sorted({int(a) % x.ndim for a in np.asarray(axes).reshape(-1)}))
    fn = {"ReduceMean": F.mean, "ReduceSum": F.sum, "ReduceMax": F.amax}[node.op]
    if node.op == "ReduceMean" and x.ndim == 4 and dims == (2, 3):
        y = F.adaptive_avg_pool2d(x, (1, 1))
        return [y if keep else y.reshape(x.shape[:2])]
    return [fn(x, dims, keep)]


def _resize(planner, node, values):
    from . import resize
    return [resize.resize_node(planner, node, values)]


HANDLERS = {
    "Conv": _conv, "ConvTranspose": _conv_transpose, "BatchNormalization": _batch_norm,
    "Relu": _activation_node, "LeakyRelu": _activation_node, "Clip": _activation_node,
    "Sigmoid": _activation_node, "HardSigmoid": _activation_node, "HardSwish": _activation_node,
    "Tanh": _activation_node, "Elu": _activation_node, "Gelu": _gelu,
    "Softmax": _softmax, "LogSoftmax": _softmax,
    "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool,
    "Gemm": _gemm, "MatMul": _matmul,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary, "Max": _binary,
    "Min": _binary,
    "Concat": _concat, "Split": _split, "Slice": _slice, "Gather": _gather,
    "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Pad": _pad, "Identity": _identity, "Dropout": _identity,
    "Shape": _shape, "Cast": _cast,
    "ReduceMean": _reduce, "ReduceSum": _reduce, "ReduceMax": _reduce,
    "Resize": _resize,
}

# What the issue lists and the tests cover (Constant is folded on the host).
SUPPORTED_OPS = tuple(sorted(set(HANDLERS) | {"Constant"}))


def unsupported_error(what, node, opset, why):
    return UnsupportedError(f"{what}: {node.op} node {node.name!r} (opset {opset}): {why}")
