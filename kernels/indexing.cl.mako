## Indexing and selection: gather / index_select, scatter, the deterministic scatter_add /
## index_add, isin, tril / triu, arange / linspace, one_hot, embedding_bag and the renorm of
## embedding's max_norm (dlprim_py/ops/indexing.py).
##
## A tensor indexed along one dimension is seen as (O, D, I): O the product of the sizes before
## the dimension, D its size, I the product of the sizes after it; an index (or a source) as
## (O, L, I). Every kernel is a grid-stride loop over its flat output, so one compile serves
## every shape; sizes, offsets and strides are run-time arguments, in elements.
##
## An index outside [0, D) is never used for an access: the kernel skips it (an output element
## it would have produced is 0) and records it in ``flag`` (long[3]: set, the index, the size),
## which the host reads at the next synchronizing call and raises on.
##
## Kernels (T: the element type):
##   gather_dim(total, L, I, D, x, x_off, idx, idx_off, idx_sO, idx_sL, idx_sI, y, y_off, flag)
##     y[o, l, i] = x[o, idx[o*sO + l*sL + i*sI], i] over the (O, L, I) output: gather with
##     the index's own strides (sO, sL, sI) = (L*I, I, 1), index_select and embedding with
##     (0, 1, 0).
##   gather_last4(total4, L, D, x, x_off, idx, idx_off, y, y_off, flag)
##     gather_dim for I = 1, a dense index and L % 4 == 0: four outputs per item (total4 of
##     them), the index read as long4.
##   select_rows4(total4, L, I4, D, x, x_off, idx, idx_off, y, y_off, flag)
##     index_select / embedding's gather_dim (index strides (0, 1, 0)) for I = 4 * I4: a
##     4-vector of a row per item.
##   scatter_dim(total, L, I, D, src, src_off, value, use_value, idx, idx_off, y, y_off, flag)
##     y[o, idx[o, l, i], i] = src[o, l, i] (or ``value``) over the (O, L, I) index; where two
##     entries name one element, one of the writes wins (torch leaves it unspecified too).
##   scatter_add_loop(total, D, I, L, src, src_off, idx, idx_off, idx_sO, idx_sL, idx_sI,
##                    y, y_off, alpha, flag)
##     y[o, d, i] += alpha * sum over l of src[o, l, i] where idx[o, l, i] == d, one work item
##     per element of y summing in index order: deterministic, O(D * L) per column.
##   index_add_sorted(total, L, I, D, keys, perm, src, src_off, y, y_off, alpha, flag)
##     index_add through the index sorted (stably) into ``keys`` with the positions ``perm``:
##     the item of the first position of each run of equal keys sums the run's source rows in
##     position order and adds the sum once: deterministic, O(L) in all.
##   isin_any(total, x, x_off, t, t_off, M, invert, y, y_off)
##     y = (x equals one of the M elements of t) != invert, as 0 / 1 bytes.
##   triangle(total, R, C, diagonal, upper, x, x_off, y, y_off)
##     tril (upper = 0) / triu (upper = 1) of every trailing R x C matrix.
##   arange_fill(total, start, step, y, y_off)          y[i] = start + i * step
##   linspace_fill(total, start, end, step, y, y_off)    torch's two-sided formula
##   one_hot(total, C, idx, idx_off, y, y_off, flag)     y[n, c] = (idx[n] == c) as long
##   embedding_bag_forward / embedding_bag_expand       see their comments
##   embedding_renorm(count, E, keys, w, w_off, max_norm, norm_type)
##
## Template parameters:
##   dtype     OpenCL C element type (float, half, int, long, uchar)
##   index_t   "int" when every index fits in 31 bits, else "long"
<%
    T = dtype
    is_float = dtype in ("float", "half")
%>
% if dtype == "half":
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
% endif
#define index_t ${index_t}

// Records a bad index for the host: the first item to claim the flag (an atomic on its low
// 32 bits) writes the index and the size, so that no two items write the same word.
inline void report(__global long* flag, long value, long size)
{
    if (atomic_cmpxchg((volatile __global int*)flag, 0, 1) == 0) {
        flag[1] = value;
        flag[2] = size;
    }
}

__kernel void gather_dim(index_t total, index_t L, index_t I, long D,
                         __global const ${T}* x, index_t x_off,
                         __global const long* idx, index_t idx_off,
                         index_t idx_sO, index_t idx_sL, index_t idx_sI,
                         __global ${T}* y, index_t y_off, __global long* flag)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t i = g % I;
        const index_t r = g / I;
        const index_t l = r % L;
        const index_t o = r / L;
        const long v = idx[idx_off + o * idx_sO + l * idx_sL + i * idx_sI];
        ${T} out = (${T})0;
        if (v >= 0 && v < D)
            out = x[x_off + (o * (index_t)D + (index_t)v) * I + i];
        else
            report(flag, v, D);
        y[y_off + g] = out;
    }
}

// gather_dim where the gathered dimension is the last (I = 1) and rows of the index hold a
// multiple of 4: four outputs per item, the index read as one long4 and the four reads of x
// issued together (the dependent index-then-value loads of gather_dim leave one read of x in
// flight per item), the outputs written as one 4-vector. The host passes idx_off and y_off
// multiples of 4, so that both are whole aligned vectors: vload4 / vstore4 assume only the
// element's alignment, and NVIDIA's compiler then issues four scalar accesses.
__kernel void gather_last4(index_t total4, index_t L, long D,
                           __global const ${T}* x, index_t x_off,
                           __global const long* idx, index_t idx_off,
                           __global ${T}* y, index_t y_off, __global long* flag)
{
    for (index_t g4 = get_global_id(0); g4 < total4; g4 += get_global_size(0)) {
        const index_t g = 4 * g4;
        const index_t o = g / L;
        const long4 v = *(__global const long4*)(idx + idx_off + g);
        __global const ${T}* row = x + x_off + o * (index_t)D;
        ${T}4 out = (${T}4)(0);
        if (v.x >= 0 && v.x < D) out.x = row[v.x]; else report(flag, v.x, D);
        if (v.y >= 0 && v.y < D) out.y = row[v.y]; else report(flag, v.y, D);
        if (v.z >= 0 && v.z < D) out.z = row[v.z]; else report(flag, v.z, D);
        if (v.w >= 0 && v.w < D) out.w = row[v.w]; else report(flag, v.w, D);
        *(__global ${T}4*)(y + y_off + g) = out;
    }
}

// index_select / embedding (gather_dim with index strides (0, 1, 0)) where the rows copied
// hold a multiple of 4 elements (I = 4 * I4): a 4-vector per item, a quarter of the items and
// of their index reads. x_off and y_off are multiples of 4 (aligned vectors, as gather_last4).
__kernel void select_rows4(index_t total4, index_t L, index_t I4, long D,
                           __global const ${T}* x, index_t x_off,
                           __global const long* idx, index_t idx_off,
                           __global ${T}* y, index_t y_off, __global long* flag)
{
    for (index_t g4 = get_global_id(0); g4 < total4; g4 += get_global_size(0)) {
        const index_t i4 = g4 % I4;
        const index_t r = g4 / I4;
        const index_t l = r % L;
        const index_t o = r / L;
        const long v = idx[idx_off + l];
        ${T}4 out = (${T}4)(0);
        if (v >= 0 && v < D)
            out = *(__global const ${T}4*)(x + x_off
                                           + ((o * (index_t)D + (index_t)v) * I4 + i4) * 4);
        else
            report(flag, v, D);
        *(__global ${T}4*)(y + y_off + 4 * g4) = out;
    }
}

__kernel void scatter_dim(index_t total, index_t L, index_t I, long D,
                          __global const ${T}* src, index_t src_off, ${T} value, int use_value,
                          __global const long* idx, index_t idx_off,
                          __global ${T}* y, index_t y_off, __global long* flag)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t i = g % I;
        const index_t o = g / I / L;
        const long v = idx[idx_off + g];
        if (v >= 0 && v < D)
            y[y_off + (o * (index_t)D + (index_t)v) * I + i] = use_value ? value : src[src_off + g];
        else
            report(flag, v, D);
    }
}

% if dtype != "uchar":
__kernel void scatter_add_loop(index_t total, index_t D, index_t I, index_t L,
                               __global const ${T}* src, index_t src_off,
                               __global const long* idx, index_t idx_off,
                               index_t idx_sO, index_t idx_sL, index_t idx_sI,
                               __global ${T}* y, index_t y_off, ${T} alpha, __global long* flag)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t i = g % I;
        const index_t r = g / I;
        const index_t d = r % D;
        const index_t o = r / D;
        __global const long* row = idx + idx_off + o * idx_sO + i * idx_sI;
        __global const ${T}* from = src + src_off + o * L * I + i;
        ${T} acc = (${T})0;
        for (index_t l = 0; l < L; ++l) {
            const long v = row[l * idx_sL];
            if (v == (long)d)
                acc += from[l * I];
            else if (d == 0 && (v < 0 || v >= (long)D))
                report(flag, v, D);
        }
        // Where D is 0 there is no element to report from: the host refuses a non-empty
        // index into an empty dimension.
        y[y_off + g] += alpha * acc;
    }
}

__kernel void index_add_sorted(index_t total, index_t L, index_t I, long D,
                               __global const long* keys, __global const long* perm,
                               __global const ${T}* src, index_t src_off,
                               __global ${T}* y, index_t y_off, ${T} alpha,
                               __global long* flag)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t i = g % I;
        const index_t r = g / I;
        const index_t l = r % L;
        const index_t o = r / L;
        const long v = keys[l];
        if (l > 0 && keys[l - 1] == v)
            continue;                     // not the first of its run
        if (v < 0 || v >= D) {
            report(flag, v, D);
            continue;
        }
        ${T} acc = (${T})0;
        for (index_t j = l; j < L && keys[j] == v; ++j)
            acc += src[src_off + (o * L + (index_t)perm[j]) * I + i];
        y[y_off + (o * (index_t)D + (index_t)v) * I + i] += alpha * acc;
    }
}
% endif

__kernel void isin_any(index_t total, __global const ${T}* x, index_t x_off,
                       __global const ${T}* t, index_t t_off, index_t M, int invert,
                       __global uchar* y, index_t y_off)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const ${T} v = x[x_off + g];
        int found = 0;
        for (index_t j = 0; j < M && !found; ++j)
            found = (t[t_off + j] == v);
        y[y_off + g] = (uchar)(found != invert);
    }
}

__kernel void triangle(index_t total, index_t R, index_t C, long diagonal, int upper,
                       __global const ${T}* x, index_t x_off, __global ${T}* y, index_t y_off)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const long c = (long)(g % C);
        const long r = (long)((g / C) % R);
        const int keep = upper ? (c - r >= diagonal) : (c - r <= diagonal);
        y[y_off + g] = keep ? x[x_off + g] : (${T})0;
    }
}

% if dtype in ("float", "long", "int"):
<% S = "float" if dtype == "float" else "long" %>
__kernel void arange_fill(index_t total, ${S} start, ${S} step, __global ${T}* y, index_t y_off)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0))
        y[y_off + g] = (${T})(start + (${S})g * step);
}
% endif

% if dtype == "float":
// torch's linspace: from the start for the first half, from the end for the second, so that
// both ends are exact.
__kernel void linspace_fill(index_t total, float start, float end, float step,
                            __global float* y, index_t y_off)
{
    const index_t middle = total / 2;
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0))
        y[y_off + g] = g < middle ? start + step * (float)g : end - step * (float)(total - g - 1);
}

// max_norm of embedding: the item of the first position of each run of equal (sorted) keys
// scales that row of the weight to norm max_norm where its norm is larger (torch's
// embedding_renorm_: scale = max_norm / (norm + 1e-7)); rows named twice are scaled once.
__kernel void embedding_renorm(index_t count, index_t E, long V, __global const long* keys,
                               __global float* w, index_t w_off, float max_norm,
                               float norm_type)
{
    for (index_t g = get_global_id(0); g < count; g += get_global_size(0)) {
        const long v = keys[g];
        if ((g > 0 && keys[g - 1] == v) || v < 0 || v >= V)
            continue;
        __global float* row = w + w_off + (index_t)v * E;
        float norm = 0.0f;
        if (norm_type == 2.0f) {
            for (index_t e = 0; e < E; ++e)
                norm += row[e] * row[e];
            norm = sqrt(norm);
        } else if (norm_type == 1.0f) {
            for (index_t e = 0; e < E; ++e)
                norm += fabs(row[e]);
        } else if (isinf(norm_type)) {
            for (index_t e = 0; e < E; ++e)
                norm = fmax(norm, fabs(row[e]));
        } else {
            for (index_t e = 0; e < E; ++e)
                norm += pow(fabs(row[e]), norm_type);
            norm = pow(norm, 1.0f / norm_type);
        }
        if (norm > max_norm) {
            const float scale = max_norm / (norm + 1e-7f);
            for (index_t e = 0; e < E; ++e)
                row[e] *= scale;
        }
    }
}

// The bag b of embedding_bag: positions [start, end) of the flat index, clamped to [0, N).
// ``fixed`` > 0: a 2-d input, bags of ``fixed`` positions each; else from ``offsets``, the
// last of the ``bags_given`` bags ending at N.
inline void bag_range(index_t b, index_t N, index_t fixed, __global const long* offsets,
                      index_t off_off, index_t bags_given, index_t* start, index_t* end)
{
    long s, e;
    if (fixed > 0) {
        s = (long)b * fixed;
        e = s + fixed;
    } else {
        s = offsets[off_off + b];
        e = b + 1 < bags_given ? offsets[off_off + b + 1] : (long)N;
    }
    s = clamp(s, (long)0, (long)N);
    e = clamp(e, s, (long)N);
    *start = (index_t)s;
    *end = (index_t)e;
}

// y[b, e] = the sum (mode 0), mean (1) or max (2) over the bag's positions p (padding_idx
// left out) of w[idx[p], e], times psw[p] where use_psw; an empty bag gives 0. Mode 2 keeps the
// position of the maximum in ``arg`` (-1 for an empty bag), for the backward.
__kernel void embedding_bag_forward(index_t total, index_t E, index_t N, long V,
                                    __global const long* idx, index_t idx_off,
                                    __global const long* offsets, index_t off_off,
                                    index_t bags_given, index_t fixed,
                                    __global const float* w, index_t w_off,
                                    __global const float* psw, index_t psw_off, int use_psw,
                                    int mode, long padding_idx,
                                    __global float* y, index_t y_off,
                                    __global long* arg, index_t arg_off, __global long* flag)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t e = g % E;
        const index_t b = g / E;
        index_t start, end;
        bag_range(b, N, fixed, offsets, off_off, bags_given, &start, &end);
        float acc = mode == 2 ? -INFINITY : 0.0f;
        long best = -1;
        index_t count = 0;
        for (index_t p = start; p < end; ++p) {
            const long v = idx[idx_off + p];
            if (v == padding_idx)
                continue;
            if (v < 0 || v >= V) {
                report(flag, v, V);
                continue;
            }
            float value = w[w_off + (index_t)v * E + e];
            if (use_psw)
                value *= psw[psw_off + p];
            if (mode == 2) {
                if (best < 0 || value > acc) {
                    acc = value;
                    best = p;
                }
            } else {
                acc += value;
            }
            ++count;
        }
        if (count == 0)
            acc = 0.0f;
        else if (mode == 1)
            acc /= (float)count;
        y[y_off + g] = acc;
        if (mode == 2)
            arg[arg_off + g] = best;
    }
}

// The backward of embedding_bag up to the weight's index_add: each position's gradient row
// expanded[p, e] from the bag's g[b, e] (times psw[p], or / the count for the mean; for the max
// only at the position that won). ``expanded`` is zero where no bag covers a position.
__kernel void embedding_bag_expand(index_t total, index_t E, index_t N,
                                   __global const long* idx, index_t idx_off,
                                   __global const long* offsets, index_t off_off,
                                   index_t bags_given, index_t fixed,
                                   __global const float* psw, index_t psw_off, int use_psw,
                                   int mode, long padding_idx,
                                   __global const float* grad, index_t grad_off,
                                   __global const long* arg, index_t arg_off,
                                   __global float* expanded)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const index_t e = g % E;
        const index_t b = g / E;
        index_t start, end;
        bag_range(b, N, fixed, offsets, off_off, bags_given, &start, &end);
        const float gv = grad[grad_off + g];
        float scale = 1.0f;
        if (mode == 1) {
            index_t count = 0;
            for (index_t p = start; p < end; ++p)
                count += idx[idx_off + p] != padding_idx;
            scale = count ? 1.0f / (float)count : 0.0f;
        }
        const long best = mode == 2 ? arg[arg_off + g] : -1;
        for (index_t p = start; p < end; ++p) {
            float out = 0.0f;
            if (idx[idx_off + p] != padding_idx) {
                if (mode == 2)
                    out = (long)p == best ? gv : 0.0f;
                else
                    out = gv * scale * (use_psw ? psw[psw_off + p] : 1.0f);
            }
            expanded[(index_t)p * E + e] = out;
        }
    }
}

// The gradient of per_sample_weights (mode "sum"): out[p] = the dot product of the output's
// gradient row of p's bag with the weight row idx[p] (0 for padding_idx and for positions no
// bag covers). A position's bag: p / fixed, or the last bag starting at or before p.
__kernel void embedding_bag_psw_grad(index_t N, index_t E, long V,
                                     __global const long* idx, index_t idx_off,
                                     __global const long* offsets, index_t off_off,
                                     index_t bags_given, index_t fixed,
                                     __global const float* w, index_t w_off,
                                     __global const float* grad, index_t grad_off,
                                     long padding_idx, __global float* out)
{
    for (index_t p = get_global_id(0); p < N; p += get_global_size(0)) {
        index_t b;
        if (fixed > 0) {
            b = p / fixed;
        } else {
            index_t lo = 0, hi = bags_given - 1;
            while (lo < hi) {
                const index_t mid = (lo + hi + 1) / 2;
                if (offsets[off_off + mid] <= (long)p)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            b = lo;
        }
        index_t start, end;
        bag_range(b, N, fixed, offsets, off_off, bags_given, &start, &end);
        const long v = idx[idx_off + p];
        float acc = 0.0f;
        if (p >= start && p < end && v != padding_idx && v >= 0 && v < V) {
            for (index_t e = 0; e < E; ++e)
                acc += grad[grad_off + b * E + e] * w[w_off + (index_t)v * E + e];
        }
        out[p] = acc;
    }
}
% endif

% if dtype == "long":
__kernel void one_hot(index_t total, long C, __global const long* idx, index_t idx_off,
                      __global long* y, index_t y_off, __global long* flag)
{
    for (index_t g = get_global_id(0); g < total; g += get_global_size(0)) {
        const long c = (long)(g % (index_t)C);
        const long v = idx[idx_off + g / (index_t)C];
        if (c == 0 && (v < 0 || v >= C))
            report(flag, v, C);
        y[y_off + g] = v == c;
    }
}
% endif
