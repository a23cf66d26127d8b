## Normalization: batch norm (per-channel statistics over (N, S)), layer norm and group norm
## (per-row statistics), and local response norm across channels.
##
## Batch norm sees x as (N, C, S): spatial mode has S = H*W..., per-activation mode folds every
## non-batch position into C and has S = 1. Training runs in two launches (reduce, then the
## elementwise step that finalizes the sums), inference in one; all sizes at run time:
##   channel_partial_sums   grid (GROUP_SIZE * chunks, C): work group (chunk j, channel c) reduces
##                          its slice of the N*S elements of channel c to two sums (tree in local
##                          memory), written to partials[(j*C + c)*2 + {0, 1}]:
##                            "stats":       sum(x - K), sum((x - K)^2) with K = x[0, c, 0] (0
##                                           where it is not finite), a shift that keeps the
##                                           variance free of cancellation;
##                            "grad":        sum(dy), sum(dy * (x - mean[c]));
##                            "grad_affine": sum(dy), sum(dy * xhat) with xhat from per-row
##                                           statistics (row = n*G + c / Cg): the weight and bias
##                                           gradients of layer norm and group norm.
##   channel_column_sums    the same sums for S == 1 with one work item per (channel, chunk of
##                          rows): coalesced where the channels are the fastest dimension.
##   channel_apply_batch_stats  out = act((x - mean) * gamma * invstd + beta); each work group
##                          sums its rows' channel partials itself, and the first work item of
##                          each channel's first row keeps the running and saved statistics.
##   channel_apply_batch_grad   dx from dy (through act' with a fused activation) and the "grad"
##                          sums, finalized the same way; the weight and bias gradients too.
##   channel_apply_inference  batch norm with given statistics, the coefficients computed per
##                          row from them.
##   channel_finalize_*, channel_apply  group norm's "split" path (below): one work item per
##                          channel finalizes coefficients, then out = (u - coef0) * coef1 +
##                          (v - coef2) * coef3 + coef4 per channel, v optional; grid (tile,
##                          rows) with row = n*C + c, so no per-element integer division.
## Layer norm and group norm see x as rows of D contiguous elements: one work group per row
## computes the statistics and writes the normalized row (row_norm_forward), or the gradient
## (row_norm_backward). Group norm with few long rows runs instead through the batch-norm
## kernels on the view (1, rows, D) (channels = rows), with group_norm_coef for the affine step. The affine weight of element d of row r is w[(r % G) * Cg + d / S]
## (layer norm: G = 1, Cg = D, S = 1), tracked incrementally without per-element division.
## Local response norm (lrn_*): one work item per element, the window runs over channels.
##
## Template parameters:
##   part         which kernels to render, so that a build holds only what its variant needs:
##                "sums" (channel_partial_sums, channel_column_sums: mode, vector), "apply"
##                (channel_apply: vector, activation), "rows4" (row_norm_forward4 /
##                row_norm_backward4: row_per) or "other" (the rest)
##   group_size   work-group size of the reduction kernels (a power of two)
##   mode         channel_partial_sums flavour: "stats", "grad" or "grad_affine"
##   activation   OpenCL C expression of the activation applied by channel_apply to a float
##                variable named v_act ("v_act" for none)
##   vector       floats per load in channel_partial_sums and channel_apply: 4 (float4, needs
##                S % 4 == 0 and every offset a multiple of 4) or 1
##   derivative   "" or, for the backward of act(batch_norm(x)) (the fusion plans' training batch
##                norm with an activation), the OpenCL C expression of act'(z) over the float
##                variables z and a = act(z); ``activation`` is then act(v_act). It adds the
##                weight, bias and invstd operands to the "grad" sums, which reduce
##                dz = dy * act'(z) with z = (x - mean) * invstd * weight + bias recomputed per
##                element, and channel_apply_batch_grad's data gradient from dz.
##   dtype        optional, "float" (the default), "half" or "bfloat16": the storage type of x,
##                y, dy and dx in row_norm_forward / row_norm_backward (16-bit: loaded into
##                float through vload_half or bfloat16's bits, no cl_khr_fp16 needed; stored
##                rounded to nearest even; statistics float)
##   wdtype       optional, likewise for their weight and bias ("float" or dtype)
##   sdtype       optional, "float" (the default) or dtype: the running mean and variance of
##                channel_apply_inference and channel_apply_batch_stats (updated in place,
##                computed in float and rounded once)
##                With a 16-bit dtype the "sums" and "apply" parts read and write x, y, dy and
##                dx (u and out) in it, VECTOR elements per access (four: 8 bytes, converted
##                to float4), weight, bias, dweight and dbias in wdtype and the running
##                statistics in sdtype; save_mean / save_invstd and the partials stay float.
##                Modes "stats" and "grad" only, no activation or derivative, no channel_apply.
##   row_vector   optional, 1 (the default) or, with a 16-bit dtype, 4: row_norm_forward /
##                row_norm_backward move four elements (8 bytes) per access, converted to
##                float4. Needs D a multiple of 4, every data offset a multiple of 4, and
##                either S == 1 (layer norm: four consecutive weights, whose offset, plus the
##                row's group times Cg, is a multiple of 4) or S a multiple of 4 (one weight
##                for the four elements)
##   row_per      optional, part "rows4": 4-vectors of a row per work item (rows of up to
##                4 * row_per * group_size elements), of dtype (float or 16-bit) and wdtype
##   rms          optional, False (the default) or True: the row kernels of rms_norm (parts
##                "other" and "rows4"): the rows uncentred, rstd = rsqrt(mean(x^2) + eps),
##                y = x * rstd * w, dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w and
##                xhat = x * rstd; save_mean is written 0, so that layer norm's weight-gradient
##                sums ("grad_affine", (x - mean) * rstd) serve rms_norm as they are. The
##                kernels keep layer norm's names and arguments (bias is passed NULL); an rms
##                build of part "other" holds the row kernels alone.
<%
    dtype = context.get("dtype", "float")
    rms = context.get("rms", False)
    wdtype = context.get("wdtype", "float")
    sdtype = context.get("sdtype", "float")
    row_vector = context.get("row_vector", 1)
    row_per = context.get("row_per", 1)
    assert row_vector == 1 or (row_vector == 4 and dtype != "float")
    assert dtype == "float" or part == "other" or (
        mode in ("stats", "grad") and activation == "v_act" and not derivative)
    assert not rms or part in ("other", "rows4")
    # The batch-norm kernels' data accesses: element or vector `i` from pointer p (float: p is
    # a floatv pointer, as these kernels had it; 16-bit: p points to the storage type).
    def vld(p, i):
        if dtype == "float":
            return f"{p}[{i}]"
        if vector == 4:
            return f"load4_{dtype}({p} + ({i}) * 4)"
        return ld(dtype, p, i)
    def vst(p, i, v):
        if dtype == "float":
            return f"{p}[{i}] = {v}"
        if vector == 4:
            return f"store4_{dtype}({p} + ({i}) * 4, {v})"
        return st(dtype, p, i, v)
    def ld4(ty, p):
        # Four elements from p on (aligned to four elements).
        if ty == "float":
            return f"*(__global const float4 *)({p})"
        return f"load4_{ty}({p})"
    storage = {"float": "float", "half": "half", "bfloat16": "ushort"}
    xs, ws, ss = storage[dtype], storage[wdtype], storage[sdtype]
    def ld(ty, p, i):
        if ty == "half":
            return f"vload_half({i}, {p})"
        if ty == "bfloat16":
            return f"bf16_to_float({p}[{i}])"
        return f"{p}[{i}]"
    def st(ty, p, i, v):
        if ty == "half":
            return f"vstore_half_rte({v}, {i}, {p})"
        if ty == "bfloat16":
            return f"{p}[{i}] = float_to_bf16({v})"
        return f"{p}[{i}] = {v}"
%>\
<%namespace name="access" file="memory_access.cl.mako"/>\
% if "bfloat16" in (dtype, wdtype, sdtype):
${access.bfloat16_conversions()}
% endif
% if row_vector == 4 or (dtype != "float" and part != "other" and vector == 4):
${access.vectors16(dtype, "_" + dtype)}
% endif
#define GROUP_SIZE ${group_size}
#define VECTOR ${vector}
% if vector == 4:
typedef float4 floatv;
#define HSUM(a) ((a).x + (a).y + (a).z + (a).w)
% else:
typedef float floatv;
#define HSUM(a) (a)
% endif

// Sums two values over the work group; every work item returns the totals.
inline float2 group_sum2(float2 value, __local float2* scratch)
{
    const int lid = get_local_id(0);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = GROUP_SIZE / 2; width > 0; width >>= 1) {
        if (lid < width)
            scratch[lid] += scratch[lid + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float2 total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}
% if rms:

// One value over the work group (rms_norm's rows have no mean to sum): every item gets the total.
inline float group_sum1(float value, __local float* scratch)
{
    const int lid = get_local_id(0);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = GROUP_SIZE / 2; width > 0; width >>= 1) {
        if (lid < width)
            scratch[lid] += scratch[lid + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}
% endif

// Non-finite inputs give torch's statistics: the mean of values holding +-inf is +-inf (NaN
// with both, or with a NaN), the variance NaN (inf - inf), and so every output of the channel
// or row is NaN, and a running variance too.

// The shift K of the sums of x - K and (x - K)^2: the first element of the channel (row),
// which keeps the variance free of cancellation; 0 where that element is not finite, so that
// an infinity there still gives the mean torch gives (x - inf would make every term NaN).
inline float stats_shift(float first)
{
    return isfinite(first) ? first : 0.0f;
}

// The biased variance from the means of x - K and (x - K)^2, clamped at 0 against rounding.
// A NaN stays NaN (fmax(NaN, 0) would be 0: a finite output, and a running variance that
// hides the NaN).
inline float shifted_variance(float mean_square, float shifted_mean)
{
    const float v = mean_square - shifted_mean * shifted_mean;
    return v < 0.0f ? 0.0f : v;
}
// Chunks first, first + step, ... of the partials of channel c, with compensated (Kahan)
// summation: a long channel is cut into up to a few thousand chunks, and their sum must not lose
// what the trees kept. Once the sum is infinite there is nothing to compensate: inf - inf would
// make the compensation, and every later sum, NaN where torch's mean is that infinity.
// One compensated step: x added to *total, the rounding lost kept in *lost.
inline void add_compensated(float2 *total, float2 *lost, float2 x)
{
    const float2 term = x - *lost;
    const float2 next = *total + term;
    *lost = select((float2)(0.0f, 0.0f), (next - *total) - term, isfinite(next));
    *total = next;
}

inline float2 sum_chunks_from(__global const float* partials, int first, int step, int chunks,
                              int C, int c)
{
    float2 total = (float2)(0.0f, 0.0f), lost = (float2)(0.0f, 0.0f);
    int j = first;
    // Eight partials loaded before any is added (the compensated sum's chain kept each load
    // waiting: 12 us for 768 channels of 128 chunks on the H200), then added in order.
    for (; j + 7 * step < chunks; j += 8 * step) {
        float2 part[8];
        for (int u = 0; u < 8; ++u)
            part[u] = vload2((long)(j + u * step) * C + c, partials);
        for (int u = 0; u < 8; ++u)
            add_compensated(&total, &lost, part[u]);
    }
    for (; j < chunks; j += step)
        add_compensated(&total, &lost, vload2((long)j * C + c, partials));
    return total;
}

inline float2 sum_chunks(__global const float* partials, int chunks, int C, int c)
{
    return sum_chunks_from(partials, 0, 1, chunks, C, c);
}

// Training statistics of a channel from the sums of x - K and (x - K)^2 over its count values
// (K = stats_shift(first)): (mean, biased variance).
inline float2 batch_stats(float2 total, float count, float first)
{
    const float shifted_mean = total.x / count;
    return (float2)(stats_shift(first) + shifted_mean,
                    shifted_variance(total.y / count, shifted_mean));
}

// What training batch norm keeps of a channel's statistics: the running mean and the unbiased
// running variance (as torch's), and the batch mean and invstd for the backward; each optional.
inline void keep_batch_stats(int c, float mean, float var, float invstd, float count,
                             float momentum
    , __global ${ss}* running_mean, long running_mean_off
    , __global ${ss}* running_var, long running_var_off
    , __global float* save_mean, long save_mean_off
    , __global float* save_invstd, long save_invstd_off)
{
    if (running_mean) {
% if sdtype == "float":
        running_mean[running_mean_off + c] = (1.0f - momentum) * running_mean[running_mean_off + c]
                                             + momentum * mean;
        running_var[running_var_off + c] = (1.0f - momentum) * running_var[running_var_off + c]
                                           + momentum * var * count / (count - 1.0f);
% else:
        const float old_mean = ${ld(sdtype, "running_mean", "running_mean_off + c")};
        const float old_var = ${ld(sdtype, "running_var", "running_var_off + c")};
        ${st(sdtype, "running_mean", "running_mean_off + c", "(1.0f - momentum) * old_mean + momentum * mean")};
        ${st(sdtype, "running_var", "running_var_off + c", "(1.0f - momentum) * old_var + momentum * var * count / (count - 1.0f)")};
% endif
    }
    if (save_mean) {
        save_mean[save_mean_off + c] = mean;
        save_invstd[save_invstd_off + c] = invstd;
    }
}
% if derivative:

inline float act_forward(float v_act)
{
    return ${activation};
}

inline float act_derivative(float z, float a)
{
    return ${derivative};
}

// The gradient at batch norm's output, dy * act'(z), with z = xm * gain + beta recomputed from
// xm = x - mean (gain = weight * invstd): nothing of the forward's output is read.
inline float grad_at(float dy, float xm, float gain, float beta)
{
    const float z = xm * gain + beta;
    return dy * act_derivative(z, act_forward(z));
}

inline floatv grad_through_activation(floatv dy, floatv xm, float gain, float beta)
{
% if vector == 4:
    return (float4)(grad_at(dy.x, xm.x, gain, beta), grad_at(dy.y, xm.y, gain, beta),
                    grad_at(dy.z, xm.z, gain, beta), grad_at(dy.w, xm.w, gain, beta));
% else:
    return grad_at(dy, xm, gain, beta);
% endif
}
% endif

% if part == "sums":
__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void channel_partial_sums(int N, int C, int SV, int per_chunk
    , __global const ${xs}* restrict x, long x_off
% if mode != "stats":
    , __global const ${xs}* restrict dy, long dy_off
% endif
% if mode == "grad":
    , __global const float* restrict mean, long mean_off
% if derivative:
    , __global const float* restrict weight, long weight_off
    , __global const float* restrict bias, long bias_off
    , __global const float* restrict invstd, long invstd_off
% endif
% elif mode == "grad_affine":
    , __global const float* restrict row_mean, __global const float* restrict row_rstd
    , int G, int Cg
% endif
    , __global float* restrict partials)
{
    __local float2 scratch[GROUP_SIZE];
    const int lid = get_local_id(0);
    const int chunk = get_group_id(0);
    const int c = get_global_id(1);
    // Positions below count vectors of VECTOR floats: SV = S / VECTOR per (n, c).
    const long M = (long)N * SV;
    const long begin = (long)chunk * per_chunk;
    const long end = min(begin + per_chunk, M);
    const long plane = (long)C * SV;
% if dtype == "float":
    __global const floatv* xv = (__global const floatv*)(x + x_off);
% if mode != "stats":
    __global const floatv* dyv = (__global const floatv*)(dy + dy_off);
% endif
% else:
    __global const ${xs}* xv = x + x_off;
% if mode != "stats":
    __global const ${xs}* dyv = dy + dy_off;
% endif
% endif
% if mode == "stats":
    const float shift = stats_shift(${ld(dtype, "x", "x_off + (long)c * SV * VECTOR")});
% elif mode == "grad":
    const float shift = mean[mean_off + c];
% if derivative:
    const float gain = (weight ? weight[weight_off + c] : 1.0f) * invstd[invstd_off + c];
    const float beta = bias ? bias[bias_off + c] : 0.0f;
% endif
% endif
    float2 acc = (float2)(0.0f, 0.0f);
    // (n, s) of position r = n*SV + s and its address, advanced by GROUP_SIZE positions with
    // additions only.
    long r = begin + lid;
    int n = (int)(r / SV);
    int s = (int)(r - (long)n * SV);
    long at = (long)n * plane + (long)c * SV + s;
    const int step_n = GROUP_SIZE / SV;
    const int step_s = GROUP_SIZE - step_n * SV;
    const long step_at = (long)step_n * plane + step_s;
    for (; r < end; r += GROUP_SIZE) {
% if mode == "stats":
        const floatv v = ${vld("xv", "at")} - shift;
        acc += (float2)(HSUM(v), HSUM(v * v));
% elif mode == "grad" and derivative:
        const floatv xm = xv[at] - shift;
        const floatv g = grad_through_activation(dyv[at], xm, gain, beta);
        acc += (float2)(HSUM(g), HSUM(g * xm));
% elif mode == "grad":
        const floatv g = ${vld("dyv", "at")};
        acc += (float2)(HSUM(g), HSUM(g * (${vld("xv", "at")} - shift)));
% else:
        const int row = n * G + c / Cg;
        const floatv g = dyv[at];
        acc += (float2)(HSUM(g), HSUM(g * (xv[at] - row_mean[row])) * row_rstd[row]);
% endif
        n += step_n;
        s += step_s;
        at += step_at;
        if (s >= SV) {
            s -= SV;
            ++n;
            at += plane - SV;
        }
    }
    const float2 total = group_sum2(acc, scratch);
    if (lid == 0)
        vstore2(total, (long)chunk * C + c, partials);
}

// The same sums for S == 1 ((N, C) inputs: per-activation mode, BatchNorm1d, layer norm's weight
// gradient): work item (c, chunk) walks rows [chunk*per_chunk, ...) of column c, so a warp reads
// consecutive channels of one row (coalesced) where a work group per channel would read a
// column with stride C.
__kernel void channel_column_sums(int N, int C, int per_chunk
    , __global const ${xs}* restrict x, long x_off
% if mode != "stats":
    , __global const ${xs}* restrict dy, long dy_off
% endif
% if mode == "grad":
    , __global const float* restrict mean, long mean_off
% if derivative:
    , __global const float* restrict weight, long weight_off
    , __global const float* restrict bias, long bias_off
    , __global const float* restrict invstd, long invstd_off
% endif
% elif mode == "grad_affine":
    , __global const float* restrict row_mean, __global const float* restrict row_rstd
    , int G, int Cg
% endif
    , __global float* restrict partials)
{
    const int c = get_global_id(0);
    const int chunk = get_global_id(1);
    if (c >= C)
        return;
    const int begin = chunk * per_chunk;
    const int end = min(begin + per_chunk, N);
% if mode == "stats":
    const float shift = stats_shift(${ld(dtype, "x", "x_off + c")});
% elif mode == "grad":
    const float shift = mean[mean_off + c];
% if derivative:
    const float gain = (weight ? weight[weight_off + c] : 1.0f) * invstd[invstd_off + c];
    const float beta = bias ? bias[bias_off + c] : 0.0f;
% endif
% endif
<%def name="column_term(k, at, n)">
% if mode == "stats":
        const float v${k} = ${ld(dtype, "x", f"x_off + {at}")} - shift;
        const float2 t${k} = (float2)(v${k}, v${k} * v${k});
% elif mode == "grad" and derivative:
        const float xm${k} = x[x_off + ${at}] - shift;
        const float g${k} = grad_at(dy[dy_off + ${at}], xm${k}, gain, beta);
        const float2 t${k} = (float2)(g${k}, g${k} * xm${k});
% elif mode == "grad":
        const float g${k} = ${ld(dtype, "dy", f"dy_off + {at}")};
        const float2 t${k} = (float2)(g${k}, g${k} * (${ld(dtype, "x", f"x_off + {at}")} - shift));
% else:
        const int row${k} = (${n}) * G + c / Cg;
        const float g${k} = dy[dy_off + ${at}];
        const float2 t${k} = (float2)(g${k}, g${k} * (x[x_off + ${at}] - row_mean[row${k}]) * row_rstd[row${k}]);
% endif
</%def>
    float2 acc = (float2)(0.0f, 0.0f);
    long at = (long)begin * C + c;
    int n = begin;
    // Four rows' loads issued before any is added (one at a time, each waited for, left the
    // kernel bound by memory latency: 28 us for a 4096 x 768 layer-norm weight gradient on the
    // H200); added in row order, as one row at a time.
    for (; n + 4 <= end; n += 4, at += 4 * (long)C) {
% for k in range(4):
${column_term(k, f"(at + {k} * (long)C)", f"n + {k}")}\
% endfor
        acc += t0;
        acc += t1;
        acc += t2;
        acc += t3;
    }
    for (; n < end; ++n, at += C) {
${column_term(0, "at", "n")}\
        acc += t0;
    }
    vstore2(acc, (long)chunk * C + c, partials);
}

% elif part == "apply":
inline float activate(float v_act)
{
    return ${activation};
}

// Grid (positions of a row, rows); SV = S / VECTOR vectors per row.
<%def name="apply_rows(with_v)">
    const long base = (long)row * SV;
% if dtype == "float":
    __global const floatv* uv = (__global const floatv*)(u + u_off) + base;
% else:
    __global const ${xs}* uv = u + u_off + base * VECTOR;
% endif
% if with_v:
    __global const floatv* vv = v ? (__global const floatv*)(v + v_off) + base : 0;
% endif
% if dtype == "float":
    __global floatv* outv = (__global floatv*)(out + out_off) + base;
% else:
    __global ${xs}* outv = out + out_off + base * VECTOR;
% endif
    for (int s = get_global_id(0); s < SV; s += get_global_size(0)) {
        floatv value = (${vld("uv", "s")} - c0) * c1 + c4;
% if with_v:
        if (vv)
            value += (vv[s] - c2) * c3;
% endif
% if activation != "v_act":
    % if vector == 1:
        value = activate(value);
    % else:
        value = (floatv)(activate(value.x), activate(value.y), activate(value.z), activate(value.w));
    % endif
% endif
        ${vst("outv", "s", "value")};
    }
</%def>
% if dtype == "float":
__kernel void channel_apply(int rows, int C, int SV, __global const float* restrict coef
    , __global const float* restrict u, long u_off
    , __global const float* restrict v, long v_off
    , __global float* restrict out, long out_off)
{
    const int row = get_global_id(1);
    if (row >= rows)
        return;
    const int c = row % C;
    const float c0 = coef[c * 5 + 0], c1 = coef[c * 5 + 1], c2 = coef[c * 5 + 2];
    const float c3 = coef[c * 5 + 3], c4 = coef[c * 5 + 4];
${apply_rows(True)}
}
% endif

// Batch norm with given statistics in one pass: channel_apply with its coefficients computed
// per row from the statistics (mean, gamma / sqrt(var + eps), beta), not read from a buffer
// that a kernel before it wrote.
__kernel void channel_apply_inference(int rows, int C, int SV, float eps
    , __global const ${ss}* restrict running_mean, long running_mean_off
    , __global const ${ss}* restrict running_var, long running_var_off
    , __global const ${ws}* restrict weight, long weight_off
    , __global const ${ws}* restrict bias, long bias_off
    , __global const ${xs}* restrict u, long u_off
    , __global ${xs}* restrict out, long out_off)
{
    const int row = get_global_id(1);
    if (row >= rows)
        return;
    const int c = row % C;
    const float gamma = weight ? ${ld(wdtype, "weight", "weight_off + c")} : 1.0f;
    const float c0 = ${ld(sdtype, "running_mean", "running_mean_off + c")};
    const float c1 = gamma * rsqrt(${ld(sdtype, "running_var", "running_var_off + c")} + eps);
    const float c4 = bias ? ${ld(wdtype, "bias", "bias_off + c")} : 0.0f;
${apply_rows(False)}
}
// The elementwise steps of training batch norm finalize their channels' sums in each work group
// (one launch where a finalize kernel and an elementwise one were two): the local0 work items of
// a row sum its channel's chunk partials between them (compensated per item, then a tree).
// Local sizes are powers of two along rows, at most APPLY_LOCAL items in all; every work item
// takes part (rows past the end with the last row's channel), since the tree has barriers.
#define APPLY_LOCAL 256
inline float2 channel_totals(__global const float* partials, int chunks, int C, int c,
                             __local float2* scratch)
{
    const int lid0 = get_local_id(0), local0 = get_local_size(0);
    __local float2* mine = scratch + get_local_id(1) * local0;
    mine[lid0] = sum_chunks_from(partials, lid0, local0, chunks, C, c);
    barrier(CLK_LOCAL_MEM_FENCE);
    // A fixed number of steps, not log2(local0): PoCL ran a side effect after a barrier loop of
    // no iterations (local0 == 1) twice for the first work item.
    for (int width = APPLY_LOCAL / 2; width > 0; width >>= 1) {
        if (lid0 < width && lid0 + width < local0)
            mine[lid0] += mine[lid0 + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return mine[0];
}

// The work item that writes a channel's per-channel results: the first of its first row (n = 0).
inline bool channel_keeper(int C)
{
    return get_global_id(1) < C && get_global_id(0) == 0;
}

// Training forward: channel_apply with the statistics of the "stats" sums; the keeper of each
// channel writes the running and saved statistics.
__kernel void channel_apply_batch_stats(int rows, int C, int SV, int N, int S, int chunks
    , float eps, float momentum, __global const float* restrict partials
    , __global const ${ws}* restrict weight, long weight_off
    , __global const ${ws}* restrict bias, long bias_off
    , __global ${ss}* restrict running_mean, long running_mean_off
    , __global ${ss}* restrict running_var, long running_var_off
    , __global float* restrict save_mean, long save_mean_off
    , __global float* restrict save_invstd, long save_invstd_off
    , __global const ${xs}* restrict u, long u_off
    , __global ${xs}* restrict out, long out_off)
{
    __local float2 scratch[APPLY_LOCAL];
    const int c = min((int)get_global_id(1), rows - 1) % C;
    const float count = (float)((long)N * S);
    const float2 stats = batch_stats(channel_totals(partials, chunks, C, c, scratch), count,
                                     ${ld(dtype, "u", "u_off + (long)c * S")});
    const float invstd = rsqrt(stats.y + eps);
    if (channel_keeper(C))
        keep_batch_stats(c, stats.x, stats.y, invstd, count, momentum, running_mean,
                         running_mean_off, running_var, running_var_off, save_mean,
                         save_mean_off, save_invstd, save_invstd_off);
    const int row = get_global_id(1);
    if (row >= rows)
        return;
    const float c0 = stats.x;
    const float c1 = (weight ? ${ld(wdtype, "weight", "weight_off + c")} : 1.0f) * invstd;
    const float c4 = bias ? ${ld(wdtype, "bias", "bias_off + c")} : 0.0f;
${apply_rows(False)}
}

// Backward, from the "grad" sums sum(dy), sum(dy * (x - mean)) (of dz = dy * act'(z) with a
// fused activation, z recomputed per element): the keeper of each channel writes dweight and
// dbias, and out (dx, when given) = (dz - c0) * c1 + (x - mean) * c3 with, for batch statistics
// (training), c0 = mean(dz), c3 = -gamma * invstd^3 * mean(dz * (x - mean)); for fixed ones
// c0 = c3 = 0; c1 = gamma * invstd.
__kernel void channel_apply_batch_grad(int rows, int C, int SV, int N, int S, int chunks
    , int training, __global const float* restrict partials
    , __global const float* restrict mean, long mean_off
    , __global const float* restrict invstd, long invstd_off
    , __global const ${ws}* restrict weight, long weight_off
    , __global const ${ws}* restrict bias, long bias_off
    , __global ${ws}* restrict dweight, long dweight_off
    , __global ${ws}* restrict dbias, long dbias_off
    , __global const ${xs}* restrict dy, long dy_off
    , __global const ${xs}* restrict x, long x_off
    , __global ${xs}* restrict out, long out_off)
{
    __local float2 scratch[APPLY_LOCAL];
    const int c = min((int)get_global_id(1), rows - 1) % C;
    const float2 total = channel_totals(partials, chunks, C, c, scratch);
    const float istd = invstd[invstd_off + c];
    if (channel_keeper(C)) {
        if (dweight)
            ${st(wdtype, "dweight", "dweight_off + c", "total.y * istd")};
        if (dbias)
            ${st(wdtype, "dbias", "dbias_off + c", "total.x")};
    }
    const int row = get_global_id(1);
    if (row >= rows || !out)
        return;
    const float count = (float)((long)N * S);
    const float gamma = weight ? ${ld(wdtype, "weight", "weight_off + c")} : 1.0f;
    const float c0 = training ? total.x / count : 0.0f;
    const float c1 = gamma * istd;
    const float c2 = mean[mean_off + c];
    const float c3 = training ? -c1 * istd * istd * total.y / count : 0.0f;
% if derivative:
    const float beta = bias ? bias[bias_off + c] : 0.0f;
% endif
    const long base = (long)row * SV;
% if dtype == "float":
    __global const floatv* dyv = (__global const floatv*)(dy + dy_off) + base;
    __global const floatv* xv = (__global const floatv*)(x + x_off) + base;
    __global floatv* outv = (__global floatv*)(out + out_off) + base;
% else:
    __global const ${xs}* dyv = dy + dy_off + base * VECTOR;
    __global const ${xs}* xv = x + x_off + base * VECTOR;
    __global ${xs}* outv = out + out_off + base * VECTOR;
% endif
    for (int s = get_global_id(0); s < SV; s += get_global_size(0)) {
        const floatv xm = ${vld("xv", "s")} - c2;
% if derivative:
        const floatv dz = grad_through_activation(dyv[s], xm, c1, beta);
% else:
        const floatv dz = ${vld("dyv", "s")};
% endif
        ${vst("outv", "s", "(dz - c0) * c1 + xm * c3")};
    }
}

% elif part == "rows4":
<%
    def st4(ty, p, v):
        if ty == "float":
            return f"*(__global float4 *)({p}) = {v}"
        return f"store4_{ty}({p}, {v})"
%>\
// ---- layer norm on rows of D = 4 * D4 elements (the "rows4" solver) ----
// A work group of GROUP_SIZE items per row, each holding its ROW_PER 4-vectors of the row (and
// of dy) in registers as float4: the row is read once, where row_norm_forward reads it twice,
// and a group sized to the row (64 items for 768 elements) needs fewer reduction steps. Rows,
// offsets (in elements) and the weight and bias start on 4-element boundaries (the host
// checks); the weight and bias are per element (layer norm's). Storage: dtype (float32 or
// 16-bit, converted to float on load and rounded once on store), the weight's wdtype.
% if rms:
// rms: the rows uncentred (rms_norm), the sum of squares alone, no shift (no cancellation to
// guard against) and no bias.
% endif

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void row_norm_forward4(int D4, float eps
    , __global const ${xs}* restrict x, long x_off
    , __global const ${ws}* restrict weight, long weight_off
    , __global const ${ws}* restrict bias, long bias_off
    , __global ${xs}* restrict y, long y_off
    , __global float* restrict save_mean, __global float* restrict save_rstd)
{
% if rms:
    __local float scratch[GROUP_SIZE];
% else:
    __local float2 scratch[GROUP_SIZE];
% endif
    const int lid = get_local_id(0);
    const int row = get_group_id(0);
    __global const ${xs}* src = x + x_off + (long)row * 4 * D4;
    __global ${xs}* dst = y + y_off + (long)row * 4 * D4;
% if rms:
    float4 v[${row_per}];
    float acc = 0.0f;
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        v[${i}] = ${ld4(dtype, f"src + 4 * (lid + {i * group_size})")};
        acc += dot(v[${i}], v[${i}]);
    }
% endfor
    const float total = group_sum1(acc, scratch);
    const float rstd = rsqrt(total / (4 * D4) + eps);
    if (lid == 0) {
        save_mean[row] = 0.0f;
        save_rstd[row] = rstd;
    }
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        const int d = 4 * (lid + ${i * group_size});
        float4 value = v[${i}] * rstd;
        if (weight)
            value *= ${ld4(wdtype, "weight + weight_off + d")};
        ${st4(dtype, "dst + d", "value")};
    }
% endfor
% else:
    const float shift = stats_shift(${ld(dtype, "src", "0")});
    float4 v[${row_per}];
    float2 acc = (float2)(0.0f, 0.0f);
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        v[${i}] = ${ld4(dtype, f"src + 4 * (lid + {i * group_size})")};
        const float4 c = v[${i}] - shift;
        acc += (float2)(c.x + c.y + c.z + c.w, dot(c, c));
    }
% endfor
    const float2 total = group_sum2(acc, scratch);
    const int D = 4 * D4;
    const float shifted_mean = total.x / D;
    const float mean = shift + shifted_mean;
    const float rstd = rsqrt(shifted_variance(total.y / D, shifted_mean) + eps);
    if (lid == 0) {
        save_mean[row] = mean;
        save_rstd[row] = rstd;
    }
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        const int d = 4 * (lid + ${i * group_size});
        float4 value = (v[${i}] - mean) * rstd;
        if (weight)
            value *= ${ld4(wdtype, "weight + weight_off + d")};
        if (bias)
            value += ${ld4(wdtype, "bias + bias_off + d")};
        ${st4(dtype, "dst + d", "value")};
    }
% endfor
% endif
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd,
// as row_norm_backward, with g and xhat kept in registers between the sums and the store.
__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void row_norm_backward4(int D4
    , __global const ${xs}* restrict x, long x_off
    , __global const ${xs}* restrict dy, long dy_off
    , __global const ${ws}* restrict weight, long weight_off
    , __global const float* restrict save_mean, __global const float* restrict save_rstd
    , __global ${xs}* restrict dx, long dx_off)
{
% if rms:
    __local float scratch[GROUP_SIZE];
% else:
    __local float2 scratch[GROUP_SIZE];
% endif
    const int lid = get_local_id(0);
    const int row = get_group_id(0);
    const long base = (long)row * 4 * D4;
% if rms:
    // Uncentred: xhat = x * rstd, and no mean(g) term (the mean is no function of x).
    const float rstd = save_rstd[row];
    float4 g[${row_per}], xhat[${row_per}];
    float acc = 0.0f;
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        const int d = 4 * (lid + ${i * group_size});
        g[${i}] = ${ld4(dtype, "dy + dy_off + base + d")};
        if (weight)
            g[${i}] *= ${ld4(wdtype, "weight + weight_off + d")};
        xhat[${i}] = ${ld4(dtype, "x + x_off + base + d")} * rstd;
        acc += dot(g[${i}], xhat[${i}]);
    }
% endfor
    const float mean_gx = group_sum1(acc, scratch) / (4 * D4);
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        const float4 value = rstd * (g[${i}] - xhat[${i}] * mean_gx);
        ${st4(dtype, f"dx + dx_off + base + 4 * (lid + {i * group_size})", "value")};
    }
% endfor
% else:
    const float mean = save_mean[row], rstd = save_rstd[row];
    float4 g[${row_per}], xhat[${row_per}];
    float2 acc = (float2)(0.0f, 0.0f);
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        const int d = 4 * (lid + ${i * group_size});
        g[${i}] = ${ld4(dtype, "dy + dy_off + base + d")};
        if (weight)
            g[${i}] *= ${ld4(wdtype, "weight + weight_off + d")};
        xhat[${i}] = (${ld4(dtype, "x + x_off + base + d")} - mean) * rstd;
        acc += (float2)(g[${i}].x + g[${i}].y + g[${i}].z + g[${i}].w, dot(g[${i}], xhat[${i}]));
    }
% endfor
    const float2 total = group_sum2(acc, scratch);
    const float mean_g = total.x / (4 * D4), mean_gx = total.y / (4 * D4);
% for i in range(row_per):
    if (lid + ${i * group_size} < D4) {
        const float4 value = rstd * (g[${i}] - mean_g - xhat[${i}] * mean_gx);
        ${st4(dtype, f"dx + dx_off + base + 4 * (lid + {i * group_size})", "value")};
    }
% endfor
% endif
}
% else:
## The batch-norm finalizers and group norm's "split" coefficients: not in an rms build.
% if not rms:
// coef[c*5 + k] of channel_apply: y = (x - mean) * (gamma * invstd) + beta.
__kernel void channel_finalize_stats(int N, int C, int S, int chunks, float eps, float momentum
    , __global const float* restrict x, long x_off, __global const float* restrict partials
    , __global const float* restrict weight, long weight_off
    , __global const float* restrict bias, long bias_off
    , __global float* restrict running_mean, long running_mean_off
    , __global float* restrict running_var, long running_var_off
    , __global float* restrict save_mean, long save_mean_off
    , __global float* restrict save_invstd, long save_invstd_off
    , __global float* restrict coef)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    const float count = (float)((long)N * S);
    const float2 stats = batch_stats(sum_chunks(partials, chunks, C, c), count,
                                      x[x_off + (long)c * S]);
    const float mean = stats.x, var = stats.y;
    const float invstd = rsqrt(var + eps);
    keep_batch_stats(c, mean, var, invstd, count, momentum, running_mean, running_mean_off,
                     running_var, running_var_off, save_mean, save_mean_off, save_invstd,
                     save_invstd_off);
    const float gamma = weight ? weight[weight_off + c] : 1.0f;
    coef[c * 5 + 0] = mean;
    coef[c * 5 + 1] = gamma * invstd;
    coef[c * 5 + 2] = 0.0f;
    coef[c * 5 + 3] = 0.0f;
    coef[c * 5 + 4] = bias ? bias[bias_off + c] : 0.0f;
}

// Inference: y = (x - running_mean) * gamma / sqrt(running_var + eps) + beta.
// From sum(dy) and sum(dy * (x - mean)): dgamma, dbeta and dx's coefficients. With batch
// statistics (training) dx = gamma*invstd * (dy - mean(dy) - (x - mean) * invstd^2 *
// mean(dy * (x - mean))); with fixed statistics dx = gamma * invstd * dy.
__kernel void channel_finalize_grad(int N, int C, int S, int chunks, int training
    , __global const float* restrict partials
    , __global const float* restrict mean, long mean_off
    , __global const float* restrict invstd, long invstd_off
    , __global const float* restrict weight, long weight_off
    , __global float* restrict dweight, long dweight_off
    , __global float* restrict dbias, long dbias_off
    , __global float* restrict coef)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    const float2 total = sum_chunks(partials, chunks, C, c);
    const float count = (float)((long)N * S);
    const float istd = invstd[invstd_off + c];
    const float gamma = weight ? weight[weight_off + c] : 1.0f;
    if (dweight)
        dweight[dweight_off + c] = total.y * istd;
    if (dbias)
        dbias[dbias_off + c] = total.x;
    const float k1 = gamma * istd;
    coef[c * 5 + 0] = training ? total.x / count : 0.0f;
    coef[c * 5 + 1] = k1;
    coef[c * 5 + 2] = mean[mean_off + c];
    coef[c * 5 + 3] = training ? -k1 * istd * istd * total.y / count : 0.0f;
    coef[c * 5 + 4] = 0.0f;
}

// Sums the chunk partials of "grad_affine": dweight = sum(dy * xhat), dbias = sum(dy).
__kernel void channel_finalize_sums(int C, int chunks, __global const float* restrict partials
    , __global float* restrict dweight, long dweight_off
    , __global float* restrict dbias, long dbias_off)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    const float2 total = sum_chunks(partials, chunks, C, c);
    if (dweight)
        dweight[dweight_off + c] = total.y;
    if (dbias)
        dbias[dbias_off + c] = total.x;
}

// Group norm through the batch-norm kernels ("split"): coefficients of channel_apply for each
// (n, c) of an (N, C, S) input from the statistics of row n*G + c / Cg.
__kernel void group_norm_coef(int N, int C, int G
    , __global const float* restrict row_mean, __global const float* restrict row_rstd
    , __global const float* restrict weight, long weight_off
    , __global const float* restrict bias, long bias_off
    , __global float* restrict coef)
{
    const int i = get_global_id(0);
    if (i >= N * C)
        return;
    const int n = i / C, c = i % C;
    const int row = n * G + c / (C / G);
    const float gamma = weight ? weight[weight_off + c] : 1.0f;
    coef[i * 5 + 0] = row_mean[row];
    coef[i * 5 + 1] = row_rstd[row] * gamma;
    coef[i * 5 + 2] = 0.0f;
    coef[i * 5 + 3] = 0.0f;
    coef[i * 5 + 4] = bias ? bias[bias_off + c] : 0.0f;
}

% endif
// ---- layer norm and group norm: one work group per row of D elements ----
% if row_vector == 4:
## The vector rows' weights: element d's weight is w[w_base + d / S]. With S == 1 the four
## elements from d on have four consecutive weights; with S a multiple of 4 they share one,
## w[w_base + cg], cg = d / S tracked in steps of four elements (S4 of them per weight)
## without a division per step.
<%def name="vector_weights()">\
const int S4 = S == 1 ? 1 : S / 4;
    int cg = lid / S4, s = lid % S4;
    const int step_c = GROUP_SIZE / S4, step_s = GROUP_SIZE % S4;</%def>
<%def name="weight4(w)">\
(S == 1 ? ${ld4(wdtype, f"{w} + {w}_off + w_base + d")} : (float4)(${ld(wdtype, w, f"{w}_off + w_base + cg")}))</%def>
<%def name="next_weights()">\
cg += step_c;
        s += step_s;
        if (s >= S4) {
            s -= S4;
            ++cg;
        }</%def>
% endif

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void row_norm_forward(int D, int G, int Cg, int S, float eps
    , __global const ${xs}* restrict x, long x_off
    , __global const ${ws}* restrict weight, long weight_off
    , __global const ${ws}* restrict bias, long bias_off
    , __global ${xs}* restrict y, long y_off
    , __global float* restrict save_mean, __global float* restrict save_rstd)
{
% if rms:
    __local float scratch[GROUP_SIZE];
% else:
    __local float2 scratch[GROUP_SIZE];
% endif
    const int lid = get_local_id(0);
    const int row = get_group_id(0);
    __global const ${xs}* src = x + x_off + (long)row * D;
    __global ${xs}* dst = y + y_off + (long)row * D;
% if rms:
    // Uncentred (rms_norm): the sum of squares alone, the mean 0 (x - 0.0f folds to x).
    float acc = 0.0f;
% if row_vector == 4:
    for (int d = lid * 4; d < D; d += GROUP_SIZE * 4) {
        const float4 v = ${ld4(dtype, "src + d")};
        acc += dot(v, v);
    }
% else:
    for (int d = lid; d < D; d += GROUP_SIZE) {
        const float v = ${ld(dtype, "src", "d")};
        acc += v * v;
    }
% endif
    const float mean = 0.0f;
    const float rstd = rsqrt(group_sum1(acc, scratch) / D + eps);
% else:
    const float shift = stats_shift(${ld(dtype, "src", "0")});
    float2 acc = (float2)(0.0f, 0.0f);
% if row_vector == 4:
    for (int d = lid * 4; d < D; d += GROUP_SIZE * 4) {
        const float4 v = ${ld4(dtype, "src + d")} - shift;
        acc += (float2)((v.x + v.y) + (v.z + v.w), dot(v, v));
    }
% else:
    for (int d = lid; d < D; d += GROUP_SIZE) {
        const float v = ${ld(dtype, "src", "d")} - shift;
        acc += (float2)(v, v * v);
    }
% endif
    const float2 total = group_sum2(acc, scratch);
    const float shifted_mean = total.x / D;
    const float mean = shift + shifted_mean;
    const float rstd = rsqrt(shifted_variance(total.y / D, shifted_mean) + eps);
% endif
    if (lid == 0) {
        save_mean[row] = mean;
        save_rstd[row] = rstd;
    }
    const int w_base = (row % G) * Cg;
% if row_vector == 4:
    ${vector_weights()}
    for (int d = lid * 4; d < D; d += GROUP_SIZE * 4) {
        float4 value = (${ld4(dtype, "src + d")} - mean) * rstd;
        if (weight)
            value *= ${weight4("weight")};
        if (bias)
            value += ${weight4("bias")};
        store4_${dtype}(dst + d, value);
        ${next_weights()}
    }
% else:
    int cg = lid / S, s = lid % S;
    const int step_c = GROUP_SIZE / S, step_s = GROUP_SIZE % S;
    for (int d = lid; d < D; d += GROUP_SIZE) {
        float value = (${ld(dtype, "src", "d")} - mean) * rstd;
        if (weight)
            value *= ${ld(wdtype, "weight", "weight_off + w_base + cg")};
        if (bias)
            value += ${ld(wdtype, "bias", "bias_off + w_base + cg")};
        ${st(dtype, "dst", "d", "value")};
        cg += step_c;
        s += step_s;
        if (s >= S) {
            s -= S;
            ++cg;
        }
    }
% endif
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd.
__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void row_norm_backward(int D, int G, int Cg, int S
    , __global const ${xs}* restrict x, long x_off
    , __global const ${xs}* restrict dy, long dy_off
    , __global const ${ws}* restrict weight, long weight_off
    , __global const float* restrict save_mean, __global const float* restrict save_rstd
    , __global ${xs}* restrict dx, long dx_off)
{
% if rms:
    __local float scratch[GROUP_SIZE];
% else:
    __local float2 scratch[GROUP_SIZE];
% endif
    const int lid = get_local_id(0);
    const int row = get_group_id(0);
    const long base = (long)row * D;
% if rms:
    // Uncentred (rms_norm): xhat = x * rstd and no mean(g) term; "- 0.0f" folds away.
    const float mean = 0.0f, rstd = save_rstd[row];
% else:
    const float mean = save_mean[row], rstd = save_rstd[row];
% endif
    const int w_base = (row % G) * Cg;
% if row_vector == 4:
% if rms:
    float acc = 0.0f;
% else:
    float2 acc = (float2)(0.0f, 0.0f);
% endif
    ${vector_weights()}
    for (int d = lid * 4; d < D; d += GROUP_SIZE * 4) {
        float4 g = ${ld4(dtype, "dy + dy_off + base + d")};
        if (weight)
            g *= ${weight4("weight")};
        const float4 xhat = (${ld4(dtype, "x + x_off + base + d")} - mean) * rstd;
% if rms:
        acc += dot(g, xhat);
% else:
        acc += (float2)((g.x + g.y) + (g.z + g.w), dot(g, xhat));
% endif
        ${next_weights()}
    }
% if rms:
    const float mean_g = 0.0f, mean_gx = group_sum1(acc, scratch) / D;
% else:
    const float2 total = group_sum2(acc, scratch);
    const float mean_g = total.x / D, mean_gx = total.y / D;
% endif
    cg = lid / S4;
    s = lid % S4;
    for (int d = lid * 4; d < D; d += GROUP_SIZE * 4) {
        float4 g = ${ld4(dtype, "dy + dy_off + base + d")};
        if (weight)
            g *= ${weight4("weight")};
        const float4 xhat = (${ld4(dtype, "x + x_off + base + d")} - mean) * rstd;
        store4_${dtype}(dx + dx_off + base + d, rstd * (g - mean_g - xhat * mean_gx));
        ${next_weights()}
    }
% else:
    const int step_c = GROUP_SIZE / S, step_s = GROUP_SIZE % S;
% if rms:
    float acc = 0.0f;
% else:
    float2 acc = (float2)(0.0f, 0.0f);
% endif
    int cg = lid / S, s = lid % S;
    for (int d = lid; d < D; d += GROUP_SIZE) {
        float g = ${ld(dtype, "dy", "dy_off + base + d")};
        if (weight)
            g *= ${ld(wdtype, "weight", "weight_off + w_base + cg")};
% if rms:
        acc += g * ${ld(dtype, "x", "x_off + base + d")} * rstd;
% else:
        acc += (float2)(g, g * (${ld(dtype, "x", "x_off + base + d")} - mean) * rstd);
% endif
        cg += step_c;
        s += step_s;
        if (s >= S) {
            s -= S;
            ++cg;
        }
    }
% if rms:
    const float mean_g = 0.0f, mean_gx = group_sum1(acc, scratch) / D;
% else:
    const float2 total = group_sum2(acc, scratch);
    const float mean_g = total.x / D, mean_gx = total.y / D;
% endif
    cg = lid / S;
    s = lid % S;
    for (int d = lid; d < D; d += GROUP_SIZE) {
        float g = ${ld(dtype, "dy", "dy_off + base + d")};
        if (weight)
            g *= ${ld(wdtype, "weight", "weight_off + w_base + cg")};
        const float xhat = (${ld(dtype, "x", "x_off + base + d")} - mean) * rstd;
        ${st(dtype, "dx", "dx_off + base + d", "rstd * (g - mean_g - xhat * mean_gx)")};
        cg += step_c;
        s += step_s;
        if (s >= S) {
            s -= S;
            ++cg;
        }
    }
% endif
}

% if not rms:
// ---- local response norm across channels (torch's local_response_norm) ----
// scale = k + alpha / size * sum of x^2 over channels [c - size/2, c + (size-1)/2]; y = x * scale^-beta

__kernel void lrn_forward(long total, int C, int S, int size, float alpha, float beta, float k
    , __global const float* restrict x, long x_off, __global float* restrict y, long y_off
    , __global float* restrict scale)
{
    for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int c = (int)((i / S) % C);
        const long channel0 = i - (long)c * S;
        const int lo = max(c - size / 2, 0), hi = min(c + (size - 1) / 2, C - 1);
        float sum = 0.0f;
        for (int j = lo; j <= hi; ++j) {
            const float v = x[x_off + channel0 + (long)j * S];
            sum += v * v;
        }
        const float d = k + alpha / size * sum;
        y[y_off + i] = x[x_off + i] * pow(d, -beta);
        if (scale)
            scale[i] = d;
    }
}

// dx_j = dy_j * scale_j^-beta - 2 alpha beta / size * x_j * sum over the channels c whose
// window holds j of dy_c * y_c / scale_c.
__kernel void lrn_backward(long total, int C, int S, int size, float alpha, float beta
    , __global const float* restrict x, long x_off, __global const float* restrict y, long y_off
    , __global const float* restrict dy, long dy_off, __global const float* restrict scale
    , __global float* restrict dx, long dx_off)
{
    for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int c = (int)((i / S) % C);
        const long channel0 = i - (long)c * S;
        const int lo = max(c - (size - 1) / 2, 0), hi = min(c + size / 2, C - 1);
        float sum = 0.0f;
        for (int j = lo; j <= hi; ++j) {
            const long at = channel0 + (long)j * S;
            sum += dy[dy_off + at] * y[y_off + at] / scale[at];
        }
        dx[dx_off + i] = dy[dy_off + i] * pow(scale[i], -beta)
                         - 2.0f * alpha * beta / size * x[x_off + i] * sum;
    }
}
% endif
% endif
