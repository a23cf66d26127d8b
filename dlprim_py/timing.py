"""Timing enqueued work with OpenCL profiling events.

``time_enqueued(ctx, run)`` calls ``run()`` (which enqueues work on ``ctx.queue``) after a
warm-up and reports the device time between the first and last event each call produced.
"""
import time

import numpy as np
import pyopencl as cl


class Timing:
    """Median and 20th/80th percentiles of repeated runs, in seconds. ``capped``: the seconds
    after which a time cap stopped the runs short of the count asked for (None when it did
    not)."""

    def __init__(self, samples, capped=None):
        self.samples = np.asarray(samples, dtype=np.float64)
        self.median = float(np.median(self.samples))
        self.p20 = float(np.percentile(self.samples, 20))
        self.p80 = float(np.percentile(self.samples, 80))
        self.capped = capped

    @property
    def spread(self):
        """p80 / p20: 1.0 for runs that all took the same time; inf when p20 is 0."""
        if self.p20 <= 0:
            return 1.0 if self.p80 <= 0 else float("inf")
        return self.p80 / self.p20

    def __repr__(self):
        return f"Timing(median={self.median * 1e3:.4f} ms, p20={self.p20 * 1e3:.4f}, p80={self.p80 * 1e3:.4f})"


def time_enqueued(ctx, run, warmup=3, repeat=20, min_time=0.0, prime=None, wall_clock=False,
                  max_time=60.0):
    """Time ``run()`` on ``ctx.queue``: device time from a marker before to a marker after.

    Markers bracket everything ``run`` enqueues, so several kernels per call are timed as one.
    Falls back to host wall-clock around ``queue.finish()`` when the queue has no profiling;
    ``wall_clock=True`` asks for that (what a caller of a public call sees, host time included).
    ``min_time``: keep repeating until this many seconds of samples were taken.
    ``prime``: a callable that enqueues untimed work right before each begin marker, so that the
    device is busy while the host enqueues the marker and ``run``'s first command: the span then
    holds device time only, not the host's latency to that first command (measure throughput of
    queued calls that way; leave it out to time what a lone call costs).
    ``max_time``: no further sample starts after this many seconds of samples (the Timing's
    ``capped`` then says so); None for no cap.
    """
    queue = ctx.queue
    for _ in range(warmup):
        run()
    queue.finish()
    samples = []
    started = time.perf_counter()
    while len(samples) < repeat or sum(samples) < min_time:
        if ctx.profiling and not wall_clock:
            if prime is not None:
                prime()
            begin = cl.enqueue_marker(queue)
            run()
            end = cl.enqueue_marker(queue)
            end.wait()
            samples.append((end.profile.end - begin.profile.start) * 1e-9)
        else:
            t0 = time.perf_counter()
            run()
            queue.finish()
            samples.append(time.perf_counter() - t0)
        if (max_time is not None and time.perf_counter() - started > max_time
                and (len(samples) < repeat or sum(samples) < min_time)):
            return Timing(samples, capped=max_time)
    return Timing(samples)
