## Direct forward convolution for few input channels and output channels (an RGB stem: C = 3,
## K = 32 or 64, 3x3 or 7x7), groups 1, any stride, padding and dilation, either layout.
## A work group stages all C * R * S * K weights in local memory once, laid out [tap][k] so that
## one float4 read (the same address in every work item: a broadcast) feeds 4 * PIXELS
## multiply-adds; each work item keeps PIXELS neighbouring output pixels (along ow) times K
## output channels in registers, and reads each input tap once per pixel. The tap loops are
## unrolled (C, R, S, K are compile-time), so no index arithmetic is left in the inner loop.
## Work items: one per (img, oh, block of PIXELS ow), ow fastest, so the K stores of a work
## item each cover neighbouring pixels across the group.
##
## Template parameters:
##   channels        C (input channels)
##   kernel_r, kernel_s  R x S
##   out_channels    K; the staged rows are padded to a multiple of 4 with zeros
##   pixels          PIXELS, output pixels per work item (1 or 2)
##   group_size      work items per group (the weight staging loop's stride)
##   has_scale, has_shift, has_residual, activation, affine_per_position, chain   the forward
##                   epilogue (conv_common; chain: a fusion plan's bias / batch-norm chain)
<%namespace name="common" file="conv_common.cl.mako"/>
<%
    taps = channels * kernel_r * kernel_s
    k4 = (out_channels + 3) // 4
%>
#define CH ${channels}
#define KR ${kernel_r}
#define KS ${kernel_s}
#define KOUT ${out_channels}
#define K4 ${k4}
#define TAPS ${taps}
#define PIXELS ${pixels}
#define GROUP ${group_size}

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void conv_direct_small_forward(${common.geometry_params()},
    __global const float *x, int x_off, __global const float *w, int w_off,
    __global float *y, int y_off, ${common.epilogue_params()})
{
    __local float4 w_local[TAPS * K4];
    __local float *w_flat = (__local float *)w_local;
    for (int i = get_local_id(0); i < TAPS * K4 * 4; i += GROUP) {
        int tap = i / (K4 * 4), k = i - tap * (K4 * 4);
        int c = tap / (KR * KS), rs = tap - c * (KR * KS);
        int r = rs / KS, s = rs - r * KS;
        w_flat[i] = k < KOUT ? w[w_off + k * wsK + c * wsC + r * wsR + s * wsS] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    const int blocks_w = (Wo + PIXELS - 1) / PIXELS;
    const int item = get_global_id(0);
    if (item >= N * Ho * blocks_w)
        return;
    const int img = item / (Ho * blocks_w), rest = item - img * (Ho * blocks_w);
    const int oh = rest / blocks_w, ow0 = (rest - oh * blocks_w) * PIXELS;
    const int h0 = oh * stride_h - pad_h;
    int w0[PIXELS];
    for (int p = 0; p < PIXELS; ++p)
        w0[p] = (ow0 + p) * stride_w - pad_w;
    __global const float *src = x + x_off + img * xsN;

    float4 acc[PIXELS][K4];
    for (int p = 0; p < PIXELS; ++p)
        for (int j = 0; j < K4; ++j)
            acc[p][j] = (float4)(0.0f);

#pragma unroll
    for (int c = 0; c < CH; ++c) {
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int ih = h0 + r * dil_h;
            const bool row_in = ih >= 0 && ih < H;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                float v[PIXELS];
                for (int p = 0; p < PIXELS; ++p) {
                    int iw = w0[p] + s * dil_w;
                    v[p] = (row_in && iw >= 0 && iw < W) ? src[c * xsC + ih * xsH + iw * xsW]
                                                         : 0.0f;
                }
                const int tap = (c * KR + r) * KS + s;
#pragma unroll
                for (int j = 0; j < K4; ++j) {
                    float4 wv = w_local[tap * K4 + j];
                    for (int p = 0; p < PIXELS; ++p)
                        acc[p][j] = mad((float4)(v[p]), wv, acc[p][j]);
                }
            }
        }
    }

    for (int p = 0; p < PIXELS; ++p) {
        const int ow = ow0 + p;
        if (ow >= Wo)
            break;
        const int pixel_index = img * ysN + oh * ysH + ow * ysW;
        for (int j = 0; j < K4; ++j) {
            float out[4] = {acc[p][j].s0, acc[p][j].s1, acc[p][j].s2, acc[p][j].s3};
            for (int q = 0; q < 4; ++q) {
                const int k = j * 4 + q;
                if (k < KOUT) {
${common.store("y", "y_off", "pixel_index + k * ysC", "k", "out[q]")}
                }
            }
        }
    }
}
