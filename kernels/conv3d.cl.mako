## 3-D convolution (NCDHW, cross-correlation as torch): x (N, C, D, H, W), w (K, C/G, KD, KH, KW),
## y (N, K, OD, OH, OW), G groups. Every size is a run-time argument (GEOMETRY), so one compile
## serves every problem; there are no template parameters.
##
## Direct solver (a work item per output element of its direction, gathers only: no atomics, a
## fixed summation order):
##   conv3d_direct_forward          y = conv(x, w) (+ bias[k] when has_bias)
##   conv3d_direct_backward_data    dx from dy and w: each dx element sums the taps that read it
##   conv3d_direct_backward_filter  dw from dy and x: each dw element sums over n and outputs
## vol2col + GEMM solver (the GEMMs run on the GEMM engine, ops/gemm.py):
##   conv3d_vol2col  col[i][c * KD*KH*KW + tap][p] = x[n0 + i, c, at tap of output p] (0 in the
##                   padding), i < images, p < OD*OH*OW
##   conv3d_col2vol  dx[n0 + i, c, z, y, x] = sum over the taps (and their outputs p) that read
##                   it of col[i][c * KD*KH*KW + tap][p] (gather: each dx element once)
## Offsets are in elements. The caller keeps every tensor below 2^31 elements.

#define GEOMETRY int N, int C, int D, int H, int W, int K, int KD, int KH, int KW, \
    int OD, int OH, int OW, int pad_d, int pad_h, int pad_w, int stride_d, int stride_h, \
    int stride_w, int dil_d, int dil_h, int dil_w, int groups

__kernel void conv3d_direct_forward(GEOMETRY,
    __global const float* restrict x, int x_off, __global const float* restrict w, int w_off,
    __global const float* restrict bias, int bias_off, int has_bias,
    __global float* restrict y, int y_off)
{
    const int total = N * K * OD * OH * OW;
    const int cg = C / groups, kg = K / groups;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int ow = i % OW;
        int r = i / OW;
        const int oh = r % OH;
        r /= OH;
        const int od = r % OD;
        r /= OD;
        const int k = r % K;
        const int n = r / K;
        const int c0 = (k / kg) * cg;
        float sum = 0.0f;
        for (int cc = 0; cc < cg; ++cc) {
            __global const float* xc = x + x_off + (n * C + c0 + cc) * D * H * W;
            __global const float* wc = w + w_off + (k * cg + cc) * KD * KH * KW;
            for (int kd = 0; kd < KD; ++kd) {
                const int z = od * stride_d - pad_d + kd * dil_d;
                if (z < 0 || z >= D)
                    continue;
                for (int kh = 0; kh < KH; ++kh) {
                    const int yy = oh * stride_h - pad_h + kh * dil_h;
                    if (yy < 0 || yy >= H)
                        continue;
                    for (int kw = 0; kw < KW; ++kw) {
                        const int xx = ow * stride_w - pad_w + kw * dil_w;
                        if (xx < 0 || xx >= W)
                            continue;
                        sum += xc[(z * H + yy) * W + xx] * wc[(kd * KH + kh) * KW + kw];
                    }
                }
            }
        }
        if (has_bias)
            sum += bias[bias_off + k];
        y[y_off + i] = sum;
    }
}

__kernel void conv3d_direct_backward_data(GEOMETRY,
    __global const float* restrict dy, int dy_off, __global const float* restrict w, int w_off,
    __global float* restrict dx, int dx_off)
{
    const int total = N * C * D * H * W;
    const int cg = C / groups, kg = K / groups;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int xx = i % W;
        int r = i / W;
        const int yy = r % H;
        r /= H;
        const int z = r % D;
        r /= D;
        const int c = r % C;
        const int n = r / C;
        const int g = c / cg, cc = c % cg;
        float sum = 0.0f;
        for (int kl = 0; kl < kg; ++kl) {
            const int k = g * kg + kl;
            __global const float* dyk = dy + dy_off + (n * K + k) * OD * OH * OW;
            __global const float* wk = w + w_off + (k * cg + cc) * KD * KH * KW;
            for (int kd = 0; kd < KD; ++kd) {
                const int td = z + pad_d - kd * dil_d;
                if (td < 0 || td % stride_d || td / stride_d >= OD)
                    continue;
                const int od = td / stride_d;
                for (int kh = 0; kh < KH; ++kh) {
                    const int th = yy + pad_h - kh * dil_h;
                    if (th < 0 || th % stride_h || th / stride_h >= OH)
                        continue;
                    const int oh = th / stride_h;
                    for (int kw = 0; kw < KW; ++kw) {
                        const int tw = xx + pad_w - kw * dil_w;
                        if (tw < 0 || tw % stride_w || tw / stride_w >= OW)
                            continue;
                        sum += dyk[(od * OH + oh) * OW + tw / stride_w]
                               * wk[(kd * KH + kh) * KW + kw];
                    }
                }
            }
        }
        dx[dx_off + i] = sum;
    }
}

__kernel void conv3d_direct_backward_filter(GEOMETRY,
    __global const float* restrict dy, int dy_off, __global const float* restrict x, int x_off,
    __global float* restrict dw, int dw_off)
{
    const int cg = C / groups, kg = K / groups;
    const int total = K * cg * KD * KH * KW;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int kw = i % KW;
        int r = i / KW;
        const int kh = r % KH;
        r /= KH;
        const int kd = r % KD;
        r /= KD;
        const int cc = r % cg;
        const int k = r / cg;
        const int c = (k / kg) * cg + cc;
        float sum = 0.0f;
        for (int n = 0; n < N; ++n) {
            __global const float* dyk = dy + dy_off + (n * K + k) * OD * OH * OW;
            __global const float* xc = x + x_off + (n * C + c) * D * H * W;
            for (int od = 0; od < OD; ++od) {
                const int z = od * stride_d - pad_d + kd * dil_d;
                if (z < 0 || z >= D)
                    continue;
                for (int oh = 0; oh < OH; ++oh) {
                    const int yy = oh * stride_h - pad_h + kh * dil_h;
                    if (yy < 0 || yy >= H)
                        continue;
                    for (int ow = 0; ow < OW; ++ow) {
                        const int xx = ow * stride_w - pad_w + kw * dil_w;
                        if (xx < 0 || xx >= W)
                            continue;
                        sum += dyk[(od * OH + oh) * OW + ow] * xc[(z * H + yy) * W + xx];
                    }
                }
            }
        }
        dw[dw_off + i] = sum;
    }
}

__kernel void conv3d_vol2col(GEOMETRY, int n0, int images,
    __global const float* restrict x, int x_off, __global float* restrict col, int col_off)
{
    const int taps = KD * KH * KW;
    const int positions = OD * OH * OW;
    const int total = images * C * taps * positions;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int p = i % positions;
        int r = i / positions;
        const int tap = r % taps;
        r /= taps;
        const int c = r % C;
        const int n = n0 + r / C;
        const int ow = p % OW, oh = (p / OW) % OH, od = p / (OW * OH);
        const int kw = tap % KW, kh = (tap / KW) % KH, kd = tap / (KW * KH);
        const int z = od * stride_d - pad_d + kd * dil_d;
        const int yy = oh * stride_h - pad_h + kh * dil_h;
        const int xx = ow * stride_w - pad_w + kw * dil_w;
        float v = 0.0f;
        if (z >= 0 && z < D && yy >= 0 && yy < H && xx >= 0 && xx < W)
            v = x[x_off + (((n * C + c) * D + z) * H + yy) * W + xx];
        col[col_off + i] = v;
    }
}

__kernel void conv3d_col2vol(GEOMETRY, int n0, int images,
    __global const float* restrict col, int col_off, __global float* restrict dx, int dx_off)
{
    const int taps = KD * KH * KW;
    const int positions = OD * OH * OW;
    const int total = images * C * D * H * W;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int xx = i % W;
        int r = i / W;
        const int yy = r % H;
        r /= H;
        const int z = r % D;
        const int ic = r / D;    // image * C + c, both within the chunk
        __global const float* rows = col + col_off + ic * taps * positions;
        float sum = 0.0f;
        for (int kd = 0; kd < KD; ++kd) {
            const int td = z + pad_d - kd * dil_d;
            if (td < 0 || td % stride_d || td / stride_d >= OD)
                continue;
            for (int kh = 0; kh < KH; ++kh) {
                const int th = yy + pad_h - kh * dil_h;
                if (th < 0 || th % stride_h || th / stride_h >= OH)
                    continue;
                for (int kw = 0; kw < KW; ++kw) {
                    const int tw = xx + pad_w - kw * dil_w;
                    if (tw < 0 || tw % stride_w || tw / stride_w >= OW)
                        continue;
                    const int p = ((td / stride_d) * OH + th / stride_h) * OW + tw / stride_w;
                    sum += rows[((kd * KH + kh) * KW + kw) * positions + p];
                }
            }
        }
        dx[dx_off + n0 * C * D * H * W + i] = sum;
    }
}
