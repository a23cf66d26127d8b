"""A small reverse-mode tape.

An operator that produced ``out`` from ``inputs`` calls ``record(out, inputs, backward)``;
``backward(grad_out)`` returns one gradient (a Tensor or None) per input. ``Tensor.backward``
walks the graph in reverse topological order, summing gradients where a tensor feeds several
operators, and accumulates into ``.grad`` of the leaves that require gradients.
"""
import contextlib
import threading

from .errors import GraphError, ShapeError

_state = threading.local()


def grad_enabled():
    return getattr(_state, "enabled", True)


@contextlib.contextmanager
def no_grad():
    """Inside this block operators record nothing on the tape."""
    previous = grad_enabled()
    _state.enabled = False
    try:
        yield
    finally:
        _state.enabled = previous


@contextlib.contextmanager
def enable_grad():
    """Inside this block operators record on the tape again (within a ``no_grad`` block)."""
    previous = grad_enabled()
    _state.enabled = True
    try:
        yield
    finally:
        _state.enabled = previous


class Node:
    """How to send an output's gradient back to the inputs that produced it."""

    __slots__ = ("backward", "inputs", "name")

    def __init__(self, backward, inputs, name):
        self.backward = backward
        self.inputs = inputs
        self.name = name

    def __repr__(self):
        return f"<{self.name}Backward>"


def needs_grad(*inputs):
    """True when recording is on and some input (Tensors, None or numbers) requires a
    gradient."""
    # The inputs first: in inference no input requires a gradient, and their flags are
    # cheaper to read than the thread's recording switch.
    for t in inputs:
        if t is not None and getattr(t, "requires_grad", False):
            return getattr(_state, "enabled", True)
    return False


def record(output, inputs, backward, name="op"):
    """Attach ``backward`` to ``output`` if any of ``inputs`` requires a gradient."""
    inputs = tuple(inputs)
    if needs_grad(*inputs):
        output.requires_grad = True
        output.grad_fn = Node(backward, inputs, name)
    return output


def _topological_order(root):
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        tensor, expanded = stack.pop()
        if expanded:
            order.append(tensor)
            continue
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        stack.append((tensor, True))
        if tensor.grad_fn is not None:
            for t in tensor.grad_fn.inputs:
                if t is not None and t.requires_grad and id(t) not in seen:
                    stack.append((t, False))
    return order[::-1]


def _accumulate(current, extra):
    if current is None:
        return extra
    with no_grad():
        # Tensor's + (the pointwise family's add): the tape imports no operator module.
        return current + extra


def backward(root, grad=None, retain_graph=False):
    """Run the graph behind ``root`` backwards (see ``Tensor.backward``). Each node's backward
    (and the tensors it saved) is released after it runs unless ``retain_graph``: running
    through it again raises GraphError, as torch does, instead of silently adding the same
    gradients again."""
    Tensor = type(root)
    if not root.requires_grad:
        raise ShapeError("backward() on a tensor that does not require grad "
                         "(no input of the computation had requires_grad=True)")
    if grad is None:
        if root.size != 1:
            raise ShapeError(f"backward() without a gradient needs a one-element tensor, "
                             f"got shape {root.shape}; pass grad=")
        grad = Tensor.full(root.ctx, root.shape, 1.0, root.dtype)
    elif not isinstance(grad, Tensor):
        raise ShapeError(f"grad must be a Tensor, got {type(grad).__name__}")
    elif grad.shape != root.shape:
        raise ShapeError(f"grad has shape {grad.shape}, the tensor has {root.shape}")
    grads = {id(root): grad}
    order = _topological_order(root)
    for tensor in order:
        node = tensor.grad_fn
        if node is not None and node.backward is None:
            raise GraphError(f"backward through the graph a second time: {node.name}'s saved "
                             f"tensors were freed by an earlier backward; pass "
                             f"retain_graph=True to that backward to run the graph again")
    with no_grad():
        for tensor in order:
            g = grads.pop(id(tensor), None)
            if g is None:
                continue
            node = tensor.grad_fn
            if node is None:
                tensor.grad = _accumulate(tensor.grad, g)
                continue
            input_grads = node.backward(g)
            if not retain_graph:
                node.backward = None
            if len(input_grads) != len(node.inputs):
                raise RuntimeError(f"{node.name} backward returned {len(input_grads)} gradients "
                                   f"for {len(node.inputs)} inputs")
            for t, ig in zip(node.inputs, input_grads):
                if t is None or ig is None or not t.requires_grad:
                    continue
                if ig.shape != t.shape:
                    raise RuntimeError(f"{node.name} backward gave a {ig.shape} gradient for a "
                                       f"{t.shape} input")
                grads[id(t)] = _accumulate(grads.get(id(t)), ig)
