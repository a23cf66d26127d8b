"""Multi-tensor launches: one kernel launch over up to ``slots`` tensors (kernels/optim.cl.mako).

OpenCL kernels take no arrays of buffers, so each kernel of ``optim.cl.mako`` has a fixed number
of slots, each a tensor given by its element count, buffer and element offset (plus the slot's
other buffers and scalars: gradient, optimizer state, bias corrections). A list of tensors is
cut into chunks of ``slots``; each chunk is one launch. The slot count is the largest, up to
``MAX_SLOTS``, whose arguments fit the device's ``CL_DEVICE_MAX_PARAMETER_SIZE`` (1024 bytes at
least on every full-profile device, which holds 8 slots of Adam with amsgrad: 96 bytes each,
counted with padding).

Each chunk position has a kernel object of its own, made once and kept by the optimizer (per
parameter group) or in the context's plan cache (clipping) under (kernel, template parameters,
chunk position): the arguments of a repeated step are
set only where they changed (a new gradient buffer, a new learning rate), and a repeated step
renders no template, builds no program and creates no kernel object. Plans (``run_planned``) do
not fit here: they replay their scalar arguments as recorded, while a learning rate or a bias
correction changes on every step.
"""
from threading import get_ident

import numpy as np
import pyopencl as cl

from .. import program
from ..launch import BoundKernel, current, enqueue_bound
from ..ops.pointwise import launch_size

MAX_SLOTS = 8
_TEMPLATE_DEFAULTS = dict(decay=0, momentum=0, nesterov=0, maximize=0, amsgrad=0, per_slot=0,
                          norm="2", group=1)
_POINTER = 8


def slot_count(ctx, slot_bytes, head_bytes=64):
    """The slots per launch for kernels whose slot takes ``slot_bytes`` of arguments."""
    cached = ctx.plans.get(("optim-slots", slot_bytes, head_bytes))
    if cached is not None:
        return cached
    limit = int(ctx.device.max_parameter_size)
    slots = max(1, min(MAX_SLOTS, (limit - head_bytes) // slot_bytes))
    return ctx.plans.put(("optim-slots", slot_bytes, head_bytes), slots)


def slot_bytes(buffers, scalars, index_bytes):
    """Argument bytes of one slot: ``buffers`` pointers with an offset each, ``scalars`` 4-byte
    scalars and the count; every offset and the count counted as 8 bytes, for the padding a
    pointer after a 4-byte argument may take."""
    return buffers * 2 * _POINTER + scalars * 4 + _POINTER


def index_type(tensors):
    """("int" or "long", numpy type) for counts and offsets of ``tensors`` (None skipped)."""
    largest = 0
    for t in tensors:
        if t is not None:
            largest = max(largest, t.offset_elements + t.size)
    if largest < 2 ** 31 - 1:
        return "int", np.int32
    return "long", np.int64


def groups_for(ctx, elements, group):
    """Work groups of a reducing launch (norm_partial) over a chunk whose largest slot has
    ``elements``."""
    per_unit = 4 if ctx.info.is_cpu else 16
    return max(1, min(-(-elements // group), ctx.info.compute_units * per_unit))


def bound_kernel(ctx, name, params, position, owner=None):
    """(the kernel object of chunk ``position`` for kernel ``name`` of ``optim.cl.mako`` with
    ``params`` (a tuple of (name, value) pairs), the dict that keeps it and its key there): made
    once per context, or once per ``owner`` (a tuple (dict, key) where a caller keeps kernel
    objects of its own: an optimizer, one set per parameter group, so that two groups do not
    set each other's arguments on every step)."""
    key = ("optim-kernel", name, params, position)
    if owner is not None:
        kernels, prefix = owner
        key = (prefix, key)
        kernel = kernels.get(key)
        if kernel is None:
            built = program.build(ctx, "optim", {**_TEMPLATE_DEFAULTS, **dict(params)})
            kernel = kernels[key] = BoundKernel(program.new_kernel(built.program, name))
        return kernel, kernels, key
    kernel = ctx.plans.get(key)
    if kernel is None:
        # Every template parameter is given (Mako's strict names): the ones a kernel does not
        # use keep their defaults.
        built = program.build(ctx, "optim", {**_TEMPLATE_DEFAULTS, **dict(params)})
        kernel = ctx.plans.put(key, BoundKernel(program.new_kernel(built.program, name)))
    return kernel, ctx.plans, key


def tensors_signature(parameter, *others):
    """A slot's tensors as plain numbers, for ``run``'s ``signature``: the parameter's element
    count, then the buffer handle and byte offset of it and of each of ``others`` (gradient,
    optimizer state), in the order the slot passes them."""
    numbers = [parameter.size]
    for t in (parameter, *others):
        numbers += (t.buffer.int_ptr, t.offset)
    return tuple(numbers)


def _slot_signature(slot_args):
    """What the slot arguments are, as plain numbers (buffers by handle): equal signatures set
    the same arguments."""
    return tuple(a.int_ptr if isinstance(a, cl.MemoryObjectHolder) else (a.dtype.char, a.tobytes())
                 for args in slot_args for a in args)


def run(ctx, name, params, position, head, slots, slot_args, elements, group=None, owner=None,
        signature=None):
    """Launch kernel ``name`` for one chunk: ``head`` (the arguments before the slots),
    ``slot_args`` (per used slot, its arguments), padded to ``slots`` with unused slots whose
    count is 0 and whose buffers are slot 0's; ``elements`` the largest slot's elements;
    ``owner`` as for ``bound_kernel``."""
    if ctx.thread != get_ident():
        ctx.check_thread()
    kernel, store, key = bound_kernel(ctx, name, params, position, owner)
    if group is None:
        gsize, lsize = launch_size(ctx, max(elements, 1))
    else:
        lsize = (group,)
        gsize = (groups_for(ctx, elements, group) * group,)
    # A step's slots are the same tensors as the last step's (the parameters, their state and,
    # from the memory pool, mostly the same gradient buffers): where their signature is the
    # last one, only the head (learning rate, bias corrections, ...) is set again, not the
    # 60-90 arguments of the slots, each compared as bytes by BoundKernel.
    # ``signature``: the caller's (plain numbers standing for every slot argument, made without
    # the arguments themselves; ``slot_args`` may then be a callable that makes them).
    if signature is None:
        slot_args = slot_args() if callable(slot_args) else slot_args
        signature = _slot_signature(slot_args)
    signature = (len(head), signature)
    signature_key = ("optim-slot-arguments", key)
    if current() is None and store.get(signature_key) == signature:
        for index, value in enumerate(head):
            kernel.set(index, value)
        enqueue_bound(ctx.queue, kernel, gsize, lsize, buffers=())
        return gsize[0] // lsize[0]
    if callable(slot_args):
        slot_args = slot_args()
    args = list(head)
    first = slot_args[0]
    for k in range(slots):
        if k < len(slot_args):
            args.extend(slot_args[k])
        else:
            args.append(first[0].__class__(0))
            args.extend(first[1:])
    kernel.set_all(args)
    enqueue_bound(ctx.queue, kernel, gsize, lsize, args)
    if isinstance(store, dict):
        store[signature_key] = signature
    else:
        store.put(signature_key, signature)
    return gsize[0] // lsize[0]
