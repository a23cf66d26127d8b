"""PyTorch's own operator samples (``op_db`` of ``torch.testing._internal.
common_methods_invocations``) run through ``dlprim_py.functional``, forward and input gradients,
against torch on float64 copies of the same data.

Used by ``tests/test_opinfo.py`` (a bounded subset of the samples of each op) and by the script
``tests/opinfo_table.py`` (every sample; it regenerates ``tests/opinfo_limitations.py``).

Which op_db entries are run: those whose name, with ``nn.functional.`` taken off, is a function of
``dlprim_py.functional`` (``ALIASES`` names the few whose functional name differs, ``EXCLUDED`` the
few whose name matches but whose meaning does not). A name added to ``dlprim_py.functional`` is
picked up without a change here.

One sample gives one ``Outcome``, of one of these kinds:

``right``    the forward, and the gradients of the inputs that require one (of sum(out * cotangent)
             for a seeded random cotangent), agree with torch's float64 results within tolerance
``wrong``    a value, shape or dtype differs, or a gradient torch has is missing
``refused``  the library raised a ``DlprimError`` (while taking the sample's tensors, in the
             forward or in the backward)
``crashed``  anything else was raised, or dlprim_py.functional does not take torch's arguments
             (the library promises a ``DlprimError`` for what it does not do)
"""
import inspect
import re
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

import dlprim_py as dp
from dlprim_py.errors import DlprimError

F = dp.functional

# Samples of the CI subset (DLPRIM_OPINFO_SAMPLES unset): the first DEFAULT_SAMPLES samples of each
# op whose tensors hold at most SUBSET_MAX_ELEMENTS elements in all. A number N in the variable
# takes the first N such samples, "all" takes every sample of any size.
DEFAULT_SAMPLES = 3
SUBSET_MAX_ELEMENTS = 2048

# Tolerances for float32 results against the float64 reference: |ours - ref| <= ATOL * scale +
# RTOL * |ref|, where scale is max(1, max |ref|) of the tensor compared (a sum of terms of
# opposite signs loses absolute, not relative, precision).
RTOL = 1e-4
ATOL = 1e-5

# op_db entries whose dlprim_py.functional name is not theirs without "nn.functional.":
# (op_db name, variant) -> functional name.
ALIASES = {
    ("true_divide", ""): "div",
    ("max", "binary"): "maximum",
    ("min", "binary"): "minimum",
    ("max", "reduction_no_dim"): "amax",
    ("min", "reduction_no_dim"): "amin",
}

# op_db entries whose name is a functional name of another meaning: (op_db name, variant) -> why.
EXCLUDED = {
    ("unfold", ""): "op_db's unfold is Tensor.unfold (windows along one dimension), not "
                    "torch.nn.functional.unfold (im2col)",
}

# op_db entries that are called with their sample's arguments rearranged (the op_db entry wraps
# the torch function): key -> f(function, input, args, kwargs) -> result.
CALL_ADAPTERS = {
    # op_db's embedding takes (weight, indices): its sample input is the weight.
    "nn.functional.embedding": lambda fn, x, args, kwargs: fn(args[0], x, *args[1:], **kwargs),
    "nn.functional.embedding_bag": lambda fn, x, args, kwargs: fn(args[0], x, *args[1:], **kwargs),
    # op_db's where takes (self, condition, other) for torch.where(condition, self, other).
    "where": lambda fn, x, args, kwargs: fn(args[0], x, *args[1:], **kwargs),
}


def _dropout_random(a):
    return a.get("training") and 0 < a.get("p", 0) < 1


# Samples that draw random numbers, whose values cannot be compared with torch's: key ->
# predicate(arguments by name, torch's defaults filled in). Their outputs and gradients are
# checked for shape, dtype and finiteness only (and a dropout's output for being 0 or
# input / (1 - p)).
RANDOM_SAMPLES = {
    "nn.functional.dropout": _dropout_random,
    "nn.functional.dropout2d": _dropout_random,
    "nn.functional.dropout3d": _dropout_random,
    "nn.functional.alpha_dropout": _dropout_random,
    "nn.functional.feature_alpha_dropout.with_train": _dropout_random,
    "nn.functional.rrelu": lambda a: a.get("training"),
    "nn.functional.fractional_max_pool2d": lambda a: True,
    "nn.functional.fractional_max_pool3d": lambda a: True,
    "nn.functional.scaled_dot_product_attention": lambda a: a.get("dropout_p", 0.0) > 0,
    "nn.functional.multi_head_attention_forward":
        lambda a: a.get("training", True) and a.get("dropout_p", 0.0) > 0,
}

# Keyword arguments of torch's that are dropped before the call: name -> why.
TORCH_ONLY_KEYWORDS = {
    "device": "a torch device ('cpu'); a dlprim_py result lives in its inputs' (or the default) "
              "context",
}

# Tolerances of their own, with the reason: key -> (rtol, atol). (None is needed today.)
TOLERANCES = {
}

_TORCH_TO_NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64,
                   torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
                   torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}


# ---- which op_db entries are run -------------------------------------------------------------

@dataclass(frozen=True)
class MappedOp:
    """An op_db entry and the dlprim_py.functional function that stands for it."""
    opinfo: object
    functional_name: str

    @property
    def key(self):
        return op_key(self.opinfo)


def op_key(opinfo):
    """``name`` or ``name.variant``: how the tests and the limitations table name an entry."""
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def op_db():
    """torch's op_db. Importing it freezes torch.backends' global flags (torch's test suite
    wants them set only in ``flags()`` blocks): they are unfrozen again, for the other tests of
    the process (the benchmark harness sets ``torch.backends.cudnn.allow_tf32``)."""
    frozen = torch.backends.flags_frozen()
    from torch.testing._internal.common_methods_invocations import op_db as entries
    if not frozen:
        # The flag torch.backends.disable_global_flags() clears, in its module's globals.
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    return entries


def functional_names():
    """The operators of dlprim_py.functional (functions of the library's op modules)."""
    return {name for name, value in vars(F).items()
            if callable(value) and not name.startswith("_")
            and getattr(value, "__module__", "").startswith("dlprim_py.ops")}


def is_functional_variant(opinfo):
    """True for the op_db entries of torch.nn.functional: ``nn.functional.*``, and the few plain
    names that torch.nn.functional also has (softmax, log_softmax, tanh, sigmoid)."""
    if (opinfo.name, opinfo.variant_test_name) in EXCLUDED:
        return False
    return opinfo.name.startswith("nn.functional.") or (
        "." not in opinfo.name and hasattr(torch.nn.functional, opinfo.name))


def functional_name(opinfo, names):
    """The dlprim_py.functional name of an op_db entry, or None."""
    pair = (opinfo.name, opinfo.variant_test_name)
    if pair in EXCLUDED:
        return None
    if pair in ALIASES:
        return ALIASES[pair] if ALIASES[pair] in names else None
    name = opinfo.name.removeprefix("nn.functional.")
    return name if "." not in name and name in names else None


def mapped_ops():
    """Every op_db entry with float32 samples that maps to a dlprim_py.functional function."""
    names = functional_names()
    mapped = []
    for opinfo in op_db():
        name = functional_name(opinfo, names)
        if name is not None and torch.float32 in opinfo.supported_dtypes("cpu"):
            mapped.append(MappedOp(opinfo, name))
    return mapped


def missing_functional_variants():
    """op_db keys of torch.nn.functional entries (with float32 samples) without a function."""
    names = functional_names()
    return [op_key(o) for o in op_db()
            if is_functional_variant(o) and torch.float32 in o.supported_dtypes("cpu")
            and functional_name(o, names) is None]


def functional_variants():
    return [op_key(o) for o in op_db()
            if is_functional_variant(o) and torch.float32 in o.supported_dtypes("cpu")]


# ---- samples ---------------------------------------------------------------------------------

@dataclass
class Sample:
    description: str        # stable across runs: shapes, dtypes and the non-tensor arguments
    sample_input: object    # the SampleInput
    elements: int           # elements of its tensors, all together


def samples(op, limit=DEFAULT_SAMPLES):
    """The op's float32 samples (torch seeded from the op's key, so the values are the same on
    every run), each with its description; the same description twice gets " #2", " #3".
    ``limit``: None for all of them, else the first ``limit`` of at most SUBSET_MAX_ELEMENTS
    elements (the smallest sample where none is that small)."""
    torch.manual_seed(zlib.crc32(op.key.encode()))
    found, seen = [], {}
    for sample_input in op.opinfo.sample_inputs("cpu", torch.float32, requires_grad=True):
        description = describe(sample_input)
        seen[description] = seen.get(description, 0) + 1
        if seen[description] > 1:
            description += f" #{seen[description]}"
        found.append(Sample(description, sample_input, _elements(sample_input)))
    if limit is None:
        return found
    small = [s for s in found if s.elements <= SUBSET_MAX_ELEMENTS][:limit]
    # An op whose samples are all large is still run, on its smallest one.
    return small or sorted(found, key=lambda s: s.elements)[:1]


def sample_limit(value):
    """DLPRIM_OPINFO_SAMPLES read: None (every sample) for "all", else a count."""
    if value is None or value.strip() == "":
        return DEFAULT_SAMPLES
    if value.strip().lower() == "all":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"DLPRIM_OPINFO_SAMPLES must be a positive count or 'all', got {value!r}")
    return count


def _parts(sample_input):
    return [sample_input.input, *sample_input.args, *sample_input.kwargs.values()]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _elements(sample_input):
    return sum(t.numel() for part in _parts(sample_input) for t in _tensors(part))


_DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
                torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}


def _describe(value):
    if isinstance(value, torch.Tensor):
        dtype = _DTYPE_NAMES.get(value.dtype, str(value.dtype).removeprefix("torch."))
        return f"{dtype}[{','.join(str(n) for n in value.shape)}]"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_describe(v)}" for k, v in value.items()) + "}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def describe(sample_input):
    """``input f32[2,3]; args (f32[3], 2); kwargs {alpha=2}`` (empty parts left out)."""
    text = f"input {_describe(sample_input.input)}"
    if sample_input.args:
        text += f"; args {_describe(tuple(sample_input.args))}"
    if sample_input.kwargs:
        text += f"; kwargs {_describe(dict(sample_input.kwargs))}"
    return text


# ---- running one sample ----------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str                  # right, wrong, refused, crashed
    message: str = ""          # what differs, or the error's message
    error: str = ""            # refused/crashed: the exception's class name
    stage: str = ""            # refused/crashed: arguments, forward or backward
    error_classes: tuple = field(default=())   # refused: the class names of its MRO


class _Refused(Exception):
    def __init__(self, stage, error):
        super().__init__(str(error))
        self.stage, self.error = stage, error


class _Converter:
    """Turns a sample's torch values into dlprim_py ones and into float64 torch copies, the same
    torch tensor always into the same tensor (a sample may pass one tensor twice)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.ours, self.reference = {}, {}
        self.leaves = []     # (our tensor, reference float64 leaf) of every tensor requiring grad

    def to_ours(self, value):
        if isinstance(value, torch.Tensor):
            if id(value) not in self.ours:
                self._convert(value)
            return self.ours[id(value)]
        if isinstance(value, torch.nn.PairwiseDistance):
            # A sample's distance module (triplet_margin_with_distance_loss): the library's.
            return dp.nn.PairwiseDistance(value.norm, value.eps, value.keepdim, ctx=self.ctx)
        if isinstance(value, torch.dtype):
            return np.dtype(_TORCH_TO_NUMPY.get(value, np.float64))
        if isinstance(value, torch.Size):
            return tuple(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_ours(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_ours(v) for k, v in value.items()}
        return value

    def to_reference(self, value):
        if isinstance(value, torch.Tensor):
            if id(value) not in self.reference:
                self._convert(value)
            return self.reference[id(value)]
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            return type(value)(self.to_reference(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_reference(v) for k, v in value.items()}
        return value

    def _convert(self, tensor):
        array = tensor.detach().cpu().contiguous().numpy()
        grad = bool(tensor.requires_grad and tensor.dtype.is_floating_point)
        reference = tensor.detach().clone()
        if reference.dtype.is_floating_point:
            reference = reference.to(torch.float64)
        reference.requires_grad_(grad)
        self.reference[id(tensor)] = reference
        try:
            ours = dp.Tensor.from_numpy(self.ctx, array, requires_grad=grad)
        except DlprimError as e:
            raise _Refused("arguments", e) from e
        self.ours[id(tensor)] = ours
        if grad:
            self.leaves.append((ours, reference))


def _outputs(value):
    """A result as a flat list: a tensor, or the items of a tuple/list of them."""
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _numpy(value):
    if isinstance(value, dp.Tensor):
        return value.numpy()
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def _compare(what, ours, ref, rtol, atol):
    """A message when ``ours`` (numpy) differs from ``ref`` (numpy, float64 for floats)."""
    if tuple(ours.shape) != tuple(ref.shape):
        return f"{what}: shape {tuple(ours.shape)}, expected {tuple(ref.shape)}"
    if ref.dtype.kind != "f":
        if ours.dtype != ref.dtype:
            return f"{what}: dtype {ours.dtype}, expected {ref.dtype}"
        if not np.array_equal(ours, ref):
            bad = np.argwhere(ours != ref)
            index = tuple(int(i) for i in bad[0])
            return (f"{what}: {len(bad)} of {ref.size} elements differ, first at {index}: "
                    f"{ours[index]} vs {ref[index]}")
        return None
    if ours.dtype.kind != "f":
        return f"{what}: dtype {ours.dtype}, expected a float"
    ours = ours.astype(np.float64)
    finite = np.isfinite(ref)
    same_nonfinite = (np.isnan(ours) & np.isnan(ref)) | (ours == ref)
    scale = max(1.0, float(np.abs(ref[finite]).max())) if finite.any() else 1.0
    with np.errstate(invalid="ignore"):
        close = np.abs(ours - ref) <= atol * scale + rtol * np.abs(ref)
    good = np.where(finite, close & np.isfinite(ours), same_nonfinite)
    if good.all():
        return None
    bad = np.argwhere(~good)
    index = tuple(int(i) for i in bad[0])
    worst = float(np.nanmax(np.where(finite, np.abs(ours - ref), 0))) if finite.any() else 0.0
    return (f"{what}: {len(bad)} of {ref.size} elements off, first at {index}: {ours[index]!r} "
            f"vs {ref[index]!r} (largest difference {worst:.3g}, allowed "
            f"{atol:.0e} * {scale:.3g} + {rtol:.0e} * |ref|)")


def _signature_mismatch(function, args, kwargs):
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except TypeError as e:
        return str(e)
    except ValueError:          # no signature to read (a builtin): let the call tell
        return None
    return None


def _arguments(op, sample_input):
    """The sample's arguments by the name torch's function gives them, its defaults filled in
    (the keywords alone where the function shows no signature)."""
    name = op.opinfo.name.removeprefix("nn.functional.")
    function = getattr(torch.nn.functional, name, None) or getattr(torch, name, None)
    try:
        bound = inspect.signature(function).bind(sample_input.input, *sample_input.args,
                                                 **sample_input.kwargs)
    except (TypeError, ValueError):
        return dict(sample_input.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _call(op, function, x, args, kwargs):
    adapter = CALL_ADAPTERS.get(op.key)
    return adapter(function, x, args, kwargs) if adapter else function(x, *args, **kwargs)


def _check_dropout_like(out, x, p):
    """A dropout's output: each element 0 or x / (1 - p)."""
    ours, x = out.numpy().astype(np.float64), _numpy(x).astype(np.float64)
    kept = np.isclose(ours, x / (1 - p), rtol=1e-5, atol=1e-6)
    if not (kept | (ours == 0)).all():
        return "output: an element is neither 0 nor input / (1 - p)"
    return None


def run_sample(ctx, op, sample, seed=0):
    """Run one sample through dlprim_py and torch (float64); return its Outcome."""
    s = sample.sample_input
    converter = _Converter(ctx)
    try:
        x, args, kwargs = (converter.to_ours(s.input), converter.to_ours(tuple(s.args)),
                           converter.to_ours(dict(s.kwargs)))
    except _Refused as refused:
        return _refusal(refused.stage, refused.error)
    kwargs = {k: v for k, v in kwargs.items() if k not in TORCH_ONLY_KEYWORDS}
    function = getattr(F, op.functional_name)
    adapter = CALL_ADAPTERS.get(op.key)
    mismatch = None if adapter else _signature_mismatch(function, (x, *args), kwargs)
    if mismatch:
        return Outcome("crashed", f"dlprim_py.functional.{op.functional_name} does not take "
                       f"torch's arguments: {mismatch}", "TypeError", "arguments")

    # The reference first: torch may reject what the sample holds only on some builds.
    rx, rargs, rkwargs = (converter.to_reference(s.input), converter.to_reference(tuple(s.args)),
                          converter.to_reference(dict(s.kwargs)))
    with warnings.catch_warnings():     # torch's advice on the sample (e.g. padding='same')
        warnings.simplefilter("ignore")
        reference = op.opinfo.op(rx, *rargs, **rkwargs)
    ref_outputs = _outputs(reference)

    try:
        result = _call(op, function, x, args, kwargs)
    except DlprimError as e:
        return _refusal("forward", e)
    except Exception as e:          # noqa: BLE001  (a library bug: reported, not raised)
        return Outcome("crashed", f"{type(e).__name__}: {e}", type(e).__name__, "forward")
    outputs = _outputs(result)
    if len(outputs) != len(ref_outputs):
        return Outcome("wrong", f"{len(outputs)} outputs, expected {len(ref_outputs)}")

    random_sample = op.key in RANDOM_SAMPLES and RANDOM_SAMPLES[op.key](_arguments(op, s))
    rtol, atol = TOLERANCES.get(op.key, (RTOL, ATOL))
    for k, (ours, ref) in enumerate(zip(outputs, ref_outputs)):
        what = "output" if len(outputs) == 1 else f"output {k}"
        if ref is None or ours is None:
            if ref is not None or ours is not None:
                return Outcome("wrong", f"{what}: {type(ours).__name__}, expected "
                                        f"{type(ref).__name__}")
            continue
        if not isinstance(ours, dp.Tensor) and isinstance(ref, torch.Tensor):
            return Outcome("wrong", f"{what}: a {type(ours).__name__}, expected a tensor")
        ours_array, ref_array = _numpy(ours), _numpy(ref)
        if random_sample:
            ref_array = np.where(np.isfinite(ref_array), 0, ref_array)
            ours_array = np.where(np.isfinite(ours_array), 0, ours_array)
        message = _compare(what, ours_array, ref_array, rtol, atol)
        if message:
            return Outcome("wrong", message)
    if random_sample and op.key == "nn.functional.dropout":
        message = _check_dropout_like(outputs[0], s.input, _arguments(op, s)["p"])
        if message:
            return Outcome("wrong", message)

    # Gradients of sum(out * cotangent) over the float outputs torch differentiates.
    differentiable = [k for k, ref in enumerate(ref_outputs)
                      if isinstance(ref, torch.Tensor) and ref.requires_grad]
    if not (op.opinfo.supports_autograd and converter.leaves and differentiable):
        return Outcome("right")
    rng = np.random.default_rng(zlib.crc32(f"{op.key}|{sample.description}|{seed}".encode()))
    cotangents = [rng.uniform(-1, 1, tuple(ref_outputs[k].shape)).astype(np.float32)
                  for k in differentiable]
    ref_grads = torch.autograd.grad(
        [ref_outputs[k] for k in differentiable], [leaf for _, leaf in converter.leaves],
        [torch.from_numpy(c.astype(np.float64)) for c in cotangents], allow_unused=True)
    try:
        loss = None
        for k, cotangent in zip(differentiable, cotangents):
            out = outputs[k]
            if not out.requires_grad:
                continue
            term = F.sum(F.mul(out, dp.Tensor.from_numpy(ctx, cotangent)))
            loss = term if loss is None else F.add(loss, term)
        if loss is not None:
            loss.backward()
    except DlprimError as e:
        return _refusal("backward", e)
    except Exception as e:          # noqa: BLE001
        return Outcome("crashed", f"{type(e).__name__}: {e}", type(e).__name__, "backward")
    for n, ((ours, leaf), ref_grad) in enumerate(zip(converter.leaves, ref_grads)):
        what = f"gradient of tensor {n} ({_describe(leaf)})"
        ref_array = (np.zeros(tuple(leaf.shape)) if ref_grad is None else ref_grad.numpy())
        if ours.grad is None:
            if ref_array.any():
                return Outcome("wrong", f"{what}: none, expected nonzero")
            continue
        ours_array = ours.grad.numpy()
        if random_sample:
            ours_array = np.where(np.isfinite(ours_array), 0, ours_array)
            ref_array = np.where(np.isfinite(ref_array), 0, ref_array)
        message = _compare(what, ours_array, ref_array, rtol, atol)
        if message:
            return Outcome("wrong", message)
    return Outcome("right")


def _refusal(stage, error):
    classes = tuple(c.__name__ for c in type(error).__mro__ if issubclass(c, DlprimError))
    message = str(error).splitlines()[0] if str(error) else ""
    return Outcome("refused", message, type(error).__name__, stage, classes)


# ---- the limitations table -------------------------------------------------------------------

ALL_SAMPLES = "*"


def expected_refusal(limitations, key, description):
    """The (error class, reason) the table lists for a sample, or None."""
    for error, reason, descriptions in limitations.get(key, ()):
        if description in descriptions or ALL_SAMPLES in descriptions:
            return error, reason
    return None


def judge(outcome, key, description, limitations, known_wrong):
    """A failure message for a sample's outcome against the tables, or None when it is as they
    say: right and listed nowhere, refused with the listed class, or wrong as listed."""
    listed = expected_refusal(limitations, key, description)
    wrong_reason = known_wrong.get(key, {}).get(description)
    if wrong_reason is not None:
        if outcome.kind == "wrong":
            return None
        return (f"{description}: listed in KNOWN_WRONG ({wrong_reason}) but now {outcome.kind}"
                f"{': ' + outcome.message if outcome.message else ''}; take it out of the table")
    if outcome.kind == "refused":
        if listed is None:
            return (f"{description}: new refusal ({outcome.stage}) {outcome.error}: "
                    f"{outcome.message} (if it is right to refuse, add it to "
                    f"tests/opinfo_limitations.py: python tests/opinfo_table.py --write)")
        if listed[0] not in outcome.error_classes:
            return (f"{description}: listed as refused with {listed[0]}, but raised "
                    f"{outcome.error}: {outcome.message}")
        return None
    if listed is not None:
        if outcome.kind == "right":
            return (f"{description}: listed as refused ({listed[1]}) but now right: take it "
                    f"out of tests/opinfo_limitations.py (python tests/opinfo_table.py --write)")
    if outcome.kind == "right":
        return None
    return f"{description}: {outcome.kind}: {outcome.message}"


def run_op(ctx, op, limit, limitations, known_wrong):
    """Run the op's samples; returns [(sample, outcome, failure message or None)]."""
    results = []
    for sample in samples(op, limit):
        outcome = run_sample(ctx, op, sample)
        results.append((sample, outcome,
                        judge(outcome, op.key, sample.description, limitations, known_wrong)))
    return results
