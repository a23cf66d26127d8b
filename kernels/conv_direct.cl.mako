## Direct (naive) convolution: one work item per output element, loops over the reduction.
## Applies to every problem; the last fallback and the reference in verification. Each kernel
## walks its output with a grid-stride loop.
##
## Template parameters:
##   has_scale, has_shift, has_residual, activation, chain   the forward epilogue (conv_common;
##                   chain: a fusion plan's bias / batch-norm chain computed in the epilogue)
##
## Kernels:
##   conv_direct_forward          y[n,k,oh,ow]  = epilogue(sum_{c,r,s} x[n,g*Cg+c,ih,iw] w[k,c,r,s])
##   conv_direct_backward_data    dx[n,c,h,w]   = alpha * sum_{k,r,s} dy[n,k,oh,ow] w[k,c',r,s] + beta dx
##   conv_direct_backward_data_phased  the same dx, with PHASED_C channels per work item and
##                                the work items ordered by stride phase: item i covers
##                                (n, channel block, phase a, phase b, qh, qw), qw fastest, and
##                                dx[n, c, a + qh * stride_h, b + qw * stride_w]. Within a phase
##                                every item takes the same (r, s) taps, so a warp does not
##                                diverge on the stride test and reads each weight at one address
##                                (a broadcast); neighbouring items read neighbouring dy. For
##                                layers with few input channels (an RGB stem's data gradient).
##   conv_direct_backward_filter  dw[k,c,r,s]   = alpha * sum_{n,oh,ow} dy[n,k,oh,ow] x[..] + beta dw
##   conv_direct_backward_bias    db[k]         = alpha * sum_{n,oh,ow} dy[n,k,oh,ow] + beta db
##                                (one work group of BIAS_GROUP items per channel)
<%namespace name="common" file="conv_common.cl.mako"/>
#define BIAS_GROUP 256
#define PHASED_C 4

__kernel void conv_direct_forward(${common.geometry_params()},
    __global const float *x, int x_off, __global const float *w, int w_off,
    __global float *y, int y_off, ${common.epilogue_params()})
{
    const int Cg = C / groups, Kg = K / groups;
    const int total = N * K * Ho * Wo;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int ow = i % Wo, t = i / Wo;
        int oh = t % Ho; t /= Ho;
        int k = t % K, n = t / K;
        int g = k / Kg;
        __global const float *xg = x + x_off + n * xsN + g * Cg * xsC;
        __global const float *wk = w + w_off + k * wsK;
        float acc = 0.0f;
        for (int c = 0; c < Cg; ++c) {
            for (int r = 0; r < R; ++r) {
                int ih = oh * stride_h - pad_h + r * dil_h;
                if (ih < 0 || ih >= H)
                    continue;
                for (int s = 0; s < S; ++s) {
                    int iw = ow * stride_w - pad_w + s * dil_w;
                    if (iw < 0 || iw >= W)
                        continue;
                    acc = mad(xg[c * xsC + ih * xsH + iw * xsW], wk[c * wsC + r * wsR + s * wsS], acc);
                }
            }
        }
${common.store("y", "y_off", "n * ysN + k * ysC + oh * ysH + ow * ysW", "k", "acc")}
    }
}

__kernel void conv_direct_backward_data(${common.geometry_params()},
    __global const float *dy, int dy_off, __global const float *w, int w_off,
    __global float *dx, int dx_off, float alpha, float beta)
{
    const int Cg = C / groups, Kg = K / groups;
    const int total = N * C * H * W;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int iw = i % W, t = i / W;
        int ih = t % H; t /= H;
        int c = t % C, n = t / C;
        int g = c / Cg, cl = c - g * Cg;
        float acc = 0.0f;
        for (int kl = 0; kl < Kg; ++kl) {
            int k = g * Kg + kl;
            for (int r = 0; r < R; ++r) {
                int th = ih + pad_h - r * dil_h;
                if (th < 0 || th % stride_h)
                    continue;
                int oh = th / stride_h;
                if (oh >= Ho)
                    continue;
                for (int s = 0; s < S; ++s) {
                    int tw = iw + pad_w - s * dil_w;
                    if (tw < 0 || tw % stride_w)
                        continue;
                    int ow = tw / stride_w;
                    if (ow >= Wo)
                        continue;
                    acc = mad(dy[dy_off + n * ysN + k * ysC + oh * ysH + ow * ysW],
                              w[w_off + k * wsK + cl * wsC + r * wsR + s * wsS], acc);
                }
            }
        }
${common.store_scaled("dx", "dx_off", "n * xsN + c * xsC + ih * xsH + iw * xsW", "acc")}
    }
}

__kernel void conv_direct_backward_data_phased(${common.geometry_params()},
    __global const float *dy, int dy_off, __global const float *w, int w_off,
    __global float *dx, int dx_off, float alpha, float beta)
{
    const int Cg = C / groups, Kg = K / groups;
    const int c_blocks = (Cg + PHASED_C - 1) / PHASED_C;
    const int Hq = (H + stride_h - 1) / stride_h, Wq = (W + stride_w - 1) / stride_w;
    const int total = N * groups * c_blocks * stride_h * stride_w * Hq * Wq;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int qw = i % Wq, t = i / Wq;
        int qh = t % Hq; t /= Hq;
        int b = t % stride_w; t /= stride_w;
        int a = t % stride_h; t /= stride_h;
        int cb = t % c_blocks; t /= c_blocks;
        int g = t % groups, n = t / groups;
        int ih = a + qh * stride_h, iw = b + qw * stride_w;
        if (ih >= H || iw >= W)
            continue;
        int c0 = cb * PHASED_C;
        float acc[PHASED_C];
#pragma unroll
        for (int j = 0; j < PHASED_C; ++j)
            acc[j] = 0.0f;
        for (int kl = 0; kl < Kg; ++kl) {
            int k = g * Kg + kl;
            __global const float *dyk = dy + dy_off + n * ysN + k * ysC;
            __global const float *wk = w + w_off + k * wsK + c0 * wsC;
            for (int r = 0; r < R; ++r) {
                int th = ih + pad_h - r * dil_h;
                if (th < 0 || th % stride_h)
                    continue;
                int oh = th / stride_h;
                if (oh >= Ho)
                    continue;
                for (int s = 0; s < S; ++s) {
                    int tw = iw + pad_w - s * dil_w;
                    if (tw < 0 || tw % stride_w)
                        continue;
                    int ow = tw / stride_w;
                    if (ow >= Wo)
                        continue;
                    float v = dyk[oh * ysH + ow * ysW];
#pragma unroll
                    for (int j = 0; j < PHASED_C; ++j)
                        if (c0 + j < Cg)
                            acc[j] = mad(v, wk[j * wsC + r * wsR + s * wsS], acc[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < PHASED_C; ++j) {
            if (c0 + j >= Cg)
                break;
            int c = g * Cg + c0 + j;
${common.store_scaled("dx", "dx_off", "n * xsN + c * xsC + ih * xsH + iw * xsW", "acc[j]")}
        }
    }
}

__kernel void conv_direct_backward_filter(${common.geometry_params()},
    __global const float *dy, int dy_off, __global const float *x, int x_off,
    __global float *dw, int dw_off, float alpha, float beta)
{
    const int Cg = C / groups, Kg = K / groups;
    const int total = K * Cg * R * S;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int s = i % S, t = i / S;
        int r = t % R; t /= R;
        int c = t % Cg, k = t / Cg;
        int g = k / Kg;
        float acc = 0.0f;
        for (int n = 0; n < N; ++n) {
            for (int oh = 0; oh < Ho; ++oh) {
                int ih = oh * stride_h - pad_h + r * dil_h;
                if (ih < 0 || ih >= H)
                    continue;
                for (int ow = 0; ow < Wo; ++ow) {
                    int iw = ow * stride_w - pad_w + s * dil_w;
                    if (iw < 0 || iw >= W)
                        continue;
                    acc = mad(dy[dy_off + n * ysN + k * ysC + oh * ysH + ow * ysW],
                              x[x_off + n * xsN + (g * Cg + c) * xsC + ih * xsH + iw * xsW], acc);
                }
            }
        }
${common.store_scaled("dw", "dw_off", "k * wsK + c * wsC + r * wsR + s * wsS", "acc")}
    }
}

__kernel __attribute__((reqd_work_group_size(BIAS_GROUP, 1, 1)))
void conv_direct_backward_bias(${common.geometry_params()},
    __global const float *dy, int dy_off, __global float *db, int db_off, float alpha, float beta)
{
    __local float partial[BIAS_GROUP];
    const int k = get_group_id(0);
    const int lid = get_local_id(0);
    const int pixels = Ho * Wo;
    float acc = 0.0f;
    for (int i = lid; i < N * pixels; i += BIAS_GROUP) {
        int n = i / pixels, p = i - n * pixels;
        int oh = p / Wo, ow = p - oh * Wo;
        acc += dy[dy_off + n * ysN + k * ysC + oh * ysH + ow * ysW];
    }
    partial[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = BIAS_GROUP / 2; step > 0; step >>= 1) {
        if (lid < step)
            partial[lid] += partial[lid + step];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
${common.store_scaled("db", "db_off", "k", "partial[0]")}
    }
}
