## Fused scaled dot-product attention, register-tiled (the "tiled" solver of the attention
## family; kernels/attention.cl.mako holds the portable "rows" kernels and states the shared
## conventions: the batch offset table, masks, causal, base-2 scores and lse, dropout).
##
## Why tiled: with a work item per query row every key element read from local memory feeds one
## multiply-add, so the rows kernels are bound by local memory. Here both products are computed
## as a GEMM's register tiles: a work-group of TILE_X x TILE_Y items owns BLOCK_M query rows;
## per step it stages BLOCK_N keys and values in local memory, and each item computes a TM x TN
## tile of the scores (TM = BLOCK_M / TILE_Y rows, TN = BLOCK_N / TILE_X keys: TM + TN float4
## reads per 4 * TM * TN multiply-adds), and a TM x (4 * TD4) tile of the output from the
## weights it wrote to local memory. The TILE_X items sharing a row are neighbours in a warp:
## the row's maximum is taken across them by warp shuffles on NVIDIA (or local memory
## elsewhere); the row's sum stays split across them until the end.
##
## Kernels (sizes are run-time arguments; index_t is int or long):
##   attention_tiled_forward(L, S, scale2, table, q, q_off, k, k_off, v, v_off, mask, mask_off,
##                           mask_stride_l, mask_stride_s, causal, o, o_off, lse, seed0, seed1,
##                           stream0, stream1, threshold, keep_scale)
##     the arguments of attention_forward (attention.cl.mako), the same outputs;
##     global (ceil(L / BLOCK_M) * GROUP, B), local (GROUP, 1), GROUP = TILE_X * TILE_Y.
##
## Template parameters:
##   dk, dv       head dims of q/k and of v
##   block_m      query rows per work-group           block_n   keys per step (TILE_X divides)
##   tile_y       rows of items (TILE_Y divides block_m); TILE_X is 16
##   mask, dropout, index_t   as attention.cl.mako
##   shuffle      "ptx" (NVIDIA warp shuffles across a row's items) or "local" (any device)
<%
    TX = 16
    DK4 = (dk + 3) // 4
    DV4 = (dv + 3) // 4
    TM = block_m // tile_y
    TN = block_n // TX
    TD4 = (DV4 + TX - 1) // TX
    # Pitches (in float4s) of the staged tiles: an odd pitch of k rows spreads the TILE_X keys
    # an item row reads over the banks; values are read along columns (no conflicts).
    KP4 = DK4 + 1 if DK4 % 2 == 0 else DK4
    VP4 = TD4 * TX
    PP = block_n + 4
    has_mask = mask != "none"
    mask_t = "uchar" if mask == "bool" else "float"
%>
#define DK ${dk}
#define DV ${dv}
#define DK4 ${DK4}
#define DV4 ${DV4}
#define TILE_X ${TX}
#define TILE_Y ${tile_y}
#define GROUP (TILE_X * TILE_Y)
#define BLOCK_M ${block_m}
#define BLOCK_N ${block_n}
#define TM ${TM}
#define TN ${TN}
#define TD4 ${TD4}
#define KP4 ${KP4}
#define VP4 ${VP4}
#define PP ${PP}
#define LOG2E 1.4426950408889634f

% if dropout:
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

uint4 philox4x32_10(uint4 ctr, uint2 key)
{
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            key.x += PHILOX_W0;
            key.y += PHILOX_W1;
        }
        uint hi0 = mul_hi(PHILOX_M0, ctr.x), lo0 = PHILOX_M0 * ctr.x;
        uint hi1 = mul_hi(PHILOX_M1, ctr.z), lo1 = PHILOX_M1 * ctr.z;
        ctr = (uint4)(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
    }
    return ctr;
}

// Whether element ``i`` of the flattened (B, L, S) weights is kept (the dropout family's rule).
bool kept_element(ulong i, uint seed0, uint seed1, uint stream0, uint stream1, uint threshold)
{
    const uint4 r = philox4x32_10((uint4)((uint)(i >> 2), (uint)(i >> 34), stream0, stream1),
                                  (uint2)(seed0, seed1));
    const uint lane = (uint)(i & 3);
    const uint word = lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
    return (word >> 8) >= threshold;
}
% endif

## Rows [first, first + count) of a (rows x width) row-major operand at ``base`` into local
## float4 rows of ``pitch4`` vectors, zeros past ``limit`` rows, past ``width`` columns and up
## to the pitch; consecutive items take consecutive float4s of a row (coalesced). ``factor``
## scales the values.
<%def name="stage(dst, base, first, count, limit, width, width4, pitch4, factor='')">
    for (int t = lid; t < ${count} * ${pitch4}; t += GROUP) {
        const int r = t / ${pitch4};
        const int e4 = t - r * ${pitch4};
        const ${index_t} row = ${first} + r;
        float4 x = (float4)(0.0f);
        if (row < ${limit} && e4 < ${width4}) {
            __global const float *p = ${base} + row * ${width} + 4 * e4;
            if (4 * e4 + 3 < ${width}) {
                x = vload4(0, p);
            } else {
                x.x = p[0];
                if (4 * e4 + 1 < ${width}) x.y = p[1];
                if (4 * e4 + 2 < ${width}) x.z = p[2];
            }
        }
        ${dst}[t] = x${factor};
    }
</%def>

## In place over ``v[0..TM)``: the maximum (op "max") or sum ("sum") of each entry across the
## TILE_X items of the row (every item of the group must reach it); every item gets the same
## bits (butterfly partners add the same two values; the local variant sums in one order).
<%def name="row_reduce(v, op)">
% if shuffle == "ptx":
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
    % for width in (1, 2, 4, 8):
        {
            float other;
            asm volatile("shfl.sync.bfly.b32 %0, %1, ${width}, 0x1f, 0xffffffff;" : "=f"(other) : "f"(${v}[i]));
            ${v}[i] = ${"fmax(%s[i], other)" % v if op == "max" else "%s[i] + other" % v};
        }
    % endfor
    }
% else:
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TM; ++i) exchange[(ty * TM + i) * TILE_X + tx] = ${v}[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TM; ++i) {
        __local const float *row_values = exchange + (ty * TM + i) * TILE_X;
        float r = row_values[0];
        for (int t = 1; t < TILE_X; ++t)
            r = ${"fmax(r, row_values[t])" if op == "max" else "r + row_values[t]"};
        ${v}[i] = r;
    }
% endif
</%def>

<%def name="exchange_buffer()">
% if shuffle != "ptx":
    __local float exchange[BLOCK_M * TILE_X];
% endif
</%def>

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void attention_tiled_forward(const ${index_t} L, const ${index_t} S, const float scale2,
                             __global const ${index_t} *table,
                             __global const float *q, const ${index_t} q_off,
                             __global const float *k, const ${index_t} k_off,
                             __global const float *v, const ${index_t} v_off,
                             __global const ${mask_t} *mask, const ${index_t} mask_off,
                             const ${index_t} mask_stride_l, const ${index_t} mask_stride_s,
                             const int causal,
                             __global float *o, const ${index_t} o_off,
                             __global float *lse,
                             const uint seed0, const uint seed1, const uint stream0,
                             const uint stream1, const uint threshold, const float keep_scale)
{
    // q rows (scaled to base-2 scores), the step's keys and values, the step's weights.
    __local float4 q_tile[BLOCK_M * DK4];
    __local float4 k_tile[BLOCK_N * KP4];
    __local float4 v_tile[BLOCK_N * VP4];
    __local float p_tile[BLOCK_M * PP];
    ${exchange_buffer()}
    const int lid = get_local_id(0);
    // tx: the item's keys (tx + j * TILE_X) and output float4s (tx + c * TILE_X); ty: its rows
    // ty * TM + i. A row's TILE_X items are consecutive ids: neighbours in one warp.
    const int tx = lid % TILE_X, ty = lid / TILE_X;
    const ${index_t} b = get_group_id(1);
    const ${index_t} row0 = (${index_t})get_group_id(0) * BLOCK_M;
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
% if has_mask:
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];
% endif

    ${stage("q_tile", "qb", "row0", "BLOCK_M", "L", "DK", "DK4", "DK4", " * scale2")}

    float4 acc[TM][TD4];
    float m[TM], l[TM];
    // A NaN score that the running maximum skips (fmax ignores NaN) still reaches the output.
    float nan_seen[TM];
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        nan_seen[i] = 0.0f;
        #pragma unroll
        for (int c = 0; c < TD4; ++c) acc[i][c] = (float4)(0.0f);
    }
    // Causal: the block's last row sees keys up to itself.
    const ${index_t} n_end = causal ? min(S, row0 + BLOCK_M) : S;

    for (${index_t} n0 = 0; n0 < n_end; n0 += BLOCK_N) {
        // Every item is done with the previous step's tiles (and q_tile is staged).
        barrier(CLK_LOCAL_MEM_FENCE);
        ${stage("k_tile", "kb", "n0", "BLOCK_N", "S", "DK", "DK4", "KP4")}
        ${stage("v_tile", "vb", "n0", "BLOCK_N", "S", "DV", "DV4", "VP4")}
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TM][TN];
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            #pragma unroll
            for (int j = 0; j < TN; ++j) s[i][j] = 0.0f;
        }
        for (int d4 = 0; d4 < DK4; ++d4) {
            float4 a[TM], bk[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = q_tile[(ty * TM + i) * DK4 + d4];
            #pragma unroll
            for (int j = 0; j < TN; ++j) bk[j] = k_tile[(tx + j * TILE_X) * KP4 + d4];
            #pragma unroll
            for (int i = 0; i < TM; ++i) {
                #pragma unroll
                for (int j = 0; j < TN; ++j) {
                    s[i][j] = mad(a[i].x, bk[j].x, s[i][j]);
                    s[i][j] = mad(a[i].y, bk[j].y, s[i][j]);
                    s[i][j] = mad(a[i].z, bk[j].z, s[i][j]);
                    s[i][j] = mad(a[i].w, bk[j].w, s[i][j]);
                }
            }
        }

        float step_max[TM];
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            const ${index_t} row = row0 + ty * TM + i;
            step_max[i] = -INFINITY;
            #pragma unroll
            for (int j = 0; j < TN; ++j) {
                const ${index_t} key = n0 + tx + j * TILE_X;
                float x = s[i][j];
                if (key >= S || row >= L || (causal && key > row)) {
                    x = -INFINITY;
                } else {
% if mask == "bool":
                    if (!mb[row * mask_stride_l + key * mask_stride_s]) x = -INFINITY;
% elif mask == "float":
                    x += mb[row * mask_stride_l + key * mask_stride_s] * LOG2E;
% endif
                }
                if (isnan(x)) nan_seen[i] = x;
                s[i][j] = x;
                step_max[i] = fmax(step_max[i], x);
            }
        }
        ${row_reduce("step_max", "max")}
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            const float m_new = fmax(m[i], step_max[i]);
            // Nothing of the row takes part yet: subtract 0, so that the weights (and alpha,
            // for m = -inf) come out 0 rather than exp2(-inf + inf) = NaN.
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = exp2(m[i] - m_use);
            m[i] = m_new;
            l[i] *= alpha;
            #pragma unroll
            for (int c = 0; c < TD4; ++c) acc[i][c] *= alpha;
% if dropout:
            const ${index_t} row = row0 + ty * TM + i;
            const ulong element0 = ((ulong)b * (ulong)L + (ulong)row) * (ulong)S + (ulong)n0;
% endif
            #pragma unroll
            for (int j = 0; j < TN; ++j) {
                const float p = exp2(s[i][j] - m_use);
                l[i] += p;
% if dropout:
                const int key_in_step = tx + j * TILE_X;
                const bool kept = n0 + key_in_step < S && row < L
                    && kept_element(element0 + key_in_step, seed0, seed1, stream0, stream1, threshold);
                p_tile[(ty * TM + i) * PP + tx + j * TILE_X] = kept ? p : 0.0f;
% else:
                p_tile[(ty * TM + i) * PP + tx + j * TILE_X] = p;
% endif
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        __local const float4 *p4 = (__local const float4 *)p_tile;
        for (int n4 = 0; n4 < BLOCK_N / 4; ++n4) {
            float4 w[TM];
            #pragma unroll
            for (int i = 0; i < TM; ++i) w[i] = p4[(ty * TM + i) * (PP / 4) + n4];
            #pragma unroll
            for (int u = 0; u < 4; ++u) {
                #pragma unroll
                for (int c = 0; c < TD4; ++c) {
                    const float4 vv = v_tile[(4 * n4 + u) * VP4 + tx + c * TILE_X];
                    #pragma unroll
                    for (int i = 0; i < TM; ++i) {
                        const float wi = u == 0 ? w[i].x : u == 1 ? w[i].y : u == 2 ? w[i].z : w[i].w;
                        acc[i][c] = mad((float4)(wi), vv, acc[i][c]);
                    }
                }
            }
        }
    }

    ${row_reduce("l", "sum")}
    ${row_reduce("nan_seen", "sum")}
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        const ${index_t} row = row0 + ty * TM + i;
        if (row >= L) continue;
% if dropout:
        const float norm = l[i] > 0.0f ? keep_scale / l[i] : 0.0f;
% else:
        const float norm = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
% endif
        __global float *orow = o + o_off + ((${index_t})b * L + row) * DV;
        #pragma unroll
        for (int c = 0; c < TD4; ++c) {
            const int e4 = tx + c * TILE_X;
            const float4 y = acc[i][c] * norm + nan_seen[i];
            if (4 * e4 + 3 < DV) {
                vstore4(y, 0, orow + 4 * e4);
            } else if (e4 < DV4) {
                orow[4 * e4] = y.x;
                if (4 * e4 + 1 < DV) orow[4 * e4 + 1] = y.y;
                if (4 * e4 + 2 < DV) orow[4 * e4 + 2] = y.z;
            }
        }
        if (tx == 0)
            lse[(${index_t})b * L + row] = l[i] > 0.0f ? m[i] + log2(l[i])
                : (l[i] == 0.0f ? INFINITY : l[i]) + nan_seen[i];
    }
}
