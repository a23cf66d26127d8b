"""The planned inference engine: an ONNX graph (``graph.Graph``, rewritten at load) run on the
device as one recorded launch list per input signature.

Planning, once per input shape (and dtype and offset): the rewritten nodes are walked in order;
a node whose inputs are all known on the host (constants, shapes) is evaluated there with numpy
(``host.py``), any other runs its handler (``ops.py``) over ``dlprim_py``'s operators and the
fusion API, inside one ``launch.Recording``. The recording becomes a ``launch.Plan`` whose
operands are the graph's input buffers and its output buffers; every other buffer the launches
use is bound in the plan. Memory planning by liveness then gives the buffers that the nodes
produced (the intermediates) new homes: each one lives from the first launch that uses it to
the last, and buffers whose lives do not overlap share one allocation (``_shared_slots``); the
convolutions' workspaces become the context's final one; the first run's buffers go back to the
pool. ``memory_bytes`` is what the plan needs: those shared allocations, the scratch buffers the
operators keep, the largest workspace asked for, and the outputs.

A later run with a planned signature binds its input buffers and fresh output buffers and
enqueues the launch list: no node is walked, nothing is built, nothing but the outputs is
allocated.
"""
import contextlib
import sys
import time

import numpy as np
import pyopencl as cl

from .. import backends, config, launch, program
from ..autograd import no_grad
from ..context import PlanCache, default_context
from ..errors import DlprimError, DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor, _checked, allocate
from . import host
from .graph import Graph
from .ops import HANDLERS


class _Planner:
    """What the op handlers see while one input signature is planned."""

    def __init__(self, model):
        self.model = model
        self.ctx = model.ctx
        self.opset = model.graph.opset
        self.env = {}
        # Concat families being filled (ops._concat_family): key -> [buffer, inputs copied].
        self.families = {}

    def value(self, name):
        if not name:
            return None
        value = self.env.get(name)
        if value is None:
            value = self.model.graph.constants.get(name)
        return value

    def device(self, value, name=None):
        """``value`` as a device tensor: a host constant is uploaded once per model (by value
        name when it has one, else by contents)."""
        if isinstance(value, Tensor):
            return value
        return self.model._constant(np.asarray(value), name)

    def host(self, node, value, what):
        """``value`` as a numpy array: UnsupportedError where it is only known on the device
        (a data-dependent shape)."""
        if isinstance(value, Tensor):
            raise self.unsupported(node, f"the {what} input must be known before the run (a "
                                         f"constant or shape arithmetic), not computed on the "
                                         f"device")
        return np.asarray(value)

    def constants_for(self, node, values):
        return {name: v for name, v in zip(node.inputs, values)
                if name and isinstance(v, np.ndarray)}

    def unsupported(self, node, why):
        return self.model.graph.unsupported(node, why)

    def concat(self, tensors, axis):
        from .. import functional as F
        return F.cat(tensors, axis)


class _Entry:
    """One planned input signature: the plan (None: replayed unrecorded, see ``_execute``), the
    output descriptions and the bytes it holds."""

    __slots__ = ("plan", "outputs", "out_sizes", "memory_bytes", "launches", "memory_parts")

    def __init__(self, plan, outputs, out_sizes, memory_bytes, launches, memory_parts=None):
        self.plan = plan
        self.outputs = outputs
        self.out_sizes = out_sizes
        self.memory_bytes = memory_bytes
        self.launches = launches
        self.memory_parts = memory_parts or {"buffers": memory_bytes}


class Model:
    """An ONNX model planned for a device (made by ``dlprim_py.onnx.load``).

    Parameters
    ----------
    source : str, os.PathLike, bytes or onnx.ModelProto
        The model.
    ctx : dlprim_py.Context, optional
        The device (default: the thread's default context).
    """

    def __init__(self, source, ctx=None):
        self.graph = Graph(source)
        self.ctx = default_context() if ctx is None else ctx
        self._device_constants = {}
        self._plans = PlanCache(64)
        self._last = None
        # Constants that planning ahead (``_build_ahead``) uploaded, for the walk for real.
        self._spare = {}

    # ---- what the file declares ----------------------------------------------------------

    @property
    def input_names(self):
        """The graph inputs' names, in the file's order (initializers excluded)."""
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self):
        """The graph outputs' names, in the file's order."""
        return list(self.graph.output_names)

    @property
    def inputs(self):
        """The graph inputs as ValueInfo objects: name, shape (a string for a symbolic
        dimension) and numpy dtype, unpackable as (name, shape, dtype)."""
        return list(self.graph.inputs)

    @property
    def opset(self):
        """The opset of the default ONNX domain the file imports."""
        return self.graph.opset

    @property
    def memory_bytes(self):
        """Device bytes the most recently planned input shape needs while it runs: the
        intermediate buffers after liveness sharing, the operators' scratch, the convolution
        workspace and the outputs (not the weights: ``weight_bytes``; not the inputs); by kind
        in ``memory_parts``. 0 before a run. The workspace counts as the largest size this
        model's convolutions ask for: the buffer is the context's (``Context.workspace``),
        shared with its other models and calls, and may be larger."""
        return 0 if self._last is None else self._last.memory_bytes

    @property
    def memory_parts(self):
        """``memory_bytes`` by kind: {"intermediates", "scratch", "workspace", "outputs"}."""
        return {} if self._last is None else dict(self._last.memory_parts)

    @property
    def weight_bytes(self):
        """Device bytes of the constants (weights) uploaded so far."""
        return sum(t.nbytes for t in self._device_constants.values())

    @property
    def launch_count(self):
        """Kernel launches in the most recently planned input shape's launch list."""
        return 0 if self._last is None else self._last.launches

    def __repr__(self):
        return (f"dlprim_py.onnx.Model({self.graph.what}, opset {self.opset}, inputs "
                f"{[tuple(v) for v in self.inputs]}, outputs {self.output_names})")

    # ---- running ----------------------------------------------------------------------------

    def run(self, feeds, output_names=None):
        """Run the model and read its outputs back.

        Parameters
        ----------
        feeds : dict
            {input name: numpy array or dp.Tensor}; arrays of another float (int) width are
            converted to the input's dtype.
        output_names : list of str, optional
            The outputs to read back (default all).

        Returns
        -------
        dict
            {output name: numpy array}.
        """
        if not isinstance(feeds, dict):
            raise DTypeError(f"run expects a dict of input name -> array, got "
                             f"{type(feeds).__name__}")
        unknown = [k for k in feeds if k not in self.input_names]
        missing = [k for k in self.input_names if k not in feeds]
        if unknown or missing:
            raise ShapeError(f"run: inputs {self.input_names} expected; "
                             + (f"missing {missing}" if missing else "")
                             + ("; " if missing and unknown else "")
                             + (f"unknown {unknown}" if unknown else ""))
        tensors = []
        for info in self.graph.inputs:
            value = feeds[info.name]
            if not isinstance(value, Tensor):
                array = np.asarray(value)
                if array.dtype != info.dtype:
                    if array.dtype.kind == info.dtype.kind or (array.dtype.kind in "iu"
                                                               and info.dtype.kind in "iu"):
                        array = array.astype(info.dtype)
                    else:
                        raise DTypeError(f"input {info.name!r} must be {info.dtype}, got "
                                         f"{array.dtype}")
                value = Tensor.from_numpy(self.ctx, np.ascontiguousarray(array))
            elif value.ctx is not self.ctx:
                from ..errors import DeviceError
                raise DeviceError(f"input {info.name!r} lives in another context than the "
                                  f"model's")
            tensors.append(value)
        outs = self._forward(tensors)
        names = self.output_names if output_names is None else list(output_names)
        result = {}
        for name, value in zip(self.output_names, outs):
            if name in names:
                result[name] = value.numpy() if isinstance(value, Tensor) else np.array(value)
        return result

    def __call__(self, *tensors):
        """Run on device tensors (the inputs in ``input_names`` order).

        Returns
        -------
        Tensor or tuple of Tensor
            The output tensor, or a tuple of them for several outputs, each in a buffer of its
            own (a later run does not overwrite it). Nothing is copied to the host.
        """
        if len(tensors) != len(self.input_names):
            raise ShapeError(f"the model takes {len(self.input_names)} input(s) "
                             f"{self.input_names}, got {len(tensors)}")
        for info, t in zip(self.graph.inputs, tensors):
            if not isinstance(t, Tensor):
                raise not_a_tensor(f"input {info.name!r}", t)
            if t.ctx is not self.ctx:
                from ..errors import DeviceError
                raise DeviceError(f"input {info.name!r} lives in another context than the "
                                  f"model's")
        outs = self._forward(list(tensors))
        outs = [v if isinstance(v, Tensor) else Tensor.from_numpy(self.ctx, np.ascontiguousarray(v))
                for v in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _check_inputs(self, tensors):
        for info, t in zip(self.graph.inputs, tensors):
            if t.ctx is not self.ctx:
                from ..errors import DeviceError
                raise DeviceError(f"input {info.name!r} lives in another context than the "
                                  f"model's")
            if np.dtype(t.dtype) != info.dtype:
                raise DTypeError(f"input {info.name!r} must be {info.dtype}, got "
                                 f"{np.dtype(t.dtype)}")
            if info.shape is not None:
                ok = len(info.shape) == t.ndim and all(
                    not isinstance(d, int) or d == s for d, s in zip(info.shape, t.shape))
                if not ok:
                    raise ShapeError(f"input {info.name!r} must have shape {info.shape} (strings "
                                     f"are free dimensions), got {t.shape}")

    def _forward(self, tensors):
        # TF32 allowed or not (dlprim_py.backends, ctx.allow_tf32) chooses other convolution
        # and GEMM kernels: a plan per setting.
        key = (tuple((t.shape, t.dtype.str, t.offset) for t in tensors),
               backends.tf32_allowed(self.ctx))
        entry = self._plans.get(key)
        if entry is None:
            self._check_inputs(tensors)
            outs, entry = self._plan(tensors)
            self._plans.put(key, entry)
            self._last = entry
            return outs
        self._last = entry
        if entry.plan is None:
            with no_grad():
                return self._outputs(self._execute(tensors)[0])
        return self._replay(entry, tensors)

    def _replay(self, entry, tensors):
        ctx = self.ctx
        buffers = [allocate(ctx, size) for size in entry.out_sizes]
        entry.plan.run([t.buffer for t in tensors] + buffers)
        outs = []
        for kind, a, shape, dtype, offset in entry.outputs:
            if kind == "host":
                outs.append(a)
            elif kind == "input":
                outs.append(_checked(ctx, tensors[a].buffer, shape, dtype, offset))
            else:
                outs.append(_checked(ctx, buffers[a], shape, dtype, offset))
        return outs

    # ---- planning ----------------------------------------------------------------------------

    def _constant(self, array, name=None):
        """A device tensor of a host constant, uploaded once."""
        key = name if name else ("value", array.dtype.str, array.shape, array.tobytes())
        t = self._device_constants.get(key)
        if t is None and self._spare:
            t = self._spare.pop(key, None)
            if t is not None:
                self._device_constants[key] = t
        if t is None:
            if array.dtype == np.float64:
                raise UnsupportedError(f"{self.graph.what}: float64 tensor {name or ''!s} on "
                                       f"the device (the library computes in float32)")
            # A blocking upload: inside a recording it is not a launch, and the plan keeps the
            # buffer with the contents it has now.
            t = Tensor.from_numpy(self.ctx, np.ascontiguousarray(array))
            self._device_constants[key] = t
        return t

    def _execute(self, tensors, collect=None, guesses=None):
        """Walk the nodes on ``tensors``: (output values, buffers the nodes produced).

        With ``collect`` (a list; inside a ``program.BuildAhead``'s ``collecting()``), a node
        that meets a program not built yet adds what is missing to it, and the walk goes on
        past the node with zeros of the shapes ONNX shape inference gives its outputs
        (``guesses()``: {name: (shape, dtype)}), where it gives them; a node that reads a value
        without a guess is skipped. Returns None then, the walk as usual where nothing was
        missing."""
        graph = self.graph
        planner = _Planner(self)
        env = planner.env
        for info, t in zip(graph.inputs, tensors):
            env[info.name] = t
        produced = {}
        for node in graph.nodes:
            if collect:
                if any(env.get(n) is _UNKNOWN for n in _reads(node)):
                    env.update((name, _UNKNOWN) for name in node.outputs if name)
                    continue
            if collect is not None:
                try:
                    outs = self._node(planner, node)
                except program.NotBuilt as e:
                    collect.extend(e.recipes)
                    shapes = guesses()
                    outs = [self._guess(name, shapes) for name in node.outputs]
            else:
                outs = self._node(planner, node)
            for name, v in zip(node.outputs, outs):
                if name:
                    env[name] = v
                    if isinstance(v, Tensor):
                        produced[v.buffer.int_ptr] = v.buffer
        if collect:
            return None
        return [planner.value(graph.resolve(n)) for n in graph.output_names], produced

    def _node(self, planner, node):
        """The output values of ``node`` (planned, its launches recorded)."""
        graph = self.graph
        if "producers" in node.fused:
            # A Concat that runs the convolutions it reads (ops._concat_in_place).
            return HANDLERS[node.op](planner, node, None)[:1]
        values = [planner.value(n) for n in node.inputs]
        for n, v in zip(node.inputs, values):
            if n and v is None:
                raise ShapeError(f"{graph.what}: {node.op} node {node.name!r} reads "
                                 f"{n!r}, which nothing before it produces")
        outs = None
        if all(v is None or isinstance(v, np.ndarray) for v in values):
            outs = host.evaluate(node, values, graph.opset, graph, small_only=True)
        if outs is None:
            handler = HANDLERS.get(node.op)
            if handler is None:
                raise planner.unsupported(node, "computed on the device, which this "
                                                "operator is not (only shape arithmetic "
                                                "on known values)")
            outs = handler(planner, node, values)
        return outs

    def _guess(self, name, guesses):
        """Zeros (never garbage: an index read from them is in range) of the shape and dtype
        shape inference gives value ``name``, or _UNKNOWN."""
        found = guesses.get(name) if name else None
        if found is None:
            return _UNKNOWN if name else None
        shape, dtype = found
        try:
            t = Tensor.empty(self.ctx, shape, dtype)
        except DlprimError:
            return _UNKNOWN
        if t.nbytes:
            cl.enqueue_fill_buffer(self.ctx.queue, t.buffer, np.uint8(0), t.offset, t.nbytes)
        return t

    def _walk(self, tensors):
        """(output values, buffers the nodes produced, workspaces handed out, recording) of a
        walk over the nodes inside a recording, the programs it needs built first.

        With ``DLPRIM_BUILD_THREADS`` above 1, programs are built ahead (``program.BuildAhead``):
        a walk gathers the programs its nodes miss instead of building them (going on past such
        a node on zeros of the shapes shape inference gives), they are built concurrently, and
        the walk is made again, until one misses nothing: that one is the plan (a node meets a
        second program once its first is built, so a walk or two more). Otherwise, or once a
        build has failed, programs are built as the walk meets them. A walk that fails after
        missing a program is made again once it is built; one that fails before fails as a
        walk building one program at a time fails there. Each walk records and runs its
        launches as the plan's does, so that it meets the same programs; the constants a
        dropped walk uploaded wait (``_spare``) for the next one, which keeps what it uses."""
        ctx = self.ctx
        threads = config.build_threads()
        ahead = program.BuildAhead(ctx, threads) if threads > 1 else None
        base = dict(self._device_constants)
        shapes = []

        def guesses():
            if not shapes:
                shapes.append(self.graph.value_shapes(
                    {info.name: t.shape for info, t in zip(self.graph.inputs, tensors)}))
            return shapes[0]

        gather = ahead is not None
        try:
            while True:
                collect = [] if gather else None
                with ctx.workspace_log() as workspaces, (
                        contextlib.nullcontext() if ahead is None else
                        ahead.active() if collect is None else ahead.collecting()):
                    with launch.Recording() as recording:
                        try:
                            found = self._execute(tensors, collect, guesses)
                        except Exception:
                            if not collect:
                                raise
                            found = None
                if found is not None:
                    return found + (workspaces, recording)
                del recording, workspaces
                started = time.perf_counter()
                count = ahead.build(collect)
                if config.debug():
                    print(f"dlprim: planning: a walk met {count} program(s) to build, built "
                          f"{ahead.threads} at a time in {time.perf_counter() - started:.3f} s",
                          file=sys.stderr)
                # After a failed build, the walk for real raises it where it is met (or what it
                # meets first).
                gather = count > 0 and not ahead.failed
                self._spare.update((k, t) for k, t in self._device_constants.items()
                                   if k not in base)
                self._device_constants = dict(base)
        finally:
            self._spare = {}

    def _outputs(self, values):
        return [v if isinstance(v, Tensor) else np.asarray(v) for v in values]

    def _plan(self, tensors):
        ctx = self.ctx
        with no_grad():
            values, produced, workspaces, recording = self._walk(tensors)
        outs = self._outputs(values)
        in_ptrs = {t.buffer.int_ptr: k for k, t in enumerate(tensors)}
        out_buffers, out_index, outputs = [], {}, []
        for v in outs:
            if not isinstance(v, Tensor):
                outputs.append(("host", v, None, None, None))
            elif v.buffer.int_ptr in in_ptrs:
                outputs.append(("input", in_ptrs[v.buffer.int_ptr], v.shape, v.dtype, v.offset))
            elif v.buffer.int_ptr in self._constant_ptrs():
                outputs.append(("host", v.numpy(), None, None, None))
            else:
                j = out_index.get(v.buffer.int_ptr)
                if j is None:
                    j = out_index[v.buffer.int_ptr] = len(out_buffers)
                    out_buffers.append(v.buffer)
                outputs.append(("device", j, v.shape, v.dtype, v.offset))
        operands = [t.buffer for t in tensors] + out_buffers
        plan = recording.plan(ctx.queue, operands)
        out_sizes = [b.size for b in out_buffers]
        steps = len(recording.steps)
        del recording
        if plan is None:
            memory = sum(b.size for p, b in produced.items() if p not in in_ptrs)
            entry = _Entry(None, outputs, out_sizes, memory, steps)
        else:
            plan, parts = self._share_memory(plan, produced, operands, workspaces)
            parts["outputs"] = sum(out_sizes)
            entry = _Entry(plan, outputs, out_sizes, sum(parts.values()), len(plan), parts)
        del produced, workspaces
        ctx.empty_cache()
        return outs, entry

    def _constant_ptrs(self):
        return {t.buffer.int_ptr for t in self._device_constants.values()}

    def _share_memory(self, plan, produced, operands, workspaces):
        """``plan`` with the node-produced buffers it binds replaced by shared allocations
        (liveness: first to last launch that uses each) and the workspaces its operators were
        handed (``Context.workspace``, which grew as planning went) replaced by the context's
        final one; and the bytes it then holds besides its operands and the weights, by kind."""
        operand_ptrs = {b.int_ptr for b in operands}
        workspace_ptrs = {b.int_ptr for _, b in workspaces}
        workspace_need = max((n for n, _ in workspaces), default=0)
        workspace = self.ctx.workspace(workspace_need).buffer if workspaces else None
        queue = plan.queue
        constants = self._constant_ptrs()
        candidates = {p: b for p, b in produced.items()
                      if p not in operand_ptrs and p not in constants}
        first, last = {}, {}
        for i, step in enumerate(plan.steps):
            for _, buf in step[3]:
                p = buf.int_ptr
                if p in candidates:
                    first.setdefault(p, i)
                    last[p] = i
        slot_of, slot_size = _shared_slots({p: candidates[p].size for p in first}, first, last)
        if workspace is not None:
            slot_of.update((p, workspace) for p in workspace_ptrs)
        # The first run's buffers go back to the pool before the shared ones are taken from it.
        kept = [b for b in plan.keep if b.int_ptr not in slot_of]
        pending = [(k, w, r, tuple((i, slot_of.get(b.int_ptr, b)) for i, b in f), t)
                   for k, w, r, f, t, _ in plan.steps]
        plan.keep = plan.steps = None
        candidates = first = last = workspaces = None
        produced.clear()
        slots = [allocate(self.ctx, size) for size in slot_size]
        new_steps = [(kernel, work, rebind,
                      tuple((i, slots[b] if isinstance(b, int) else b) for i, b in fixed),
                      template, object())
                     for kernel, work, rebind, fixed, template in pending]
        parts = {"intermediates": sum(slot_size),
                 "scratch": sum(b.size for b in kept if b.int_ptr not in constants),
                 "workspace": workspace_need}
        keep = kept + slots + ([workspace] if workspace is not None else [])
        return launch.Plan(queue, new_steps, keep), parts


# A value that a walk gathering programs (``Model._build_ahead``) could not guess.
_UNKNOWN = object()


def _reads(node):
    """The value names planning ``node`` reads: its inputs, a fused residual's, and those of
    the convolutions a Concat runs (``ops._concat_in_place``)."""
    yield from node.inputs
    if node.fused.get("residual"):
        yield node.fused["residual"]
    for conv in (node.fused.get("producers") or {}).values():
        yield from _reads(conv)


def _shared_slots(sizes, first, last):
    """Buffers that live from launch ``first[p]`` to ``last[p]`` assigned to shared slots:
    largest first, each into the smallest slot none of whose occupants' lives overlaps its own,
    else a new slot of its size (greedy by size, as TensorFlow Lite's shared-object planner).
    Slots are sized by the buffer that opened them, so a small buffer never grows one; whole
    buffers rather than offsets into one arena, since sub-buffers cost NVIDIA's driver time on
    every launch that passes one. {buffer: slot}, [slot sizes]."""
    import bisect
    slot_of, slot_size, starts, ends = {}, [], [], []
    for p in sorted(sizes, key=lambda p: (-sizes[p], first[p])):
        f, l = first[p], last[p]
        best = None
        for s in range(len(slot_size)):
            # A slot's lives are disjoint, so sorted by start they are sorted by end too.
            i = bisect.bisect_right(starts[s], l) - 1
            if (i < 0 or ends[s][i] < f) and (best is None or slot_size[s] < slot_size[best]):
                best = s
        if best is None:
            best = len(slot_size)
            slot_size.append(sizes[p])
            starts.append([])
            ends.append([])
        i = bisect.bisect_left(starts[best], f)
        starts[best].insert(i, f)
        ends[best].insert(i, l)
        slot_of[p] = best
    return slot_of, slot_size
