## Winograd F(m x m, 3x3) convolution (m = 2 or 4) for 3x3, stride 1, dilation 1, groups 1, in
## three passes around a batched GEMM (the GEMM engine, one GEMM per transform element e):
##   U[e][m][kk] = (G g G^T)[e]          weights, e = element of the (m+2)x(m+2) transform tile
##   V[e][kk][t] = (B^T d B)[e]          (m+2)x(m+2) input tiles d at m x m output steps,
##                                       t = (n, th, tw)
##   M[e][m][t]  = sum_kk U[e][m][kk] V[e][kk][t]                     (the GEMM)
##   out         = epilogue(A^T M A)     each tile gives an m x m block of the output
## The weight and input transforms of forward and backward data run as one launch
## (winograd_transforms).
## Forward: m = k, kk = c, input x, output y. Backward data is the forward convolution of dy
## with the filter rotated by 180 degrees and transposed (m = c, kk = k) and padding 2 - pad.
## Tensors are addressed through (n, channel, h, w) element strides given at run time.
##
## Template parameters:
##   output_tile     2: F(2x2, 3x3) for forward and backward data and F(3x3, 2x2) for backward
##                   filter, the kernels below written out by hand (4x4 transform tiles);
##                   4: F(4x4, 3x3) for forward and backward data (6x6 transform tiles), its
##                   transforms generated from the three matrices that follow, with the same
##                   kernel names and arguments as the F(2x2) forward kernels
##   matrix_bt, matrix_g, matrix_at   F(4x4) only (None for 2): the (6 x 6) input transform
##                   B^T, the (6 x 3) filter transform G and the (4 x 6) output transform A^T
##                   as tuples of rows of Python floats (winograd.cook_toom); zero entries are
##                   left out of the generated sums
##   matrix_g_grad, matrix_at_grad   F(4x4) only: G (6 x 4) and A^T (3 x 6) of F(3x3, 4x4) on
##                   the same points (its B^T is matrix_bt), for backward filter: each 4x4 tile
##                   of dy meets the 6x6 input tile under it,
##                   dW += A^T [(G g G^T) . (B^T d B)] A, summed over tiles by the batched GEMM
##                   M[e][k][c] = sum_t D[e][k][t] V[e][c][t]
##   has_scale, has_shift, has_residual, activation, chain   the forward epilogue (conv_common;
##                   chain: a fusion plan's bias / batch-norm chain computed in the epilogue)
<%namespace name="common" file="conv_common.cl.mako"/>
<%!
def combination(coefficients, terms):
    """OpenCL C expression of sum(c * t) over the non-zero coefficients."""
    parts = []
    for c, t in zip(coefficients, terms):
        c = float(c)
        if c == 0.0:
            continue
        sign = "-" if c < 0 else "+"
        magnitude = abs(c)
        parts.append(f"{sign} {t}" if magnitude == 1.0 else f"{sign} {magnitude!r}f * {t}")
    if not parts:
        return "0.0f"
    expr = " ".join(parts)
    return expr[2:] if expr.startswith("+ ") else "-" + expr[2:]
%>
% if output_tile == 2:

// Filter i of GM x GK 3x3 filters g -> G g G^T. `rotate`: read w[kk][m][2-r][2-s] (backward data).
inline void weight_transform_at(int i, int GM, int GK, int rotate,
    __global const float *w, int w_off, int wsK, int wsC, int wsR, int wsS,
    __global float *U, int U_off)
{
    const int total = GM * GK;
    {
        int m = i / GK, kk = i - m * GK;
        float g[3][3];
        for (int r = 0; r < 3; ++r)
            for (int s = 0; s < 3; ++s)
                g[r][s] = rotate ? w[w_off + kk * wsK + m * wsC + (2 - r) * wsR + (2 - s) * wsS]
                                 : w[w_off + m * wsK + kk * wsC + r * wsR + s * wsS];
        float t[4][3];   // G g
        for (int s = 0; s < 3; ++s) {
            t[0][s] = g[0][s];
            t[1][s] = 0.5f * (g[0][s] + g[1][s] + g[2][s]);
            t[2][s] = 0.5f * (g[0][s] - g[1][s] + g[2][s]);
            t[3][s] = g[2][s];
        }
        for (int a = 0; a < 4; ++a) {   // (G g) G^T
            float u0 = t[a][0];
            float u1 = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
            float u2 = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
            float u3 = t[a][2];
            __global float *dst = U + U_off + (a * 4) * total + i;
            dst[0] = u0;
            dst[total] = u1;
            dst[2 * total] = u2;
            dst[3 * total] = u3;
        }
    }
}

// Input tile i (of channel c, tile t) d (4x4, zero outside the image) -> B^T d B, into
// V[e][c][t].
inline void input_transform_at(int i, int N, int CH, int H, int W, int pad_h, int pad_w,
    int TH, int TW, __global const float *x, int x_off, int sN, int sC, int sH, int sW,
    __global float *V, int V_off)
{
    const int T = N * TH * TW;
    const int total = CH * T;
    {
        int c = i / T, t = i - c * T;
        int n = t / (TH * TW), p = t - n * (TH * TW);
        int th = p / TW, tw = p - th * TW;
        int h0 = th * 2 - pad_h, w0 = tw * 2 - pad_w;
        __global const float *src = x + x_off + n * sN + c * sC;
        float d[4][4];
        for (int a = 0; a < 4; ++a) {
            int ih = h0 + a;
            for (int b = 0; b < 4; ++b) {
                int iw = w0 + b;
                d[a][b] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? src[ih * sH + iw * sW] : 0.0f;
            }
        }
        float q[4][4];   // B^T d
        for (int b = 0; b < 4; ++b) {
            q[0][b] = d[0][b] - d[2][b];
            q[1][b] = d[1][b] + d[2][b];
            q[2][b] = d[2][b] - d[1][b];
            q[3][b] = d[1][b] - d[3][b];
        }
        __global float *dst = V + V_off + i;
        for (int a = 0; a < 4; ++a) {   // (B^T d) B
            dst[(a * 4 + 0) * total] = q[a][0] - q[a][2];
            dst[(a * 4 + 1) * total] = q[a][1] + q[a][2];
            dst[(a * 4 + 2) * total] = q[a][2] - q[a][1];
            dst[(a * 4 + 3) * total] = q[a][1] - q[a][3];
        }
    }
}

// M[e][k][t] -> A^T M A, a 2x2 output block per tile, through the epilogue.
__kernel void winograd_output_transform(int N, int CH, int Ho, int Wo, int TH, int TW,
    __global const float *M, int M_off, __global float *y, int y_off,
    int ysN, int ysC, int ysH, int ysW, ${common.epilogue_params()})
{
    const int T = N * TH * TW;
    const int total = CH * T;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int k = i / T, t = i - k * T;
${common.chain_per_channel("k")}
        int n = t / (TH * TW), p = t - n * (TH * TW);
        int th = p / TW, tw = p - th * TW;
        __global const float *src = M + M_off + i;
        float m[4][4];
        for (int e = 0; e < 16; ++e)
            m[e / 4][e % 4] = src[e * total];
        float q[2][4];   // A^T m
        for (int b = 0; b < 4; ++b) {
            q[0][b] = m[0][b] + m[1][b] + m[2][b];
            q[1][b] = m[1][b] - m[2][b] - m[3][b];
        }
        for (int a = 0; a < 2; ++a) {
            int oh = th * 2 + a;
            if (oh >= Ho)
                continue;
            float out[2];
            out[0] = q[a][0] + q[a][1] + q[a][2];
            out[1] = q[a][1] - q[a][2] - q[a][3];
            for (int b = 0; b < 2; ++b) {
                int ow = tw * 2 + b;
                if (ow >= Wo)
                    continue;
${common.store("y", "y_off", "n * ysN + k * ysC + oh * ysH + ow * ysW", "k", "out[b]", hoisted=True)}
            }
        }
    }
}

// Backward filter as F(3x3, 2x2): each 2x2 tile g of dy (zero outside Ho x Wo) meets the 4x4
// input tile d under it, dW += A'^T [(G' g G'^T) . (B^T d B)] A' with the same B^T as above,
// G' = [1 0; 1 1; 1 -1; 0 -1] and A'^T = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1]. The sum over tiles
// and images is the batched GEMM  M[e][k][c] = sum_t D[e][k][t] V[e][c][t].
// dy 2x2 tiles -> G' g G'^T, into D[e][k][t].
__kernel void winograd_grad_transform(int N, int CH, int Ho, int Wo, int TH, int TW,
    __global const float *dy, int dy_off, int sN, int sC, int sH, int sW,
    __global float *D, int D_off)
{
    const int T = N * TH * TW;
    const int total = CH * T;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int k = i / T, t = i - k * T;
        int n = t / (TH * TW), p = t - n * (TH * TW);
        int th = p / TW, tw = p - th * TW;
        __global const float *src = dy + dy_off + n * sN + k * sC;
        float g[2][2];
        for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
                int oh = th * 2 + a, ow = tw * 2 + b;
                g[a][b] = (oh < Ho && ow < Wo) ? src[oh * sH + ow * sW] : 0.0f;
            }
        float q[4][2];   // G' g
        for (int b = 0; b < 2; ++b) {
            q[0][b] = g[0][b];
            q[1][b] = g[0][b] + g[1][b];
            q[2][b] = g[0][b] - g[1][b];
            q[3][b] = -g[1][b];
        }
        __global float *dst = D + D_off + i;
        for (int a = 0; a < 4; ++a) {   // (G' g) G'^T
            dst[(a * 4 + 0) * total] = q[a][0];
            dst[(a * 4 + 1) * total] = q[a][0] + q[a][1];
            dst[(a * 4 + 2) * total] = q[a][0] - q[a][1];
            dst[(a * 4 + 3) * total] = -q[a][1];
        }
    }
}

// M[e][k][c] -> A'^T M A' (3x3): dw[k, c] = alpha * that + beta * dw.
__kernel void winograd_filter_output_transform(int K, int C,
    __global const float *M, int M_off, __global float *dw, int dw_off,
    int wsK, int wsC, int wsR, int wsS, float alpha, float beta)
{
    const int total = K * C;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int k = i / C, c = i - k * C;
        float m[4][4];
        for (int e = 0; e < 16; ++e)
            m[e / 4][e % 4] = M[M_off + e * total + i];
        float q[3][4];   // A'^T m
        for (int b = 0; b < 4; ++b) {
            q[0][b] = m[0][b] + 0.5f * (m[1][b] + m[2][b]);
            q[1][b] = 0.5f * (m[1][b] - m[2][b]);
            q[2][b] = 0.5f * (m[1][b] + m[2][b]) + m[3][b];
        }
        for (int r = 0; r < 3; ++r) {
            float row[3];
            row[0] = q[r][0] + 0.5f * (q[r][1] + q[r][2]);
            row[1] = 0.5f * (q[r][1] - q[r][2]);
            row[2] = 0.5f * (q[r][1] + q[r][2]) + q[r][3];
            for (int s = 0; s < 3; ++s) {
${common.store_scaled("dw", "dw_off", "k * wsK + c * wsC + r * wsR + s * wsS", "row[s]")}
            }
        }
    }
}
% else:
<%
    tile_out = output_tile
    tile_in = output_tile + 2
    e_count = tile_in * tile_in
%>
// Filter i of GM x GK 3x3 filters g -> G g G^T into U[e][m][kk], e over the 6x6 transform tile.
// `rotate`: read w[kk][m][2-r][2-s] (backward data).
inline void weight_transform_at(int i, int GM, int GK, int rotate,
    __global const float *w, int w_off, int wsK, int wsC, int wsR, int wsS,
    __global float *U, int U_off)
{
    const int total = GM * GK;
    {
        int m = i / GK, kk = i - m * GK;
        float g[3][3];
        for (int r = 0; r < 3; ++r)
            for (int s = 0; s < 3; ++s)
                g[r][s] = rotate ? w[w_off + kk * wsK + m * wsC + (2 - r) * wsR + (2 - s) * wsS]
                                 : w[w_off + m * wsK + kk * wsC + r * wsR + s * wsS];
        float t[${tile_in}][3];   // G g
% for a in range(tile_in):
%   for s in range(3):
        t[${a}][${s}] = ${combination(matrix_g[a], [f"g[{r}][{s}]" for r in range(3)])};
%   endfor
% endfor
        __global float *dst = U + U_off + i;
% for a in range(tile_in):
%   for b in range(tile_in):
        dst[${a * tile_in + b} * total] = ${combination(matrix_g[b], [f"t[{a}][{s}]" for s in range(3)])};
%   endfor
% endfor
    }
}

// Input tile i (of channel c, tile t) d (6x6 at 4x4 output steps, zero outside the image) ->
// B^T d B, into V[e][c][t].
inline void input_transform_at(int i, int N, int CH, int H, int W, int pad_h, int pad_w,
    int TH, int TW, __global const float *x, int x_off, int sN, int sC, int sH, int sW,
    __global float *V, int V_off)
{
    const int T = N * TH * TW;
    const int total = CH * T;
    {
        int c = i / T, t = i - c * T;
        int n = t / (TH * TW), p = t - n * (TH * TW);
        int th = p / TW, tw = p - th * TW;
        int h0 = th * ${tile_out} - pad_h, w0 = tw * ${tile_out} - pad_w;
        __global const float *src = x + x_off + n * sN + c * sC;
        float d[${tile_in}][${tile_in}];
        for (int a = 0; a < ${tile_in}; ++a) {
            int ih = h0 + a;
            bool row_in = ih >= 0 && ih < H;
            for (int b = 0; b < ${tile_in}; ++b) {
                int iw = w0 + b;
                d[a][b] = (row_in && iw >= 0 && iw < W) ? src[ih * sH + iw * sW] : 0.0f;
            }
        }
        float q[${tile_in}][${tile_in}];   // B^T d
% for a in range(tile_in):
%   for b in range(tile_in):
        q[${a}][${b}] = ${combination(matrix_bt[a], [f"d[{r}][{b}]" for r in range(tile_in)])};
%   endfor
% endfor
        __global float *dst = V + V_off + i;
% for a in range(tile_in):
%   for b in range(tile_in):
        dst[${a * tile_in + b} * total] = ${combination(matrix_bt[b], [f"q[{a}][{s}]" for s in range(tile_in)])};
%   endfor
% endfor
    }
}

// M[e][k][t] -> A^T M A, a 4x4 output block per tile, through the epilogue.
__kernel void winograd_output_transform(int N, int CH, int Ho, int Wo, int TH, int TW,
    __global const float *M, int M_off, __global float *y, int y_off,
    int ysN, int ysC, int ysH, int ysW, ${common.epilogue_params()})
{
    const int T = N * TH * TW;
    const int total = CH * T;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int k = i / T, t = i - k * T;
${common.chain_per_channel("k")}
        int n = t / (TH * TW), p = t - n * (TH * TW);
        int th = p / TW, tw = p - th * TW;
        __global const float *src = M + M_off + i;
        float m[${tile_in}][${tile_in}];
        for (int e = 0; e < ${e_count}; ++e)
            m[e / ${tile_in}][e % ${tile_in}] = src[e * total];
        float q[${tile_out}][${tile_in}];   // A^T m
% for a in range(tile_out):
%   for b in range(tile_in):
        q[${a}][${b}] = ${combination(matrix_at[a], [f"m[{r}][{b}]" for r in range(tile_in)])};
%   endfor
% endfor
        for (int a = 0; a < ${tile_out}; ++a) {
            int oh = th * ${tile_out} + a;
            if (oh >= Ho)
                continue;
            float out[${tile_out}];
% for b in range(tile_out):
            out[${b}] = ${combination(matrix_at[b], [f"q[a][{s}]" for s in range(tile_in)])};
% endfor
            for (int b = 0; b < ${tile_out}; ++b) {
                int ow = tw * ${tile_out} + b;
                if (ow >= Wo)
                    continue;
${common.store("y", "y_off", "n * ysN + k * ysC + oh * ysH + ow * ysW", "k", "out[b]", hoisted=True)}
            }
        }
    }
}

// dy 4x4 tiles (zero outside Ho x Wo) -> G g G^T, into D[e][k][t].
__kernel void winograd_grad_transform(int N, int CH, int Ho, int Wo, int TH, int TW,
    __global const float *dy, int dy_off, int sN, int sC, int sH, int sW,
    __global float *D, int D_off)
{
    const int T = N * TH * TW;
    const int total = CH * T;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int k = i / T, t = i - k * T;
        int n = t / (TH * TW), p = t - n * (TH * TW);
        int th = p / TW, tw = p - th * TW;
        __global const float *src = dy + dy_off + n * sN + k * sC;
        float g[${tile_out}][${tile_out}];
        for (int a = 0; a < ${tile_out}; ++a) {
            int oh = th * ${tile_out} + a;
            for (int b = 0; b < ${tile_out}; ++b) {
                int ow = tw * ${tile_out} + b;
                g[a][b] = (oh < Ho && ow < Wo) ? src[oh * sH + ow * sW] : 0.0f;
            }
        }
        float q[${tile_in}][${tile_out}];   // G g
% for a in range(tile_in):
%   for b in range(tile_out):
        q[${a}][${b}] = ${combination(matrix_g_grad[a], [f"g[{r}][{b}]" for r in range(tile_out)])};
%   endfor
% endfor
        __global float *dst = D + D_off + i;
% for a in range(tile_in):
%   for b in range(tile_in):
        dst[${a * tile_in + b} * total] = ${combination(matrix_g_grad[b], [f"q[{a}][{s}]" for s in range(tile_out)])};
%   endfor
% endfor
    }
}

// M[e][k][c] -> A^T M A (3x3): dw[k, c] = alpha * that + beta * dw.
__kernel void winograd_filter_output_transform(int K, int C,
    __global const float *M, int M_off, __global float *dw, int dw_off,
    int wsK, int wsC, int wsR, int wsS, float alpha, float beta)
{
    const int total = K * C;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int k = i / C, c = i - k * C;
        float m[${tile_in}][${tile_in}];
        for (int e = 0; e < ${e_count}; ++e)
            m[e / ${tile_in}][e % ${tile_in}] = M[M_off + e * total + i];
        float q[3][${tile_in}];   // A^T m
% for a in range(3):
%   for b in range(tile_in):
        q[${a}][${b}] = ${combination(matrix_at_grad[a], [f"m[{r}][{b}]" for r in range(tile_in)])};
%   endfor
% endfor
% for r in range(3):
%   for s in range(3):
        {
            const int r = ${r}, s = ${s};
            const float value = ${combination(matrix_at_grad[s], [f"q[{r}][{j}]" for j in range(tile_in)])};
${common.store_scaled("dw", "dw_off", "k * wsK + c * wsC + r * wsR + s * wsS", "value")}
        }
%   endfor
% endfor
    }
}
% endif

// The input transform alone (backward filter: its weights side is dy's transform).
__kernel void winograd_input_transform(int N, int CH, int H, int W, int pad_h, int pad_w,
    int TH, int TW, __global const float *x, int x_off, int sN, int sC, int sH, int sW,
    __global float *V, int V_off)
{
    const int total = CH * N * TH * TW;
    for (int i = get_global_id(0); i < total; i += get_global_size(0))
        input_transform_at(i, N, CH, H, W, pad_h, pad_w, TH, TW, x, x_off, sN, sC, sH, sW, V,
                           V_off);
}

// Forward and backward data: the weight and input transforms in one launch (they are
// independent), work items 0 .. GM*GK-1 on filters and the rest on input tiles.
__kernel void winograd_transforms(int GM, int GK, int rotate,
    __global const float *w, int w_off, int wsK, int wsC, int wsR, int wsS,
    __global float *U, int U_off,
    int N, int H, int W, int pad_h, int pad_w,
    int TH, int TW, __global const float *x, int x_off, int sN, int sC, int sH, int sW,
    __global float *V, int V_off)
{
    const int filters = GM * GK;
    const int total = filters + GK * N * TH * TW;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        if (i < filters)
            weight_transform_at(i, GM, GK, rotate, w, w_off, wsK, wsC, wsR, wsS, U, U_off);
        else
            input_transform_at(i - filters, N, GK, H, W, pad_h, pad_w, TH, TW, x, x_off, sN,
                               sC, sH, sW, V, V_off);
    }
}
