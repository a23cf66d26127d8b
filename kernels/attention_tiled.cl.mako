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
##   attention_delta(rows, o, o_off, dout, dout_off, delta)   as attention.cl.mako's.
##   attention_tiled_backward_kv(L, S, scale2, table, q, ..., causal, scale, dout, dout_off, lse,
##                               delta, dk, dv, seed0, ..., keep_scale)
##     the arguments and outputs of attention_backward_kv; global (ceil(S / kv_block) *
##     TILE_X * kv_tile_y, B): a group owns kv_block keys (k scaled, and v, staged once) and
##     walks the query rows q_step at a time; each item computes a tile of the transposed
##     scores and of dO V^T (its keys by its rows), writes the weights P and dS = P (dP - D) to
##     local memory, and adds P^T dO and dS^T Q to its keys' rows of dV and dK.
##   attention_tiled_backward_q(L, S, scale2, table, q, ..., causal, scale, dout, dout_off, lse,
##                              delta, dq, seed0, ..., keep_scale)
##     the arguments and output of attention_backward_q; global (ceil(L / q_block) * TILE_X *
##     q_tile_y, B): a group owns q_block query rows (q scaled, and dO, staged once) and walks
##     the keys k_step at a time: tiles of the scores and of dO V^T, dS to local memory, dS K
##     added to its rows of dQ.
##
## Template parameters:
##   dk, dv       head dims of q/k and of v
##   block_m      query rows per work-group           block_n   keys per step (TILE_X divides)
##   tile_y       rows of items (TILE_Y divides block_m)
##   tile_x       items sharing a row (8 or 16: neighbours in a warp; TILE_X divides block_n)
##   kv_block, q_step, kv_tile_y   the dK/dV kernel: keys per work-group, query rows per step,
##                rows of items (kv_block / kv_tile_y keys by q_step / TILE_X rows each)
##   q_block, k_step, q_tile_y     the dQ kernel: query rows per work-group, keys per step, rows
##                of items
##   mask, dropout, index_t   as attention.cl.mako
##   shuffle      "ptx" (NVIDIA warp shuffles across a row's items) or "local" (any device)
##   prefetch     load each step's tiles into registers during the previous step (their global
##                latency hidden behind its products), storing them to local memory at its start
<%namespace name="attention" file="attention_common.cl.mako"/>
<%
    TX = tile_x
    DK4 = (dk + 3) // 4
    DV4 = (dv + 3) // 4
    TM = block_m // tile_y
    TN = block_n // TX
    TD4 = (DV4 + TX - 1) // TX
    # Pitches (in float4s) of the staged tiles: an odd pitch spreads the rows that a warp's items
    # read at once over the banks; a pitch of at least TD4 * TX float4s (zeros past the head
    # dim) lets each item read its columns tx + c * TX unguarded.
    def odd(n):
        return n + 1 if n % 2 == 0 else n
    QP4 = odd(DK4)
    KP4 = odd(DK4)
    VP4 = TD4 * TX
    KCP4 = odd(max(DK4, ((DK4 + TX - 1) // TX) * TX))
    VCP4 = odd(max(DV4, TD4 * TX))
    TK4 = (DK4 + TX - 1) // TX
    VRP4 = odd(DV4)
    TKN = kv_block // kv_tile_y
    TQ = q_step // TX
    PQ = q_step + 4
    TQM = q_block // q_tile_y
    TKS = k_step // TX
    PK = k_step + 4
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
#define QP4 ${QP4}
#define KP4 ${KP4}
#define VP4 ${VP4}
#define KCP4 ${KCP4}
#define VCP4 ${VCP4}
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
    // An array, not a chain of selects on the components (which Oclgrind got wrong).
    const uint words[4] = {r.x, r.y, r.z, r.w};
    return (words[i & 3] >> 8) >= threshold;
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

## A step's tiles: each (dst, base, count, limit, width, width4, pitch4) staged as ``stage``
## does, from row ``first``. Without prefetch: between two barriers. With prefetch (software
## pipelining): the step's tiles were loaded into registers (``prefetch_first``, or the previous
## step) and go to local memory here; the next step's (from ``next_first``, while below ``end``)
## are loaded into registers before this step computes, so their global latency overlaps it.
<%def name="prefetch_registers(tiles, group)">
% if prefetch:
    % for (dst, base, count, limit, width, width4, pitch4) in tiles:
    float4 ${dst}_next[${-(-(count * pitch4) // group)}];
    % endfor
% endif
</%def>
<%def name="prefetch_load(tiles, first, group)">
    % for (dst, base, count, limit, width, width4, pitch4) in tiles:
    #pragma unroll
    for (int it = 0; it < ${-(-(count * pitch4) // group)}; ++it) {
        const int t = lid + it * ${group};
        const int r = t / ${pitch4};
        const int e4 = t - r * ${pitch4};
        const ${index_t} row = ${first} + r;
        float4 x = (float4)(0.0f);
        if (t < ${count * pitch4} && row < ${limit} && e4 < ${width4}) {
            __global const float *p = ${base} + row * ${width} + 4 * e4;
            if (4 * e4 + 3 < ${width}) {
                x = vload4(0, p);
            } else {
                x.x = p[0];
                if (4 * e4 + 1 < ${width}) x.y = p[1];
                if (4 * e4 + 2 < ${width}) x.z = p[2];
            }
        }
        ${dst}_next[it] = x;
    }
    % endfor
</%def>
<%def name="prefetch_first(tiles, first, group)">
% if prefetch:
    ${prefetch_load(tiles, first, group)}
% endif
</%def>
<%def name="step_tiles(tiles, first, next_first, end, group)">
        // Every item is done with the previous step's tiles.
        barrier(CLK_LOCAL_MEM_FENCE);
% if prefetch:
    % for (dst, base, count, limit, width, width4, pitch4) in tiles:
        #pragma unroll
        for (int it = 0; it < ${-(-(count * pitch4) // group)}; ++it) {
            const int t = lid + it * ${group};
            if (t < ${count * pitch4}) ${dst}[t] = ${dst}_next[it];
        }
    % endfor
        ${caller.body()}
        barrier(CLK_LOCAL_MEM_FENCE);
        if (${next_first} < ${end}) {
            ${prefetch_load(tiles, next_first, group)}
        }
% else:
    % for (dst, base, count, limit, width, width4, pitch4) in tiles:
        ${stage(dst, base, first, count, limit, width, width4, pitch4)}
    % endfor
        ${caller.body()}
        barrier(CLK_LOCAL_MEM_FENCE);
% endif
</%def>

## In place over ``v[0..TM)``: the maximum (op "max") or sum ("sum") of each entry across the
## TILE_X items of the row (every item of the group must reach it); every item gets the same
## bits (butterfly partners add the same two values; the local variant sums in one order).
<%def name="row_reduce(v, op)">
% if shuffle == "ptx":
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
    % for width in [w for w in (1, 2, 4, 8) if w < TX]:
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
    __local float4 q_tile[BLOCK_M * QP4];
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

    ${stage("q_tile", "qb", "row0", "BLOCK_M", "L", "DK", "DK4", "QP4", " * scale2")}

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

<% fwd_tiles = [("k_tile", "kb", block_n, "S", "DK", "DK4", KP4), ("v_tile", "vb", block_n, "S", "DV", "DV4", VP4)] %>
    ${prefetch_registers(fwd_tiles, TX * tile_y)}
    ${prefetch_first(fwd_tiles, "0", TX * tile_y)}
    for (${index_t} n0 = 0; n0 < n_end; n0 += BLOCK_N) {
        <%self:step_tiles tiles="${fwd_tiles}" first="n0" next_first="n0 + BLOCK_N" end="n_end" group="${TX * tile_y}">
        </%self:step_tiles>

        float s[TM][TN];
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            #pragma unroll
            for (int j = 0; j < TN; ++j) s[i][j] = 0.0f;
        }
        for (int d4 = 0; d4 < DK4; ++d4) {
            float4 a[TM], bk[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = q_tile[(ty * TM + i) * QP4 + d4];
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

${attention.delta_kernel(index_t, dv)}

## ``out[i][j] += a_tile[a_row(i)] . b_tile[b_row(j)]`` over n4 float4s: the A rows are the
## item's own (ty: shared by a row of items, broadcast), the B rows tx + j * TILE_X (distinct).
<%def name="dot_tile(out, ta, tb, a_tile, a_pitch, a_first, b_tile, b_pitch, n4)">
        for (int d4 = 0; d4 < ${n4}; ++d4) {
            float4 a[${ta}], bb[${tb}];
            #pragma unroll
            for (int i = 0; i < ${ta}; ++i) a[i] = ${a_tile}[(${a_first} + i) * ${a_pitch} + d4];
            #pragma unroll
            for (int j = 0; j < ${tb}; ++j) bb[j] = ${b_tile}[(tx + j * TILE_X) * ${b_pitch} + d4];
            #pragma unroll
            for (int i = 0; i < ${ta}; ++i) {
                #pragma unroll
                for (int j = 0; j < ${tb}; ++j) {
                    ${out}[i][j] = mad(a[i].x, bb[j].x, ${out}[i][j]);
                    ${out}[i][j] = mad(a[i].y, bb[j].y, ${out}[i][j]);
                    ${out}[i][j] = mad(a[i].z, bb[j].z, ${out}[i][j]);
                    ${out}[i][j] = mad(a[i].w, bb[j].w, ${out}[i][j]);
                }
            }
        }
</%def>

## ``acc[i][c] += sum_n w[a_first + i][n] * b_tile[n][tx + c * TILE_X]`` for n < count (a
## multiple of 4): the weights w (floats, rows of ``w_pitch``) from local memory, four at a time.
<%def name="accumulate_tile(acc, ta, tc, w_tile, w_pitch, a_first, b_tile, b_pitch, count)">
        {
            __local const float4 *w4 = (__local const float4 *)${w_tile};
            for (int n4 = 0; n4 < ${count} / 4; ++n4) {
                float4 w[${ta}];
                #pragma unroll
                for (int i = 0; i < ${ta}; ++i) w[i] = w4[(${a_first} + i) * (${w_pitch} / 4) + n4];
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    #pragma unroll
                    for (int c = 0; c < ${tc}; ++c) {
                        const float4 bb = ${b_tile}[(4 * n4 + u) * ${b_pitch} + tx + c * TILE_X];
                        #pragma unroll
                        for (int i = 0; i < ${ta}; ++i) {
                            const float wi = u == 0 ? w[i].x : u == 1 ? w[i].y : u == 2 ? w[i].z : w[i].w;
                            ${acc}[i][c] = mad((float4)(wi), bb, ${acc}[i][c]);
                        }
                    }
                }
            }
        }
</%def>

## Row ``row`` of a (rows x width) output at ``dst``: the item's float4s tx + c * TILE_X of
## acc[i] times ``factor``.
<%def name="store_row(dst, acc, i, tc, width, width4, factor)">
        #pragma unroll
        for (int c = 0; c < ${tc}; ++c) {
            const int e4 = tx + c * TILE_X;
            const float4 y = ${acc}[${i}][c] * ${factor};
            if (4 * e4 + 3 < ${width}) {
                vstore4(y, 0, ${dst} + 4 * e4);
            } else if (e4 < ${width4}) {
                ${dst}[4 * e4] = y.x;
                if (4 * e4 + 1 < ${width}) ${dst}[4 * e4 + 1] = y.y;
                if (4 * e4 + 2 < ${width}) ${dst}[4 * e4 + 2] = y.z;
            }
        }
</%def>

## The weight p of score x for query row ``row`` and key ``key`` (lse: the row's), with its
## dP value dp; sets pv (the weight as dropped and scaled, for dV) and ds = p (dP' - delta).
<%def name="weight_and_ds(x, dp, row, key, row_lse, row_delta)">
                float p = 0.0f;
                if (${key} < S && ${row} < L && !(causal && ${key} > ${row})) {
                    float xs = ${x};
% if mask == "bool":
                    if (!mb[${row} * mask_stride_l + ${key} * mask_stride_s]) xs = -INFINITY;
% elif mask == "float":
                    xs += mb[${row} * mask_stride_l + ${key} * mask_stride_s] * LOG2E;
% endif
                    p = exp2(xs - ${row_lse});
                }
                float dpv = ${dp};
% if dropout:
                const bool kept = ${key} < S && ${row} < L && kept_element(
                    ((ulong)b * (ulong)L + (ulong)(${row})) * (ulong)S + (ulong)(${key}),
                    seed0, seed1, stream0, stream1, threshold);
                const float pv = kept ? p * keep_scale : 0.0f;
                dpv = kept ? dpv * keep_scale : 0.0f;
% else:
                const float pv = p;
% endif
                const float ds = p * (dpv - ${row_delta});
</%def>

#undef GROUP
#define GROUP (TILE_X * ${kv_tile_y})

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void attention_tiled_backward_kv(const ${index_t} L, const ${index_t} S, const float scale2,
                                 __global const ${index_t} *table,
                                 __global const float *q, const ${index_t} q_off,
                                 __global const float *k, const ${index_t} k_off,
                                 __global const float *v, const ${index_t} v_off,
                                 __global const ${mask_t} *mask, const ${index_t} mask_off,
                                 const ${index_t} mask_stride_l, const ${index_t} mask_stride_s,
                                 const int causal, const float scale,
                                 __global const float *dout, const ${index_t} dout_off,
                                 __global const float *lse, __global const float *delta,
                                 __global float *dk, __global float *dv,
                                 const uint seed0, const uint seed1, const uint stream0,
                                 const uint stream1, const uint threshold, const float keep_scale)
{
    // The group's keys (scaled to base-2 scores) and values: rows of the items' tiles.
    __local float4 k_tile[${kv_block} * KP4];
    __local float4 v_tile[${kv_block} * ${VRP4}];
    // The step's query rows and output gradient rows: read as rows and as columns.
    __local float4 q_tile[${q_step} * KCP4];
    __local float4 g_tile[${q_step} * VCP4];
    __local float lse_tile[${q_step}], delta_tile[${q_step}];
    // P (dropped and scaled) and dS, transposed: a row per key.
    __local float pt_tile[${kv_block} * ${PQ}];
    __local float dst_tile[${kv_block} * ${PQ}];
    const int lid = get_local_id(0);
    // tx: the item's query rows of a step (tx + j * TILE_X) and head-dim float4s
    // (tx + c * TILE_X); ty: its keys ty * TKN + i.
    const int tx = lid % TILE_X, ty = lid / TILE_X;
    const ${index_t} b = get_group_id(1);
    const ${index_t} kv0 = (${index_t})get_group_id(0) * ${kv_block};
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
% if has_mask:
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];
% endif
    __global const float *gb = dout + dout_off + (${index_t})b * L * DV;

    ${stage("k_tile", "kb", "kv0", kv_block, "S", "DK", "DK4", "KP4", " * scale2")}
    ${stage("v_tile", "vb", "kv0", kv_block, "S", "DV", "DV4", VRP4)}
    float4 dk_acc[${TKN}][${TK4}], dv_acc[${TKN}][TD4];
    #pragma unroll
    for (int i = 0; i < ${TKN}; ++i) {
        #pragma unroll
        for (int c = 0; c < ${TK4}; ++c) dk_acc[i][c] = (float4)(0.0f);
        #pragma unroll
        for (int c = 0; c < TD4; ++c) dv_acc[i][c] = (float4)(0.0f);
    }
    // Causal: query rows before the group's first key see none of its keys.
    const ${index_t} i_begin = causal ? kv0 : 0;

<% kv_tiles = [("q_tile", "qb", q_step, "L", "DK", "DK4", KCP4), ("g_tile", "gb", q_step, "L", "DV", "DV4", VCP4)] %>
    ${prefetch_registers(kv_tiles, TX * kv_tile_y)}
    ${prefetch_first(kv_tiles, "i_begin", TX * kv_tile_y)}
    for (${index_t} i0 = i_begin; i0 < L; i0 += ${q_step}) {
        <%self:step_tiles tiles="${kv_tiles}" first="i0" next_first="${'i0 + %d' % q_step}" end="L" group="${TX * kv_tile_y}">
        for (int t = lid; t < ${q_step}; t += GROUP) {
            const ${index_t} row = i0 + t;
            lse_tile[t] = row < L ? lse[(${index_t})b * L + row] : INFINITY;
            delta_tile[t] = row < L ? delta[(${index_t})b * L + row] : 0.0f;
        }
        </%self:step_tiles>

        float st[${TKN}][${TQ}], dpt[${TKN}][${TQ}];
        #pragma unroll
        for (int i = 0; i < ${TKN}; ++i) {
            #pragma unroll
            for (int j = 0; j < ${TQ}; ++j) st[i][j] = dpt[i][j] = 0.0f;
        }
        ${dot_tile("st", TKN, TQ, "k_tile", "KP4", "ty * %d" % TKN, "q_tile", "KCP4", "DK4")}
        ${dot_tile("dpt", TKN, TQ, "v_tile", VRP4, "ty * %d" % TKN, "g_tile", "VCP4", "DV4")}
        #pragma unroll
        for (int i = 0; i < ${TKN}; ++i) {
            const ${index_t} key = kv0 + ty * ${TKN} + i;
            #pragma unroll
            for (int j = 0; j < ${TQ}; ++j) {
                const int r = tx + j * TILE_X;
                const ${index_t} row = i0 + r;
                ${weight_and_ds("st[i][j]", "dpt[i][j]", "row", "key", "lse_tile[r]", "delta_tile[r]")}
                pt_tile[(ty * ${TKN} + i) * ${PQ} + r] = pv;
                dst_tile[(ty * ${TKN} + i) * ${PQ} + r] = ds;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        ${accumulate_tile("dv_acc", TKN, "TD4", "pt_tile", PQ, "ty * %d" % TKN, "g_tile", "VCP4", q_step)}
        ${accumulate_tile("dk_acc", TKN, TK4, "dst_tile", PQ, "ty * %d" % TKN, "q_tile", "KCP4", q_step)}
    }
    #pragma unroll
    for (int i = 0; i < ${TKN}; ++i) {
        const ${index_t} key = kv0 + ty * ${TKN} + i;
        if (key >= S) continue;
        __global float *dkrow = dk + ((${index_t})b * S + key) * DK;
        __global float *dvrow = dv + ((${index_t})b * S + key) * DV;
        ${store_row("dkrow", "dk_acc", "i", TK4, "DK", "DK4", "scale")}
        ${store_row("dvrow", "dv_acc", "i", "TD4", "DV", "DV4", "1.0f")}
    }
}

#undef GROUP
#define GROUP (TILE_X * ${q_tile_y})

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void attention_tiled_backward_q(const ${index_t} L, const ${index_t} S, const float scale2,
                                __global const ${index_t} *table,
                                __global const float *q, const ${index_t} q_off,
                                __global const float *k, const ${index_t} k_off,
                                __global const float *v, const ${index_t} v_off,
                                __global const ${mask_t} *mask, const ${index_t} mask_off,
                                const ${index_t} mask_stride_l, const ${index_t} mask_stride_s,
                                const int causal, const float scale,
                                __global const float *dout, const ${index_t} dout_off,
                                __global const float *lse, __global const float *delta,
                                __global float *dq,
                                const uint seed0, const uint seed1, const uint stream0,
                                const uint stream1, const uint threshold, const float keep_scale)
{
    // The group's query rows (scaled to base-2 scores) and output gradient rows.
    __local float4 q_tile[${q_block} * QP4];
    __local float4 g_tile[${q_block} * ${VRP4}];
    // The step's keys (read as rows and as columns) and values.
    __local float4 k_tile[${k_step} * KCP4];
    __local float4 v_tile[${k_step} * ${VRP4}];
    __local float ds_tile[${q_block} * ${PK}];
    const int lid = get_local_id(0);
    // tx: the item's keys of a step (tx + j * TILE_X) and head-dim float4s (tx + c * TILE_X);
    // ty: its rows ty * TQM + i.
    const int tx = lid % TILE_X, ty = lid / TILE_X;
    const ${index_t} b = get_group_id(1);
    const ${index_t} row0 = (${index_t})get_group_id(0) * ${q_block};
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
% if has_mask:
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];
% endif
    __global const float *gb = dout + dout_off + (${index_t})b * L * DV;

    ${stage("q_tile", "qb", "row0", q_block, "L", "DK", "DK4", "QP4", " * scale2")}
    ${stage("g_tile", "gb", "row0", q_block, "L", "DV", "DV4", VRP4)}
    float row_lse[${TQM}], row_delta[${TQM}];
    float4 acc[${TQM}][${TK4}];
    #pragma unroll
    for (int i = 0; i < ${TQM}; ++i) {
        const ${index_t} row = row0 + ty * ${TQM} + i;
        row_lse[i] = row < L ? lse[(${index_t})b * L + row] : INFINITY;
        row_delta[i] = row < L ? delta[(${index_t})b * L + row] : 0.0f;
        #pragma unroll
        for (int c = 0; c < ${TK4}; ++c) acc[i][c] = (float4)(0.0f);
    }
    const ${index_t} n_end = causal ? min(S, row0 + ${q_block}) : S;

<% q_tiles = [("k_tile", "kb", k_step, "S", "DK", "DK4", KCP4), ("v_tile", "vb", k_step, "S", "DV", "DV4", VRP4)] %>
    ${prefetch_registers(q_tiles, TX * q_tile_y)}
    ${prefetch_first(q_tiles, "0", TX * q_tile_y)}
    for (${index_t} n0 = 0; n0 < n_end; n0 += ${k_step}) {
        <%self:step_tiles tiles="${q_tiles}" first="n0" next_first="${'n0 + %d' % k_step}" end="n_end" group="${TX * q_tile_y}">
        </%self:step_tiles>

        float s[${TQM}][${TKS}], dp[${TQM}][${TKS}];
        #pragma unroll
        for (int i = 0; i < ${TQM}; ++i) {
            #pragma unroll
            for (int j = 0; j < ${TKS}; ++j) s[i][j] = dp[i][j] = 0.0f;
        }
        ${dot_tile("s", TQM, TKS, "q_tile", "QP4", "ty * %d" % TQM, "k_tile", "KCP4", "DK4")}
        ${dot_tile("dp", TQM, TKS, "g_tile", VRP4, "ty * %d" % TQM, "v_tile", VRP4, "DV4")}
        #pragma unroll
        for (int i = 0; i < ${TQM}; ++i) {
            const ${index_t} row = row0 + ty * ${TQM} + i;
            #pragma unroll
            for (int j = 0; j < ${TKS}; ++j) {
                const ${index_t} key = n0 + tx + j * TILE_X;
                ${weight_and_ds("s[i][j]", "dp[i][j]", "row", "key", "row_lse[i]", "row_delta[i]")}
                ds_tile[(ty * ${TQM} + i) * ${PK} + tx + j * TILE_X] = ds;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        ${accumulate_tile("acc", TQM, TK4, "ds_tile", PK, "ty * %d" % TQM, "k_tile", "KCP4", k_step)}
    }
    #pragma unroll
    for (int i = 0; i < ${TQM}; ++i) {
        const ${index_t} row = row0 + ty * ${TQM} + i;
        if (row >= L) continue;
        __global float *dqrow = dq + ((${index_t})b * L + row) * DK;
        ${store_row("dqrow", "acc", "i", TK4, "DK", "DK4", "scale")}
    }
}
