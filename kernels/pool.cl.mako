## 2-D pooling over NCHW (any N*C planes): max and average, with fixed windows (kernel, stride,
## padding, dilation, as torch's max_pool2d / avg_pool2d) or adaptive windows (torch's
## adaptive_*_pool2d: output o covers [floor(o*In/Out), ceil((o+1)*In/Out))).
##
## pool_forward: one work item per output element (grid-stride loop over N*C*OH*OW).
## pool_backward: one work item per input element; it gathers the gradients of every window that
## holds it (for max: the windows whose saved argmax is this element), so no atomics are needed
## and the summation order is fixed.
## pool_plane_forward (windows that cover the whole plane: global pooling): PLANE_THREADS work
## items share one plane, read it contiguously and combine their results in local memory; a work
## group of GROUP_SIZE holds GROUP_SIZE / PLANE_THREADS planes. Max keeps torch's choice without
## depending on the order of combination: the largest value, the first position among equals,
## and a NaN over any number (the last NaN, as torch's scan keeps replacing).
## Indices (max only) are flat positions h*W + w inside the input plane, as torch returns them.
##
## Template parameters:
##   method        "max" or "avg"
##   window        "regular" (kernel/stride/padding/dilation) or "adaptive"
##   save_indices  max only: write the argmax of each window (needed for backward)
##   index_t       "int" when every element index fits in 31 bits, else "long"
##   group_size    work-group size of pool_plane_forward (a power of two)
#define I ${index_t}
#define GROUP_SIZE ${group_size}

<%def name="window_h(o)">
% if window == "regular":
        const int h_start = ${o}h * stride_h - pad_h;
% else:
        const int h_start = (int)(((long)${o}h * H) / OH);
        const int h_end = (int)((((long)${o}h + 1) * H + OH - 1) / OH);
% endif
</%def>
<%def name="window_w(o)">
% if window == "regular":
        const int w_start = ${o}w * stride_w - pad_w;
% else:
        const int w_start = (int)(((long)${o}w * W) / OW);
        const int w_end = (int)((((long)${o}w + 1) * W + OW - 1) / OW);
% endif
</%def>

#define POOL_ARGS I total, int H, int W, int OH, int OW, int kernel_h, int kernel_w, \
    int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, \
    int count_include_pad, int divisor_override

% if method == "avg" and window == "regular":
// torch's divisor: the window clipped to the padded input (count_include_pad) or to the input.
inline float avg_divisor(int h_start, int w_start, int H, int W, int kernel_h, int kernel_w,
                         int pad_h, int pad_w, int count_include_pad, int divisor_override)
{
    if (divisor_override)
        return (float)divisor_override;
    int h_end = min(h_start + kernel_h, H + pad_h);
    int w_end = min(w_start + kernel_w, W + pad_w);
    int padded = (h_end - h_start) * (w_end - w_start);
    if (count_include_pad)
        return (float)padded;
    return (float)((min(h_end, H) - max(h_start, 0)) * (min(w_end, W) - max(w_start, 0)));
}
% endif

__kernel void pool_forward(POOL_ARGS,
    __global const float* restrict x, I x_off, __global float* restrict y, I y_off
% if save_indices:
    , __global long* restrict indices, I indices_off
% endif
    )
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int ow = (int)(i % OW);
        const I r = i / OW;
        const int oh = (int)(r % OH);
        const I plane = r / OH;
        __global const float* src = x + x_off + plane * H * W;
        ${window_h("o")}
        ${window_w("o")}
% if method == "max":
        float best = -INFINITY;
        int best_index = -1;
    % if window == "regular":
        for (int kh = 0; kh < kernel_h; ++kh) {
            const int ih = h_start + kh * dilation_h;
            if (ih < 0 || ih >= H)
                continue;
            for (int kw = 0; kw < kernel_w; ++kw) {
                const int iw = w_start + kw * dilation_w;
                if (iw < 0 || iw >= W)
                    continue;
    % else:
        for (int ih = h_start; ih < h_end; ++ih) {
            for (int iw = w_start; iw < w_end; ++iw) {
    % endif
                const float v = src[ih * W + iw];
                // torch's rule: the first maximum wins, a NaN wins over any number.
                if (best_index < 0 || v > best || isnan(v)) {
                    best = v;
                    best_index = ih * W + iw;
                }
            }
        }
        y[y_off + i] = best;
    % if save_indices:
        indices[indices_off + i] = best_index;
    % endif
% else:
        float sum = 0.0f;
    % if window == "regular":
        const int h_lo = max(h_start, 0), h_hi = min(h_start + kernel_h, H);
        const int w_lo = max(w_start, 0), w_hi = min(w_start + kernel_w, W);
        for (int ih = h_lo; ih < h_hi; ++ih)
            for (int iw = w_lo; iw < w_hi; ++iw)
                sum += src[ih * W + iw];
        y[y_off + i] = sum / avg_divisor(h_start, w_start, H, W, kernel_h, kernel_w, pad_h, pad_w,
                                         count_include_pad, divisor_override);
    % else:
        for (int ih = h_start; ih < h_end; ++ih)
            for (int iw = w_start; iw < w_end; ++iw)
                sum += src[ih * W + iw];
        y[y_off + i] = sum / (float)((h_end - h_start) * (w_end - w_start));
    % endif
% endif
    }
}

// total counts input elements here.
__kernel void pool_backward(POOL_ARGS,
    __global const float* restrict dy, I dy_off, __global float* restrict dx, I dx_off
% if method == "max":
    , __global const long* restrict indices, I indices_off
% endif
    )
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int iw = (int)(i % W);
        const I r = i / W;
        const int ih = (int)(r % H);
        const I plane = r / H;
        const I out_plane = plane * OH * OW;
        float sum = 0.0f;
% if window == "regular":
        for (int kh = 0; kh < kernel_h; ++kh) {
            const int th = ih + pad_h - kh * dilation_h;
            if (th < 0 || th % stride_h)
                continue;
            const int oh = th / stride_h;
            if (oh >= OH)
                continue;
            for (int kw = 0; kw < kernel_w; ++kw) {
                const int tw = iw + pad_w - kw * dilation_w;
                if (tw < 0 || tw % stride_w)
                    continue;
                const int ow = tw / stride_w;
                if (ow >= OW)
                    continue;
% else:
        // Outputs whose adaptive window can hold ih (resp. iw); each is checked below.
        const int oh_lo = (int)(((long)ih * OH) / H);
        const int oh_hi = (int)((((long)ih + 1) * OH + H - 1) / H);
        const int ow_lo = (int)(((long)iw * OW) / W);
        const int ow_hi = (int)((((long)iw + 1) * OW + W - 1) / W);
        for (int oh = oh_lo; oh < min(oh_hi, OH); ++oh) {
            ${window_h("o")}
            if (ih < h_start || ih >= h_end)
                continue;
            for (int ow = ow_lo; ow < min(ow_hi, OW); ++ow) {
                ${window_w("o")}
                if (iw < w_start || iw >= w_end)
                    continue;
% endif
                const I o = out_plane + oh * OW + ow;
% if method == "max":
                if (indices[indices_off + o] == ih * W + iw)
                    sum += dy[dy_off + o];
% elif window == "regular":
                sum += dy[dy_off + o] / avg_divisor(oh * stride_h - pad_h, ow * stride_w - pad_w, H, W,
                    kernel_h, kernel_w, pad_h, pad_w, count_include_pad, divisor_override);
% else:
                sum += dy[dy_off + o] / (float)((h_end - h_start) * (w_end - w_start));
% endif
            }
        }
        dx[dx_off + i] = sum;
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
    __global const float* restrict x, I x_off, __global float* restrict y, I y_off
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
        __global const float* src = x + x_off + plane * plane_size;
        for (int e = lane; e < plane_size; e += plane_threads) {
% if method == "max":
            const float v = src[e];
            if (wins(v, e, acc, acc_i)) {
                acc = v;
                acc_i = e;
            }
% else:
            acc += src[e];
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
        y[y_off + plane] = values[lid];
    % if save_indices:
        indices[indices_off + plane] = where[lid];
    % endif
% else:
        y[y_off + plane] = values[lid] / divisor;
% endif
    }
}
% endif
