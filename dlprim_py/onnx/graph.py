"""An ONNX model read into a plain node list, checked against what the engine supports, and
rewritten once, before any input shape is known: constants folded, Identity and Dropout
dropped, BatchNormalization folded into the convolution before it, and a convolution's
residual Add and activation (or a BatchNormalization's activation, a Gemm's) fused into it.

Nothing here touches a device: the planner (``engine.py``) walks the rewritten nodes once per
input shape.
"""
import math
import os

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from . import host

# Opsets of the default domain that the importer reads (torch exports 13 to 20).
MIN_OPSET, MAX_OPSET = 7, 22

# Attributes whose only supported value is given: anything else raises UnsupportedError.
_FIXED_ATTRIBUTES = {
    "MaxPool": {"storage_order": 0},
    "BatchNormalization": {"training_mode": 0, "spatial": 1},
    "Softmax": {}, "LogSoftmax": {},
    "Resize": {"antialias": 0, "keep_aspect_ratio_policy": "stretch"},
    "Cast": {"saturate": 1},
    "Gelu": {},
}


class Node:
    """One graph node: op type, name, input and output value names ('' for an absent optional
    input), attributes as Python values, and what planning fused into it (``fused``)."""

    __slots__ = ("op", "name", "inputs", "outputs", "attrs", "fused", "domain")

    def __init__(self, op, name, inputs, outputs, attrs, domain=""):
        self.op = op
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs)
        self.fused = {}
        self.domain = domain

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def input(self, k):
        """The k-th input's value name, or '' when absent."""
        return self.inputs[k] if k < len(self.inputs) else ""

    def __repr__(self):
        return f"Node({self.op} {self.name!r}: {self.inputs} -> {self.outputs})"


class ValueInfo:
    """A graph input: ``name``, ``shape`` (ints, with a string for a symbolic dimension such as
    the batch, None where the file gives nothing) and numpy ``dtype``."""

    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name = name
        self.shape = shape
        self.dtype = dtype

    def __repr__(self):
        return f"ValueInfo({self.name!r}, shape={self.shape}, dtype={np.dtype(self.dtype).name})"

    def __iter__(self):
        return iter((self.name, self.shape, self.dtype))


def _onnx():
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the onnx extra is missing
        raise UnsupportedError("dlprim_py.onnx needs the onnx package: pip install onnx") from exc
    return onnx


def read_model(source):
    """(ModelProto, what to call it in messages) of a path, bytes or ModelProto; a file that
    does not parse or check raises ModelFileError naming it."""
    onnx = _onnx()
    if isinstance(source, onnx.ModelProto):
        model, what = source, "the ModelProto given"
    elif isinstance(source, (bytes, bytearray, memoryview)):
        what = f"the ONNX bytes given ({len(source)} bytes)"
        model = _parse(onnx, bytes(source), what)
    elif isinstance(source, (str, os.PathLike)):
        what = os.fspath(source)
        try:
            with open(what, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ModelFileError(f"cannot read ONNX file {what!r}: {exc}") from exc
        model = _parse(onnx, data, f"ONNX file {what!r}")
        if _has_external_data(model):
            try:
                from onnx.external_data_helper import load_external_data_for_model
                load_external_data_for_model(model, os.path.dirname(os.path.abspath(what)))
            except Exception as exc:
                raise ModelFileError(f"ONNX file {what!r}: its external weight data cannot be "
                                     f"read: {exc}") from exc
        what = f"ONNX file {what!r}"
    else:
        raise ModelFileError(f"onnx.load expects a path, bytes or an onnx.ModelProto, got "
                             f"{type(source).__name__}")
    return model, what


def _parse(onnx, data, what):
    if not data:
        raise ModelFileError(f"{what} is empty")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:
        raise ModelFileError(f"{what} is not an ONNX model (truncated or damaged): {exc}") from exc
    if not model.HasField("graph") or not model.graph.node:
        raise ModelFileError(f"{what} holds no graph (truncated, or not an ONNX model)")
    return model


def _has_external_data(model):
    return any(t.data_location == 1 for t in model.graph.initializer)


def tensor_value(proto):
    """A TensorProto as a numpy array."""
    from onnx import numpy_helper
    return np.array(numpy_helper.to_array(proto))


def _attributes(node_proto):
    from onnx import helper
    attrs = {}
    for a in node_proto.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        elif hasattr(value, "dims") and hasattr(value, "data_type"):
            value = tensor_value(value)
        attrs[a.name] = value
    return attrs


def _shape_of(value_info):
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for k, d in enumerate(t.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or f"dim{k}")
    return tuple(dims)


def _dtype_of(value_info):
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type))


class Graph:
    """The model's nodes, constants, inputs and outputs, after the load-time rewrites."""

    def __init__(self, source):
        model, self.what = read_model(source)
        self.opset = None
        for entry in model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                self.opset = int(entry.version)
        if self.opset is None:
            raise ModelFileError(f"{self.what} imports no opset of the default ONNX domain")
        if model.graph.sparse_initializer:
            raise UnsupportedError(f"{self.what}: sparse initializers are not supported")
        g = model.graph
        self.constants = {}
        for t in g.initializer:
            self.constants[t.name] = tensor_value(t)
        self.inputs = [ValueInfo(v.name, _shape_of(v), _dtype_of(v)) for v in g.input
                       if v.name not in self.constants]
        self.output_names = [v.name for v in g.output]
        self.nodes = []
        for k, n in enumerate(g.node):
            self.nodes.append(Node(n.op_type, n.name or f"{n.op_type}_{k}", n.input, n.output,
                                   _attributes(n), n.domain))
        self.alias = {}
        self.check_defined()
        self.check_supported()
        self._counter = 0
        self.fold_constants()
        self.fold_batch_norm()
        self.fuse_conv_residual()
        self.fuse_activations()
        self.prune()
        self.concat_in_place()
        self.concat_families(model)
        self._shape_model = _shape_model(model)

    def value_shapes(self, input_shapes):
        """{value name: (shape, numpy dtype)} of every value ONNX shape inference gives a
        static shape for, the graph inputs having ``input_shapes`` ({name: shape}); {} where
        inference fails. A guess for planning ahead (``engine._build_ahead``), never a check:
        the rewrites keep the file's value names, so the names the planner meets are there."""
        onnx = _onnx()
        model = onnx.ModelProto()
        model.CopyFrom(self._shape_model)
        for v in model.graph.input:
            shape = input_shapes.get(v.name)
            if shape is not None:
                dims = v.type.tensor_type.shape.dim
                del dims[:]
                for size in shape:
                    dims.add().dim_value = int(size)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False,
                                                         data_prop=True)
        except Exception:  # noqa: BLE001 - an optimisation's input, not a check
            return {}
        from onnx import helper
        shapes = {}
        for v in list(inferred.graph.value_info) + list(inferred.graph.output):
            t = v.type.tensor_type if v.type.HasField("tensor_type") else None
            if t is None or not t.HasField("shape") or not t.elem_type:
                continue
            if not all(d.HasField("dim_value") for d in t.shape.dim):
                continue
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
            except Exception:  # noqa: BLE001 - a type numpy lacks: no guess
                continue
            shapes[v.name] = (tuple(int(d.dim_value) for d in t.shape.dim), dtype)
        return shapes

    # ---- checks ---------------------------------------------------------------------------

    def unsupported(self, node, why):
        return UnsupportedError(f"{self.what}: {node.op} node {node.name!r} (opset {self.opset}): "
                                f"{why}")

    def check_defined(self):
        """ModelFileError where a node reads a value that no graph input, initializer or earlier
        node defines, or an output is never produced (a truncated or damaged file)."""
        defined = set(self.constants) | {v.name for v in self.inputs}
        for node in self.nodes:
            for name in node.inputs:
                if name and name not in defined:
                    raise ModelFileError(f"{self.what} is not a valid ONNX model: {node.op} node "
                                         f"{node.name!r} reads {name!r}, which no input, "
                                         f"initializer or earlier node defines")
            defined.update(o for o in node.outputs if o)
        for name in self.output_names:
            if name not in defined:
                raise ModelFileError(f"{self.what} is not a valid ONNX model: output {name!r} is "
                                     f"never produced")
        if not self.output_names:
            raise ModelFileError(f"{self.what} is not a valid ONNX model: the graph has no outputs")

    def check_supported(self):
        """UnsupportedError for the first node whose op or attribute is not supported."""
        from .ops import HANDLERS, check_node
        if not MIN_OPSET <= self.opset <= MAX_OPSET:
            raise UnsupportedError(f"{self.what}: opset {self.opset} of the default domain; "
                                   f"supported: {MIN_OPSET} to {MAX_OPSET}")
        for node in self.nodes:
            if node.domain not in ("", "ai.onnx"):
                raise self.unsupported(node, f"domain {node.domain!r} is not supported")
            if node.op not in HANDLERS and node.op not in host.EVALUATORS:
                raise self.unsupported(node, "this operator is not supported")
            for name, value in _FIXED_ATTRIBUTES.get(node.op, {}).items():
                if name in node.attrs and node.attrs[name] != value:
                    raise self.unsupported(node, f"attribute {name}={node.attrs[name]!r} is not "
                                                 f"supported (only {value!r})")
            why = check_node(node, self.opset)
            if why:
                raise self.unsupported(node, why)

    # ---- helpers for the rewrites --------------------------------------------------------

    def resolve(self, name):
        while name in self.alias:
            name = self.alias[name]
        return name

    def consumers(self):
        """value name -> number of uses (node inputs and graph outputs)."""
        count = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    count[name] = count.get(name, 0) + 1
        for name in self.output_names:
            count[name] = count.get(name, 0) + 1
        return count

    def new_constant(self, hint, value):
        self._counter += 1
        name = f"{hint}::folded{self._counter}"
        self.constants[name] = value
        return name

    def _apply_alias(self):
        for node in self.nodes:
            node.inputs = [self.resolve(n) if n else n for n in node.inputs]

    # ---- rewrites ---------------------------------------------------------------------------

    def fold_constants(self):
        """Evaluate on the host every node whose inputs are all constants (and that the host
        evaluates); drop Identity and inference Dropout."""
        kept = []
        for node in self.nodes:
            node.inputs = [self.resolve(n) if n else n for n in node.inputs]
            if node.op in ("Identity", "Dropout") and node.outputs[0] not in self.output_names:
                if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
                    kept.append(node)
                    continue
                self.alias[node.outputs[0]] = node.inputs[0]
                continue
            present = [n for n in node.inputs if n]
            if (node.op in host.EVALUATORS and all(n in self.constants for n in present)
                    and not any(o in self.output_names for o in node.outputs)):
                values = [self.constants[n] if n else None for n in node.inputs]
                results = host.evaluate(node, values, self.opset, self)
                if results is not None:
                    for name, value in zip(node.outputs, results):
                        if name:
                            self.constants[name] = value
                    continue
            kept.append(node)
        self.nodes = kept
        self._apply_alias()

    def fold_batch_norm(self):
        """Conv -> BatchNormalization (the conv's only consumer, constant statistics): the BN's
        scale and shift multiplied into the conv's weights and bias, in float64."""
        uses = self.consumers()
        producer = {o: n for n in self.nodes for o in n.outputs}
        kept = []
        for node in self.nodes:
            if node.op == "BatchNormalization" and len(node.outputs) == 1:
                conv = producer.get(node.inputs[0])
                params = node.inputs[1:5]
                if (conv is not None and conv.op == "Conv" and not conv.fused
                        and uses.get(conv.outputs[0]) == 1
                        and all(p in self.constants for p in params)
                        and conv.inputs[1] in self.constants
                        and (not conv.input(2) or conv.input(2) in self.constants)):
                    scale, shift, mean, var = (self.constants[p].astype(np.float64) for p in params)
                    eps = float(node.attr("epsilon", 1e-5))
                    w = self.constants[conv.inputs[1]]
                    k = w.shape[0]
                    b = (self.constants[conv.input(2)].astype(np.float64) if conv.input(2)
                         else np.zeros(k))
                    factor = scale / np.sqrt(var + eps)
                    w2 = (w.astype(np.float64) * factor.reshape((k,) + (1,) * (w.ndim - 1)))
                    b2 = (b - mean) * factor + shift
                    conv.inputs = [conv.inputs[0], self.new_constant(conv.name + ".weight",
                                                                     w2.astype(w.dtype)),
                                   self.new_constant(conv.name + ".bias", b2.astype(w.dtype))]
                    conv.outputs = list(node.outputs)
                    conv.fused["batch_norm"] = node.name
                    continue
            kept.append(node)
        self.nodes = kept

    def fuse_conv_residual(self):
        """Conv -> Add(conv, z): the residual z added in the convolution's epilogue (planning
        checks that z has the output's shape and falls back to the Add otherwise)."""
        uses = self.consumers()
        producer = {o: n for n in self.nodes for o in n.outputs}
        moved = {}
        for node in self.nodes:
            if node.op != "Add" or len(node.inputs) != 2:
                continue
            for side in (0, 1):
                conv = producer.get(node.inputs[side])
                other = node.inputs[1 - side]
                if (conv is not None and conv.op == "Conv" and "residual" not in conv.fused
                        and "activation" not in conv.fused and uses.get(conv.outputs[0]) == 1
                        and other not in self.constants and other != conv.outputs[0]):
                    conv.fused["residual"] = other
                    conv.fused["add"] = node.name
                    conv.outputs = list(node.outputs)
                    moved[id(node)] = conv
                    break
        # The fused convolution runs where its Add ran: z exists by then.
        moved_convs = {id(c) for c in moved.values()}
        self.nodes = [moved.get(id(n), n) for n in self.nodes if id(n) not in moved_convs]

    def concat_in_place(self):
        """Concat nodes whose inputs are all convolutions that nothing else reads take those
        convolutions in (they run where the Concat runs, into slices of its output where the
        layout allows: ``ops._concat_in_place``)."""
        uses = self.consumers()
        producer = {o: n for n in self.nodes for o in n.outputs}
        taken = set()
        for node in self.nodes:
            if node.op != "Concat" or len(node.inputs) < 2 or len(set(node.inputs)) != len(
                    node.inputs):
                continue
            convs = [producer.get(name) for name in node.inputs]
            if all(c is not None and c.op == "Conv" and uses.get(name) == 1
                   and name not in self.output_names and id(c) not in taken
                   for c, name in zip(convs, node.inputs)):
                node.fused["producers"] = dict(zip(node.inputs, convs))
                taken.update(id(c) for c in convs)
        self.nodes = [n for n in self.nodes if id(n) not in taken]

    def concat_families(self, model):
        """Concat nodes whose inputs are a prefix of a larger Concat's (DenseNet: each layer
        reads the concatenation of every earlier feature) form a family around the largest:
        where the batch is 1 (nothing before the axis but ones), every member is a prefix of
        one buffer that each input is copied into once (``ops._concat_family``), instead of a
        new concatenation per member. Needs the inputs' sizes along the axis before they are
        computed: ONNX shape inference's, where static."""
        concats = [n for n in self.nodes if n.op == "Concat" and "producers" not in n.fused
                   and n.inputs and all(n.inputs) and len(set(n.inputs)) == len(n.inputs)]
        if len(concats) < 2:
            return
        largest = {}
        for node in concats:
            axis = node.attr("axis")
            for other in concats:
                if (other.attr("axis") == axis and len(other.inputs) >= len(node.inputs)
                        and list(other.inputs[:len(node.inputs)]) == list(node.inputs)
                        and len(other.inputs) > len(largest.get(id(node), node).inputs)):
                    largest[id(node)] = other
        members = {}
        for node in concats:
            top = largest.get(id(node), node)
            members.setdefault(id(top), (top, []))[1].append(node)
        families = [(top, group) for top, group in members.values() if len(group) > 1]
        if not families:
            return
        sizes = _static_axis_sizes(model, [(tuple(top.inputs), top.attr("axis"))
                                           for top, _ in families])
        for top, group in families:
            found = sizes.get(tuple(top.inputs))
            if found is None:
                continue
            for node in group:
                node.fused["family"] = (top.outputs[0], found)

    def prune(self):
        """Drop the nodes whose outputs nothing reads (what folding and fusion left behind, and
        side branches the file's outputs do not need)."""
        needed = {self.resolve(n) for n in self.output_names}
        kept = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.outputs if o):
                kept.append(node)
                needed.update(n for n in node.inputs if n)
                res = node.fused.get("residual")
                if res:
                    needed.add(res)
        self.nodes = kept[::-1]

    def fuse_activations(self):
        """Conv / Gemm / BatchNormalization -> activation (its only consumer): the activation
        in the producer's epilogue; also Conv -> Mul(conv, Sigmoid(conv)) as SiLU."""
        from .ops import activation_of
        uses = self.consumers()
        producer = {o: n for n in self.nodes for o in n.outputs}
        removed = set()
        for node in self.nodes:
            if id(node) in removed:
                continue
            desc = activation_of(node, self.constants, self.opset)
            if desc is not None:
                src = producer.get(node.inputs[0])
                if (src is not None and src.op in ("Conv", "Gemm", "BatchNormalization")
                        and "activation" not in src.fused and len(src.outputs) == 1
                        and uses.get(src.outputs[0]) == 1):
                    src.fused["activation"] = desc
                    src.fused["activation_node"] = node.name
                    src.outputs = list(node.outputs)
                    producer[src.outputs[0]] = src
                    removed.add(id(node))
                continue
            if node.op == "Mul" and len(node.inputs) == 2:
                for side in (0, 1):
                    sig = producer.get(node.inputs[side])
                    a = node.inputs[1 - side]
                    src = producer.get(a)
                    if (sig is not None and sig.op == "Sigmoid" and sig.inputs[0] == a
                            and src is not None and src.op == "Conv"
                            and "activation" not in src.fused and uses.get(a) == 2
                            and uses.get(sig.outputs[0]) == 1):
                        from ..activation import ActivationDesc
                        src.fused["activation"] = ActivationDesc("silu")
                        src.fused["activation_node"] = node.name
                        src.outputs = list(node.outputs)
                        producer[src.outputs[0]] = src
                        removed.add(id(node))
                        removed.add(id(sig))
                        break
        self.nodes = [n for n in self.nodes if id(n) not in removed]


def _shape_model(model):
    """``model`` without its large initializers (declared as inputs of their shape instead): what
    ``Graph.value_shapes`` runs shape inference on, kept small. Small initializers stay, since
    shape arithmetic (Reshape's target, Slice's bounds) reads their values."""
    onnx = _onnx()
    from onnx import helper
    light = onnx.ModelProto()
    light.ir_version = max(model.ir_version, 4)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = model.graph.name
    initializers = {t.name for t in model.graph.initializer}
    g.input.extend(v for v in model.graph.input if v.name not in initializers)
    for t in model.graph.initializer:
        if prod(t.dims) <= 64:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    g.node.extend(model.graph.node)
    for v in model.graph.output:
        out = g.output.add()
        out.CopyFrom(v)
        if out.type.HasField("tensor_type"):
            # The file's (symbolic) output shape would stand in for the inferred static one.
            out.type.tensor_type.ClearField("shape")
    return light


def _static_axis_sizes(model, families):
    """{input names: (each input's size along the axis, ...)} for the families (input names of
    the largest member, axis) whose every input ONNX shape inference gives a static size; none
    where inference fails."""
    onnx = _onnx()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is an optimisation's input, not a check
        return {}
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(
            inferred.graph.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None
                              for d in v.type.tensor_type.shape.dim]
    out = {}
    for names, axis in families:
        sizes = []
        for name in names:
            shape = shapes.get(name)
            if not shape or axis is None or not -len(shape) <= axis < len(shape):
                break
            size = shape[axis]
            if not size:
                break
            sizes.append(int(size))
        else:
            out[names] = tuple(sizes)
    return out


def prod(values):
    return int(math.prod(int(v) for v in values))
