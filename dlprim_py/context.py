"""OpenCL device choice, the device facts kernels are specialised on, and the command queue.

``Context`` is the handle every tensor and operator carries. It either owns its pyopencl context
and queue, or wraps a host application's own ``pyopencl.CommandQueue`` so that all work is
enqueued there (the embedding use case).
"""
import contextlib
import re
import threading

import pyopencl as cl

from . import config
from .errors import DeviceError, DlprimError

_VENDORS = (
    ("nvidia", "nvidia"),
    ("advanced micro devices", "amd"),
    ("amd", "amd"),
    ("intel", "intel"),
    ("apple", "apple"),
    ("arm", "arm"),
    ("portable computing language", "pocl"),
    ("pocl", "pocl"),
)


def normalise_vendor(platform_name, device_vendor):
    """Map OpenCL vendor strings to nvidia/amd/intel/apple/arm/pocl/other."""
    text = f"{platform_name} {device_vendor}".lower()
    # PoCL reports the CPU's vendor as the device vendor; the platform says PoCL.
    if "portable computing language" in platform_name.lower() or "pocl" in platform_name.lower():
        return "pocl"
    for needle, name in _VENDORS:
        if needle in text:
            return name
    return "other"


def devices():
    """Every OpenCL device as a list of ``(index, platform name, device name, device type)``.

    ``index`` is the "P:D" string that ``Context`` and ``DLPRIM_DEVICE`` accept.
    """
    return [(f"{p}:{d}", device.platform.name.strip(), device.name.strip(),
             cl.device_type.to_string(device.type)) for p, d, device in _all_devices()]


def _all_devices():
    result = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    for p, platform in enumerate(platforms):
        try:
            platform_devices = platform.get_devices()
        except cl.Error:
            continue
        for d, device in enumerate(platform_devices):
            result.append((p, d, device))
    return result


def find_device(spec=None):
    """The ``pyopencl.Device`` for a "P:D" index or a piece of the device name.

    With no spec: ``DLPRIM_DEVICE`` if set, else the first GPU, else the first CPU, else the
    first device of any kind.
    """
    if spec is None:
        spec = config.device_spec()
    candidates = _all_devices()
    if not candidates:
        raise DeviceError("no OpenCL device found: install a driver, or `pip install "
                          "pocl-binary-distribution` for a CPU device")
    listing = "; ".join(f"{p}:{d} {dev.name.strip()}" for p, d, dev in candidates)
    if spec is not None:
        spec = str(spec).strip()
        match = re.fullmatch(r"(\d+):(\d+)", spec)
        if match:
            p, d = int(match.group(1)), int(match.group(2))
            for cp, cd, device in candidates:
                if (cp, cd) == (p, d):
                    return device
            raise DeviceError(f"no OpenCL device at index {spec!r}; devices: {listing}")
        for _, _, device in candidates:
            if spec.lower() in device.name.lower() or spec.lower() in device.platform.name.lower():
                return device
        raise DeviceError(f"no OpenCL device whose name contains {spec!r}; devices: {listing}")
    for wanted in (cl.device_type.GPU, cl.device_type.CPU):
        for _, _, device in candidates:
            if device.type & wanted:
                return device
    return candidates[0][2]


class DeviceInfo:
    """The facts about one device that kernels and algorithm choice depend on."""

    def __init__(self, device):
        platform = device.platform
        self.name = device.name.strip()
        self.platform_name = platform.name.strip()
        self.platform_version = platform.version.strip()
        self.version = device.version.strip()
        self.driver_version = device.driver_version.strip()
        self.vendor = normalise_vendor(self.platform_name, device.vendor)
        self.is_gpu = bool(device.type & cl.device_type.GPU)
        self.is_cpu = bool(device.type & cl.device_type.CPU)
        self.local_mem_size = int(device.local_mem_size)
        self.max_work_group_size = int(device.max_work_group_size)
        self.max_work_item_sizes = tuple(int(s) for s in device.max_work_item_sizes)
        self.compute_units = int(device.max_compute_units)
        self.global_mem_size = int(device.global_mem_size)
        self.max_alloc_size = int(device.max_mem_alloc_size)
        self.base_addr_align_bytes = int(device.mem_base_addr_align) // 8
        extensions = set(device.extensions.split())
        self.extensions = frozenset(extensions)
        self.has_fp16 = "cl_khr_fp16" in extensions
        self.has_fp64 = "cl_khr_fp64" in extensions or _has_double_config(device)
        self.has_subgroups = bool(extensions & {"cl_khr_subgroups", "cl_intel_subgroups"})
        self.has_intel_subgroups = "cl_intel_subgroups" in extensions
        self.architecture = _architecture(device, self.vendor, self.name)
        # The SIMD width the hardware executes in lockstep: warps on NVIDIA, wavefronts on AMD.
        if self.vendor == "nvidia":
            self.simd_width = 32
        elif self.vendor == "amd":
            self.simd_width = 64 if "gfx9" in self.name.lower() else 32
        elif self.vendor == "intel" and self.is_gpu:
            self.simd_width = 16
        else:
            self.simd_width = 1

    def key(self):
        """A string that names this device and driver, for caches and tuning databases."""
        return f"{self.platform_name}|{self.platform_version}|{self.name}|{self.version}|{self.driver_version}"

    def __repr__(self):
        return (f"DeviceInfo({self.name!r}, vendor={self.vendor!r}, "
                f"architecture={self.architecture!r}, cu={self.compute_units}, "
                f"local_mem={self.local_mem_size}, wg={self.max_work_group_size}, "
                f"fp16={self.has_fp16}, fp64={self.has_fp64}, subgroups={self.has_subgroups})")


def _architecture(device, vendor, name):
    """The device's architecture as tuning databases name it ("nvidia:sm_90", "amd:gfx90a"),
    or None where the driver does not say it."""
    if vendor == "nvidia":
        try:
            major = int(device.compute_capability_major_nv)
            minor = int(device.compute_capability_minor_nv)
        except (cl.Error, AttributeError):
            return None
        return f"nvidia:sm_{major}{minor}"
    if vendor == "amd" and name.lower().startswith("gfx"):
        return "amd:" + name.split(":")[0].lower()
    return None


def _has_double_config(device):
    try:
        return int(device.double_fp_config) != 0
    except (cl.Error, AttributeError):
        return False


class PlanCache:
    """Plans by key, bounded: at most ``capacity`` of them, the ones used least recently
    dropped first (and rebuilt from the in-memory program cache if they are needed again).
    Keys are tuples whose first item names the operator family.

    Recently used, not recently made: a loop's plans stay while it runs, however many other
    plans came and went (dropping the oldest would rebuild a hot plan once per pass through a
    working set larger than the capacity). The order is kept in two generations rather than
    by moving an entry on every hit: a hit in the current generation is one dictionary probe
    (every repeated operator call makes one); a hit in the previous one moves the entry to the
    current; storing a new plan when the current holds half the capacity (or both hold all of
    it) makes the current the previous and drops the previous. So only new plans drop old
    ones, and an entry used once per capacity / 2 new plans is never dropped."""

    def __init__(self, capacity=4096):
        if capacity < 2:
            raise ValueError(f"PlanCache capacity must be at least 2, got {capacity!r}")
        self.capacity = capacity
        self._half = capacity // 2
        self._current = {}
        self._previous = {}
        # The current generation's dict.get, for the hottest callers: ``hit(key)`` is one C
        # call; None from it means "ask get", which also looks in the previous generation.
        # The current generation is therefore emptied in place, never replaced.
        self.hit = self._current.get

    def get(self, key):
        """The plan stored under ``key``, or None."""
        plan = self._current.get(key)
        if plan is None and self._previous:
            plan = self._previous.pop(key, None)
            if plan is not None:
                # Moved without a rotation: a hit never drops plans. Dropping one frees its
                # kernel objects, whose PyOpenCL invokers are reference cycles, and a repeated
                # call would leave them to the cycle collector.
                self._current[key] = plan
        return plan

    def put(self, key, plan):
        """Store ``plan`` under ``key`` and return it."""
        self._previous.pop(key, None)
        current = self._current
        if key not in current and (len(current) >= self._half
                                   or len(current) + len(self._previous) >= self.capacity):
            self._previous = current.copy()
            current.clear()
            if len(self._previous) >= self.capacity:   # hits moved everything into it
                del self._previous[next(iter(self._previous))]
        current[key] = plan
        return plan

    def clear(self):
        self._current.clear()
        self._previous.clear()

    def __len__(self):
        return len(self._current) + len(self._previous)


class Context:
    """An OpenCL device, its context and the queue all work is enqueued on.

    ``Context()`` picks the device from ``DLPRIM_DEVICE``, else the first GPU, else the first
    CPU. ``Context("0:1")`` or ``Context("H200")`` picks one by index or name.
    ``Context(queue=q)`` wraps a host application's ``pyopencl.CommandQueue``: its context and
    device are used and every kernel is enqueued on ``q``.
    ``ctx.allow_tf32``: None (default) follows ``dlprim_py.backends.allow_tf32``; True or False
    allows or forbids TF32 GEMM on this context alone (see ``dlprim_py.backends``).
    """

    def __init__(self, device=None, *, queue=None, profiling=True):
        if queue is not None:
            if device is not None:
                raise DeviceError("give either a device or a queue, not both")
            if not isinstance(queue, cl.CommandQueue):
                raise DeviceError(f"queue must be a pyopencl.CommandQueue, got {type(queue).__name__}")
            self.queue = queue
            self.cl_context = queue.context
            self.device = queue.device
            self.owns_queue = False
        else:
            if isinstance(device, cl.Device):
                self.device = device
            else:
                self.device = find_device(device)
            self.cl_context = cl.Context([self.device])
            props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
            self.queue = cl.CommandQueue(self.cl_context, self.device, properties=props)
            self.owns_queue = True
        self.info = DeviceInfo(self.device)
        self.profiling = bool(self.queue.properties & cl.command_queue_properties.PROFILING_ENABLE)
        # Per-context memo of built programs: (template, params, options) -> cl.Program.
        self.programs = {}
        # Per-context memo of what an operator finds once (device facts, tuned choices, shared
        # constants); plans go to ``plans``.
        self.memo = {}
        # The plans of every operator family, by a key of what a call's plan depends on.
        self.plans = PlanCache()
        # Checks of enqueued work whose result is read at the next synchronizing call (a bad
        # class target of nll_loss): name -> check(ctx), which raises.
        self.deferred_checks = {}
        # Device memory of tensors: freed tensors' blocks are held for reuse (empty_cache()
        # hands them back to the driver).
        import pyopencl.tools as cl_tools
        self.memory_pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue))
        # The thread that may call operators on this context (see check_thread).
        self.thread = threading.get_ident()
        # The scratch tensor operators' algorithms work in (see workspace()); while a network
        # is planned, the sizes asked for and the buffers handed out (see workspace_log()).
        self._workspace = None
        self._workspace_log = None
        # TF32 GEMM on this context: None follows dlprim_py.backends.allow_tf32.
        self.allow_tf32 = None

    @property
    def vendor(self):
        """The device's vendor: "nvidia", "amd", "intel", "apple", "arm", "pocl" or "other"."""
        return self.info.vendor

    def synchronize(self):
        """Wait until everything enqueued on the queue has finished; raises what a deferred
        check of that work found (an out-of-range class target)."""
        self.queue.finish()
        self.run_deferred_checks()

    def memory_allocated(self):
        """Bytes of device memory held by live tensors of this context (torch's name)."""
        return self.memory_pool.active_bytes

    def memory_reserved(self):
        """Bytes of device memory the context's pool holds: live tensors plus freed blocks kept
        for reuse (torch's name)."""
        return self.memory_pool.managed_bytes

    def workspace(self, nbytes):
        """A float32 scratch tensor of at least ``nbytes`` bytes, shared by every operator call
        of this context: a call's algorithm writes its workspace before reading it and is done
        with it when the next call's kernels run (one queue, in order), so one buffer, grown to
        the largest need seen, serves them all. A planned network then holds one workspace,
        not one per layer. A plan keeps the buffer it recorded with alive; a call after the
        buffer grew passes the new one."""
        from .tensor import Tensor
        if self._workspace is None or self._workspace.nbytes < nbytes:
            self._workspace = None
            self._workspace = Tensor.empty(self, (-(-nbytes // 4),))
        if self._workspace_log is not None:
            self._workspace_log.append((nbytes, self._workspace.buffer))
        return self._workspace

    @contextlib.contextmanager
    def workspace_log(self):
        """Within the block, every workspace() call is logged as (bytes asked for, buffer
        handed out) in the list this yields: a planner (``dlprim_py.onnx``) rebinds the
        workspaces its launches recorded with, which grew as it went, to the final one, and
        counts the largest need rather than the buffer's size (the buffer is the context's,
        shared with every other user)."""
        outer, self._workspace_log = self._workspace_log, []
        try:
            yield self._workspace_log
        finally:
            self._workspace_log = outer

    def empty_cache(self):
        """Return the freed blocks the pool holds to the driver (live tensors keep theirs)."""
        self.memory_pool.free_held()

    def use_in_this_thread(self):
        """Hand the context to the calling thread: operators may be called from it, and from no
        other, from now on (see check_thread)."""
        self.thread = threading.get_ident()

    def check_thread(self):
        """Raise DeviceError when called from another thread than the context's.

        A context's plans, bound kernel objects and scratch buffers serve one call at a time:
        two threads calling operators on one context would interleave their launches and mix
        their results. Use one Context per thread (``default_context()`` gives each thread its
        own), or hand one over with ``use_in_this_thread()``."""
        if self.thread != threading.get_ident():
            raise DeviceError(f"{self!r} belongs to thread {self.thread} and was called from "
                              f"thread {threading.get_ident()}: a context serves one thread; "
                              f"create one Context per thread, or hand this one over with "
                              f"ctx.use_in_this_thread()")

    def kept_tensor(self, key, make, fits=None):
        """The tensor this context keeps under ``key`` in its memo (a flag, a vector of ones,
        a constant operand), made by ``make()`` the first time, or again when ``fits(kept)``
        is false, outside any open recording: the plan of the call that happened to make it
        must not replay its fill or copy on every later call."""
        kept = self.memo.get(key)
        if kept is None or (fits is not None and not fits(kept)):
            from .launch import unrecorded     # launch imports this module
            with unrecorded():
                kept = self.memo[key] = make()
        return kept

    def defer_check(self, name, check):
        """Run ``check(self)`` (which reads device results and raises on a bad one) at the next
        synchronizing call; one pending check per ``name``."""
        self.deferred_checks[name] = check

    def run_deferred_checks(self):
        """Run the pending deferred checks (each once), raising the first error found."""
        while self.deferred_checks:
            name = next(iter(self.deferred_checks))
            self.deferred_checks.pop(name)(self)

    def __repr__(self):
        return f"dlprim_py.Context({self.info.name!r} on {self.info.platform_name!r})"


_default = threading.local()


def default_context():
    """The calling thread's default context, made on its first use (``DLPRIM_DEVICE`` or the
    first GPU/CPU): a context serves one thread (see ``Context.check_thread``)."""
    context = getattr(_default, "context", None)
    if context is None:
        context = _default.context = Context()
    return context


def check_same_context(*tensors):
    """Raise DeviceError unless every tensor (None is skipped) lives in one OpenCL context."""
    present = [t for t in tensors if t is not None]
    if not present:
        return None
    ctx = present[0].ctx
    for k, t in enumerate(present[1:], start=1):
        if t.ctx.cl_context != ctx.cl_context:
            same_device = t.ctx.device == ctx.device
            raise DeviceError(
                f"tensors of one call must share one dlprim_py.Context (these live in "
                f"different OpenCL contexts): operand 0 "
                f"({'x'.join(map(str, present[0].shape))} {present[0].dtype}) lives in "
                f"{ctx!r} at 0x{id(ctx):x}, operand {k} ({'x'.join(map(str, t.shape))} "
                f"{t.dtype}) in {t.ctx!r} at 0x{id(t.ctx):x}"
                + ("; the two contexts are on the same device, but OpenCL does not share "
                   "buffers between contexts: make both tensors with one Context (or "
                   "dp.default_context())" if same_device else ""))
    return ctx


__all__ = ["Context", "DeviceInfo", "devices", "find_device", "default_context",
           "check_same_context", "normalise_vendor", "DlprimError"]
