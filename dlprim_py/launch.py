"""How every operator family launches kernels: bound kernel objects, and plans that a later
call replays on its own buffers.

Host time is what a small operator costs, and two things dominated it: creating a
``cl.Kernel`` (PyOpenCL looks its argument invoker up in an on-disk cache: a sqlite query, an
unpickle and a ``compile``, 0.2 ms on a fast host, 1 ms on a small one) and setting arguments
one by one. So:

* ``BoundKernel`` is a kernel object of its own whose arguments are set only when they change
  (buffers compared by handle, scalars by type and bytes).
* ``Recording``: inside ``with Recording() as r:`` every launch made through ``launch`` (on a
  new kernel object of its own) or ``enqueue_bound`` (on the caller's bound kernel) is kept as
  a ``Step``: the kernel, its sizes, its buffer arguments and its other arguments as set.
  ``r.plan(queue, operands)`` turns the steps into a ``Plan`` whose ``run(buffers)`` sets the
  operand arguments to the given buffers and enqueues: one ``clSetKernelArg`` per changed
  buffer and one ``clEnqueueNDRangeKernel`` per kernel. Where another call has set a step's
  kernel object since (a family's shared kernel), the step's recorded arguments are restored
  first. ``run_planned`` does all of this for a call keyed by what its launches depend on.

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
import functools
import threading
from threading import get_ident

import numpy as np
import pyopencl as cl

from . import config
from .context import check_same_context
from .program import new_kernel

_state = threading.local()
_UNSET = object()


def set_argument(kernel, index, value):
    """``kernel.set_arg(index, value)``, with numpy scalars passed as their bytes: PyOpenCL's
    ``set_arg`` takes about 10 us to recognise a numpy scalar (3 us for local memory) against
    0.1 us for a buffer, while ``_set_arg_buf`` (what its own generated invokers use for typed
    scalars) sets the bytes directly, and OpenCL checks their size against the argument's."""
    if isinstance(value, np.generic) and _set_arg_buf is not None:
        _set_arg_buf(kernel, index, value)
    else:
        kernel.set_arg(index, value)


_set_arg_buf = getattr(cl.Kernel, "_set_arg_buf", None)


def _opencl_library():
    """clEnqueueNDRangeKernel of the OpenCL library PyOpenCL loaded (its handles are the ones
    PyOpenCL's objects carry), or None where it cannot be found."""
    import ctypes
    import ctypes.util
    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            candidates += [line.split()[-1] for line in maps if "libOpenCL" in line]
    except OSError:
        pass
    candidates += [ctypes.util.find_library("OpenCL"),
                   "/System/Library/Frameworks/OpenCL.framework/OpenCL"]
    for path in candidates:
        if not path:
            continue
        try:
            function = ctypes.CDLL(path).clEnqueueNDRangeKernel
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_int32
        return function
    return None


# PyOpenCL's enqueue_nd_range_kernel asks the driver for an event and wraps it: 12 us per launch
# on an H200 with NVIDIA's driver, of which the event is half (the call itself without one: 5-6
# us, PyOpenCL's set_arg and the ctypes call included). Nothing here waits on a launch's event
# (timing brackets launches with markers), so launches go through the library's own entry
# point without one. None: PyOpenCL's call (no library found).
_clEnqueueNDRangeKernel = _opencl_library()


class WorkSize:
    """A launch's global and local sizes, with their native arrays made once (a plan's
    launches reuse them on every run)."""

    __slots__ = ("global_size", "local_size", "native")

    def __init__(self, global_size, local_size):
        import ctypes
        self.global_size = tuple(global_size)
        self.local_size = None if local_size is None else tuple(local_size)
        dims = len(self.global_size)
        # The argument tail of clEnqueueNDRangeKernel after (queue, kernel).
        self.native = (ctypes.c_uint32(dims), None, (ctypes.c_size_t * dims)(*self.global_size),
                       None if local_size is None else (ctypes.c_size_t * dims)(*self.local_size),
                       ctypes.c_uint32(0), None, None)


def native_handle(cl_object):
    """A PyOpenCL object's handle as a ctypes pointer, for the native enqueue."""
    import ctypes
    return ctypes.c_void_p(cl_object.int_ptr)


_work_sizes = {}


def work_size(global_size, local_size):
    """The WorkSize of these sizes (tuples or lists), made once per pair of sizes."""
    key = (tuple(global_size), None if local_size is None else tuple(local_size))
    work = _work_sizes.get(key)
    if work is None:
        if len(_work_sizes) > 4096:
            _work_sizes.clear()
        work = _work_sizes[key] = WorkSize(*key)
    return work


def enqueue_kernel(queue, queue_handle, kernel, work):
    """Enqueue BoundKernel ``kernel`` (arguments set) over ``work`` (a WorkSize) on ``queue``,
    whose ``native_handle()`` is ``queue_handle``; no event (unless ``kernel_events`` is
    collecting them)."""
    if _clEnqueueNDRangeKernel is not None and not _collecting:
        if not _clEnqueueNDRangeKernel(queue_handle, kernel.handle, *work.native):
            return
        # An error enqueued nothing: PyOpenCL's call raises it with its name (or enqueues, if
        # the condition has passed).
    event = cl.enqueue_nd_range_kernel(queue, kernel.kernel, work.global_size, work.local_size)
    events = _state.__dict__.get("events")
    if events is not None:
        events.append((kernel.kernel.function_name, event))


# Open kernel_events blocks, in any thread: while there are none, a launch tests one global.
_collecting = 0


class kernel_events:
    """``with kernel_events() as events:``: every kernel this thread launches inside the block
    takes PyOpenCL's path with an event, and ``events`` collects (kernel name, event) pairs, to
    say where device time goes (the events' profiling times, on a profiling queue). Launches
    cost their event's host time meanwhile: time calls outside the block."""

    def __enter__(self):
        global _collecting
        self._outer = _state.__dict__.get("events")
        self.events = []
        _state.events = self.events
        _collecting += 1
        return self.events

    def __exit__(self, *exc):
        global _collecting
        _collecting -= 1
        _state.events = self._outer
        return False


class BoundKernel:
    """A ``cl.Kernel`` of its own whose arguments are set only when they change.

    Setting an argument costs host time on every OpenCL implementation (about 17 us each on
    PoCL); an operator called again on the same shapes changes few of them (often none: pooled
    buffers come back with the same handle). Enqueued commands keep the arguments they were
    enqueued with, so changing them afterwards is safe. The kernel object must not be shared.
    """

    __slots__ = ("kernel", "handle", "_bound", "_scalars", "owner")

    def __init__(self, kernel):
        self.kernel = kernel
        self.handle = native_handle(kernel)
        # The plan step whose arguments are set now (None after any other setting): a plan
        # that finds its own step there rebinds only its operands.
        self.owner = None
        # Per argument: what is set (a buffer's handle, a scalar's type and bytes) and the scalar
        # object last passed (plans pass the same objects again: one identity test skips it).
        self._bound = []
        self._scalars = []

    def __call__(self, queue, global_size, local_size, *args):
        """Set every argument from ``args`` (buffers, None, numpy scalars) and enqueue. Inside
        a recording the launch goes to a kernel object of its own, as ``launch`` gives it: a
        plan step on a kernel object that other calls share (``bind``'s, one per program
        kernel) would have every argument set again whenever another call used it between
        two runs, which for one family's calls on several shapes is every run."""
        kernel = self
        if current() is not None:
            kernel = BoundKernel(new_kernel(self.kernel.program, self.kernel.function_name))
        kernel.set_all(args)
        enqueue_bound(queue, kernel, global_size, local_size, args)

    def set_all(self, args):
        """Set every argument from ``args`` (buffers, None, numpy scalars) where it changed."""
        self.owner = None
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
                set_argument(kernel, index, value)
                bound[index] = key
            scalars[index] = scalar

    def set(self, index, value, kind=None):
        """Set argument ``index`` alone, if it changed: a buffer, None or a numpy scalar, as in
        a call; or a Python number with its numpy type ``kind`` (converted only when it
        changed)."""
        self.owner = None
        bound = self._bound
        if len(bound) <= index:
            bound.extend([_UNSET] * (index + 1 - len(bound)))
            self._scalars.extend([_UNSET] * (index + 1 - len(self._scalars)))
        if kind is not None:
            # The same number object as the last setting of this argument is set already (a
            # call passes its constants, alpha = 1.0 say, as the same objects every time).
            if value is self._scalars[index]:
                return
            # A number is its own key, but a zero is keyed by float.hex, which keeps -0.0 and
            # 0.0 (equal as numbers) apart as the bytes of numpy scalars do.
            key = (kind, value) if value else (kind, float(value).hex())
            if bound[index] != key:
                set_argument(self.kernel, index, kind(value))
                bound[index] = key
            self._scalars[index] = value
            return
        if value is self._scalars[index]:
            return
        key, self._scalars[index] = _argument_key(value)
        if bound[index] != key:
            set_argument(self.kernel, index, value)
            bound[index] = key

    def set_buffer(self, index, buffer):
        """Set buffer argument ``index`` if another buffer is set there."""
        self.owner = None
        self._put_buffer(index, buffer)

    def _put_buffer(self, index, buffer):
        # What set_buffer does, for plans, which keep themselves as the kernel's owner.
        handle = buffer.int_ptr
        if self._bound[index] != handle:
            self.kernel.set_arg(index, buffer)
            self._bound[index] = handle

    def scalar_template(self):
        """((index, what is set, the value to set it again), ...) for the arguments that are not
        buffers, rebuilt from what is set (a plan restores them where another user of this
        kernel object changed them)."""
        template = []
        for index, key in enumerate(self._bound):
            if key is _UNSET or key.__class__ is int:   # a buffer's handle
                continue
            if key is None:   # a NULL buffer: another user may have set a buffer there
                value = None
            elif key[0] == "local":
                value = cl.LocalMemory(key[1])
            elif isinstance(key[0], str):   # a numpy scalar: (type code, bytes)
                value = np.frombuffer(key[1], dtype=key[0])[0]
            elif isinstance(key[1], str):   # (numpy type, float.hex of a zero)
                value = key[0](float.fromhex(key[1]))
            else:
                value = key[0](key[1])
            template.append((index, key, value))
        return tuple(template)

    def restore(self, template):
        """Set the arguments of ``template`` (from ``scalar_template``) where they differ."""
        bound = self._bound
        for index, key, value in template:
            if bound[index] != key:
                set_argument(self.kernel, index, value)
                bound[index] = key
                self._scalars[index] = _UNSET

    def enqueue(self, queue, global_size, local_size, buffers=None):
        """Enqueue with the arguments as set (recorded when a recording is open; ``buffers``:
        the (index, buffer) pairs of its buffer arguments, for the recording)."""
        enqueue_bound(queue, self, global_size, local_size, buffers=buffers)


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

    __slots__ = ("queue", "kernel", "global_size", "local_size", "buffers", "template")

    def __init__(self, queue, kernel, global_size, local_size, buffers):
        self.queue = queue
        self.kernel = kernel
        self.global_size = global_size
        self.local_size = local_size
        self.buffers = buffers
        # The other arguments as they are set for this launch (the kernel object may launch
        # again in the same recording with others).
        self.template = kernel.scalar_template()


class Recording:
    """The launches of one run, each on a kernel object of its own (see the module's text)."""

    def __init__(self):
        self.steps = []
        # Non-kernel commands (callables) recorded through ``enqueue``: a recording that has any
        # replays but cannot become a rebinding plan.
        self.opaque = False

    def __enter__(self):
        global _recordings_open
        self._outer = getattr(_state, "recording", None)
        _state.recording = self
        with _recordings_lock:
            _recordings_open += 1
        return self

    def __exit__(self, *exc):
        global _recordings_open
        with _recordings_lock:
            _recordings_open -= 1
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
            steps.append((step.kernel, WorkSize(step.global_size, step.local_size),
                          tuple(rebind), tuple(fixed), step.template, object()))
        return Plan(queue, steps, list(keep.values()))


class Plan:
    """Recorded launches that ``run`` enqueues again on the operands it is given."""

    __slots__ = ("queue", "queue_handle", "steps", "keep", "_launches")

    def __init__(self, queue, steps, keep):
        self.queue = queue
        self.queue_handle = native_handle(queue)
        # Per launch: (BoundKernel, WorkSize, ((arg index, operand index), ...), ((arg index,
        # buffer the plan holds), ...), the other arguments as recorded, a token that marks the
        # kernel object as bound by this step).
        self.steps = steps
        self.keep = keep
        # What run reads per launch, with the native enqueue's arguments made once: (kernel,
        # rebind, fixed, template, token, work, (queue handle, kernel handle, *work.native)).
        self._launches = tuple(
            (kernel, rebind, fixed, template, token, work,
             (self.queue_handle, kernel.handle) + work.native)
            for kernel, work, rebind, fixed, template, token in steps)

    def run(self, operands, handles=None):
        """Bind ``operands`` (buffers, in the order the plan was made with) and enqueue;
        ``handles``: their ``int_ptr`` (None for None), where the caller has them already.

        A kernel object may serve other calls between two runs (a family's shared kernel, a
        nested plan): where its owner is not this step, every recorded argument is set again
        where it differs; otherwise only the operands that changed."""
        if handles is None:
            handles = [None if b is None else b.int_ptr for b in operands]
        _run_launches(self, operands, handles, current() if _recordings_open else None, False)

    def __len__(self):
        return len(self.steps)


def _run_launches(plan, operands, handles, outer, tensors):
    """``plan``'s launches on ``operands`` (whose handles are ``handles``): buffers, or with
    ``tensors`` tensors, whose buffer is read only where an argument changes; each step is
    added to the recording ``outer`` where one is open. ``Plan.run`` and every repeated
    operator call (``run_planned_on``) come here."""
    queue, queue_handle = plan.queue, plan.queue_handle
    native = _clEnqueueNDRangeKernel if not _collecting else None
    for kernel, rebind, fixed, template, token, work, native_args in plan._launches:
        if kernel.owner is not token:
            kernel.restore(template)
            for index, buf in fixed:
                kernel._put_buffer(index, buf)
            kernel.owner = token
        # BoundKernel._put_buffer and enqueue_kernel inlined: every step of every repeated
        # call passes here.
        bound = kernel._bound
        for index, slot in rebind:
            handle = handles[slot]
            if bound[index] != handle:
                operand = operands[slot]
                kernel.kernel.set_arg(index, operand.buffer if tensors else operand)
                bound[index] = handle
        if native is None or native(*native_args):
            enqueue_kernel(queue, queue_handle, kernel, work)
        if outer is not None:
            kernel.owner = None
            outer.steps.append(Step(queue, kernel, work.global_size, work.local_size,
                                    tuple((i, operands[j].buffer if tensors else operands[j])
                                          for i, j in rebind) + fixed))


# Recordings open in any thread: while there are none (every repeated call), ``current`` is one
# global test, not a thread-local lookup. Counted under a lock: a count that two threads' updates
# left low would let a launch escape its recording.
_recordings_open = 0
_recordings_lock = threading.Lock()


def current():
    """The open recording, or None."""
    if not _recordings_open:
        return None
    return getattr(_state, "recording", None)


class unrecorded:
    """``with unrecorded():`` enqueues outside the calling thread's open recording (if any):
    for work a plan must not replay, such as making a context's long-lived buffer on the first
    call that needs it."""

    def __enter__(self):
        self._outer = getattr(_state, "recording", None)
        _state.recording = None
        return self

    def __exit__(self, *exc):
        _state.recording = self._outer
        return False


def command_enqueued():
    """Tell the open recording (if any) that a command other than a kernel launch (a fill, a
    copy) was enqueued: it can then not become a rebinding plan."""
    recording = current()
    if recording is not None:
        recording.opaque = True


def enqueue(step):
    """Run ``step()`` (a command that is not a kernel launch) and add it to the open recording,
    which can then replay but not become a rebinding plan."""
    step()
    recording = current()
    if recording is not None:
        recording.steps.append(step)
        recording.opaque = True


def enqueue_bound(queue, kernel, global_size, local_size, args=None, buffers=None):
    """Enqueue BoundKernel ``kernel`` whose arguments are set; recorded when a recording is open
    (its buffer arguments from ``args``, the full argument list, or ``buffers``, the (index,
    buffer) pairs)."""
    enqueue_kernel(queue, native_handle(queue), kernel, work_size(global_size, local_size))
    recording = current()
    if recording is not None:
        kernel.owner = None
        if buffers is None:
            if args is None:
                # Which arguments are buffers is unknown: replayable, but not on other buffers.
                recording.opaque = True
                buffers = ()
            else:
                buffers = buffer_arguments(args)
        recording.steps.append(Step(queue, kernel, global_size, local_size, tuple(buffers)))


def launch(ctx, built, name, global_size, local_size, args):
    """Enqueue kernel ``name`` of ``built`` on ``ctx.queue`` with ``args``.

    Inside a recording the launch gets a kernel object of its own (a plan replays it later);
    outside, the program's shared kernel for ``name`` is used, with its arguments set where they
    changed."""
    if current() is not None:
        kernel = BoundKernel(new_kernel(built.program, name))
    else:
        kernel = bind(built.kernel(name))
    kernel.set_all(args)
    enqueue_bound(ctx.queue, kernel, global_size, local_size, args)


def alias_pattern(buffers):
    """What a plan depends on in how ``buffers`` (each a buffer or None) share memory: a plan
    recorded for one pattern is replayed only for the same. The common case, no buffer passed
    twice and at most one None, is an int (where the None is, or -2): one set, no scan."""
    return _pattern([None if b is None else b.int_ptr for b in buffers])


def _pattern(handles):
    distinct = set(handles)
    if len(distinct) == len(handles):
        return handles.index(None) if None in distinct else -2
    # For each buffer the index of the first with the same handle (-1 for None).
    return tuple([-1 if h is None else handles.index(h) for h in handles])


def run_planned_on(ctx, key, tensors, run, plans=None, args=None):
    """``run_planned`` on the buffers of ``tensors`` (None allowed), after checking that they
    share ``ctx``'s OpenCL context; unplanned while DLPRIM_LOG_CMD asks every call to log.
    ``args``: what ``run`` is called with (none by default), so that a caller need not make a
    closure on every call for a run that a repeated call never makes.

    Every repeated operator call comes through here: the tensors' handles and the alias
    pattern (as ``alias_pattern`` makes it) in one pass, then the plan's lookup and run."""
    if ctx.thread != get_ident():
        ctx.check_thread()
    # The handles (kept on the tensors) and the context check in one pass: this runs for every
    # operand of every call. The buffers are read only where an argument changes.
    handles = []
    add = handles.append
    for t in tensors:
        if t is None:
            add(None)
        else:
            if t.ctx is not ctx:
                check_same_context(*tensors)
            add(t.handle)
    if config.switches().log_cmd:
        run(*args) if args is not None else run()
        return
    if plans is None:
        plans = ctx.plans
    # _pattern inlined for its common case, no buffer passed twice.
    distinct = set(handles)
    if len(distinct) == len(handles):
        key = (key, handles.index(None) if None in distinct else -2)
    else:
        key = (key, _pattern(handles))
    plan = plans.hit(key)
    if plan is None or plan is _UNPLANNABLE or (_recordings_open and current() is not None):
        if args is not None:
            run = functools.partial(run, *args)
        _replay(ctx, plans, key, [None if t is None else t.buffer for t in tensors], handles, run)
        return
    # Outside a recording, reading a tensor's buffer only where its argument changes.
    _run_launches(plan, tensors, handles, None, True)


# A key whose run cannot become a plan (it has non-kernel commands): it runs unrecorded.
_UNPLANNABLE = object()


def run_planned(ctx, key, operands, run, plans=None):
    """``run()`` (which enqueues on ``ctx.queue``) through the plan stored under ``key`` in
    ``plans`` (default: the context's plan cache; an operator may keep its own).

    The first call with ``key`` (and this aliasing of ``operands``) runs ``run`` inside a
    recording and keeps the plan; later calls only bind ``operands`` (buffers or None) and
    enqueue. ``key`` must hold everything the launches depend on but the operands' buffers
    (shapes, dtypes, offsets, scalars, forced algorithms), and ``run`` may allocate nothing
    that outlives the call but scratch: the plan keeps the first call's scratch buffers and
    uses them again."""
    if ctx.thread != get_ident():
        ctx.check_thread()
    handles = [None if b is None else b.int_ptr for b in operands]
    _replay(ctx, ctx.plans if plans is None else plans, (key, _pattern(handles)), operands,
            handles, run)


def _replay(ctx, plans, key, operands, handles, run):
    """The plan under ``key`` (which holds the alias pattern) run on ``operands`` (whose
    handles are ``handles``): recorded from ``run()`` the first time, ``run()`` itself where it
    cannot be a plan."""
    plan = plans.get(key)
    if plan is None:
        with Recording() as recording:
            run()
        plan = recording.plan(ctx.queue, operands)
        plans.put(key, _UNPLANNABLE if plan is None else plan)
    elif plan is _UNPLANNABLE:
        run()
    else:
        plan.run(operands, handles)
