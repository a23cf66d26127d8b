## Data movement around the 16-bit GEMM convolution ("gemm16", "im2col_gemm16",
## dlprim_py/ops/conv/gemm16.py): float16 / bfloat16 x, w, y, any kernel size, stride, padding,
## dilation and groups. The products are the GEMM engine's 16-bit GEMMs (float32 sums); these
## kernels only move 16-bit values, and sum or convert in float32. With NP = N * Ho * Wo output
## pixels np = (img, oh, ow), GK = C * R * S taps kk = (c, r, s) (w's memory order, so w is the
## GEMM's A matrix as stored: group g's rows [g * K/g, (g + 1) * K/g) of [K][GK/groups]) and LD
## the column matrices' leading dimension (NP rounded up to 8 values: rows start on 16 bytes,
## which the tensor-core kernel's 16-byte copies need):
##   conv16_im2col          col[kk][np] = x at tap kk of pixel np (0 in the padding), 16-bit
##   conv16_output_to_rows  rows[k][np] = dy[img, k, oh, ow], 16-bit
##   conv16_rows_to_output  y = acc[k][np] (+ beta * y_old: then rounded again), acc: the 16-bit
##                          GEMM result act(alpha * sum + bias), rounded once
##   conv16_col2im          dx = alpha * (float32 sum of dcol over the taps that read each input
##                          element) + beta * dx, rounded once (dcol: float32)
##   conv16_bias_grad       db[k] = alpha * (float32 sum of dy over n, oh, ow) + beta * db[k]
##   conv16_store_scaled    dw = alpha * (sum of acc's parts) + beta * dw, rounded once (acc:
##                          float32 filter gradients of parts of the batch or of the pixels)
## The copies move bit patterns (ushort), whatever the 16-bit type: no conversion, no
## cl_khr_fp16 (NVIDIA's OpenCL has none). Conversions: float16 through the core vload_half /
## vstore_half_rte on `half *` buffers, bfloat16 with integer operations (memory_access's
## bfloat16_conversions), both rounding to nearest even. Each dx element is summed by one work
## item (a gather, no atomics): the result does not depend on scheduling.
## Tensors are addressed through conv_common's geometry strides.
##
## Template parameters:
##   TYPE   "half" (float16) or "bfloat16"
<%namespace name="common" file="conv_common.cl.mako"/>
<%namespace name="access" file="memory_access.cl.mako"/>
<%
    storage = "half" if TYPE == "half" else "ushort"
%>
${access.bfloat16_conversions()}

inline float load16(__global const ${storage} *p, int i)
{
% if TYPE == "half":
    return vload_half(i, p);
% else:
    return bf16_to_float(p[i]);
% endif
}

inline void store16(__global ${storage} *p, int i, float v)
{
% if TYPE == "half":
    vstore_half_rte(v, i, p);
% else:
    p[i] = float_to_bf16(v);
% endif
}

// One work item per (c, np): its R * S taps, each a coalesced row segment of col.
__kernel void conv16_im2col(${common.geometry_params()},
    __global const ushort *x, int x_off, __global ushort *col, int col_off, int LD)
{
    const int HoWo = Ho * Wo, NP = N * HoWo;
    const int total = C * NP;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int c = i / NP, np = i - c * NP;
        int img = np / HoWo, p = np - img * HoWo;
        int oh = p / Wo, ow = p - oh * Wo;
        int h0 = oh * stride_h - pad_h, w0 = ow * stride_w - pad_w;
        __global const ushort *src = x + x_off + img * xsN + c * xsC;
        __global ushort *dst = col + col_off + np;
        for (int r = 0; r < R; ++r) {
            int ih = h0 + r * dil_h;
            bool row_in = ih >= 0 && ih < H;
            for (int s = 0; s < S; ++s) {
                int iw = w0 + s * dil_w;
                // 0x0000 is +0 in both 16-bit types.
                ushort v = (row_in && iw >= 0 && iw < W) ? src[ih * xsH + iw * xsW] : (ushort)0;
                dst[((c * R + r) * S + s) * LD] = v;
            }
        }
    }
}

// rows[k][np] = dy[img, k, oh, ow], work items in dy's memory order.
__kernel void conv16_output_to_rows(${common.geometry_params()},
    __global const ushort *dy, int dy_off, __global ushort *rows, int rows_off, int LD)
{
    const int HoWo = Ho * Wo;
    const int total = N * K * HoWo;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int img = i / (K * HoWo), rest = i - img * (K * HoWo);
        int k = rest / HoWo, p = rest - k * HoWo;
        int oh = p / Wo, ow = p - oh * Wo;
        rows[rows_off + k * LD + img * HoWo + p] =
            dy[dy_off + img * ysN + k * ysC + oh * ysH + ow * ysW];
    }
}

// y[img, k, oh, ow] = acc[k][np] (+ beta * y_old), work items in y's memory order.
__kernel void conv16_rows_to_output(${common.geometry_params()},
    __global const ${storage} *acc, int acc_off, int LD, __global ${storage} *y, int y_off,
    float beta)
{
    const int HoWo = Ho * Wo;
    const int total = N * K * HoWo;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int img = i / (K * HoWo), rest = i - img * (K * HoWo);
        int k = rest / HoWo, p = rest - k * HoWo;
        int oh = p / Wo, ow = p - oh * Wo;
        int at = y_off + img * ysN + k * ysC + oh * ysH + ow * ysW;
        // y_old is read only when beta != 0 (an unwritten y is fine otherwise); without it the
        // value is copied as it is, bits and all.
        int from = acc_off + k * LD + img * HoWo + p;
        if (beta != 0.0f)
            store16(y, at, load16(acc, from) + beta * load16(y, at));
        else
            ((__global ushort *)y)[at] = ((__global const ushort *)acc)[from];
    }
}

// dx[img, c, h, w] = alpha * sum over taps (r, s) with h + pad_h - r * dil_h = oh * stride_h
// (and likewise for w) inside the output of dcol[kk(c, r, s)][img, oh, ow] + beta * dx.
__kernel void conv16_col2im(${common.geometry_params()},
    __global const float *dcol, int dcol_off, int LD, __global ${storage} *dx, int dx_off,
    float alpha, float beta)
{
    const int HoWo = Ho * Wo, HW = H * W;
    const int total = N * C * HW;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int img = i / (C * HW), rest = i - img * (C * HW);
        int c = rest / HW, hw = rest - c * HW;
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
                    acc += src[((c * R + r) * S + s) * LD + oh * Wo + ow];
            }
        }
        int at = dx_off + img * xsN + c * xsC + h * xsH + w * xsW;
        float v = alpha * acc;
        if (beta != 0.0f)
            v += beta * load16(dx, at);
        store16(dx, at, v);
    }
}

// One work-group of BIAS_GROUP items per output channel k: float32 partial sums over
// (n, oh, ow), a tree in local memory, one rounding at the store.
#define BIAS_GROUP 64
__kernel __attribute__((reqd_work_group_size(BIAS_GROUP, 1, 1)))
void conv16_bias_grad(${common.geometry_params()},
    __global const ${storage} *dy, int dy_off, __global ${storage} *db, int db_off,
    float alpha, float beta)
{
    __local float part[BIAS_GROUP];
    const int k = get_group_id(0), lid = get_local_id(0);
    const int HoWo = Ho * Wo, total = N * HoWo;
    float acc = 0.0f;
    for (int i = lid; i < total; i += BIAS_GROUP) {
        int img = i / HoWo, p = i - img * HoWo;
        int oh = p / Wo, ow = p - oh * Wo;
        acc += load16(dy, dy_off + img * ysN + k * ysC + oh * ysH + ow * ysW);
    }
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int half_width = BIAS_GROUP / 2; half_width > 0; half_width /= 2) {
        if (lid < half_width)
            part[lid] += part[lid + half_width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        float v = alpha * part[0];
        if (beta != 0.0f)
            v += beta * load16(db, db_off + k);
        store16(db, db_off + k, v);
    }
}

// dst[i] = alpha * (the sum over s < parts of src[s * count + i]) + beta * dst[i] for
// i < count, rounded once: a filter gradient summed in float32 over parts of the batch
// (one src) or over chunks of its pixels (parts src), stored.
__kernel void conv16_store_scaled(int count, int parts, __global const float *src, int src_off,
    __global ${storage} *dst, int dst_off, float alpha, float beta)
{
    for (int i = get_global_id(0); i < count; i += get_global_size(0)) {
        float sum = 0.0f;
        for (int s = 0; s < parts; ++s)
            sum += src[src_off + s * count + i];
        float v = alpha * sum;
        if (beta != 0.0f)
            v += beta * load16(dst, dst_off + i);
        store16(dst, dst_off + i, v);
    }
}
