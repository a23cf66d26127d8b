## Fused optimizer updates and gradient clipping (dlprim_py/optim, dlprim_py/nn/utils.py).
##
## OpenCL kernels cannot take an array of buffers, so every kernel here takes a fixed number of
## "slots" (the template's `slots`), each a tensor given as (element count, buffer, element
## offset, ...): one launch updates up to `slots` parameters, with their gradients and state.
## A slot of count 0 is unused (its buffers are those of slot 0 and are never touched). Each
## work item walks every slot with a grid-stride loop over the slot's elements, so one launch
## covers tensors of any sizes with no per-element search for the slot.
##
## Everything that changes from step to step (the learning rate, momentum, betas, the bias
## corrections of each parameter's step count) is a run-time scalar argument; the template's
## parameters are the slot count, the index type and the options that select code paths.
##
## sgd_step(lr, weight_decay, momentum, one_minus_dampening, fresh,
##          per slot k: n_k, p_k, p_off_k, g_k, g_off_k [, buf_k, buf_off_k])
##   torch.optim.SGD's update (torch's _single_tensor_sgd, in float32):
##     d = maximize ? -g : g;  d += weight_decay * p  (when decay)
##     with momentum: buf = (bit k of fresh) ? d : momentum * buf + (1 - dampening) * d
##                    d = nesterov ? d + momentum * buf : buf
##     p -= lr * d
##
## adam_step(beta2, one_minus_beta1, one_minus_beta2, eps, decay_factor, weight_decay,
##           [step_size, bc2_sqrt,]
##           per slot k: n_k, [step_size_k, bc2_sqrt_k,] p_k, p_off_k, g_k, g_off_k,
##                       m_k, m_off_k, v_k, v_off_k [, vmax_k, vmax_off_k])
##   torch.optim.Adam / AdamW (torch's _single_tensor_adam, in float32):
##     d = maximize ? -g : g
##     decoupled (AdamW): p *= decay_factor (= 1 - lr * weight_decay)
##     else with decay:   d += weight_decay * p
##     m = lerp(m, d, 1 - beta1);  v = beta2 * v + (1 - beta2) * d * d
##     amsgrad: vmax = max(vmax, v), read in place of v below
##     p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
##   1 - beta1, 1 - beta2, 1 - dampening and decay_factor are computed in double on the host, as
##   torch computes these scalars before they meet a float32 tensor.
##   step_size_k = lr / (1 - beta1^step) and bc2_sqrt_k = sqrt(1 - beta2^step) are computed in
##   double on the host from slot k's own step count; where every slot of a launch has the same
##   count (the usual case) they are passed once, before the slots (per_slot = 0), so that a
##   step sets two scalar arguments per launch rather than two per slot.
##
## norm_partial(partials, base, power, per slot k: n_k, g_k, g_off_k)
##   Work group w writes partials[base + w]: the sum over its share of every slot's elements of
##   |x|^2 (norm "2"), |x| ("1"), |x|^power ("p"), or their maximum ("inf").
## norm_finish(partials, count, result, max_norm, inv_power)
##   One work group: result[0] = the total norm of partials[0 .. count), result[1] = the clip
##   coefficient max_norm / (total + 1e-6), clamped to at most 1 (NaN stays NaN, as torch's
##   clamp leaves it).
## scale_grads(result, per slot k: n_k, g_k, g_off_k)
##   g *= result[1].
## clamp_grads(limit, per slot k: n_k, g_k, g_off_k)
##   g = min(max(g, -limit), limit), NaN kept (torch's clamp).
##
## Template parameters:
##   kernel      "sgd", "adam", "norm", "scale", "clamp"
##   slots       tensors per launch
##   index_t     "int" when every count and offset fits in 31 bits, else "long"
##   sgd:  decay, momentum, nesterov, maximize (0/1)
##   adam: decay (0: none, 1: added to the gradient, 2: decoupled), amsgrad, maximize (0/1),
##         per_slot (1: bias corrections per slot, 0: one pair for the launch)
##   norm: norm ("2", "1", "inf", "p"), group (work-group size, a power of two)
<%
    K = range(slots)
%>
% if kernel == "sgd":
__kernel void sgd_step(float lr, float weight_decay, float momentum, float one_minus_dampening,
                       uint fresh
% for k in K:
                       , ${index_t} n${k}, __global float* p${k}, ${index_t} p_off${k}
                       , __global const float* g${k}, ${index_t} g_off${k}
    % if momentum:
                       , __global float* buf${k}, ${index_t} buf_off${k}
    % endif
% endfor
                       )
{
    const ${index_t} step = get_global_size(0);
% for k in K:
    for (${index_t} i = get_global_id(0); i < n${k}; i += step) {
        const float w = p${k}[p_off${k} + i];
        float d = g${k}[g_off${k} + i];
    % if maximize:
        d = -d;
    % endif
    % if decay:
        d = d + weight_decay * w;
    % endif
    % if momentum:
        float b;
        if (fresh & (1u << ${k})) {
            b = d;
        } else {
            b = buf${k}[buf_off${k} + i] * momentum;
            b = b + one_minus_dampening * d;
        }
        buf${k}[buf_off${k} + i] = b;
        % if nesterov:
        d = d + momentum * b;
        % else:
        d = b;
        % endif
    % endif
        p${k}[p_off${k} + i] = w - lr * d;
    }
% endfor
}
% elif kernel == "adam":
<%
    step_size = (lambda k: f"step_size{k}") if per_slot else (lambda k: "step_size")
    bc2_sqrt = (lambda k: f"bc2_sqrt{k}") if per_slot else (lambda k: "bc2_sqrt")
%>
__kernel void adam_step(float beta2, float one_minus_beta1, float one_minus_beta2, float eps,
                        float decay_factor, float weight_decay
% if not per_slot:
                        , float step_size, float bc2_sqrt
% endif
% for k in K:
                        , ${index_t} n${k}
    % if per_slot:
                        , float step_size${k}, float bc2_sqrt${k}
    % endif
                        , __global float* p${k}, ${index_t} p_off${k}
                        , __global const float* g${k}, ${index_t} g_off${k}
                        , __global float* m${k}, ${index_t} m_off${k}
                        , __global float* v${k}, ${index_t} v_off${k}
    % if amsgrad:
                        , __global float* vmax${k}, ${index_t} vmax_off${k}
    % endif
% endfor
                        )
{
    const ${index_t} step = get_global_size(0);
% for k in K:
    for (${index_t} i = get_global_id(0); i < n${k}; i += step) {
        float w = p${k}[p_off${k} + i];
        float d = g${k}[g_off${k} + i];
    % if maximize:
        d = -d;
    % endif
    % if decay == 2:
        w = w * decay_factor;
    % elif decay == 1:
        d = d + weight_decay * w;
    % endif
        float m = m${k}[m_off${k} + i];
        // torch's lerp: start + weight * (end - start) for a weight below 0.5, else
        // end - (end - start) * (1 - weight).
        if (one_minus_beta1 < 0.5f)
            m = m + one_minus_beta1 * (d - m);
        else
            m = d - (d - m) * (1.0f - one_minus_beta1);
        float v = v${k}[v_off${k} + i] * beta2;
        v = v + one_minus_beta2 * (d * d);
        m${k}[m_off${k} + i] = m;
        v${k}[v_off${k} + i] = v;
    % if amsgrad:
        // torch.maximum: a NaN in either wins (fmax would drop it).
        const float held = vmax${k}[vmax_off${k} + i];
        v = (isnan(held) || isnan(v)) ? NAN : fmax(held, v);
        vmax${k}[vmax_off${k} + i] = v;
    % endif
        const float denom = sqrt(v) / ${bc2_sqrt(k)} + eps;
        p${k}[p_off${k} + i] = w + (-${step_size(k)}) * (m / denom);
    }
% endfor
}
% elif kernel == "norm":
<%
    if norm == "2":
        term = "x * x"
    elif norm == "1":
        term = "fabs(x)"
    elif norm == "inf":
        term = "fabs(x)"
    else:
        term = "pow(fabs(x), power)"
    combine = "fmax" if norm == "inf" else None
%>
inline float combine(float a, float b)
{
% if combine:
    // A NaN in either wins, as torch's max of absolute values gives NaN.
    return (isnan(a) || isnan(b)) ? NAN : fmax(a, b);
% else:
    return a + b;
% endif
}

__kernel void norm_partial(__global float* partials, ${index_t} base, float power
% for k in K:
                           , ${index_t} n${k}, __global const float* g${k}, ${index_t} g_off${k}
% endfor
                           )
{
    __local float scratch[${group}];
    const ${index_t} step = get_global_size(0);
    float acc = 0.0f;
% for k in K:
    for (${index_t} i = get_global_id(0); i < n${k}; i += step) {
        const float x = g${k}[g_off${k} + i];
        acc = combine(acc, ${term});
    }
% endfor
    const int lid = get_local_id(0);
    scratch[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = ${group} / 2; width > 0; width /= 2) {
        if (lid < width)
            scratch[lid] = combine(scratch[lid], scratch[lid + width]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        partials[base + get_group_id(0)] = scratch[0];
}

__kernel void norm_finish(__global const float* partials, int count, __global float* result,
                          float max_norm, float inv_power)
{
    __local float scratch[${group}];
    const int lid = get_local_id(0);
    float acc = 0.0f;
    for (int i = lid; i < count; i += ${group})
        acc = combine(acc, partials[i]);
    scratch[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = ${group} / 2; width > 0; width /= 2) {
        if (lid < width)
            scratch[lid] = combine(scratch[lid], scratch[lid + width]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        float total = scratch[0];
% if norm == "2":
        total = sqrt(total);
% elif norm == "p":
        total = pow(total, inv_power);
% endif
        const float coef = max_norm / (total + 1e-6f);
        result[0] = total;
        result[1] = coef > 1.0f ? 1.0f : coef;
    }
}
% elif kernel == "scale":
__kernel void scale_grads(__global const float* result
% for k in K:
                          , ${index_t} n${k}, __global float* g${k}, ${index_t} g_off${k}
% endfor
                          )
{
    const float coef = result[1];
    const ${index_t} step = get_global_size(0);
% for k in K:
    for (${index_t} i = get_global_id(0); i < n${k}; i += step)
        g${k}[g_off${k} + i] *= coef;
% endfor
}
% elif kernel == "clamp":
__kernel void clamp_grads(float limit
% for k in K:
                          , ${index_t} n${k}, __global float* g${k}, ${index_t} g_off${k}
% endfor
                          )
{
    const ${index_t} step = get_global_size(0);
% for k in K:
    for (${index_t} i = get_global_id(0); i < n${k}; i += step) {
        const float x = g${k}[g_off${k} + i];
        g${k}[g_off${k} + i] = x < -limit ? -limit : (x > limit ? limit : x);
    }
% endfor
}
% endif
