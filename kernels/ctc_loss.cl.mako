## The connectionist temporal classification loss (torch.nn.functional.ctc_loss): the negative
## log-likelihood of each target over every alignment of it to the input's time steps, by the
## forward (alpha) and backward (beta) recursions in log space (ops/ctc_loss.py).
##
## Layout: log_probs (T, N, C) dense; targets int64, batch entry n's labels at
## targets[target_off[n] ..] (target_len[n] of them); input_len[n] <= T time steps. The
## extended target of n interleaves blanks: state s (0 .. 2 L) is the blank for even s, label
## (s - 1) / 2 for odd s. alpha and beta are (N, T, STATES) workspaces (STATES >= 2 L + 1 for
## every n), -inf where no alignment reaches.
##
## Kernels (one work-group of GROUP items per batch entry; the states of a time step in
## parallel, the time steps in order with a barrier between them):
##   ctc_alpha(T, N, C, STATES, blank, lp, lp_off, targets, target_off, target_len, input_len,
##             alpha, nll)
##     alpha[n, t, s] = log of the probability of the prefixes ending in state s at t; nll[n] =
##     -log(alpha[n, T_n - 1, 2 L] + alpha[n, T_n - 1, 2 L - 1]) (inf where no alignment fits;
##     0 for an empty target over no step).
##   ctc_gradient(T, N, C, STATES, blank, lp, lp_off, targets, target_off, target_len,
##                input_len, alpha, beta, z, nll, scale, zero_infinity, grad, grad_off)
##     beta like alpha from the end, then grad[t, n, c] = scale[n] (exp(lp[t, n, c]) -
##     sum over the states s of label c of exp(alpha + beta - lp[t, n, c] - z[n, t])), torch's
##     form (the derivative through a log_softmax that produced lp); 0 for t >= T_n, and for
##     every t where zero_infinity and nll[n] is inf. z[n, t] (a (N, T) workspace) is the log
##     of the sum over s of exp(alpha + beta - lp) at step t: -nll in exact arithmetic, taken
##     per step so that the rounding alpha and beta gathered over the steps before and after t,
##     common to every state of the step, cancels (against -nll the occupancies were off by
##     about 1e-4 after 50 steps in float32). Each class's sum is made by one item in a fixed
##     order (the blank's over the even states, a label's over its occurrences from the first).
##
## Template parameters:
##   GROUP   work-items per group (a power of two)

#define NEG_INF (-INFINITY)

// log(exp(a) + exp(b)), -inf when both are.
inline float log_add(float a, float b)
{
    const float m = fmax(a, b);
    if (m == NEG_INF)
        return NEG_INF;
    return m + log1p(exp(-fabs(a - b)));
}

// The class of extended state s.
inline long state_label(int s, int blank, __global const long *labels)
{
    return (s & 1) ? labels[s >> 1] : (long)blank;
}

// Whether state s may be entered from s - 2 (a label that differs from the one before it).
inline bool skips(int s, int blank, __global const long *labels)
{
    return (s & 1) && s >= 2 && labels[s >> 1] != labels[(s >> 1) - 1];
}

__kernel __attribute__((reqd_work_group_size(${GROUP}, 1, 1)))
void ctc_alpha(const int T, const int N, const int C, const int STATES, const int blank,
               __global const float *lp, const long lp_off,
               __global const long *targets, __global const long *target_off,
               __global const long *target_len, __global const long *input_len,
               __global float *alpha, __global float *nll)
{
    const int n = get_group_id(0), lid = get_local_id(0);
    const int Tn = (int)input_len[n], L = (int)target_len[n], states = 2 * L + 1;
    __global const long *labels = targets + target_off[n];
    __global const float *lpn = lp + lp_off + (long)n * C;
    const long step = (long)N * C;
    __global float *a = alpha + (long)n * T * STATES;
    if (Tn > 0) {
        for (int s = lid; s < states; s += ${GROUP})
            a[s] = s < 2 ? lpn[state_label(s, blank, labels)] : NEG_INF;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int t = 1; t < Tn; ++t) {
        __global const float *prev = a + (long)(t - 1) * STATES;
        __global float *cur = a + (long)t * STATES;
        for (int s = lid; s < states; s += ${GROUP}) {
            float v = prev[s];
            if (s >= 1) v = log_add(v, prev[s - 1]);
            if (skips(s, blank, labels)) v = log_add(v, prev[s - 2]);
            cur[s] = v + lpn[t * step + state_label(s, blank, labels)];
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
    if (lid == 0) {
        if (Tn == 0) {
            nll[n] = L == 0 ? 0.0f : INFINITY;
        } else {
            __global const float *last = a + (long)(Tn - 1) * STATES;
            const float end = states > 1 ? log_add(last[states - 1], last[states - 2])
                                         : last[states - 1];
            nll[n] = -end;
        }
    }
}

__kernel __attribute__((reqd_work_group_size(${GROUP}, 1, 1)))
void ctc_gradient(const int T, const int N, const int C, const int STATES, const int blank,
                  __global const float *lp, const long lp_off,
                  __global const long *targets, __global const long *target_off,
                  __global const long *target_len, __global const long *input_len,
                  __global const float *alpha, __global float *beta, __global float *z,
                  __global const float *nll, __global const float *scale,
                  const int zero_infinity, __global float *grad, const long grad_off)
{
    const int n = get_group_id(0), lid = get_local_id(0);
    const int Tn = (int)input_len[n], L = (int)target_len[n], states = 2 * L + 1;
    __global const long *labels = targets + target_off[n];
    __global const float *lpn = lp + lp_off + (long)n * C;
    const long step = (long)N * C;
    __global const float *a = alpha + (long)n * T * STATES;
    __global float *b = beta + (long)n * T * STATES;
    const float loss = nll[n];
    const bool zeroed = zero_infinity && isinf(loss);
    const float g = scale[n];
    // beta from the last step back.
    if (Tn > 0) {
        __global float *last = b + (long)(Tn - 1) * STATES;
        for (int s = lid; s < states; s += ${GROUP})
            last[s] = s >= states - 2 ? lpn[(Tn - 1) * step + state_label(s, blank, labels)]
                                      : NEG_INF;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int t = Tn - 2; t >= 0; --t) {
        __global const float *next = b + (long)(t + 1) * STATES;
        __global float *cur = b + (long)t * STATES;
        for (int s = lid; s < states; s += ${GROUP}) {
            float v = next[s];
            if (s + 1 < states) v = log_add(v, next[s + 1]);
            if (s + 2 < states && skips(s + 2, blank, labels)) v = log_add(v, next[s + 2]);
            cur[s] = v + lpn[t * step + state_label(s, blank, labels)];
        }
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
    // Each step's normalizer: the states' log-sum-exp, as a tree in local memory.
    __local float part[${GROUP}];
    __global float *zn = z + (long)n * T;
    for (int t = 0; t < Tn; ++t) {
        __global const float *at = a + (long)t * STATES;
        __global const float *bt = b + (long)t * STATES;
        float acc = NEG_INF;
        for (int s = lid; s < states; s += ${GROUP})
            acc = log_add(acc, at[s] + bt[s] - lpn[t * step + state_label(s, blank, labels)]);
        part[lid] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int width = ${GROUP} / 2; width > 0; width >>= 1) {
            if (lid < width)
                part[lid] = log_add(part[lid], part[lid + width]);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (lid == 0)
            zn[t] = part[0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    // Every class: exp(lp) g inside the input's steps, 0 past them (or everywhere when zeroed).
    __global float *gn = grad + grad_off + (long)n * C;
    for (int t = 0; t < T; ++t)
        for (int c = lid; c < C; c += ${GROUP})
            gn[t * step + c] = (t < Tn && !zeroed) ? exp(lpn[t * step + c]) * g : 0.0f;
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (zeroed)
        return;
    // Then the occupancies taken off: item u = 0 the blank's, u = j + 1 label j's where j is
    // the label's first occurrence in the target (its later occurrences summed with it).
    for (int u = lid; u <= L; u += ${GROUP}) {
        const long label = u == 0 ? (long)blank : labels[u - 1];
        bool first = true;
        for (int k = 0; u > 0 && k < u - 1; ++k)
            if (labels[k] == label) first = false;
        if (!first)
            continue;
        for (int t = 0; t < Tn; ++t) {
            const float lpc = lpn[t * step + label] + zn[t];
            __global const float *at = a + (long)t * STATES;
            __global const float *bt = b + (long)t * STATES;
            float occupancy = 0.0f;
            if (u == 0) {
                for (int s = 0; s < states; s += 2)
                    occupancy += exp(at[s] + bt[s] - lpc);
            } else {
                for (int k = u - 1; k < L; ++k)
                    if (labels[k] == label)
                        occupancy += exp(at[2 * k + 1] + bt[2 * k + 1] - lpc);
            }
            gn[t * step + label] -= occupancy * g;
        }
    }
}
