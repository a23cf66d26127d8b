## Direct depthwise convolution (groups == C, K = C * multiplier), any stride, padding and
## dilation (MobileNet's stride-1 and stride-2 layers). The kernel size is compile-time so the
## R x S window unrolls; the rest of the geometry is run-time.
##
## Template parameters:
##   kernel_r, kernel_s  the kernel size R x S
##   channel_last        bool: enumerate outputs channel-fastest (NHWC) for coalesced access
##   reduce_group        work items per group in backward_filter (a power of two)
##   has_scale, has_shift, has_residual, activation, chain   the forward epilogue (conv_common;
##                   chain: a fusion plan's bias / batch-norm chain computed in the epilogue)
##   tile                None, or a dict selecting the tiled forward kernel conv_dw_forward_tiled
##                       (NCHW planes, dilation 1) with the keys
##                         stride  the convolution stride, both axes
##                         gx, gy  work-group size along W and H
##                         tw, th  outputs per work item along W and H
##                         planes  (image, channel) planes per work group (third local axis)
##   rows                None, or a dict selecting the row-band kernels conv_dw_forward_rows and
##                       conv_dw_backward_data_rows (NCHW, dilation 1) with the keys
##                         stride  the convolution stride, both axes
##                         gx, gy  work-group size along W and along (plane, row)
##
## Kernels:
##   conv_dw_forward          y[n,k,oh,ow] = epilogue(sum_{r,s} x[n,k/mult,ih,iw] w[k,0,r,s])
##   conv_dw_backward_data    dx[n,c,h,w]  = alpha * sum_{m,r,s} dy[n,c*mult+m,oh,ow] w[..] + beta dx
##                            both one work item per output element on a 3-D grid: (pixel,
##                            channel, image), or (channel, pixel, image) with channel_last, so
##                            that neighbouring work items touch neighbouring addresses
##   conv_dw_backward_filter  partial[split][k][r*S+s] = sum over the split's images; one work
##                            group per (k, split)
##   conv_dw_reduce           dw = alpha * sum_split partial + beta * dw
##   conv_dw_forward_tiled    the forward of one (tw * gx) x (th * gy) output block of `planes`
##                            (n, k) planes per work group: the input block with its halo is
##                            staged in local memory by coalesced row loads, then each work item
##                            keeps th x tw outputs in registers. Its columns are interleaved
##                            (item x has columns x, x + gx, ...) so that neighbouring items read
##                            neighbouring local words and write neighbouring addresses; rows are
##                            adjacent so that each staged row read serves several outputs.
##   conv_dw_forward_rows     the forward of a band of `band_h` whole output rows of `planes`
##                            consecutive (n, k) planes per work group: small planes share a
##                            group (several planes, whole), large ones are cut into bands. The
##                            input rows with their halo are staged in local memory (a run-time
##                            size), each staged row read by gx neighbouring items at neighbouring
##                            addresses; item (x, y) then computes outputs (row y + i * gy,
##                            column x + j * gx): no division on the inner loops, stores
##                            coalesced along W. Any multiplier.
##   conv_dw_backward_data_rows  the same for dx (multiplier 1): the dy rows a band of dx rows
##                            reads are staged, and each dx element gathers the taps whose
##                            (position + pad - tap) is a multiple of the stride (compile-time,
##                            so the test is a mask, not a division).
<%namespace name="common" file="conv_common.cl.mako"/>
#define KR ${kernel_r}
#define KS ${kernel_s}
#define REDUCE_GROUP ${reduce_group}

__kernel void conv_dw_forward(${common.geometry_params()},
    __global const float *x, int x_off, __global const float *w, int w_off,
    __global float *y, int y_off, ${common.epilogue_params()})
{
    const int mult = K / C;
% if channel_last:
    const int k = get_global_id(0), p = get_global_id(1), n = get_global_id(2);
% else:
    const int p = get_global_id(0), k = get_global_id(1), n = get_global_id(2);
% endif
    if (p >= Ho * Wo || k >= K)
        return;
    {
        const int oh = p / Wo, ow = p - oh * Wo;
        __global const float *xc = x + x_off + n * xsN + (k / mult) * xsC;
        __global const float *wk = w + w_off + k * wsK;
        const int ih0 = oh * stride_h - pad_h, iw0 = ow * stride_w - pad_w;
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            int ih = ih0 + r * dil_h;
            if (ih < 0 || ih >= H)
                continue;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                int iw = iw0 + s * dil_w;
                if (iw >= 0 && iw < W)
                    acc = mad(xc[ih * xsH + iw * xsW], wk[r * wsR + s * wsS], acc);
            }
        }
${common.store("y", "y_off", "n * ysN + k * ysC + oh * ysH + ow * ysW", "k", "acc")}
    }
}

__kernel void conv_dw_backward_data(${common.geometry_params()},
    __global const float *dy, int dy_off, __global const float *w, int w_off,
    __global float *dx, int dx_off, float alpha, float beta)
{
    const int mult = K / C;
% if channel_last:
    const int c = get_global_id(0), p = get_global_id(1), n = get_global_id(2);
% else:
    const int p = get_global_id(0), c = get_global_id(1), n = get_global_id(2);
% endif
    if (p >= H * W || c >= C)
        return;
    {
        const int ih = p / W, iw = p - ih * W;
        float acc = 0.0f;
        for (int m = 0; m < mult; ++m) {
            int k = c * mult + m;
            __global const float *dyk = dy + dy_off + n * ysN + k * ysC;
            __global const float *wk = w + w_off + k * wsK;
#pragma unroll
            for (int r = 0; r < KR; ++r) {
                int th = ih + pad_h - r * dil_h;
                if (th < 0)
                    continue;
                int oh = th / stride_h;
                if (oh * stride_h != th || oh >= Ho)
                    continue;
#pragma unroll
                for (int s = 0; s < KS; ++s) {
                    int tw = iw + pad_w - s * dil_w;
                    if (tw < 0)
                        continue;
                    int ow = tw / stride_w;
                    if (ow * stride_w == tw && ow < Wo)
                        acc = mad(dyk[oh * ysH + ow * ysW], wk[r * wsR + s * wsS], acc);
                }
            }
        }
${common.store_scaled("dx", "dx_off", "n * xsN + c * xsC + ih * xsH + iw * xsW", "acc")}
    }
}

__kernel __attribute__((reqd_work_group_size(REDUCE_GROUP, 1, 1)))
void conv_dw_backward_filter(${common.geometry_params()},
    __global const float *dy, int dy_off, __global const float *x, int x_off,
    __global float *partial, int partial_off, int images_per_split)
{
    __local float sums[KR * KS][REDUCE_GROUP];
    const int mult = K / C;
    const int k = get_group_id(0), split = get_group_id(1);
    const int lid = get_local_id(0);
    const int c = k / mult;
    const int n_begin = split * images_per_split;
    const int n_end = min(N, n_begin + images_per_split);
    const int pixels = Ho * Wo;
    float acc[KR * KS];
    for (int q = 0; q < KR * KS; ++q)
        acc[q] = 0.0f;
    // (image, pixel) pairs are flattened so that small images still occupy the whole group.
    const int count = (n_end - n_begin) * pixels;
    for (int e = lid; e < count; e += REDUCE_GROUP) {
        int n = n_begin + e / pixels, p = e - (e / pixels) * pixels;
        __global const float *dyk = dy + dy_off + n * ysN + k * ysC;
        __global const float *xc = x + x_off + n * xsN + c * xsC;
        {
            int oh = p / Wo, ow = p - oh * Wo;
            float g = dyk[oh * ysH + ow * ysW];
            int ih0 = oh * stride_h - pad_h, iw0 = ow * stride_w - pad_w;
#pragma unroll
            for (int r = 0; r < KR; ++r) {
                int ih = ih0 + r * dil_h;
                bool row_in = ih >= 0 && ih < H;
#pragma unroll
                for (int s = 0; s < KS; ++s) {
                    int iw = iw0 + s * dil_w;
                    if (row_in && iw >= 0 && iw < W)
                        acc[r * KS + s] = mad(g, xc[ih * xsH + iw * xsW], acc[r * KS + s]);
                }
            }
        }
    }
    for (int q = 0; q < KR * KS; ++q)
        sums[q][lid] = acc[q];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = REDUCE_GROUP / 2; step > 0; step >>= 1) {
        if (lid < step)
            for (int q = 0; q < KR * KS; ++q)
                sums[q][lid] += sums[q][lid + step];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < KR * KS)
        partial[partial_off + (split * K + k) * (KR * KS) + lid] = sums[lid][0];
}

// dw[k, 0, r, s] = alpha * sum_split partial[split][k][r*S+s] + beta * dw.
__kernel void conv_dw_reduce(${common.geometry_params()}, int splits,
    __global const float *partial, int partial_off, __global float *dw, int dw_off, float alpha,
    float beta)
{
    const int count = K * KR * KS;
    for (int i = get_global_id(0); i < count; i += get_global_size(0)) {
        int k = i / (KR * KS), rs = i - k * (KR * KS);
        int r = rs / KS, s = rs - r * KS;
        float acc = 0.0f;
        for (int q = 0; q < splits; ++q)
            acc += partial[partial_off + q * count + i];
${common.store_scaled("dw", "dw_off", "k * wsK + r * wsR + s * wsS", "acc")}
    }
}

% if tile:
<%
    st, gx, gy, tw, th, planes = (tile[k] for k in ("stride", "gx", "gy", "tw", "th", "planes"))
    block_w, block_h = gx * tw, gy * th
    in_w, in_h = (block_w - 1) * st + kernel_s, (block_h - 1) * st + kernel_r
    item_rows = (th - 1) * st + kernel_r
%>
#define TILE_IN_W ${in_w}
#define TILE_IN_H ${in_h}

// Grid: (ceil(N * K / planes) * tiles_h * tiles_w * gx, gy, planes): the work groups along
// axis 0 enumerate (plane group, output block), blocks fastest; tiles_w blocks per output row.
// Axis 0 alone carries the count, whose limit (2^32 groups) the other axes lack.
__kernel __attribute__((reqd_work_group_size(${gx}, ${gy}, ${planes})))
void conv_dw_forward_tiled(${common.geometry_params()},
    __global const float *x, int x_off, __global const float *w, int w_off,
    __global float *y, int y_off, ${common.epilogue_params()}, int tiles_w, int tiles)
{
    __local float staged[${planes}][TILE_IN_H][TILE_IN_W];
    const int lx = get_local_id(0), ly = get_local_id(1), lp = get_local_id(2);
    const int group = get_group_id(0);
    const int block = group % tiles;
    const int plane = (group / tiles) * ${planes} + lp;
    const bool plane_in = plane < N * K;
    const int n = plane_in ? plane / K : 0, k = plane_in ? plane - n * K : 0;
    const int mult = K / C;
    const int oh0 = (block / tiles_w) * ${block_h}, ow0 = (block % tiles_w) * ${block_w};
    const int ih0 = oh0 * ${st} - pad_h, iw0 = ow0 * ${st} - pad_w;
    {
        __global const float *xc = x + x_off + n * xsN + (k / mult) * xsC;
        // Indexed by row and column: a flat index through &staged[lp][0][0] runs past the
        // first row's bounds, which C leaves undefined (Oclgrind reports it).
        for (int i = ly * ${gx} + lx; i < TILE_IN_H * TILE_IN_W; i += ${gx * gy}) {
            int r = i / TILE_IN_W, c = i - r * TILE_IN_W;
            int ih = ih0 + r, iw = iw0 + c;
            bool inside = plane_in && ih >= 0 && ih < H && iw >= 0 && iw < W;
            staged[lp][r][c] = inside ? xc[ih * xsH + iw * xsW] : 0.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!plane_in)
        return;
    __global const float *wk = w + w_off + k * wsK;
    float wr[KR * KS];
% for r in range(kernel_r):
% for s in range(kernel_s):
    wr[${r * kernel_s + s}] = wk[${r} * wsR + ${s} * wsS];
% endfor
% endfor
    const int row0 = ly * ${th * st};
% for j in range(tw):
    {
        const int col = (lx + ${j * gx}) * ${st};
        const int ow = ow0 + lx + ${j * gx};
% for t in range(th):
        float acc${t} = 0.0f;
% endfor
% for q in range(item_rows):
        {
            __local const float *row = &staged[lp][row0 + ${q}][col];
% for s in range(kernel_s):
            const float v${s} = row[${s}];
% endfor
% for t in range(th):
<% r = q - t * st %>\
% if 0 <= r < kernel_r:
% for s in range(kernel_s):
            acc${t} = mad(v${s}, wr[${r * kernel_s + s}], acc${t});
% endfor
% endif
% endfor
        }
% endfor
        if (ow < Wo) {
% for t in range(th):
            {
                const int oh = oh0 + ly * ${th} + ${t};
                if (oh < Ho)
${common.store("y", "y_off", "n * ysN + k * ysC + oh * ysH + ow * ysW", "k", "acc%d" % t)}
            }
% endfor
        }
    }
% endfor
}
% endif

% if rows:
<%
    st, rgx, rgy = rows["stride"], rows["gx"], rows["gy"]
%>
#define RST ${st}

// Grid: (ceil(N * K / planes) * bands * gx, gy): work groups along axis 0 enumerate (plane
// group, band), bands fastest. staged holds planes x staged_rows x staged_w words.
__kernel __attribute__((reqd_work_group_size(${rgx}, ${rgy}, 1)))
void conv_dw_forward_rows(${common.geometry_params()},
    __global const float *x, int x_off, __global const float *w, int w_off,
    __global float *y, int y_off, ${common.epilogue_params()},
    int planes, int band_h, int bands, int staged_rows, int staged_w, __local float *staged)
{
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int group = get_group_id(0);
    const int oh0 = (group % bands) * band_h;
    const int plane0 = (group / bands) * planes;
    const int plane_count = min(planes, N * K - plane0);
    const int mult = K / C;
    const int ih0 = oh0 * RST - pad_h;
    for (int row = ly; row < plane_count * staged_rows; row += ${rgy}) {
        const int p = row / staged_rows, r = row - p * staged_rows;
        const int plane = plane0 + p, n = plane / K, k = plane - n * K;
        const int ih = ih0 + r;
        const bool row_in = ih >= 0 && ih < H;
        const int base = x_off + n * xsN + (k / mult) * xsC + ih * xsH;
        __local float *dst = staged + row * staged_w;
        for (int c = lx; c < staged_w; c += ${rgx}) {
            const int iw = c - pad_w;
            dst[c] = (row_in && iw >= 0 && iw < W) ? x[base + iw * xsW] : 0.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int out_rows = min(band_h, Ho - oh0);
    for (int row = ly; row < plane_count * band_h; row += ${rgy}) {
        const int p = row / band_h, t = row - p * band_h;
        if (t >= out_rows)
            continue;
        const int plane = plane0 + p, n = plane / K, k = plane - n * K;
        const int oh = oh0 + t;
        __global const float *wk = w + w_off + k * wsK;
        float wr[KR * KS];
% for r in range(kernel_r):
% for s in range(kernel_s):
        wr[${r * kernel_s + s}] = wk[${r} * wsR + ${s} * wsS];
% endfor
% endfor
        __local const float *src = staged + (p * staged_rows + t * RST) * staged_w;
        for (int ow = lx; ow < Wo; ow += ${rgx}) {
            __local const float *tap = src + ow * RST;
            float acc = 0.0f;
% for r in range(kernel_r):
% for s in range(kernel_s):
            acc = mad(tap[${r} * staged_w + ${s}], wr[${r * kernel_s + s}], acc);
% endfor
% endfor
${common.store("y", "y_off", "n * ysN + k * ysC + oh * ysH + ow * ysW", "k", "acc")}
        }
    }
}

// dx rows [ih0, ih0 + band_h) of `planes` consecutive (n, c) planes; K == C. ih0 is a multiple
// of the stride (band_h is one, or one band covers the plane) so that the staged rows' count
// is the host's (staged_shape in ops/conv/depthwise.py). Staged dy row 0 is output row
// floor((ih0 + pad_h - KR + 1) / stride), column 0 output column floor((pad_w - KS + 1) / stride).
__kernel __attribute__((reqd_work_group_size(${rgx}, ${rgy}, 1)))
void conv_dw_backward_data_rows(${common.geometry_params()},
    __global const float *dy, int dy_off, __global const float *w, int w_off,
    __global float *dx, int dx_off, float alpha, float beta,
    int planes, int band_h, int bands, int staged_rows, int staged_w, __local float *staged)
{
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int group = get_group_id(0);
    const int ih0 = (group % bands) * band_h;
    const int plane0 = (group / bands) * planes;
    const int plane_count = min(planes, N * C - plane0);
    // Floor divisions of possibly negative numbers, shifted to non-negative ones.
    const int oh_lo = (ih0 + pad_h - KR + 1 + RST * KR) / RST - KR;
    const int ow_lo = (pad_w - KS + 1 + RST * KS) / RST - KS;
    for (int row = ly; row < plane_count * staged_rows; row += ${rgy}) {
        const int p = row / staged_rows, r = row - p * staged_rows;
        const int plane = plane0 + p, n = plane / C, c = plane - n * C;
        const int oh = oh_lo + r;
        const bool row_in = oh >= 0 && oh < Ho;
        const int base = dy_off + n * ysN + c * ysC + oh * ysH;
        __local float *dst = staged + row * staged_w;
        for (int q = lx; q < staged_w; q += ${rgx}) {
            const int ow = ow_lo + q;
            dst[q] = (row_in && ow >= 0 && ow < Wo) ? dy[base + ow * ysW] : 0.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int in_rows = min(band_h, H - ih0);
    for (int row = ly; row < plane_count * band_h; row += ${rgy}) {
        const int p = row / band_h, t = row - p * band_h;
        if (t >= in_rows)
            continue;
        const int plane = plane0 + p, n = plane / C, c = plane - n * C;
        const int ih = ih0 + t;
        __global const float *wk = w + w_off + c * wsK;
        float wr[KR * KS];
% for r in range(kernel_r):
% for s in range(kernel_s):
        wr[${r * kernel_s + s}] = wk[${r} * wsR + ${s} * wsS];
% endfor
% endfor
        __local const float *src = staged + p * staged_rows * staged_w;
        for (int iw = lx; iw < W; iw += ${rgx}) {
            float acc = 0.0f;
% for r in range(kernel_r):
            {
                // Non-negative by the choice of oh_lo; a multiple of the stride where tap r hits.
                const int tr = ih + pad_h - ${r} - RST * oh_lo;
% if st > 1:
                const bool row_hit = tr % RST == 0;
% endif
                __local const float *line = src + (tr / RST) * staged_w;
% for s in range(kernel_s):
                {
                    const int tc = iw + pad_w - ${s} - RST * ow_lo;
% if st > 1:
                    const float v = (row_hit && tc % RST == 0) ? line[tc / RST] : 0.0f;
% else:
                    const float v = line[tc];
% endif
                    acc = mad(v, wr[${r * kernel_s + s}], acc);
                }
% endfor
            }
% endfor
${common.store_scaled("dx", "dx_off", "n * xsN + c * xsC + ih * xsH + iw * xsW", "acc")}
        }
    }
}
% endif
