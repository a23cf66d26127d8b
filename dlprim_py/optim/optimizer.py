"""``Optimizer``: torch.optim.Optimizer's interface over dp.Tensor parameters.

Parameters are leaf ``dp.Tensor``s of float32 in one context; ``.grad`` is a dp.Tensor of the
same shape, or None (the parameter is skipped, its state untouched). ``param_groups`` is a list
of dicts, each with ``"params"`` (a list of tensors) and the group's options, which a scheduler
(``dp.optim.lr_scheduler``) or the caller may change between steps: every step reads them
again, and numbers that change (lr, momentum, betas) are kernel arguments, never part of a
built program.

``state`` maps each parameter to its state dict (dp.Tensors for buffers, a number for the step
count). ``state_dict()`` has torch's layout: ``{"state": {index: {name: numpy array}},
"param_groups": [{options..., "params": [index, ...]}]}``, indices counting parameters in group
order; ``load_state_dict`` takes that (numpy arrays, torch tensors, dp.Tensors or numbers).
"""
import copy
import math

import numpy as np

from .. import autograd
from ..errors import DeviceError, DTypeError, ShapeError, not_a_tensor
from ..tensor import Tensor


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


def check_number(name, value, low=None, high=None, low_open=False, high_open=True, what=None):
    """``value`` as a float, or a ShapeError naming ``name`` and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ShapeError(f"{what}: {name} must be a number, got {value!r}")
    value = float(value)
    ok = not math.isnan(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low}"
        hi = "" if high is None else f"{high}" + (")" if high_open else "]")
        raise ShapeError(f"{what}: invalid {name} {value!r}; expected a value in "
                         f"{lo or '(-inf'}, {hi or 'inf)'}")
    return value


def _as_array(value):
    """A numpy array of a state value: numpy arrays, torch tensors, dp.Tensors, numbers."""
    if isinstance(value, Tensor):
        return value.numpy()
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class Optimizer:
    """Base of the optimizers: parameter groups, state, zero_grad, state_dict. Subclasses set
    the defaults, check a group's options in ``_check_group`` and update in ``_step_group``."""

    name = "Optimizer"
    # The state entries that are tensors of the parameter's shape.
    tensor_state = ()

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self._check_group(self.defaults)
        self.state = {}
        self.param_groups = []
        self.ctx = None
        if isinstance(params, Tensor):
            raise DTypeError(f"{self.name}: params must be an iterable of Tensors or of dicts, "
                             f"got a single Tensor (pass [tensor])")
        try:
            groups = list(params)
        except TypeError:
            raise DTypeError(f"{self.name}: params must be an iterable of Tensors or of dicts, "
                             f"got {type(params).__name__}") from None
        if not groups:
            raise ShapeError(f"{self.name}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        return "\n".join(lines + [")"])

    # ---- groups ---------------------------------------------------------------------------

    def add_param_group(self, param_group):
        """Add a group (a dict with ``"params"`` and any options; missing options take the
        optimizer's defaults)."""
        if not isinstance(param_group, dict):
            raise DTypeError(f"{self.name}: a parameter group must be a dict, got "
                             f"{type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise DTypeError(f"{self.name}: parameters must be an ordered collection, not a set")
        try:
            params = list(params)
        except TypeError:
            raise DTypeError(f"{self.name}: a group's 'params' must be a Tensor or an iterable of "
                             f"Tensors, got {type(params).__name__}") from None
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise not_a_tensor(f"{self.name}: parameter {i}", p)
            if not p.is_leaf:
                raise ShapeError(f"{self.name}: can't optimize a non-leaf Tensor (parameter {i}, "
                                 f"made by {p.grad_fn}); pass the leaf it was computed from")
            if p.dtype != np.float32:
                raise DTypeError(f"{self.name}: parameter {i} is {p.dtype}; only float32 "
                                 f"parameters are supported")
            if self.ctx is None:
                self.ctx = p.ctx
            elif p.ctx is not self.ctx:
                raise DeviceError(f"{self.name}: parameter {i} lives in another context "
                                  f"({p.ctx}) than the optimizer's other parameters "
                                  f"({self.ctx}); one optimizer updates one context's tensors")
        if len({id(p) for p in params}) != len(params):
            raise ShapeError(f"{self.name}: a parameter group holds a parameter more than once")
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ShapeError(f"{self.name}: parameter group didn't specify a value of "
                                 f"required optimization parameter {name}")
            group.setdefault(name, default)
        group["params"] = params
        self._check_group(group)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ShapeError(f"{self.name}: some parameters appear in more than one parameter "
                             f"group")
        self.param_groups.append(group)

    def _check_group(self, group):
        pass

    # ---- stepping -------------------------------------------------------------------------

    def zero_grad(self, set_to_none=True):
        """Drop every parameter's gradient (``set_to_none=True``) or fill it with zeros."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    def step(self, closure=None):
        """One update of every parameter that has a gradient; ``closure`` (re-evaluates the
        model and returns the loss) runs first, with gradients enabled, and its loss is
        returned."""
        loss = None
        if closure is not None:
            with autograd.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._check_group(group)
            with_grad = []
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if not isinstance(g, Tensor):
                    raise not_a_tensor(f"{self.name}: a parameter's .grad", g)
                if g.ctx is not p.ctx:
                    raise DeviceError(f"{self.name}: a gradient lives in another context than "
                                      f"its parameter")
                if g.shape != p.shape:
                    raise ShapeError(f"{self.name}: gradient of shape {g.shape} for a parameter "
                                     f"of shape {p.shape}")
                if g.dtype != np.float32:
                    raise DTypeError(f"{self.name}: gradient is {g.dtype}, expected float32")
                with_grad.append(p)
            if with_grad:
                self._step_group(group, with_grad)
        return loss

    def _step_group(self, group, params):
        raise NotImplementedError

    def _kernel_owner(self, group):
        """Where this group's kernel objects live (``dlprim_py.optim.fused.bound_kernel``): one
        set per group, so that groups do not reset each other's arguments on every step."""
        kernels = self.__dict__.setdefault("_kernels", {})
        return kernels, id(group["params"])

    # ---- state ----------------------------------------------------------------------------

    def state_dict(self):
        """torch's layout, state tensors as numpy arrays (copies)."""
        index, groups = {}, []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                packed["params"].append(index[id(p)])
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                entry = self.state.get(p)
                if entry:
                    state[index[id(p)]] = {k: self._export(k, v) for k, v in entry.items()}
        return {"state": state, "param_groups": groups}

    def _export(self, name, value):
        if isinstance(value, Tensor):
            return value.numpy()
        if name == "step":
            return np.array(value, dtype=np.float32)
        return copy.deepcopy(value)

    def load_state_dict(self, state_dict):
        """Take the options and state of ``state_dict`` (as ``state_dict()`` makes it, or
        torch's): groups and their sizes must match this optimizer's."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or \
                "param_groups" not in state_dict:
            raise ShapeError(f"{self.name}: a state dict has 'state' and 'param_groups', got "
                             f"{type(state_dict).__name__}"
                             + (f" with keys {sorted(state_dict)}" if isinstance(state_dict, dict)
                                else ""))
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ShapeError(f"{self.name}: loaded state dict has {len(saved)} parameter groups, "
                             f"this optimizer {len(self.param_groups)}")
        for i, (mine, theirs) in enumerate(zip(self.param_groups, saved)):
            if len(theirs["params"]) != len(mine["params"]):
                raise ShapeError(f"{self.name}: loaded state dict's group {i} has "
                                 f"{len(theirs['params'])} parameters, this optimizer's "
                                 f"{len(mine['params'])}")
        params = {}
        for mine, theirs in zip(self.param_groups, saved):
            for index, p in zip(theirs["params"], mine["params"]):
                params[index] = p
        state = {}
        for index, entry in state_dict["state"].items():
            p = params.get(index if not isinstance(index, str) else int(index))
            if p is None:
                continue
            state[p] = {k: self._import(p, k, v) for k, v in entry.items()}
        groups = []
        for mine, theirs in zip(self.param_groups, saved):
            group = {k: copy.deepcopy(v) for k, v in theirs.items() if k != "params"}
            if "betas" in group:
                group["betas"] = tuple(group["betas"])
            group["params"] = mine["params"]
            self._check_group(group)
            groups.append(group)
        self.state = state
        self.param_groups[:] = groups

    def _import(self, p, name, value):
        if value is None:
            return None
        if name == "step":
            return float(_as_array(value))
        if name in self.tensor_state:
            array = np.ascontiguousarray(_as_array(value), dtype=np.float32)
            if array.shape != p.shape:
                raise ShapeError(f"{self.name}: state {name!r} of shape {array.shape} for a "
                                 f"parameter of shape {p.shape}")
            return Tensor.from_numpy(p.ctx, array)
        return copy.deepcopy(value)
