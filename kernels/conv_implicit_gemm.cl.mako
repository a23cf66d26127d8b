## Implicit-GEMM convolution: the im2col gather is folded into the tile loads (no column buffer).
##
## Per group g, every direction is one GEMM  out[m, n] = sum_kk A[m, kk] * B[kk, n]:
##   forward          m = k (K/g)   n = (img, oh, ow)   kk = (c, r, s)      A = w    B = x gather
##   backward_data    m = c (C/g)   n = (img, ih, iw)   kk = (k, r, s)      A = w    B = dy gather
##   backward_filter  m = k (K/g)   n = (c, r, s)       kk = (img, oh, ow)  A = dy   B = x gather
## (c, r, s) is enumerated channel-first for NCHW and channel-last (r, s, c) for NHWC, so that
## kk walks the weights in memory order. Work group (n tile, m tile, g * splits + split):
## a TILE_M x TILE_N block of out, THREAD_M x THREAD_N per work item (in runs of 4 rows and 4
## columns strided by the thread grid, read from local memory as float4 without bank
## conflicts), kk in steps of TILE_K through two local-memory stages: the next step's global
## loads are issued before the current step's arithmetic and stored into the other stage, one
## barrier per step. Forward reads the weights (A rows, contiguous in kk in both layouts) as
## float4 where the row start is 4-aligned (checked at run time), scalars otherwise.
## backward_filter may split kk over `splits` work groups, each writing its partial block to a
## workspace [splits][K][C/g*R*S] that conv_igemm_reduce sums with alpha/beta.
##
## Template parameters:
##   direction       "forward", "backward_data" or "backward_filter"
##   tile_m, tile_n  block of out per work group
##   tile_k          kk step (local memory holds 2 x TILE_K x (TILE_M + TILE_N + 8) floats)
##   thread_m, thread_n  block of out per work item, multiples of 4
##                   (tile_m / thread_m * tile_n / thread_n work items)
##   kernel_r, kernel_s  the kernel size R x S as compile-time constants, so that the (c, r, s)
##                   split of kk divides by constants (and vanishes for 1x1, which becomes a
##                   plain GEMM over strided loads); 0 reads R and S at run time
##   channel_last    bool: (r, s, c) enumeration (NHWC) instead of (c, r, s)
##   split_k         bool: write raw partial sums to the workspace (backward_filter only)
##   has_scale, has_shift, has_residual, activation, chain   the forward epilogue (conv_common;
##                   chain: a fusion plan's bias / batch-norm chain computed in the epilogue)
<%namespace name="common" file="conv_common.cl.mako"/>
<%
    threads_m = tile_m // thread_m
    threads_n = tile_n // thread_n
    threads = threads_m * threads_n
    a_per_thread = tile_m * tile_k // threads
    b_per_thread = tile_k * tile_n // threads
    assert a_per_thread * threads == tile_m * tile_k and b_per_thread * threads == tile_k * tile_n
    assert thread_m % 4 == 0 and thread_n % 4 == 0
    # How the work items of a group cover a tile when loading: the fast index follows memory.
    a_fast_m = direction == "backward_data"
    b_fast_n = direction != "backward_filter"
    # Forward loads A in runs of 4 along kk (float4 where aligned).
    a_vec = 4 if direction == "forward" and tile_k % 4 == 0 and a_per_thread % 4 == 0 else 1
    a_runs = a_per_thread // a_vec
    assert threads % (tile_m if a_fast_m else tile_k // a_vec) == 0
    assert threads % (tile_n if b_fast_n else tile_k) == 0
%>
#define TILE_M ${tile_m}
#define TILE_N ${tile_n}
#define TILE_K ${tile_k}
#define THREAD_M ${thread_m}
#define THREAD_N ${thread_n}
#define THREADS_M ${threads_m}
#define THREADS_N ${threads_n}
#define THREADS ${threads}
#define A_PER_THREAD ${a_per_thread}
#define B_PER_THREAD ${b_per_thread}
#define A_VEC ${a_vec}
#define A_RUNS ${a_runs}
% if kernel_r:
#define KR ${kernel_r}
#define KS ${kernel_s}
% else:
#define KR R
#define KS S
% endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_igemm_${direction}(${common.geometry_params()},
    __global const float *a_src, int a_off, __global const float *b_src, int b_off,
    __global float *out, int out_off, int k_per_split, ${common.epilogue_params()})
{
    // Rows padded by 4 floats: the transposed scalar stores spread over the banks and the
    // float4 reads stay aligned.
    __local float4 a_tiles[2][TILE_K][(TILE_M + 4) / 4];
    __local float4 b_tiles[2][TILE_K][(TILE_N + 4) / 4];

    const int Cg = C / groups, Kg = K / groups, RS = KR * KS;
    const int HoWo = Ho * Wo, HW = H * W;
% if direction == "forward":
    const int GM = Kg, GN = N * HoWo, GK = Cg * RS;
% elif direction == "backward_data":
    const int GM = Cg, GN = N * HW, GK = Kg * RS;
% else:
    const int GM = Kg, GN = Cg * RS, GK = N * HoWo;
% endif
    const int splits = get_num_groups(2) / groups;
    const int g = get_group_id(2) / splits;
    const int split = get_group_id(2) - g * splits;
    const int kk_begin = split * k_per_split;
    const int kk_end = min(GK, kk_begin + k_per_split);
    const int m0 = get_group_id(1) * TILE_M;
    const int n0 = get_group_id(0) * TILE_N;
    const int tid = get_local_id(0);

    // Where this work item loads: element i of its A share is (a_m[i], kk + a_k[i]).
    // Run i of A_VEC elements starts at (a_m[i], kk + a_k[i]).
    int a_m[A_RUNS], a_k[A_RUNS];
    for (int i = 0; i < A_RUNS; ++i) {
        int e = tid + i * THREADS;
% if a_fast_m:
        a_m[i] = e % TILE_M; a_k[i] = e / TILE_M;
% else:
        a_m[i] = e / (TILE_K / A_VEC); a_k[i] = (e % (TILE_K / A_VEC)) * A_VEC;
% endif
    }
% if a_vec > 1:
    const bool a_aligned = ((a_off | wsK) & 3) == 0;
% endif
    int b_n[B_PER_THREAD], b_k[B_PER_THREAD];
    // Column facts that stay fixed over the kk loop.
    int col_base[B_PER_THREAD], col_h[B_PER_THREAD], col_w[B_PER_THREAD];
    for (int i = 0; i < B_PER_THREAD; ++i) {
        int e = tid + i * THREADS;
% if b_fast_n:
        b_n[i] = e % TILE_N; b_k[i] = e / TILE_N;
% else:
        b_n[i] = e / TILE_K; b_k[i] = e % TILE_K;
% endif
        int n = n0 + b_n[i];
        col_base[i] = -1;
        col_h[i] = 0;
        col_w[i] = 0;
        if (n < GN) {
% if direction == "forward":
            int img = n / HoWo, p = n - img * HoWo;
            int oh = p / Wo, ow = p - oh * Wo;
            col_base[i] = b_off + img * xsN + g * Cg * xsC;
            col_h[i] = oh * stride_h - pad_h;
            col_w[i] = ow * stride_w - pad_w;
% elif direction == "backward_data":
            int img = n / HW, p = n - img * HW;
            int ih = p / W, iw = p - ih * W;
            col_base[i] = b_off + img * ysN + g * Kg * ysC;
            col_h[i] = ih + pad_h;
            col_w[i] = iw + pad_w;
% else:
%   if channel_last:
            int rs = n / Cg, c = n - rs * Cg;
%   else:
            int c = n / RS, rs = n - c * RS;
%   endif
            int r = rs / KS, s = rs - r * KS;
            col_base[i] = b_off + (g * Cg + c) * xsC;
            col_h[i] = r * dil_h - pad_h;
            col_w[i] = s * dil_w - pad_w;
% endif
        }
    }

    float a_next[A_PER_THREAD], b_next[B_PER_THREAD];
    float acc[THREAD_M][THREAD_N];
    for (int i = 0; i < THREAD_M; ++i)
        for (int j = 0; j < THREAD_N; ++j)
            acc[i][j] = 0.0f;

## Global loads of the kk step starting at `kk0` into a_next / b_next (zero outside the problem).
<%def name="load_step(kk0)">
% if direction == "backward_filter":
        // Every A and B element this work item loads shares one kk (one pixel): split it once.
        const int step_kk = ${kk0} + tid % TILE_K;
        const int step_img = step_kk / HoWo, step_p = step_kk - step_img * HoWo;
        const int step_oh = step_p / Wo, step_ow = step_p - step_oh * Wo;
% endif
% if a_vec > 1:
        for (int i = 0; i < A_RUNS; ++i) {
            int m = m0 + a_m[i], kk = ${kk0} + a_k[i];
            float4 v = (float4)(0.0f);
            if (m < GM) {
                __global const float *row = a_src + a_off + (g * Kg + m) * wsK;
                if (a_aligned && kk + 3 < kk_end) {
                    v = vload4(0, row + kk);
                } else {
                    if (kk < kk_end) v.s0 = row[kk];
                    if (kk + 1 < kk_end) v.s1 = row[kk + 1];
                    if (kk + 2 < kk_end) v.s2 = row[kk + 2];
                    if (kk + 3 < kk_end) v.s3 = row[kk + 3];
                }
            }
            a_next[4 * i] = v.s0; a_next[4 * i + 1] = v.s1;
            a_next[4 * i + 2] = v.s2; a_next[4 * i + 3] = v.s3;
        }
% else:
        for (int i = 0; i < A_PER_THREAD; ++i) {
            int m = m0 + a_m[i], kk = ${kk0} + a_k[i];
            float v = 0.0f;
            if (m < GM && kk < kk_end) {
% if direction == "forward":
                v = a_src[a_off + (g * Kg + m) * wsK + kk];
% elif direction == "backward_data":
%   if channel_last:
                int rs = kk / Kg, k = kk - rs * Kg;
%   else:
                int k = kk / RS, rs = kk - k * RS;
%   endif
                int r = rs / KS, s = rs - r * KS;
                v = a_src[a_off + (g * Kg + k) * wsK + m * wsC + r * wsR + s * wsS];
% else:
                v = a_src[a_off + step_img * ysN + (g * Kg + m) * ysC + step_oh * ysH + step_ow * ysW];
% endif
            }
            a_next[i] = v;
        }
% endif
        for (int i = 0; i < B_PER_THREAD; ++i) {
            int kk = ${kk0} + b_k[i];
            float v = 0.0f;
            if (col_base[i] >= 0 && kk < kk_end) {
% if direction == "forward":
%   if channel_last:
                int rs = kk / Cg, c = kk - rs * Cg;
%   else:
                int c = kk / RS, rs = kk - c * RS;
%   endif
                int r = rs / KS, s = rs - r * KS;
                int ih = col_h[i] + r * dil_h, iw = col_w[i] + s * dil_w;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                    v = b_src[col_base[i] + c * xsC + ih * xsH + iw * xsW];
% elif direction == "backward_data":
%   if channel_last:
                int rs = kk / Kg, k = kk - rs * Kg;
%   else:
                int k = kk / RS, rs = kk - k * RS;
%   endif
                int r = rs / KS, s = rs - r * KS;
                int th = col_h[i] - r * dil_h, tw = col_w[i] - s * dil_w;
                if (th >= 0 && tw >= 0) {
                    int oh = th / stride_h, ow = tw / stride_w;
                    if (oh * stride_h == th && ow * stride_w == tw && oh < Ho && ow < Wo)
                        v = b_src[col_base[i] + k * ysC + oh * ysH + ow * ysW];
                }
% else:
                int ih = col_h[i] + step_oh * stride_h, iw = col_w[i] + step_ow * stride_w;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                    v = b_src[col_base[i] + step_img * xsN + ih * xsH + iw * xsW];
% endif
            }
            b_next[i] = v;
        }
</%def>

    const int tm = tid / THREADS_N, tn = tid - tm * THREADS_N;

## Stores a_next / b_next into local stage `stage`.
<%def name="store_step(stage)">
        {
            __local float *a_flat = (__local float *)a_tiles[${stage}];
            __local float *b_flat = (__local float *)b_tiles[${stage}];
% if a_vec > 1:
            for (int i = 0; i < A_RUNS; ++i)
                for (int j = 0; j < A_VEC; ++j)
                    a_flat[(a_k[i] + j) * (TILE_M + 4) + a_m[i]] = a_next[A_VEC * i + j];
% else:
            for (int i = 0; i < A_PER_THREAD; ++i)
                a_flat[a_k[i] * (TILE_M + 4) + a_m[i]] = a_next[i];
% endif
            for (int i = 0; i < B_PER_THREAD; ++i)
                b_flat[b_k[i] * (TILE_N + 4) + b_n[i]] = b_next[i];
        }
</%def>
    if (kk_begin < kk_end) {
        {
${load_step("kk_begin")}
        }
${store_step("0")}
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Step kk0 multiplies stage `stage` while the global loads of the next step are in
    // flight; they go to the other stage, which every work item finished reading before the
    // previous barrier.
    int stage = 0;
    for (int kk0 = kk_begin; kk0 < kk_end; kk0 += TILE_K) {
        const bool more = kk0 + TILE_K < kk_end;
        if (more) {
${load_step("kk0 + TILE_K")}
        }
#pragma unroll
        for (int q = 0; q < TILE_K; ++q) {
            float a_reg[THREAD_M], b_reg[THREAD_N];
#pragma unroll
            for (int i4 = 0; i4 < THREAD_M / 4; ++i4) {
                float4 v = a_tiles[stage][q][i4 * THREADS_M + tm];
                a_reg[i4 * 4] = v.s0; a_reg[i4 * 4 + 1] = v.s1;
                a_reg[i4 * 4 + 2] = v.s2; a_reg[i4 * 4 + 3] = v.s3;
            }
#pragma unroll
            for (int j4 = 0; j4 < THREAD_N / 4; ++j4) {
                float4 v = b_tiles[stage][q][j4 * THREADS_N + tn];
                b_reg[j4 * 4] = v.s0; b_reg[j4 * 4 + 1] = v.s1;
                b_reg[j4 * 4 + 2] = v.s2; b_reg[j4 * 4 + 3] = v.s3;
            }
#pragma unroll
            for (int i = 0; i < THREAD_M; ++i)
#pragma unroll
                for (int j = 0; j < THREAD_N; ++j)
                    acc[i][j] = mad(a_reg[i], b_reg[j], acc[i][j]);
        }
        if (more) {
            if (stage) {
${store_step("0")}
            } else {
${store_step("1")}
            }
        }
        stage ^= 1;
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    // Work item (tm, tn) holds rows (i4 * THREADS_M + tm) * 4 + v, columns likewise.
    for (int j = 0; j < THREAD_N; ++j) {
        int n = n0 + ((j / 4) * THREADS_N + tn) * 4 + (j % 4);
        if (n >= GN)
            continue;
% if direction == "forward":
        int img = n / HoWo, p = n - img * HoWo;
        int oh = p / Wo, ow = p - oh * Wo;
        int col_index = img * ysN + oh * ysH + ow * ysW;
% elif direction == "backward_data":
        int img = n / HW, p = n - img * HW;
        int ih = p / W, iw = p - ih * W;
        int col_index = img * xsN + ih * xsH + iw * xsW;
% else:
%   if channel_last:
        int rs = n / Cg, c = n - rs * Cg;
%   else:
        int c = n / RS, rs = n - c * RS;
%   endif
        int r = rs / KS, s = rs - r * KS;
        int col_index = c * wsC + r * wsR + s * wsS;
% endif
        for (int i = 0; i < THREAD_M; ++i) {
            int m = m0 + ((i / 4) * THREADS_M + tm) * 4 + (i % 4);
            if (m >= GM)
                continue;
% if direction == "forward":
            int channel = g * Kg + m;
${common.store("out", "out_off", "col_index + channel * ysC", "channel", "acc[i][j]")}
% elif direction == "backward_data":
${common.store_scaled("out", "out_off", "col_index + (g * Cg + m) * xsC", "acc[i][j]")}
% elif split_k:
            out[out_off + split * (K * wsK) + col_index + (g * Kg + m) * wsK] = acc[i][j];
% else:
${common.store_scaled("out", "out_off", "col_index + (g * Kg + m) * wsK", "acc[i][j]")}
% endif
        }
    }
}

% if direction == "backward_filter":
// out[i] = alpha * sum_s partial[s][i] + beta * out[i] over the `count` weights.
__kernel void conv_igemm_reduce(int count, int splits, __global const float *partial, int partial_off,
    __global float *out, int out_off, float alpha, float beta)
{
    for (int i = get_global_id(0); i < count; i += get_global_size(0)) {
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s)
            acc += partial[partial_off + s * count + i];
${common.store_scaled("out", "out_off", "i", "acc")}
    }
}
% endif
