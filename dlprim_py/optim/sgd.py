"""torch.optim.SGD: one fused launch per chunk of parameters (see ``dlprim_py.optim``)."""
import numpy as np

from ..errors import ShapeError
from ..tensor import Tensor
from . import fused
from .optimizer import Optimizer, check_number


class SGD(Optimizer):
    """Stochastic gradient descent with torch's semantics:

        d = -g if maximize else g;  d += weight_decay * p
        momentum: buf = d on a parameter's first step, else momentum * buf + (1 - dampening) * d;
                  d = d + momentum * buf if nesterov else buf
        p -= lr * d

    State per parameter: ``momentum_buffer`` (a dp.Tensor, or None without momentum)."""

    name = "SGD"
    tensor_state = ("momentum_buffer",)

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))

    def _check_group(self, group):
        what = self.name
        check_number("learning rate", group["lr"], 0.0, what=what)
        momentum = check_number("momentum", group["momentum"], 0.0, what=what)
        dampening = check_number("dampening", group["dampening"], what=what)
        check_number("weight_decay", group["weight_decay"], 0.0, what=what)
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ShapeError(f"{what}: Nesterov momentum requires a momentum and zero dampening "
                             f"(got momentum={momentum}, dampening={dampening})")

    def _step_group(self, group, params):
        ctx = self.ctx
        momentum = float(group["momentum"])
        decay = float(group["weight_decay"])
        with_momentum = momentum != 0
        fresh = []
        buffers = []
        for p in params:
            state = self.state.setdefault(p, {})
            if not with_momentum:
                state.setdefault("momentum_buffer", None)
                buffers.append(None)
                fresh.append(False)
                continue
            buf = state.get("momentum_buffer")
            fresh.append(buf is None)
            if buf is None:
                buf = state["momentum_buffer"] = Tensor.empty(ctx, p.shape)
            buffers.append(buf)
        # Empty parameters have state (as in torch) but take no slot.
        live = [i for i, p in enumerate(params) if p.size]
        if not live:
            return
        params = [params[i] for i in live]
        fresh = [fresh[i] for i in live]
        buffers = [buffers[i] for i in live]
        index_t, index = fused.index_type([t for p in params for t in (p, p.grad)] + buffers)
        ibytes = np.dtype(index).itemsize
        slots = fused.slot_count(ctx, fused.slot_bytes(3 if with_momentum else 2, 0, ibytes))
        params_key = (("kernel", "sgd"), ("slots", slots), ("index_t", index_t),
                      ("decay", int(decay != 0)), ("momentum", int(with_momentum)),
                      ("nesterov", int(bool(group["nesterov"]))),
                      ("maximize", int(bool(group["maximize"]))))
        lr = np.float32(group["lr"])
        head_common = (lr, np.float32(decay), np.float32(momentum),
                       np.float32(1 - float(group["dampening"])))
        for position, start in enumerate(range(0, len(params), slots)):
            chunk = range(start, min(start + slots, len(params)))
            mask = 0
            signature = []
            for k, i in enumerate(chunk):
                state = (buffers[i],) if with_momentum else ()
                signature += fused.tensors_signature(params[i], params[i].grad, *state)
                if with_momentum and fresh[i]:
                    mask |= 1 << k

            def slot_args(chunk=chunk):
                made = []
                for i in chunk:
                    p, g = params[i], params[i].grad
                    args = [index(p.size), p.buffer, index(p.offset_elements), g.buffer,
                            index(g.offset_elements)]
                    if with_momentum:
                        args += [buffers[i].buffer, index(buffers[i].offset_elements)]
                    made.append(args)
                return made

            elements = max(params[i].size for i in chunk)
            # The signature (every slot argument as plain numbers) lets a step whose slots are
            # the last step's set only the head.
            fused.run(ctx, "sgd_step", params_key, position, head_common + (np.uint32(mask),),
                      slots, slot_args, elements, owner=self._kernel_owner(group),
                      signature=(index_t, tuple(signature)))
