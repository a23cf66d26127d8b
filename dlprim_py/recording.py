"""Recording enqueues so that a later call with the same operands replays them.

An operator that runs the same kernels on the same buffers again and again (a convolution in a
training loop, a fusion plan per layer) spends most of its host time building argument lists.
Inside ``with Recording() as r:`` every launch made through ``enqueue``/``launch`` is run and
kept with its arguments bound; ``r.replay()`` enqueues them again (about 6 us of host time per
kernel instead of 20 or more). Recordings nest: the steps of an inner recording, and of a
recording replayed while an outer one is open, belong to the outer one too, so a fusion plan
can record a convolution that itself replays its own recording.

A recording holds raw kernel arguments: whoever keeps one must keep the buffers it binds alive
(``Recording.buffers``), and must replay it only for the same buffers, offsets and scalars.
"""
import functools
import threading

import pyopencl as cl

_state = threading.local()


class Recording:
    """The enqueues of one run, with their arguments bound."""

    def __init__(self):
        self.steps = []
        self.buffers = []

    def __enter__(self):
        self._outer = getattr(_state, "recording", None)
        _state.recording = self
        return self

    def __exit__(self, *exc):
        _state.recording = self._outer
        if self._outer is not None:
            self._outer.steps.extend(self.steps)
        return False

    def replay(self):
        for step in self.steps:
            step()
        outer = getattr(_state, "recording", None)
        if outer is not None and outer is not self:
            outer.steps.extend(self.steps)


def current():
    """The open recording, or None."""
    return getattr(_state, "recording", None)


def enqueue(step):
    """Run ``step()`` (an enqueue with bound arguments) and add it to the open recording."""
    step()
    recording = getattr(_state, "recording", None)
    if recording is not None:
        recording.steps.append(step)


def launch(ctx, built, name, gsize, lsize, args):
    """Enqueue kernel ``name`` of ``built`` on ``ctx.queue`` with ``args`` (recorded)."""
    kernel = built.kernel(name, fresh=True)
    kernel.set_args(*args)
    enqueue(functools.partial(cl.enqueue_nd_range_kernel, ctx.queue, kernel, gsize, lsize))


def launch_kernel(queue, kernel, gsize, lsize):
    """Enqueue ``kernel`` whose arguments are already set (recorded)."""
    enqueue(functools.partial(cl.enqueue_nd_range_kernel, queue, kernel, gsize, lsize))
