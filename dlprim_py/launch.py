"""How every operator family launches kernels: bound kernel objects, and plans that a later
call replays on its own buffers.

Host time is what a small operator costs, and two things dominated it: creating a
``cl.Kernel`` (PyOpenCL looks its argument invoker up in an on-disk cache: a sqlite query, an
unpickle and a ``compile``, 0.2 ms on a fast host, 1 ms on a small one) and setting arguments
one by one. So:

* ``BoundKernel`` is a kernel object of its own whose arguments are set only when they change
  (buffers compared by handle, scalars by type and bytes).
* ``Recording``: inside ``with Recording() as r:`` every launch made through ``launch`` or
  ``enqueue_bound`` runs on a new kernel object of its own and is kept as a ``Step`` (the kernel,
  its sizes, which arguments are buffers). ``r.plan(operands)`` turns the steps into a ``Plan``
  whose ``run(buffers)`` sets the operand arguments to the given buffers and enqueues: one
  ``clSetKernelArg`` per changed buffer and one ``clEnqueueNDRangeKernel`` per kernel.

What keeps buffers alive: a plan holds every buffer its steps bind that is not one of its
operands (workspaces, constants it made while recording), and no operand: the caller passes
the operands on every run, and a step's arguments hold raw handles. A kernel argument left
pointing at a freed operand is never read, since every run binds its operands first. Pooled
buffers keep their handle across reuse, so a loop that gets the same pooled memory back sets no
argument at all.

A plan is valid for the operands' offsets, shapes and scalars it was recorded with, and for the
same pattern of aliasing between operands (two operands in one buffer): callers key their plans on
all of that (``alias_pattern``). Recordings nest: the steps of an inner recording, and of a plan
run while a recording is open, belong to the open recording too.
"""
import threading

import pyopencl as cl

from .program import new_kernel

_state = threading.local()
_UNSET = object()


class BoundKernel:
    """A ``cl.Kernel`` of its own whose arguments are set only when they change.

    Setting an argument costs host time on every OpenCL implementation (about 17 us each on
    PoCL); an operator called again on the same shapes changes few of them (often none: pooled
    buffers come back with the same handle). Enqueued commands keep the arguments they were
    enqueued with, so changing them afterwards is safe. The kernel object must not be shared.
    """

    __slots__ = ("kernel", "_bound", "_scalars")

    def __init__(self, kernel):
        self.kernel = kernel
        # Per argument: what is set (a buffer's handle, a scalar's type and bytes) and the scalar
        # object last passed (plans pass the same objects again: one identity test skips it).
        self._bound = []
        self._scalars = []

    def __call__(self, queue, global_size, local_size, *args):
        """Set every argument from ``args`` (buffers, None, numpy scalars) and enqueue."""
        self.set_all(args)
        return enqueue_bound(queue, self, global_size, local_size, args)

    def set_all(self, args):
        """Set every argument from ``args`` (buffers, None, numpy scalars) where it changed."""
        bound, scalars = self._bound, self._scalars
        if len(bound) != len(args):
            bound[:] = [_UNSET] * len(args)
            scalars[:] = [_UNSET] * len(args)
        kernel = self.kernel
        for index, value in enumerate(args):
            if value is scalars[index]:
                continue
            key, scalar = _argument_key(value)
            if bound[index] != key:
                kernel.set_arg(index, value)
                bound[index] = key
            scalars[index] = scalar

    def set(self, index, value, kind=None):
        """Set argument ``index`` alone, if it changed: a buffer, None or a numpy scalar, as in
        a call; or a Python number with its numpy type ``kind`` (converted only when it
        changed)."""
        bound = self._bound
        if len(bound) <= index:
            bound.extend([_UNSET] * (index + 1 - len(bound)))
            self._scalars.extend([_UNSET] * (index + 1 - len(self._scalars)))
        if kind is not None:
            # A number is its own key, but a zero is keyed by float.hex, which keeps -0.0 and
            # 0.0 (equal as numbers) apart as the bytes of numpy scalars do.
            key = (kind, value) if value else (kind, float(value).hex())
            if bound[index] != key:
                self.kernel.set_arg(index, kind(value))
                bound[index] = key
                self._scalars[index] = _UNSET
            return
        if value is self._scalars[index]:
            return
        key, self._scalars[index] = _argument_key(value)
        if bound[index] != key:
            self.kernel.set_arg(index, value)
            bound[index] = key

    def set_buffer(self, index, buffer):
        """Set buffer argument ``index`` if another buffer is set there (the plans' fast path)."""
        handle = buffer.int_ptr
        if self._bound[index] != handle:
            self.kernel.set_arg(index, buffer)
            self._bound[index] = handle

    def enqueue(self, queue, global_size, local_size, buffers=None):
        """Enqueue with the arguments as set (recorded when a recording is open; ``buffers``:
        the (index, buffer) pairs of its buffer arguments, for the recording)."""
        return enqueue_bound(queue, self, global_size, local_size, buffers=buffers)


def _argument_key(value):
    """(what is set for ``value``, the scalar object to recognise by identity next time)."""
    if isinstance(value, cl.MemoryObjectHolder):
        # The handle, not the object: holding a pooled buffer would keep it from the pool.
        return value.int_ptr, _UNSET
    if value is None:
        return None, _UNSET
    if isinstance(value, cl.LocalMemory):
        return ("local", value.size), value
    # The bytes, so that -0.0 and 0.0 (equal as numbers) stay distinct.
    return (value.dtype.char, value.tobytes()), value


# int_ptr of a shared kernel -> (the shared kernel, kept so that its handle is not reused, and
# the BoundKernel of a fresh copy).
_bound_kernels = {}


def bind(kernel):
    """The BoundKernel standing for ``kernel`` (a shared ``cl.Kernel``, e.g. from
    ``program.kernel``): a fresh copy of it, one per kernel, that only BoundKernel calls touch."""
    entry = _bound_kernels.get(kernel.int_ptr)
    if entry is None:
        entry = _bound_kernels[kernel.int_ptr] = (
            kernel, BoundKernel(new_kernel(kernel.program, kernel.function_name)))
    return entry[1]


def buffer_arguments(args):
    """The (index, buffer) pairs of the buffer arguments in ``args``."""
    return tuple((i, a) for i, a in enumerate(args) if isinstance(a, cl.MemoryObjectHolder))


class Step:
    """One recorded launch: a bound kernel, its sizes and its buffer arguments at record time."""

    __slots__ = ("queue", "kernel", "global_size", "local_size", "buffers")

    def __init__(self, queue, kernel, global_size, local_size, buffers):
        self.queue = queue
        self.kernel = kernel
        self.global_size = global_size
        self.local_size = local_size
        self.buffers = buffers


class Recording:
    """The launches of one run, each on a kernel object of its own (see the module's text)."""

    def __init__(self):
        self.steps = []
        # Non-kernel commands (callables) recorded through ``enqueue``: a recording that has any
        # replays but cannot become a rebinding plan.
        self.opaque = False

    def __enter__(self):
        self._outer = getattr(_state, "recording", None)
        _state.recording = self
        return self

    def __exit__(self, *exc):
        _state.recording = self._outer
        if self._outer is not None:
            self._outer.steps.extend(self.steps)
            self._outer.opaque |= self.opaque
        return False

    def replay(self):
        """Enqueue every step again with its arguments as they are set (find mode, probes)."""
        for step in self.steps:
            if callable(step):
                step()
            else:
                cl.enqueue_nd_range_kernel(step.queue, step.kernel.kernel,
                                           step.global_size, step.local_size)

    def plan(self, queue, operands):
        """A ``Plan`` that runs these steps on ``queue`` with ``operands`` (buffers or None, in
        the caller's order) replaced by the buffers given to ``run``; None when a step is not
        a kernel launch."""
        if self.opaque:
            return None
        slots = {}
        for j, buf in enumerate(operands):
            if buf is not None:
                slots.setdefault(buf.int_ptr, j)
        steps, keep = [], {}
        for step in self.steps:
            rebind, fixed = [], []
            for i, buf in step.buffers:
                j = slots.get(buf.int_ptr)
                if j is None:
                    fixed.append((i, buf))
                    keep[buf.int_ptr] = buf
                else:
                    rebind.append((i, j))
            steps.append((step.kernel, step.global_size, step.local_size, tuple(rebind),
                          tuple(fixed)))
        return Plan(queue, steps, list(keep.values()))


class Plan:
    """Recorded launches that ``run`` enqueues again on the operands it is given."""

    __slots__ = ("queue", "steps", "keep")

    def __init__(self, queue, steps, keep):
        self.queue = queue
        # (BoundKernel, global size, local size, ((arg index, operand index), ...),
        #  ((arg index, buffer the plan holds), ...)) per launch.
        self.steps = steps
        self.keep = keep

    def run(self, operands):
        """Bind ``operands`` (buffers, in the order the plan was made with) and enqueue;
        returns the last kernel's event."""
        queue = self.queue
        outer = getattr(_state, "recording", None)
        event = None
        for kernel, global_size, local_size, rebind, fixed in self.steps:
            for index, slot in rebind:
                kernel.set_buffer(index, operands[slot])
            for index, buf in fixed:
                # Another plan that shares this step (a nested one) may have bound another
                # buffer here.
                kernel.set_buffer(index, buf)
            event = cl.enqueue_nd_range_kernel(queue, kernel.kernel, global_size, local_size)
            if outer is not None:
                outer.steps.append(Step(queue, kernel, global_size, local_size,
                                        tuple((i, operands[j]) for i, j in rebind) + fixed))
        return event

    def __len__(self):
        return len(self.steps)


def current():
    """The open recording, or None."""
    return getattr(_state, "recording", None)


def enqueue(step):
    """Run ``step()`` (a command that is not a kernel launch) and add it to the open recording,
    which can then replay but not become a rebinding plan."""
    step()
    recording = getattr(_state, "recording", None)
    if recording is not None:
        recording.steps.append(step)
        recording.opaque = True


def enqueue_bound(queue, kernel, global_size, local_size, args=None, buffers=None):
    """Enqueue BoundKernel ``kernel`` whose arguments are set; recorded when a recording is open
    (its buffer arguments from ``args``, the full argument list, or ``buffers``, the (index,
    buffer) pairs)."""
    event = cl.enqueue_nd_range_kernel(queue, kernel.kernel, global_size, local_size)
    recording = getattr(_state, "recording", None)
    if recording is not None:
        if buffers is None:
            if args is None:
                # Which arguments are buffers is unknown: replayable, but not on other buffers.
                recording.opaque = True
                buffers = ()
            else:
                buffers = buffer_arguments(args)
        recording.steps.append(Step(queue, kernel, global_size, local_size, tuple(buffers)))
    return event


def launch(ctx, built, name, global_size, local_size, args):
    """Enqueue kernel ``name`` of ``built`` on ``ctx.queue`` with ``args``.

    Inside a recording the launch gets a kernel object of its own (a plan replays it later);
    outside, the program's shared kernel for ``name`` is used, with its arguments set where they
    changed."""
    if getattr(_state, "recording", None) is not None:
        kernel = BoundKernel(new_kernel(built.program, name))
    else:
        kernel = bind(built.kernel(name))
    kernel.set_all(args)
    return enqueue_bound(ctx.queue, kernel, global_size, local_size, args)


def alias_pattern(buffers):
    """For each buffer (or None), the index of the first one with the same handle (-1 for
    None): a plan recorded for one pattern of shared buffers is replayed only for the same."""
    handles = [None if b is None else b.int_ptr for b in buffers]
    return tuple(-1 if h is None else handles.index(h) for h in handles)
