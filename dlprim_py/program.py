"""Render a Mako kernel template, build it for a context, and cache the result.

This is the only place that builds OpenCL programs. Two caches sit in front of the compiler:

* in memory, per context: (template, parameters, options) -> built program and its kernels;
* on disk: program binaries keyed by the rendered source, the build options, the platform,
  device and driver versions and the library version. Entries are written to a temporary file
  and renamed into place, so concurrent processes never see half a file. Each entry carries its
  key and the SHA-256 of its binary, checked before the driver sees the binary; an entry that
  fails the check or that the driver rejects is rebuilt from source and rewritten, with one
  ``CacheWarning`` per file, and a cache folder that cannot be written is reported once and
  the builds go on without it. ``DLPRIM_CACHE_DIR`` moves it, ``DLPRIM_NO_CACHE=1`` disables it.
"""
import contextlib
import hashlib
import re
import struct
import sys
import threading
import time
from pathlib import Path

import pyopencl as cl
from mako.exceptions import MakoException, text_error_template
from mako.lookup import TemplateLookup

from . import config
from .errors import KernelBuildError
from .files import atomic_write, warn_once
from .version import __version__

_SOURCE_KERNELS = Path(__file__).resolve().parent.parent / "kernels"
_INSTALLED_KERNELS = Path(__file__).resolve().parent / "kernels"


def kernels_dir():
    """Where the ``*.cl.mako`` templates are: the source tree's ``kernels/`` when running from a
    checkout, else the ``dlprim_py/kernels`` that the wheel installs."""
    for path in (_INSTALLED_KERNELS, _SOURCE_KERNELS):
        if path.is_dir() and any(path.glob("*.cl.mako")):
            return path
    raise KernelBuildError(f"kernel templates not found in {_INSTALLED_KERNELS} or {_SOURCE_KERNELS}")


_lookup = None


def _template_lookup():
    global _lookup
    if _lookup is None:
        _lookup = TemplateLookup(directories=[str(kernels_dir())], strict_undefined=True,
                                 input_encoding="utf-8")
    return _lookup


def render(template, **params):
    """The OpenCL C source of ``kernels/<template>.cl.mako`` with ``params`` substituted.

    Undefined names in the template are errors (Mako's strict_undefined).
    """
    name = template if template.endswith(".cl.mako") else f"{template}.cl.mako"
    stats["renders"] += 1
    try:
        tmpl = _template_lookup().get_template(name)
        return tmpl.render(**params)
    except MakoException as e:
        raise KernelBuildError(f"cannot render {name}: {e}") from e
    except NameError as e:
        raise KernelBuildError(f"cannot render {name}: {e} (pass it as a template parameter)") from e
    except Exception as e:
        if type(e).__module__.startswith("mako"):
            raise KernelBuildError(f"cannot render {name}:\n{text_error_template().render()}") from e
        raise


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


# What the library has built and created since the process started, per kind: "renders"
# (templates rendered to source), "builds" (programs built, from source or from a cached binary)
# and "kernels" (cl.Kernel objects created). Tests assert that a repeated call adds to none.
stats = {"renders": 0, "builds": 0, "kernels": 0}
_stats_lock = threading.Lock()


def new_kernel(program, name):
    """A new ``cl.Kernel`` for ``name`` of the ``cl.Program`` ``program``: the one place kernel
    objects are created (each costs PyOpenCL's invoker lookup, 0.2-1 ms of host time)."""
    stats["kernels"] += 1
    return cl.Kernel(program, name)


class BuiltProgram:
    """A built ``cl.Program`` and a memo of its kernels by name."""

    def __init__(self, program, source, options, from_cache):
        self.program = program
        self.source = source
        self.options = options
        self.from_cache = from_cache
        self._kernels = {}

    def kernel(self, name, fresh=False):
        """The kernel ``name``. ``fresh=True`` gives a new ``cl.Kernel`` object, for callers that
        bind arguments once with ``set_args`` and must not share it."""
        if fresh:
            return new_kernel(self.program, name)
        kernel = self._kernels.get(name)
        if kernel is None:
            kernel = self._kernels[name] = new_kernel(self.program, name)
        return kernel


class NotBuilt(BaseException):
    """Raised inside ``probe_builds()`` by the first ``build`` that the context does not hold
    yet, instead of building it: ``on_disk`` says whether the disk cache has its binary (a load,
    not a compile). Inside a ``BuildAhead``'s ``collecting()``, ``on_disk`` is None and
    ``recipes`` holds what is missing (``Recipe`` objects, several where a caller gathered them, as
    find mode's timing of several candidates does).

    A BaseException, as KeyboardInterrupt is: it says where a walk stopped, not what went
    wrong, so an operator's ``except Exception`` (one that turns any failure into a library
    error, or falls back to another algorithm) must not take it for a failure."""

    def __init__(self, template, on_disk, recipes=()):
        state = "to build" if on_disk is None else "on disk" if on_disk else "to compile"
        super().__init__(f"{template}: not built yet ({state})")
        self.template = template
        self.on_disk = on_disk
        self.recipes = list(recipes)


class Recipe:
    """What ``build`` would build: the memo key, the rendered source, the options and the label
    its messages use."""

    __slots__ = ("key", "source", "options", "label")

    def __init__(self, key, source, options, label):
        self.key = key
        self.source = source
        self.options = options
        self.label = label


_probing = threading.local()


@contextlib.contextmanager
def probe_builds():
    """Inside, ``build`` builds nothing: a program the context does not hold raises
    ``NotBuilt`` (what would be built, and whether from the disk cache), so that a caller can
    tell what constructing an object would cost (the tuner, before it spends its budget)."""
    outer = getattr(_probing, "on", False)
    _probing.on = True
    try:
        yield
    finally:
        _probing.on = outer


class BuildAhead:
    """Programs gathered from a walk that builds nothing, then built concurrently.

    A planner that launches many kernels (``dlprim_py.onnx``'s, once per input shape) would
    otherwise build its programs one after the other as it meets them, each a compiler run of
    0.2-0.7 s, while the host has cores to spare and the drivers compile from several threads
    at once (PyOpenCL lets go of the GIL in clBuildProgram). So: inside ``collecting()`` a
    ``build`` of a program the context does not hold raises ``NotBuilt`` with its ``Recipe``
    (rendered once per session); the caller gathers them from its walk and passes them to
    ``build``, which compiles them in a pool of ``threads`` through ``build_source`` (the disk
    cache, its checks and its errors as ever) and stores the results in ``ctx.programs``, from
    the calling thread, under the keys ``build`` uses. A build that fails is kept and raised
    again, the same ``KernelBuildError``, by the first ``build`` of that program inside
    ``active()`` (the walk for real), at the point where building one at a time would have
    raised it. Nothing else changes: the programs built are the ones ``build`` would build, so
    the walk for real finds them built.
    """

    def __init__(self, ctx, threads):
        self.ctx = ctx
        self.threads = max(1, int(threads))
        self.collecting_now = False
        self.recipes = {}   # key -> Recipe, rendered once
        self.failed = {}    # key -> the KernelBuildError its build raised
        self.built = 0

    def recipe(self, key, template, params, options):
        recipe = self.recipes.get(key)
        if recipe is None:
            recipe = self.recipes[key] = Recipe(key, render(template, **params), options,
                                                template)
        return recipe

    @contextlib.contextmanager
    def active(self):
        """Inside, ``build`` for this context raises kept failures and reuses rendered sources."""
        outer = getattr(_probing, "ahead", None)
        _probing.ahead = self
        try:
            yield self
        finally:
            _probing.ahead = outer

    @contextlib.contextmanager
    def collecting(self):
        """Inside, ``build`` of a program the context does not hold raises ``NotBuilt``."""
        with self.active():
            outer, self.collecting_now = self.collecting_now, True
            try:
                yield self
            finally:
                self.collecting_now = outer

    def build(self, recipes):
        """Build ``recipes`` (duplicates dropped) concurrently and store them in
        ``ctx.programs``; failures are kept (``failed``). Returns how many were attempted.
        Programs of one source and options are built one per call (the others, by a later
        call, come from the disk cache as they would one at a time)."""
        todo, seen_keys, seen_sources = [], set(), set()
        for recipe in recipes:
            same = (recipe.source, recipe.options)
            if (recipe.key in seen_keys or recipe.key in self.ctx.programs
                    or recipe.key in self.failed or same in seen_sources):
                continue
            seen_keys.add(recipe.key)
            seen_sources.add(same)
            todo.append(recipe)
        if not todo:
            return 0
        ctx = self.ctx

        def one(recipe):
            try:
                return build_source(ctx, recipe.source, recipe.options, label=recipe.label), None
            except KernelBuildError as e:
                return None, e

        if self.threads == 1 or len(todo) == 1:
            results = [one(r) for r in todo]
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(min(self.threads, len(todo)),
                                    thread_name_prefix="dlprim-build") as pool:
                results = list(pool.map(one, todo))
        for recipe, (built, error) in zip(todo, results):
            if error is not None:
                self.failed[recipe.key] = error
            else:
                ctx.programs[recipe.key] = built
        self.built += len(todo)
        return len(todo)


def collecting():
    """Whether ``build`` raises ``NotBuilt`` for what it would build (inside a ``BuildAhead``'s
    ``collecting()``), so that a caller trying several programs may gather them all."""
    ahead = getattr(_probing, "ahead", None)
    return ahead is not None and ahead.collecting_now


def build(ctx, template, params=None, options=()):
    """Render ``template`` with ``params``, build it for ``ctx`` and return a ``BuiltProgram``.

    Memoized per context on (template, params, options); program binaries are cached on disk.
    """
    params = dict(params or {})
    options = tuple(options) + config.build_options()
    key = (template, _freeze(params), options)
    built = ctx.programs.get(key)
    if built is None:
        ahead = getattr(_probing, "ahead", None)
        if ahead is not None and ahead.ctx is ctx:
            failed = ahead.failed.get(key)
            if failed is not None:
                raise failed
            recipe = ahead.recipe(key, template, params, options)
            if ahead.collecting_now:
                raise NotBuilt(template, None, [recipe])
            source = recipe.source
        else:
            source = render(template, **params)
        if getattr(_probing, "on", False):
            on_disk = not config.no_cache() and _cache_path(
                _disk_key(ctx, source, options)).is_file()
            raise NotBuilt(template, on_disk)
        built = ctx.programs[key] = build_source(ctx, source, options, label=template)
    return built


def kernel(ctx, template, name, params=None, options=(), fresh=False):
    """Shortcut: the kernel ``name`` of ``build(ctx, template, params, options)``."""
    return build(ctx, template, params, options).kernel(name, fresh=fresh)


# A disk entry: this header, then the binary. Drivers do not fail cleanly on a damaged binary
# (PoCL segfaults on a short one, LLVM aborts on a flipped byte), so no byte reaches
# clCreateProgramWithBinary unchecked; the key catches an entry copied or renamed over another.
# The format is part of the key, so files of another format are never read.
_MAGIC = b"DLPRIMPB"
_FORMAT = 1
_HEADER = struct.Struct("<8sI32sQ32s")  # magic, format, SHA-256 of the key, length, SHA-256


def _disk_key(ctx, source, options):
    digest = hashlib.sha256()
    for part in (f"{__version__} entry format {_FORMAT}", ctx.info.key(), " ".join(options),
                 source):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def _cache_path(key):
    return Path(config.cache_dir()) / "programs" / f"{key}.bin"


def _pack_entry(key, binary):
    return _HEADER.pack(_MAGIC, _FORMAT, bytes.fromhex(key), len(binary),
                        hashlib.sha256(binary).digest()) + binary


def _unpack_entry(data, key):
    """The binary of the entry ``data`` if it is whole and was written for ``key``; else raises
    ValueError saying what is wrong."""
    if data[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not a dlprim_py program cache entry")
    if len(data) < _HEADER.size:
        raise ValueError(f"truncated header ({len(data)} bytes)")
    _, version, key_digest, length, checksum = _HEADER.unpack_from(data)
    if version != _FORMAT:
        raise ValueError(f"entry format {version}, expected {_FORMAT}")
    if key_digest != bytes.fromhex(key):
        raise ValueError("written for another program (key mismatch)")
    binary = data[_HEADER.size:]
    if len(binary) != length:
        raise ValueError(f"binary of {len(binary)} bytes, its header says {length}")
    if hashlib.sha256(binary).digest() != checksum:
        raise ValueError("checksum mismatch")
    return binary


def _read_entry(path, key):
    """The checked binary of the entry at ``path``, or None (a miss, or a bad entry: warned)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None  # a miss; an unusable folder is reported when the entry is written
    except OSError as e:
        _warn_entry(path, f"cannot be read ({e})")
        return None
    try:
        return _unpack_entry(data, key)
    except ValueError as e:
        _warn_entry(path, str(e))
        return None


def _warn_entry(path, reason):
    warn_once(path, f"dlprim_py: program cache entry {path}: {reason}; rebuilt from source and "
                    f"rewritten")


def build_source(ctx, source, options=(), label="<source>"):
    """Build OpenCL C ``source`` for ``ctx`` through the on-disk binary cache."""
    options = tuple(options)
    with _stats_lock:   # BuildAhead builds from several threads
        stats["builds"] += 1
    key = None if config.no_cache() else _disk_key(ctx, source, options)
    path = None if key is None else _cache_path(key)
    started = time.perf_counter()
    binary = None if path is None else _read_entry(path, key)
    if binary is not None:
        try:
            program = cl.Program(ctx.cl_context, [ctx.device], [binary]).build(options=list(options))
            if config.debug():
                print(f"dlprim: {label}: binary cache hit {path.name[:12]} "
                      f"({time.perf_counter() - started:.3f} s)", file=sys.stderr)
            return BuiltProgram(program, source, options, from_cache=True)
        except cl.Error as e:
            # A whole entry the driver no longer accepts: rebuilt and rewritten below; said,
            # since a driver that rejected its own binaries would otherwise rebuild every run.
            _warn_entry(path, f"the driver rejected it ({e})")
    program = _build_from_source(ctx, source, options, label)
    if config.debug():
        print(f"dlprim: {label}: built from source ({time.perf_counter() - started:.3f} s)",
              file=sys.stderr)
    if path is not None:
        _store_binary(program, key, path)
    return BuiltProgram(program, source, options, from_cache=False)


def _build_from_source(ctx, source, options, label):
    # The raw program type bypasses pyopencl's own source cache: this module keeps the cache.
    raw = cl._cl._Program(ctx.cl_context, source)
    try:
        raw.build(" ".join(options).encode("utf-8"), [ctx.device])
    except cl.Error as e:
        try:
            log = raw.get_build_info(ctx.device, cl.program_build_info.LOG)
        except cl.Error:
            log = ""
        raise KernelBuildError(_build_error_message(label, source, options, log, e),
                               log=log, source=source) from None
    return cl.Program(raw)


# Compilers write "<file>:LINE:COL: error: ..." (clang, NVIDIA) or "error: <file>:LINE:COL: ..."
# (PoCL): take the first line that says error and the first LINE:COL on it.
_LINE_COLUMN = re.compile(r":(\d+):\d+:")


def _first_error_line(log):
    for text in log.splitlines():
        if "error" in text.lower():
            match = _LINE_COLUMN.search(text)
            if match:
                return int(match.group(1))
    return None


def _build_error_message(label, source, options, log, error):
    lines = source.splitlines()
    message = [f"OpenCL build of {label} failed ({error.code if hasattr(error, 'code') else error})",
               f"options: {' '.join(options) or '(none)'}", "compiler log:", (log or str(error)).strip()]
    line = _first_error_line(log or "")
    if line is not None and 1 <= line <= len(lines):
        lo, hi = max(1, line - 4), min(len(lines), line + 4)
        message.append(f"rendered source around line {line}:")
        for n in range(lo, hi + 1):
            marker = ">>" if n == line else "  "
            message.append(f"{marker}{n:5d} | {lines[n - 1]}")
    return "\n".join(message)


def _store_binary(program, key, path):
    try:
        binaries = program.get_info(cl.program_info.BINARIES)
    except cl.Error:
        return
    if not binaries or not binaries[0]:
        return
    try:
        atomic_write(path, _pack_entry(key, bytes(binaries[0])))
    except OSError as e:
        # The cache is an optimisation: an unwritable folder (read-only, a regular file in its
        # place, a full disk) must not fail the build, but is said once, or every run would
        # rebuild everything without a word.
        warn_once(path.parent, f"dlprim_py: program cache folder {path.parent} cannot be "
                               f"written ({e}); programs are built from source without it")
