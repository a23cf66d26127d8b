"""``Module`` and ``Parameter``: torch.nn's bookkeeping over ``dlprim_py`` tensors.

A module holds its parameters, buffers and submodules in three ordered dicts, filled by
attribute assignment as in torch (a ``Parameter`` lands in ``_parameters``, a ``Module`` in
``_modules``, a tensor given to ``register_buffer`` in ``_buffers``), so that traversal
(``named_parameters``, ``named_buffers``, ``named_modules``) and ``state_dict`` keys come out
in torch's order and with torch's dotted names.

``state_dict()`` returns numpy arrays (host copies); ``load_state_dict`` takes numpy arrays,
torch tensors, ``dp.Tensor``s or numbers and copies them into the existing tensors, after
checking every key and shape first: a bad state dict changes nothing.
"""
from collections import OrderedDict, namedtuple

import numpy as np

from .. import autograd
from ..context import default_context
from ..errors import DeviceError, DlprimError, DTypeError, ShapeError
from ..tensor import Tensor, _check_context


class StateDictError(DlprimError, RuntimeError):
    """``load_state_dict`` was given missing, unexpected or mis-shaped keys (the message names
    them all)."""


class Parameter(Tensor):
    """A tensor that a module owns as a weight: ``requires_grad=True`` by default, and
    registered in ``Module._parameters`` when assigned to a module attribute.

    ``Parameter(tensor)`` shares ``tensor``'s memory (no copy) and is a leaf of the autograd
    tape. A subclass of ``Tensor`` without fields of its own: operators take it wherever they
    take a tensor, and their outputs are plain tensors.
    """

    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            data = Tensor.empty(default_context(), (0,))
        if not isinstance(data, Tensor):
            raise DTypeError(f"Parameter needs a dlprim_py.Tensor, got {type(data).__name__}; "
                             f"make one with dp.Tensor.from_numpy(array)")
        p = Tensor.__new__(cls)
        p.ctx, p.buffer, p.handle, p.shape, p.dtype, p.offset = (
            data.ctx, data.buffer, data.handle, data.shape, data.dtype, data.offset)
        p.grad = p.grad_fn = None
        p.requires_grad = False
        if requires_grad:
            p.requires_grad_(True)
        return p

    def __init__(self, data=None, requires_grad=True):
        # Everything is set by __new__ (Tensor.__init__ takes a buffer, not a tensor).
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    @property
    def data(self):
        """The same memory as a plain tensor outside the tape (torch's ``.data``)."""
        return self.detach()


_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _host_value(value, name):
    """A numpy array of a state-dict value: numpy, a number, a dp.Tensor or a torch tensor."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Tensor):
        return value.numpy()
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        # A torch tensor (any device, any dtype numpy has): its values on the host.
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    if isinstance(value, (int, float, bool, np.number, np.bool_)):
        return np.asarray(value)
    raise DTypeError(f"load_state_dict: {name!r} is a {type(value).__name__}; expected a numpy "
                     f"array, a torch tensor, a dlprim_py.Tensor or a number")


class Module:
    """Base class of every layer, as ``torch.nn.Module``: subclasses call
    ``super().__init__()`` first, assign their parameters, buffers and submodules as
    attributes, and define ``forward``; ``module(x)`` calls ``forward(x)``.

    ``training`` (True after construction) is what ``train()`` / ``eval()`` set on the module
    and all its descendants; batch norm and dropout read it.
    """

    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- registration -------------------------------------------------------------------

    def _dicts(self, name):
        try:
            return self.__dict__["_parameters"], self.__dict__["_buffers"], self.__dict__["_modules"]
        except KeyError:
            raise AttributeError(f"cannot assign {name!r} before {type(self).__name__}.__init__ "
                                 f"called Module.__init__()") from None

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            params, buffers, modules = self._dicts(name)
            self.__dict__.pop(name, None)
            buffers.pop(name, None)
            modules.pop(name, None)
            self._non_persistent.discard(name)
            params[name] = value
            return
        if isinstance(value, Module):
            params, buffers, modules = self._dicts(name)
            self.__dict__.pop(name, None)
            params.pop(name, None)
            buffers.pop(name, None)
            self._non_persistent.discard(name)
            modules[name] = value
            return
        d = self.__dict__
        if name in d.get("_parameters", ()):
            if value is not None:
                raise DTypeError(f"cannot assign a {type(value).__name__} as parameter {name!r} "
                                 f"(dp.nn.Parameter or None expected)")
            d["_parameters"][name] = None
            return
        if name in d.get("_modules", ()):
            if value is not None:
                raise DTypeError(f"cannot assign a {type(value).__name__} as child module "
                                 f"{name!r} (dp.nn.Module or None expected)")
            d["_modules"][name] = None
            return
        if name in d.get("_buffers", ()):
            if value is not None and not isinstance(value, Tensor):
                raise DTypeError(f"cannot assign a {type(value).__name__} as buffer {name!r} "
                                 f"(dp.Tensor or None expected)")
            d["_buffers"][name] = value
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only reached when normal lookup fails: the registered entries.
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            entries = d.get(key)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        for key in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(key)
            if entries is not None and name in entries:
                del entries[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def _check_name(self, name, kind):
        if not isinstance(name, str):
            raise DTypeError(f"{kind} name must be a str, got {type(name).__name__}")
        if not name or "." in name:
            raise ShapeError(f"{kind} name must be non-empty and hold no '.', got {name!r}")
        if hasattr(self, name) and name not in self._parameters and name not in self._buffers \
                and name not in self._modules:
            raise ShapeError(f"attribute {name!r} already exists")

    def register_buffer(self, name, tensor, persistent=True):
        """Keep ``tensor`` (a dp.Tensor or None) as buffer ``name``: saved in ``state_dict`` when
        ``persistent``, listed by ``buffers()``, not a parameter."""
        self._dicts(name)
        self._check_name(name, "buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise DTypeError(f"cannot assign a {type(tensor).__name__} as buffer {name!r} "
                             f"(dp.Tensor or None expected)")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def register_parameter(self, name, param):
        """Keep ``param`` (a Parameter or None) as parameter ``name``."""
        self._dicts(name)
        self._check_name(name, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise DTypeError(f"cannot assign a {type(param).__name__} as parameter {name!r} "
                             f"(dp.nn.Parameter or None expected)")
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        self.__dict__.pop(name, None)
        self._parameters[name] = param

    def add_module(self, name, module):
        """Keep ``module`` (a Module or None) as child ``name``."""
        self._dicts(name)
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise DTypeError(f"{type(module).__name__} is not a dp.nn.Module")
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self.__dict__.pop(name, None)
        self._modules[name] = module

    register_module = add_module

    # ---- traversal ----------------------------------------------------------------------

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(dotted name, module) of this module and every descendant, depth first, each module
        once (``remove_duplicate``)."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                            remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, module in self.named_children():
            yield module

    def _named_members(self, key, prefix, recurse, remove_duplicate):
        seen = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for name, value in getattr(module, key).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Parameter) of every parameter, torch's order; a shared one once."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, tensor) of every buffer (persistent or not)."""
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn):
        """Call ``fn(module)`` on every descendant, children first, then on this module (as
        torch: ``model.apply(init_weights)``); returns self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def get_submodule(self, target):
        """The descendant at dotted path ``target`` ("" is this module)."""
        module = self
        for part in target.split(".") if target else ():
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule {part!r} "
                                     f"(looking up {target!r})")
            module = child
        return module

    # ---- modes and gradients ------------------------------------------------------------

    def train(self, mode=True):
        """Set ``training`` to ``mode`` on this module and every descendant; returns self."""
        if not isinstance(mode, bool):
            raise DTypeError(f"training mode must be a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        """``train(False)``."""
        return self.train(False)

    def _cast_floating(self, dtype):
        """Every floating point parameter and buffer (float32, float16, bfloat16) converted to
        ``dtype`` in place of the old (parameters stay the same objects, so an optimizer
        holding them keeps them; their gradients are converted too); returns self."""
        from ..dtypes import FLOAT16_TYPES, as_dtype, float32
        dtype = as_dtype(dtype)
        floating = (float32,) + FLOAT16_TYPES

        def converted(t):
            with autograd.no_grad():
                return t.detach().to(dtype)

        for module in self.modules():
            for p in module._parameters.values():
                if p is None or p.dtype not in floating or p.dtype == dtype:
                    continue
                new = converted(p)
                p.buffer, p.handle, p.dtype, p.offset = new.buffer, new.handle, new.dtype, \
                    new.offset
                if p.grad is not None:
                    p.grad = converted(p.grad)
            for name, b in module._buffers.items():
                if b is not None and b.dtype in floating and b.dtype != dtype:
                    module._buffers[name] = converted(b)
            module._state_loaded()
        return self

    def half(self):
        """Floating point parameters and buffers to float16 (torch's ``Module.half``)."""
        return self._cast_floating("float16")

    def bfloat16(self):
        """Floating point parameters and buffers to bfloat16 (torch's ``Module.bfloat16``)."""
        return self._cast_floating("bfloat16")

    def float(self):
        """Floating point parameters and buffers to float32 (torch's ``Module.float``)."""
        return self._cast_floating("float32")

    def to(self, ctx):
        """Move every parameter and buffer to the Context ``ctx`` (through the host), as torch's
        ``.to(device)``; returns self. Parameters stay the same objects (an optimizer holding
        them keeps working) and their gradients move with them."""
        ctx = module_context(ctx)
        for module in self.modules():
            for p in module._parameters.values():
                if p is None or p.ctx is ctx:
                    continue
                moved = Tensor.from_numpy(ctx, p.numpy())
                p.ctx, p.buffer, p.offset = moved.ctx, moved.buffer, moved.offset
                if p.grad is not None:
                    p.grad = Tensor.from_numpy(ctx, p.grad.numpy())
            for name, b in module._buffers.items():
                if b is not None and b.ctx is not ctx:
                    module._buffers[name] = Tensor.from_numpy(ctx, b.numpy())
            module._state_loaded()
        return self

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """Clear every parameter's ``.grad``: drop it (``set_to_none``, torch's default, which
        frees the memory and lets the next backward write rather than add) or fill it with
        zeros."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with autograd.no_grad():
                    p.grad.zero_()

    # ---- state dict ---------------------------------------------------------------------

    def _state_entries(self, prefix=""):
        """(key, tensor) of what ``state_dict`` saves, in torch's order: each module's
        parameters, then its persistent buffers, then its children's."""
        for module_prefix, module in self.named_modules(prefix=prefix, remove_duplicate=False):
            head = f"{module_prefix}." if module_prefix else ""
            for name, p in module._parameters.items():
                if p is not None:
                    yield head + name, p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    yield head + name, b

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """OrderedDict of torch's keys (``layer1.0.bn1.running_mean``, ...,
        ``num_batches_tracked`` included) to numpy copies of the values; ``keep_vars=True``
        keeps the tensors themselves instead."""
        if destination is None:
            destination = OrderedDict()
        for key, t in self._state_entries(prefix):
            destination[key] = t if keep_vars else t.numpy()
        return destination

    def load_state_dict(self, state_dict, strict=True):
        """Copy ``state_dict``'s values (numpy arrays, torch tensors, dp.Tensors or numbers,
        converted to each tensor's dtype) into this module's parameters and persistent buffers.
        A batch norm's ``num_batches_tracked`` may be absent (it keeps its value), as torch
        allows for state dicts without version metadata, which older checkpoints are.

        Every key and shape is checked before anything is copied: a shape that differs raises
        ``StateDictError`` always, and so do missing or unexpected keys when ``strict``; the
        message names each such key. Returns ``(missing_keys, unexpected_keys)``, as torch."""
        if not hasattr(state_dict, "items"):
            raise DTypeError(f"load_state_dict expects a mapping of names to values, got "
                             f"{type(state_dict).__name__}")
        targets = OrderedDict(self._state_entries())
        optional = {f"{prefix}.{name}" if prefix else name
                    for prefix, module in self.named_modules()
                    for name in module._optional_state}
        missing = [k for k in targets if k not in state_dict and k not in optional]
        unexpected = [k for k in state_dict if k not in targets]
        mismatched, values = [], []
        for key, target in targets.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if isinstance(value, Tensor) and value.dtype == target.dtype \
                    and value.ctx.cl_context == target.ctx.cl_context:
                shape = value.shape
            else:
                value = _host_value(value, key)
                shape = tuple(value.shape)
            if shape != target.shape:
                mismatched.append(f"{key}: the state dict has shape {shape}, the module "
                                  f"{target.shape}")
                continue
            values.append((target, value))
        problems = []
        if strict and missing:
            problems.append("missing key(s): " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected key(s): " + ", ".join(unexpected))
        if mismatched:
            problems.append("size mismatch for " + "; ".join(mismatched))
        if problems:
            raise StateDictError(f"error(s) loading the state dict into {type(self).__name__}:\n  "
                                 + "\n  ".join(problems))
        for target, value in values:
            if isinstance(value, Tensor):
                target.copy_(value)
            else:
                # np.array, not np.ascontiguousarray: that makes a 0-d value (a batch
                # counter) 1-d.
                target.copy_(np.array(value, dtype=target.dtype, order="C"))
        for module in self.modules():
            module._state_loaded()
        return _IncompatibleKeys(missing, unexpected)

    # Names of this module's state entries that a state dict may lack (the value stays).
    _optional_state = ()

    def _state_loaded(self):
        """Called on every module after ``load_state_dict`` copied values in (batch norm
        forgets its host copy of the batch count here)."""

    # ---- printing -----------------------------------------------------------------------

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = []
        for name, module in self._modules.items():
            text = repr(module).replace("\n", "\n  ")
            lines.append(f"({name}): {text}")
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        body = "\n  ".join(([extra] if extra else []) + lines)
        return f"{type(self).__name__}(\n  {body}\n)"

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))


def module_context(ctx):
    """The Context a module's tensors are made in: ``ctx``, else the thread's default."""
    if ctx is not None and not hasattr(ctx, "cl_context"):
        raise DeviceError(f"ctx must be a dlprim_py.Context, got {type(ctx).__name__}")
    return _check_context(ctx)


def check_ctx(ctx):
    """The ``ctx=`` of a module without tensors: None or a Context (kept for a uniform
    signature; such a module computes wherever its input lives)."""
    if ctx is not None and not hasattr(ctx, "cl_context"):
        raise DeviceError(f"ctx must be a dlprim_py.Context, got {type(ctx).__name__}")
