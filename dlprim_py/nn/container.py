"""Containers (torch.nn's): ``Sequential`` and ``ModuleList`` (children named "0", "1", ...) and
``ModuleDict`` (children by name)."""
from collections import OrderedDict

from ..errors import DTypeError, ShapeError
from .module import Module


def _index(i, n, what):
    if not isinstance(i, int) or isinstance(i, bool):
        raise DTypeError(f"{what} indices must be ints or slices, got {type(i).__name__}")
    if not -n <= i < n:
        raise ShapeError(f"index {i} is out of range for a {what} of {n} modules")
    return i % n


class Sequential(Module):
    """Modules called in order, each on the previous one's output: ``Sequential(a, b, c)`` or
    ``Sequential(OrderedDict(name=module, ...))``."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(OrderedDict(list(self._modules.items())[i]))
        return list(self._modules.values())[_index(i, len(self), "Sequential")]

    def __setitem__(self, i, module):
        key = list(self._modules)[_index(i, len(self), "Sequential")]
        setattr(self, key, module)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def forward(self, input):
        for module in self._modules.values():
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ... (no forward of its own)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        return self._modules[str(_index(i, len(self), "ModuleList"))]

    def __setitem__(self, i, module):
        setattr(self, str(_index(i, len(self), "ModuleList")), module)

    def __iadd__(self, modules):
        return self.extend(modules)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for module in modules:
            self.append(module)
        return self

    def insert(self, index, module):
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)


class ModuleDict(Module):
    """Modules by name, in insertion order, registered as children of those names (no forward
    of its own)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def pop(self, key):
        return self._modules.pop(key)

    def clear(self):
        self._modules.clear()

    def update(self, modules):
        """Add ``modules``: a mapping, or (name, module) pairs."""
        items = modules.items() if hasattr(modules, "items") else modules
        for key, module in items:
            self[key] = module
