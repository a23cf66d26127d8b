## 1-, 2- and 3-D pooling over (N*C) planes of D x H x W (a 2-D pool has D = 1, a 1-D one
## D = H = 1; sizes are run-time arguments, so one compile serves every rank): max and average,
## with fixed windows (kernel, stride, padding, dilation, as torch's max_pool{1,2,3}d /
## avg_pool{1,2,3}d) or adaptive windows (torch's adaptive_*_pool{1,2,3}d: output o covers
## [floor(o*In/Out), ceil((o+1)*In/Out)) along each dimension).
##
## pool_forward: one work item per output element (grid-stride loop over N*C*OD*OH*OW).
## pool_backward: one work item per input element; it gathers the gradients of every window that
## holds it (for max: the windows whose saved argmax is this element), so no atomics are needed
## and the summation order is fixed.
## pool_plane_forward (windows that cover the whole plane: global pooling): PLANE_THREADS work
## items share one plane, read it contiguously and combine their results in local memory; a work
## group of GROUP_SIZE holds GROUP_SIZE / PLANE_THREADS planes. Max keeps torch's choice without
## depending on the order of combination: the largest value, the first position among equals,
## and a NaN over any number (the last NaN, as torch's scan keeps replacing).
## Indices (max only) are flat positions (d*H + h)*W + w inside the input plane, as torch
## returns them.
##
## Template parameters:
##   method        "max" or "avg"
##   window        "regular" (kernel/stride/padding/dilation) or "adaptive"
##   save_indices  max only: write the argmax of each window (needed for backward)
##   index_t       "int" when every element index fits in 31 bits, else "long"
##   group_size    work-group size of pool_plane_forward (a power of two)
##   dtype         optional, "float" (the default), "half" or "bfloat16": the storage type of
##                 x, y, dy and dx; 16-bit values are loaded into float (vload_half, or
##                 bfloat16's bits shifted: no cl_khr_fp16 needed), every sum and comparison is
##                 float, and results are stored rounded to nearest even
<%
    dtype = context.get("dtype", "float")
    storage = {"float": "float", "half": "half", "bfloat16": "ushort"}[dtype]
    def ld(p, i):
        if dtype == "half":
            return f"vload_half({i}, {p})"
        if dtype == "bfloat16":
            return f"bf16_to_float({p}[{i}])"
        return f"{p}[{i}]"
    # A store is written as store_open(p, i) + value + store_close(p, i), so that a value
    # spanning lines keeps its text.
    def store_open(p, i):
        if dtype == "half":
            return "vstore_half_rte("
        if dtype == "bfloat16":
            return f"{p}[{i}] = float_to_bf16("
        return f"{p}[{i}] = "
    def store_close(p, i):
        if dtype == "half":
            return f", {i}, {p});"
        if dtype == "bfloat16":
            return ");"
        return ";"
%>\
<%namespace name="access" file="memory_access.cl.mako"/>\
% if dtype == "bfloat16":
${access.bfloat16_conversions()}
% endif
#define I ${index_t}
#define GROUP_SIZE ${group_size}

## The window of output coordinate o${dim} along one dimension: its start (and for adaptive
## windows its end).
<%def name="window_bounds(dim, size, osize)">
% if window == "regular":
        const int ${dim}_start = o${dim} * stride_${dim} - pad_${dim};
% else:
        const int ${dim}_start = (int)(((long)o${dim} * ${size}) / ${osize});
        const int ${dim}_end = (int)((((long)o${dim} + 1) * ${size} + ${osize} - 1) / ${osize});
% endif
</%def>

#define POOL_ARGS I total, int D, int H, int W, int OD, int OH, int OW, \
    int kernel_d, int kernel_h, int kernel_w, int stride_d, int stride_h, int stride_w, \
    int pad_d, int pad_h, int pad_w, int dilation_d, int dilation_h, int dilation_w, \
    int count_include_pad, int divisor_override

% if method == "avg" and window == "regular":
// The clipped length of a window along one dimension: to the padded input (count_include_pad)
// or to the input.
inline int avg_extent(int start, int size, int window, int pad, int count_include_pad)
{
    const int end = min(start + window, size + pad);
    if (count_include_pad)
        return end - start;
    return min(end, size) - max(start, 0);
}

// torch's divisor: the window clipped to the padded input (count_include_pad) or to the input.
inline float avg_divisor(int d_start, int h_start, int w_start, int D, int H, int W,
                         int kernel_d, int kernel_h, int kernel_w, int pad_d, int pad_h,
                         int pad_w, int count_include_pad, int divisor_override)
{
    if (divisor_override)
        return (float)divisor_override;
    return (float)(avg_extent(d_start, D, kernel_d, pad_d, count_include_pad)
                   * avg_extent(h_start, H, kernel_h, pad_h, count_include_pad)
                   * avg_extent(w_start, W, kernel_w, pad_w, count_include_pad));
}
% endif

__kernel void pool_forward(POOL_ARGS,
    __global const ${storage}* restrict x, I x_off, __global ${storage}* restrict y, I y_off
% if save_indices:
    , __global long* restrict indices, I indices_off
% endif
    )
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int ow = (int)(i % OW);
        I r = i / OW;
        const int oh = (int)(r % OH);
        r /= OH;
        const int od = (int)(r % OD);
        const I plane = r / OD;
        __global const ${storage}* src = x + x_off + plane * D * H * W;
        ${window_bounds("d", "D", "OD")}
        ${window_bounds("h", "H", "OH")}
        ${window_bounds("w", "W", "OW")}
% if method == "max":
        float best = -INFINITY;
        int best_index = -1;
    % if window == "regular":
        for (int kd = 0; kd < kernel_d; ++kd) {
            const int id = d_start + kd * dilation_d;
            if (id < 0 || id >= D)
                continue;
            for (int kh = 0; kh < kernel_h; ++kh) {
                const int ih = h_start + kh * dilation_h;
                if (ih < 0 || ih >= H)
                    continue;
                for (int kw = 0; kw < kernel_w; ++kw) {
                    const int iw = w_start + kw * dilation_w;
                    if (iw < 0 || iw >= W)
                        continue;
    % else:
        for (int id = d_start; id < d_end; ++id) {
            for (int ih = h_start; ih < h_end; ++ih) {
                for (int iw = w_start; iw < w_end; ++iw) {
    % endif
                    const int e = (id * H + ih) * W + iw;
                    const float v = ${ld("src", "e")};
                    // torch's rule: the first maximum wins, a NaN wins over any number.
                    if (best_index < 0 || v > best || isnan(v)) {
                        best = v;
                        best_index = e;
                    }
                }
            }
        }
        ${store_open("y", "y_off + i")}best${store_close("y", "y_off + i")}
    % if save_indices:
        indices[indices_off + i] = best_index;
    % endif
% else:
        float sum = 0.0f;
    % if window == "regular":
        const int d_lo = max(d_start, 0), d_hi = min(d_start + kernel_d, D);
        const int h_lo = max(h_start, 0), h_hi = min(h_start + kernel_h, H);
        const int w_lo = max(w_start, 0), w_hi = min(w_start + kernel_w, W);
        for (int id = d_lo; id < d_hi; ++id)
            for (int ih = h_lo; ih < h_hi; ++ih)
                for (int iw = w_lo; iw < w_hi; ++iw)
                    sum += ${ld("src", "(id * H + ih) * W + iw")};
        ${store_open("y", "y_off + i")}sum / avg_divisor(d_start, h_start, w_start, D, H, W, kernel_d, kernel_h,
                                         kernel_w, pad_d, pad_h, pad_w, count_include_pad,
                                         divisor_override)${store_close("y", "y_off + i")}
    % else:
        for (int id = d_start; id < d_end; ++id)
            for (int ih = h_start; ih < h_end; ++ih)
                for (int iw = w_start; iw < w_end; ++iw)
                    sum += ${ld("src", "(id * H + ih) * W + iw")};
        ${store_open("y", "y_off + i")}sum / (float)((d_end - d_start) * (h_end - h_start) * (w_end - w_start))${store_close("y", "y_off + i")}
    % endif
% endif
    }
}

## The outputs along one dimension whose window can hold input coordinate i${dim}: a loop
## header opening a block (closed by the caller); "continue" skips the others.
<%def name="outputs_holding(dim, size, osize)">
% if window == "regular":
            for (int k${dim} = 0; k${dim} < kernel_${dim}; ++k${dim}) {
                const int t${dim} = i${dim} + pad_${dim} - k${dim} * dilation_${dim};
                if (t${dim} < 0 || t${dim} % stride_${dim})
                    continue;
                const int o${dim} = t${dim} / stride_${dim};
                if (o${dim} >= ${osize})
                    continue;
% else:
            const int o${dim}_lo = (int)(((long)i${dim} * ${osize}) / ${size});
            const int o${dim}_hi = min((int)((((long)i${dim} + 1) * ${osize} + ${size} - 1) / ${size}), ${osize});
            for (int o${dim} = o${dim}_lo; o${dim} < o${dim}_hi; ++o${dim}) {
                ${window_bounds(dim, size, osize)}
                if (i${dim} < ${dim}_start || i${dim} >= ${dim}_end)
                    continue;
% endif
</%def>

// total counts input elements here.
__kernel void pool_backward(POOL_ARGS,
    __global const ${storage}* restrict dy, I dy_off, __global ${storage}* restrict dx, I dx_off
% if method == "max":
    , __global const long* restrict indices, I indices_off
% endif
    )
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int iw = (int)(i % W);
        I r = i / W;
        const int ih = (int)(r % H);
        r /= H;
        const int id = (int)(r % D);
        const I plane = r / D;
        const I out_plane = plane * OD * OH * OW;
        float sum = 0.0f;
        ${outputs_holding("d", "D", "OD")}
        ${outputs_holding("h", "H", "OH")}
        ${outputs_holding("w", "W", "OW")}
                const I o = out_plane + (od * OH + oh) * OW + ow;
% if method == "max":
                if (indices[indices_off + o] == (id * H + ih) * W + iw)
                    sum += ${ld("dy", "dy_off + o")};
% elif window == "regular":
                sum += ${ld("dy", "dy_off + o")} / avg_divisor(od * stride_d - pad_d, oh * stride_h - pad_h,
                    ow * stride_w - pad_w, D, H, W, kernel_d, kernel_h, kernel_w, pad_d, pad_h,
                    pad_w, count_include_pad, divisor_override);
% else:
                sum += ${ld("dy", "dy_off + o")}
                    / (float)((d_end - d_start) * (h_end - h_start) * (w_end - w_start));
% endif
            }
          }
        }
        ${store_open("dx", "dx_off + i")}sum${store_close("dx", "dx_off + i")}
    }
}

% if window == "adaptive":
% if method == "max":
// Does (v, i) win over the current (best, best_i)?
inline int wins(float v, int i, float best, int best_i)
{
    if (best_i < 0)
        return i >= 0;
    if (i < 0)
        return 0;
    if (isnan(v) || isnan(best))
        return isnan(v) && (!isnan(best) || i > best_i);
    return v > best || (v == best && i < best_i);
}
% endif

__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void pool_plane_forward(I planes, int plane_size, int plane_threads, float divisor,
    __global const ${storage}* restrict x, I x_off, __global ${storage}* restrict y, I y_off
% if save_indices:
    , __global long* restrict indices, I indices_off
% endif
    )
{
    __local float values[GROUP_SIZE];
% if method == "max":
    __local int where[GROUP_SIZE];
% endif
    const int lid = get_local_id(0);
    const int lane = lid % plane_threads;
    const I plane = (I)get_group_id(0) * (GROUP_SIZE / plane_threads) + lid / plane_threads;
% if method == "max":
    float acc = -INFINITY;
    int acc_i = -1;
% else:
    float acc = 0.0f;
% endif
    if (plane < planes) {
        __global const ${storage}* src = x + x_off + plane * plane_size;
        for (int e = lane; e < plane_size; e += plane_threads) {
% if method == "max":
            const float v = ${ld("src", "e")};
            if (wins(v, e, acc, acc_i)) {
                acc = v;
                acc_i = e;
            }
% else:
            acc += ${ld("src", "e")};
% endif
        }
    }
    values[lid] = acc;
% if method == "max":
    where[lid] = acc_i;
% endif
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = plane_threads / 2; width > 0; width >>= 1) {
        if (lane < width) {
% if method == "max":
            if (wins(values[lid + width], where[lid + width], values[lid], where[lid])) {
                values[lid] = values[lid + width];
                where[lid] = where[lid + width];
            }
% else:
            values[lid] += values[lid + width];
% endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lane == 0 && plane < planes) {
% if method == "max":
        ${store_open("y", "y_off + plane")}values[lid]${store_close("y", "y_off + plane")}
    % if save_indices:
        indices[indices_off + plane] = where[lid];
    % endif
% else:
        ${store_open("y", "y_off + plane")}values[lid] / divisor${store_close("y", "y_off + plane")}
% endif
    }
}
% endif
