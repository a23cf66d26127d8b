"""torch.optim.Adam and AdamW: one fused launch per chunk of parameters (see
``dlprim_py.optim``)."""
import math

import numpy as np

from ..errors import ShapeError
from ..tensor import Tensor
from . import fused
from .optimizer import Optimizer, check_number


class Adam(Optimizer):
    """Adam with torch's semantics (``weight_decay`` added to the gradient; AdamW, or
    ``decoupled_weight_decay=True``, decouples it), per parameter and step t (the parameter's
    own count of steps with a gradient):

        d = -g if maximize else g;  d += weight_decay * p          (Adam)
        p *= 1 - lr * weight_decay                                 (AdamW)
        m = lerp(m, d, 1 - beta1);  v = beta2 * v + (1 - beta2) * d^2
        amsgrad: v_max = max(v_max, v), used for v below
        p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    State per parameter: ``step`` (a number; a float32 array in ``state_dict``), ``exp_avg``,
    ``exp_avg_sq`` and with amsgrad ``max_exp_avg_sq`` (dp.Tensors)."""

    name = "Adam"
    tensor_state = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, foreach=foreach, maximize=maximize,
                                      capturable=capturable, differentiable=differentiable,
                                      fused=fused,
                                      decoupled_weight_decay=bool(decoupled_weight_decay)))

    def _check_group(self, group):
        what = self.name
        check_number("learning rate", group["lr"], 0.0, what=what)
        check_number("epsilon value", group["eps"], 0.0, what=what)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ShapeError(f"{what}: betas must be a pair of numbers in [0, 1), got {betas!r}")
        check_number("beta parameter at index 0", betas[0], 0.0, 1.0, what=what)
        check_number("beta parameter at index 1", betas[1], 0.0, 1.0, what=what)
        check_number("weight_decay value", group["weight_decay"], 0.0, what=what)

    def _step_group(self, group, params):
        ctx = self.ctx
        amsgrad = bool(group["amsgrad"])
        beta1, beta2 = (float(b) for b in group["betas"])
        lr = float(group["lr"])
        decay = float(group["weight_decay"])
        states = []
        for p in params:
            state = self.state.setdefault(p, {})
            if "exp_avg" not in state:
                state["step"] = 0.0
                state["exp_avg"] = Tensor.zeros(ctx, p.shape)
                state["exp_avg_sq"] = Tensor.zeros(ctx, p.shape)
                if amsgrad:
                    state["max_exp_avg_sq"] = Tensor.zeros(ctx, p.shape)
            elif amsgrad and state.get("max_exp_avg_sq") is None:
                state["max_exp_avg_sq"] = Tensor.zeros(ctx, p.shape)
            state["step"] = float(state["step"]) + 1.0
            states.append(state)
        # Empty parameters have state and a step count (as in torch) but take no slot.
        live = [i for i, p in enumerate(params) if p.size]
        if not live:
            return
        params = [params[i] for i in live]
        states = [states[i] for i in live]
        tensors = [t for p in params for t in (p, p.grad)]
        tensors += [s[n] for s in states for n in ("exp_avg", "exp_avg_sq")]
        if amsgrad:
            tensors += [s["max_exp_avg_sq"] for s in states]
        index_t, index = fused.index_type(tensors)
        ibytes = np.dtype(index).itemsize
        slots = fused.slot_count(ctx, fused.slot_bytes(5 if amsgrad else 4, 2, ibytes))
        mode = 0 if decay == 0 else 2 if group.get("decoupled_weight_decay") else 1
        head = (np.float32(beta2), np.float32(1 - beta1), np.float32(1 - beta2),
                np.float32(group["eps"]), np.float32(1.0 - lr * decay), np.float32(decay))
        corrections = {}
        for position, start in enumerate(range(0, len(params), slots)):
            chunk = range(start, min(start + slots, len(params)))
            scalars = []
            for i in chunk:
                # float32 step counts, as torch keeps them, then double arithmetic.
                step = float(np.float32(states[i]["step"]))
                pair = corrections.get(step)
                if pair is None:
                    bias_correction1 = 1 - beta1 ** step
                    bias_correction2 = 1 - beta2 ** step
                    pair = corrections[step] = (np.float32(lr / bias_correction1),
                                                np.float32(math.sqrt(bias_correction2)))
                scalars.append(pair)
            # One pair for the launch where every slot has the same step count.
            per_slot = any(pair is not scalars[0] for pair in scalars)

            def slot_args(chunk=chunk, scalars=scalars, per_slot=per_slot):
                made = []
                for i, pair in zip(chunk, scalars):
                    p, g, state = params[i], params[i].grad, states[i]
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                    args = [index(p.size)]
                    if per_slot:
                        args += pair
                    args += [p.buffer, index(p.offset_elements), g.buffer,
                             index(g.offset_elements), m.buffer, index(m.offset_elements),
                             v.buffer, index(v.offset_elements)]
                    if amsgrad:
                        vmax = state["max_exp_avg_sq"]
                        args += [vmax.buffer, index(vmax.offset_elements)]
                    made.append(args)
                return made

            # Every slot argument as plain numbers, where the bias corrections are the launch's
            # (per slot they change every step: no signature, the arguments are compared).
            signature = None
            if not per_slot:
                signature = [index_t]
                names = (("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad
                         else ("exp_avg", "exp_avg_sq"))
                for i in chunk:
                    signature += fused.tensors_signature(params[i], params[i].grad,
                                                         *(states[i][n] for n in names))
                signature = tuple(signature)
            params_key = (("kernel", "adam"), ("slots", slots), ("index_t", index_t),
                          ("decay", mode), ("amsgrad", int(amsgrad)),
                          ("maximize", int(bool(group["maximize"]))), ("per_slot", int(per_slot)))
            elements = max(params[i].size for i in chunk)
            fused.run(ctx, "adam_step", params_key, position,
                      head if per_slot else head + scalars[0], slots, slot_args, elements,
                      owner=self._kernel_owner(group), signature=signature)


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (p *= 1 - lr * weight_decay before the update),
    torch's default weight_decay 1e-2."""

    name = "AdamW"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
