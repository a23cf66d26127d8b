## Data movement around the explicit-GEMM convolution ("im2col_gemm", ops/conv/algorithms.py),
## groups 1, any kernel size, stride, padding and dilation. With NP = N * Ho * Wo output
## pixels np = (img, oh, ow) and GK = C * R * S taps kk:
##   forward        col[kk][np] = x at tap kk of pixel np (0 in the padding)       conv_im2col
##                  acc[k][np]  = w[k][kk] @ col[kk][np]                            (GEMM engine)
##                  y           = epilogue(acc), permuted to y's layout             conv_rows_to_output
##   backward data  rows[k][np] = dy[img, k, oh, ow]                                conv_output_to_rows
##                  dcol[kk][np] = w[k][kk]^T @ rows[k][np]                         (GEMM engine)
##                  dx          = alpha * (sum of dcol over the taps that read each input
##                                element) + beta * dx                              conv_col2im
## kk walks the weights in memory order: (c, r, s) for NCHW, (r, s, c) for NHWC, so that w is
## the GEMM's A matrix as stored ([K][GK], leading dimension GK). Each element of dx is summed by
## one work item (a gather, no atomics): the result does not depend on scheduling.
## Tensors are addressed through conv_common's geometry strides, so one compile serves both
## layouts' data; only the kk order is compile-time.
##
## Template parameters:
##   channel_last    bool: kk = (r, s, c) (NHWC weights) instead of (c, r, s)
##   has_scale, has_shift, has_residual, activation, affine_per_position, chain
##                   the forward epilogue (conv_common; chain: a fusion plan's bias /
##                   batch-norm chain), read by conv_rows_to_output only
<%namespace name="common" file="conv_common.cl.mako"/>
<%def name="tap(c, r, s)">\
% if channel_last:
((${r}) * S + (${s})) * C + (${c})\
% else:
((${c}) * R + (${r})) * S + (${s})\
% endif
</%def>

// One work item per (c, np): its R * S taps, each a coalesced row segment of col.
__kernel void conv_im2col(${common.geometry_params()},
    __global const float *x, int x_off, __global float *col, int col_off)
{
    const int HoWo = Ho * Wo, NP = N * HoWo;
    const int total = C * NP;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int c = i / NP, np = i - c * NP;
        int img = np / HoWo, p = np - img * HoWo;
        int oh = p / Wo, ow = p - oh * Wo;
        int h0 = oh * stride_h - pad_h, w0 = ow * stride_w - pad_w;
        __global const float *src = x + x_off + img * xsN + c * xsC;
        __global float *dst = col + col_off + np;
        for (int r = 0; r < R; ++r) {
            int ih = h0 + r * dil_h;
            bool row_in = ih >= 0 && ih < H;
            for (int s = 0; s < S; ++s) {
                int iw = w0 + s * dil_w;
                float v = (row_in && iw >= 0 && iw < W) ? src[ih * xsH + iw * xsW] : 0.0f;
                dst[(${tap("c", "r", "s")}) * NP] = v;
            }
        }
    }
}

// y[img, k, oh, ow] = epilogue(acc[k][np]), work items in y's memory order.
__kernel void conv_rows_to_output(${common.geometry_params()},
    __global const float *acc, int acc_off, __global float *y, int y_off,
    ${common.epilogue_params()})
{
    const int HoWo = Ho * Wo, NP = N * HoWo;
    const int total = K * NP;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
% if channel_last:
        int k = i % K, np = i / K;
        int img = np / HoWo, p = np - img * HoWo;
% else:
        int img = i / (K * HoWo), rest = i - img * (K * HoWo);
        int k = rest / HoWo, p = rest - k * HoWo;
        int np = img * HoWo + p;
% endif
        int oh = p / Wo, ow = p - oh * Wo;
${common.store("y", "y_off", "img * ysN + k * ysC + oh * ysH + ow * ysW", "k", "acc[acc_off + k * NP + np]")}
    }
}

// rows[k][np] = dy[img, k, oh, ow], work items in dy's memory order.
__kernel void conv_output_to_rows(${common.geometry_params()},
    __global const float *dy, int dy_off, __global float *rows, int rows_off)
{
    const int HoWo = Ho * Wo, NP = N * HoWo;
    const int total = K * NP;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
% if channel_last:
        int k = i % K, np = i / K;
        int img = np / HoWo, p = np - img * HoWo;
% else:
        int img = i / (K * HoWo), rest = i - img * (K * HoWo);
        int k = rest / HoWo, p = rest - k * HoWo;
        int np = img * HoWo + p;
% endif
        int oh = p / Wo, ow = p - oh * Wo;
        rows[rows_off + k * NP + np] = dy[dy_off + img * ysN + k * ysC + oh * ysH + ow * ysW];
    }
}

// dx[img, c, h, w] = alpha * sum over taps (r, s) with h + pad_h - r * dil_h = oh * stride_h
// (and likewise for w) inside the output of dcol[kk(c, r, s)][img, oh, ow] + beta * dx.
__kernel void conv_col2im(${common.geometry_params()},
    __global const float *dcol, int dcol_off, __global float *dx, int dx_off,
    float alpha, float beta)
{
    const int HoWo = Ho * Wo, NP = N * HoWo, HW = H * W;
    const int total = N * C * HW;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
% if channel_last:
        int c = i % C, pix = i / C;
        int img = pix / HW, hw = pix - img * HW;
% else:
        int img = i / (C * HW), rest = i - img * (C * HW);
        int c = rest / HW, hw = rest - c * HW;
% endif
        int h = hw / W, w = hw - h * W;
        __global const float *src = dcol + dcol_off + img * HoWo;
        float acc = 0.0f;
        for (int r = 0; r < R; ++r) {
            int th = h + pad_h - r * dil_h;
            if (th < 0)
                break;
            int oh = th / stride_h;
            if (oh * stride_h != th || oh >= Ho)
                continue;
            for (int s = 0; s < S; ++s) {
                int tw = w + pad_w - s * dil_w;
                if (tw < 0)
                    break;
                int ow = tw / stride_w;
                if (ow * stride_w == tw && ow < Wo)
                    acc += src[(${tap("c", "r", "s")}) * NP + oh * Wo + ow];
            }
        }
${common.store_scaled("dx", "dx_off", "img * xsN + c * xsC + h * xsH + w * xsW", "acc")}
    }
}
