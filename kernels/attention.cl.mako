## Fused scaled dot-product attention, FlashAttention-style: softmax(Q K^T * scale + bias) V without
## the L x S score matrix in memory. The forward runs an online softmax over tiles of keys and
## keeps each query row's log-sum-exp (base 2) for the backward; the backward follows
## FlashAttention-2: a preprocess takes D = rowsum(dO * O), one kernel walks the query rows for a
## block of keys (dK, dV), another walks the keys for a block of query rows (dQ). No atomics:
## every gradient element is summed by one work item, in a fixed order.
##
## Layout: the caller flattens the broadcast batch dimensions into B batches. Per batch b the
## table holds the element offsets (from the operands' own offsets) of q, k, v and the mask:
## table[4 * b + 0..3]; that one table expresses broadcasting and grouped-query heads. q is
## (L, DK) rows, k (S, DK), v (S, DV), o (B, L, DV) dense, lse and delta (B, L). The mask, where
## there is one, is read at mask_row * mask_stride_l + key * mask_stride_s (a stride is 0 where
## the mask broadcasts). causal (0 or 1): keys n > l do not take part for query row l
## (top-left aligned, as torch); a run-time flag, uniform across the launch. Scores are kept in base 2: s2 = (q . k) * scale * log2(e) + bias *
## log2(e), so exp2 gives the softmax; lse2 = m2 + log2(l) (+inf for a row with no key taking
## part: its output and gradients are 0, as PyTorch's fused kernels give).
##
## Dropout (dropout = True) drops element (b, l, n) of the attention weights as F.dropout does
## element (b * L + l) * S + n of a (B, L, S) tensor (kernels/dropout.cl.mako: Philox4x32-10 of
## (element / 4, stream), key = seed, word element % 4, kept when (word >> 8) >= threshold);
## kept weights are scaled by keep_scale = 1 / (1 - p) and the backward recomputes the mask.
##
## Kernels (sizes are run-time arguments; index_t is int or long):
##   attention_forward(L, S, scale2, table, q, q_off, k, k_off, v, v_off, mask, mask_off,
##                     mask_stride_l, mask_stride_s, causal, o, o_off, lse, seed0, seed1, stream0,
##                     stream1, threshold, keep_scale)
##     global (ceil(L / BLOCK_M) * BLOCK_M * LANES, B), local (BLOCK_M * LANES, 1): LANES work
##     items per query row,
##     holding its q row and output row in registers; the group stages BLOCK_N keys and values
##     (and the mask's BLOCK_M x BLOCK_N tile) in local memory per step.
##   attention_delta(rows, o, o_off, dout, dout_off, delta)
##     delta[r] = sum_e dout[r, e] * o[r, e] for r < rows; a work item per row.
##   attention_backward_q(L, S, scale2, scale, table, q, ..., mask_stride_s, dout, dout_off,
##                        lse, delta, dq, seed0, ..., keep_scale)
##     the forward's geometry: a work item per query row, dq (B, L, DK) dense.
##   attention_backward_kv(L, S, scale2, scale, table, q, ..., mask_stride_s, dout, dout_off,
##                         lse, delta, dk, dv, seed0, ..., keep_scale)
##     global (ceil(S / KV_BLOCK) * KV_BLOCK * LANES, B), local (KV_BLOCK * LANES, 1): LANES
##     work items per key,
##     holding its k and v rows and their gradients in registers; the group stages Q_TILE query
##     rows (q, dout, lse, delta, the mask's tile) per step. dk, dv (B, S, DK / DV) dense.
##
## Template parameters:
##   dk, dv       head dims of q/k and of v (compile time: the rows live in registers)
##   block_m      query rows per work-group (forward, dq)     block_n   keys per step (forward, dq)
##   kv_block     keys per work-group (dk, dv)                q_tile    query rows per step (dk, dv)
##   mask         "none", "bool" (nonzero: takes part) or "float" (added to the scores)
##   rows         query rows per work item in the forward (their k and v reads shared; the
##                forward's group has block_m / rows * lanes items)
##   lanes        work items per query row (forward, dq) or key (dk/dv): each holds DK4 / lanes
##                and DV4 / lanes float4s of the rows (fewer registers per item); their partial
##                dot products are summed across the lanes (lane_sum)
##   shuffle      how lanes sum: "ptx" (NVIDIA warp shuffles; a row's lanes are neighbours
##                in one warp) or "local" (local memory and barriers, any device)
##   unroll       unroll the loops over a step's keys (GPUs: the scores stay in registers;
##                CPUs compile the rolled loops faster)
##   dropout      whether the attention weights are dropped
##   index_t      "int" or "long"
##   delta_group  attention_delta's work-group size: 64, or the device's largest power of two
##                below it
<%namespace name="attention" file="attention_common.cl.mako"/>
<%
    DK4 = (dk + 3) // 4
    DV4 = (dv + 3) // 4
    DK4L = DK4 // lanes
    DV4L = DV4 // lanes
    has_mask = mask != "none"
    mask_t = "uchar" if mask == "bool" else "float"
%>
#define DK ${dk}
#define DV ${dv}
#define DK4 ${DK4}
#define DV4 ${DV4}
#define LANES ${lanes}
// The float4s of a head-dim row that each of a row's LANES items holds.
#define DK4L ${DK4L}
#define DV4L ${DV4L}
#define LOG2E 1.4426950408889634f

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

uint4 block_words(ulong block, uint key0, uint key1, uint stream0, uint stream1)
{
    return philox4x32_10((uint4)((uint)block, (uint)(block >> 32), stream0, stream1),
                         (uint2)(key0, key1));
}

// The word that decides element ``i`` of the flattened (B, L, S) weights (the dropout family's
// rule: kept when (word >> 8) >= threshold).
uint element_word(ulong i, uint seed0, uint seed1, uint stream0, uint stream1)
{
    const uint4 r = block_words(i >> 2, seed0, seed1, stream0, stream1);
    const uint words[4] = {r.x, r.y, r.z, r.w};
    return words[i & 3];
}

## ``out`` = the row of a (registers, float4[n4]) dotted with row b_row of b_local (float4 rows
## of n4 vectors); four partial sums in a float4 for independent multiply-adds.

## ``out`` = this lane's slice of a (registers, float4[n4l]) dotted with the same slice of row
## b_row of b_local (float4 rows of n4 vectors), four partial sums in a float4.
<%def name="dot_slice(out, a, b_local, b_row, n4, n4l)">
            float ${out};
            {
                __local const float4 *brow = ${b_local} + (${b_row}) * ${n4} + lane * ${n4l};
                float4 sum4 = (float4)(0.0f);
                for (int e = 0; e < ${n4l}; ++e) sum4 = mad(${a}[e], brow[e], sum4);
                ${out} = (sum4.x + sum4.y) + (sum4.z + sum4.w);
            }
</%def>

## Loads rows [first, first + count) of a (rows x width) row-major operand at ``base`` into a local
## float4 array of ``count`` rows of width4 vectors (zeros past ``limit`` rows and past ``width``
## columns), cooperatively, consecutive items taking consecutive elements.
<%def name="stage_rows(dst, base, first, count, limit, width, width4, items, lid)">
    {
        __local float *flat = (__local float *)${dst};
        for (int t = ${lid}; t < ${count} * ${width4} * 4; t += ${items}) {
            const int r = t / (${width4} * 4);
            const int e = t - r * (${width4} * 4);
            const ${index_t} row = ${first} + r;
            flat[t] = (row < ${limit} && e < ${width}) ? ${base}[row * ${width} + e] : 0.0f;
        }
    }
</%def>

## The mask's (rows x keys) tile from query row row0 and key n0, as base-2 biases, into
## ``tile[r * pitch + j]``.
<%def name="stage_bias(tile, rows, keys, pitch, row0, n0, items, lid)">
% if has_mask:
    for (int t = ${lid}; t < ${rows} * ${keys}; t += ${items}) {
        const int r = t / ${keys};
        const int j = t - r * ${keys};
        const ${index_t} row = ${row0} + r, key = ${n0} + j;
        float value = 0.0f;
        if (row < L && key < S) {
            const ${mask_t} m = mb[row * mask_stride_l + key * mask_stride_s];
    % if mask == "bool":
            value = m ? 0.0f : -INFINITY;
    % else:
            value = m * LOG2E;
    % endif
        }
        ${tile}[r * ${pitch} + j] = value;
    }
% endif
</%def>

<%def name="unroll_pragma()">
% if unroll:
        #pragma unroll
% endif
</%def>

## Sum the lanes' partial values (names a, b) in place: every lane of a row gets the same sums.
## Every item of the group must reach it (the local variant has barriers).
<%def name="lane_sum(a, b=None)">
% if lanes > 1:
    % if shuffle == "ptx":
        % for width in [w for w in (1, 2, 4, 8) if w < lanes]:
            {
                float other;
                asm volatile("shfl.sync.bfly.b32 %0, %1, ${width}, 0x1f, 0xffffffff;" : "=f"(other) : "f"(${a}));
                ${a} += other;
            % if b:
                asm volatile("shfl.sync.bfly.b32 %0, %1, ${width}, 0x1f, 0xffffffff;" : "=f"(other) : "f"(${b}));
                ${b} += other;
            % endif
            }
        % endfor
    % else:
            barrier(CLK_LOCAL_MEM_FENCE);
            exchange[lid] = ${a};
        % if b:
            exchange[GROUP + lid] = ${b};
        % endif
            barrier(CLK_LOCAL_MEM_FENCE);
            {
                const int first = lid - lane;
                float sa = 0.0f;
        % if b:
                float sb = 0.0f;
        % endif
                // The lanes in the same order on every lane: the same sums.
                for (int t = 0; t < LANES; ++t) {
                    sa += exchange[first + t];
        % if b:
                    sb += exchange[GROUP + first + t];
        % endif
                }
                ${a} = sa;
        % if b:
                ${b} = sb;
        % endif
            }
    % endif
% endif
</%def>
<%def name="exchange_buffer()">
% if lanes > 1 and shuffle == "local":
    __local float exchange[2 * GROUP];
% endif
</%def>

<%def name="common_args()">
    const ${index_t} L, const ${index_t} S, const float scale2,
    __global const ${index_t} *table,
    __global const float *q, const ${index_t} q_off,
    __global const float *k, const ${index_t} k_off,
    __global const float *v, const ${index_t} v_off,
    __global const ${mask_t} *mask, const ${index_t} mask_off,
    const ${index_t} mask_stride_l, const ${index_t} mask_stride_s, const int causal
</%def>
<%def name="dropout_args()">
    const uint seed0, const uint seed1, const uint stream0, const uint stream1,
    const uint threshold, const float keep_scale
</%def>
<%def name="operand_bases()">
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
% if has_mask:
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];
% endif
</%def>

## This lane's slice (float4s [lane * n4l, (lane + 1) * n4l)) of a row of ``width`` floats at
## ``src`` into float4 registers ``dst``, zeros past the width (and everywhere unless ``active``).
<%def name="load_slice(dst, src, width, n4l, active)">
    for (int e = 0; e < ${n4l}; ++e) {
        float4 x = (float4)(0.0f);
        const int at = 4 * (lane * ${n4l} + e);
        if (${active}) {
            __global const float *p = ${src} + at;
            if (at < ${width}) x.x = p[0];
            if (at + 1 < ${width}) x.y = p[1];
            if (at + 2 < ${width}) x.z = p[2];
            if (at + 3 < ${width}) x.w = p[3];
        }
        ${dst}[e] = x;
    }
</%def>
<%def name="store_slice(dst, src, width, n4l, factor)">
    for (int e = 0; e < ${n4l}; ++e) {
        const float4 y = ${src}[e] * ${factor};
        const int at = 4 * (lane * ${n4l} + e);
        if (at < ${width}) ${dst}[at] = y.x;
        if (at + 1 < ${width}) ${dst}[at + 1] = y.y;
        if (at + 2 < ${width}) ${dst}[at + 2] = y.z;
        if (at + 3 < ${width}) ${dst}[at + 3] = y.w;
    }
</%def>

// The forward's items: ROWS query rows each (their key and value reads shared), LANES per row.
#define ROWS ${rows}
#define GROUP (${block_m} / ROWS * LANES)

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void attention_forward(${common_args()},
                       __global float *o, const ${index_t} o_off,
                       __global float *lse,
                       ${dropout_args()})
{
    __local float4 k_tile[${block_n} * DK4];
    __local float4 v_tile[${block_n} * DV4];
% if has_mask:
    // Pitch block_n + 1: the items read their own rows, banks apart.
    __local float bias_tile[${block_m} * (${block_n} + 1)];
% endif
    ${exchange_buffer()}
    const int lid = get_local_id(0);
    const int lane = lid % LANES, slot = lid / LANES;
    const ${index_t} b = get_group_id(1);
    const ${index_t} row0 = (${index_t})get_group_id(0) * ${block_m};
    ${operand_bases()}

    // Rows row0 + slot * ROWS + r: this lane's slice of each q row, scaled so that q . k
    // gives base-2 scores.
    float4 qr[ROWS][DK4L], acc[ROWS][DV4L];
    float m[ROWS], l[ROWS];
    // A NaN score that the running maximum skips (fmax ignores NaN) still reaches the output.
    float nan_seen[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const ${index_t} row = row0 + slot * ROWS + r;
        ${load_slice("qr[r]", "(qb + row * DK)", "DK", "DK4L", "row < L")}
        for (int e = 0; e < DK4L; ++e) qr[r][e] *= scale2;
        for (int e = 0; e < DV4L; ++e) acc[r][e] = (float4)(0.0f);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        nan_seen[r] = 0.0f;
    }
    // Causal: the block's last row sees keys up to itself.
    const ${index_t} n_end = causal ? min(S, row0 + ${block_m}) : S;

    for (${index_t} n0 = 0; n0 < n_end; n0 += ${block_n}) {
        // Every item is done with the previous tiles.
        barrier(CLK_LOCAL_MEM_FENCE);
        ${stage_rows("k_tile", "kb", "n0", block_n, "S", "DK", "DK4", "GROUP", "lid")}
        ${stage_rows("v_tile", "vb", "n0", block_n, "S", "DV", "DV4", "GROUP", "lid")}
        ${stage_bias("bias_tile", block_m, block_n, block_n + 1, "row0", "n0", "GROUP", "lid")}
        barrier(CLK_LOCAL_MEM_FENCE);

        // Every item runs the scores (the lanes sum across items); rows past L score zeros.
        float s[ROWS][${block_n}];
        float tile_max[ROWS];
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) tile_max[r] = -INFINITY;
        ${unroll_pragma()}
        for (int j = 0; j < ${block_n}; ++j) {
            __local const float4 *krow = k_tile + j * DK4 + lane * DK4L;
            float x[ROWS];
            #pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float4 sum4 = (float4)(0.0f);
                for (int e = 0; e < DK4L; ++e) sum4 = mad(qr[r][e], krow[e], sum4);
                x[r] = (sum4.x + sum4.y) + (sum4.z + sum4.w);
            }
            #pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                ${lane_sum("x[r]")}
                const ${index_t} row = row0 + slot * ROWS + r, key = n0 + j;
% if has_mask:
                x[r] += bias_tile[(slot * ROWS + r) * (${block_n} + 1) + j];
% endif
                if (key >= S || (causal && key > row)) x[r] = -INFINITY;
                if (isnan(x[r])) nan_seen[r] = x[r];
                s[r][j] = x[r];
                tile_max[r] = fmax(tile_max[r], x[r]);
            }
        }
        // s becomes the weights in place (registers are what limits the items per SM).
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float m_new = fmax(m[r], tile_max[r]);
            // Nothing takes part yet (m_new = -inf): weights 0, not exp2(-inf + inf).
            const float alpha = m_new == -INFINITY ? 1.0f : exp2(m[r] - m_new);
            m[r] = m_new;
            l[r] *= alpha;
            for (int e = 0; e < DV4L; ++e) acc[r][e] *= alpha;
% if dropout:
            // Bit j: whether key n0 + j is kept (Philox blocks covering the tile's elements).
            ulong keep = 0;
            {
                const ulong first = ((ulong)b * (ulong)L + (ulong)(row0 + slot * ROWS + r))
                                    * (ulong)S + (ulong)n0;
                for (int blk = 0; blk <= ${block_n} / 4; ++blk) {
                    const ulong block = (first >> 2) + (ulong)blk;
                    const uint4 w4 = block_words(block, seed0, seed1, stream0, stream1);
                    const long j0 = (long)(block * 4 - first);
                    const uint words[4] = {w4.x, w4.y, w4.z, w4.w};
                    for (int w = 0; w < 4; ++w) {
                        const long j = j0 + w;
                        if (j >= 0 && j < ${block_n} && (words[w] >> 8) >= threshold)
                            keep |= (ulong)1 << j;
                    }
                }
            }
% endif
            ${unroll_pragma()}
            for (int j = 0; j < ${block_n}; ++j) {
                const float p = m_new == -INFINITY ? 0.0f : exp2(s[r][j] - m_new);
                l[r] += p;
% if dropout:
                s[r][j] = (keep >> j) & 1 ? p : 0.0f;
% else:
                s[r][j] = p;
% endif
            }
        }
        ${unroll_pragma()}
        for (int j = 0; j < ${block_n}; ++j) {
            __local const float4 *vrow = v_tile + j * DV4 + lane * DV4L;
            for (int e = 0; e < DV4L; ++e) {
                const float4 ve = vrow[e];
                #pragma unroll
                for (int r = 0; r < ROWS; ++r) acc[r][e] = mad((float4)(s[r][j]), ve, acc[r][e]);
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const ${index_t} row = row0 + slot * ROWS + r;
        if (row >= L) break;
% if dropout:
        const float norm = l[r] > 0.0f ? keep_scale / l[r] : 0.0f;
% else:
        const float norm = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
% endif
        for (int e = 0; e < DV4L; ++e) acc[r][e] = acc[r][e] * norm + nan_seen[r];
        __global float *orow = o + o_off + ((${index_t})b * L + row) * DV;
        ${store_slice("orow", "acc[r]", "DV", "DV4L", "1.0f")}
        if (lane == 0)
            lse[(${index_t})b * L + row] = l[r] > 0.0f ? m[r] + log2(l[r])
                                           : (l[r] == 0.0f ? INFINITY : l[r]) + nan_seen[r];
    }
}

#undef ROWS
#undef GROUP
#define GROUP (${block_m} * LANES)

${attention.delta_kernel(index_t, dv, delta_group)}

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void attention_backward_q(${common_args()}, const float scale,
                          __global const float *dout, const ${index_t} dout_off,
                          __global const float *lse, __global const float *delta,
                          __global float *dq,
                          ${dropout_args()})
{
    __local float4 k_tile[${block_n} * DK4];
    __local float4 v_tile[${block_n} * DV4];
% if has_mask:
    __local float bias_tile[${block_m} * (${block_n} + 1)];
% endif
    ${exchange_buffer()}
    const int lid = get_local_id(0);
    const int lane = lid % LANES, slot = lid / LANES;
    const ${index_t} b = get_group_id(1);
    const ${index_t} row0 = (${index_t})get_group_id(0) * ${block_m};
    const ${index_t} row = row0 + slot;
    const bool active = row < L;
    ${operand_bases()}

    float4 qr[DK4L], gr[DV4L], acc[DK4L];
    ${load_slice("qr", "(qb + row * DK)", "DK", "DK4L", "active")}
    ${load_slice("gr", "(dout + dout_off + ((" + index_t + ")b * L + row) * DV)", "DV", "DV4L", "active")}
    for (int e = 0; e < DK4L; ++e) {
        qr[e] *= scale2;
        acc[e] = (float4)(0.0f);
    }
    // Inactive rows: lse = +inf gives weights 0.
    const float row_lse = active ? lse[(${index_t})b * L + row] : INFINITY;
    const float row_delta = active ? delta[(${index_t})b * L + row] : 0.0f;
    const ${index_t} n_end = causal ? min(S, row0 + ${block_m}) : S;
% if dropout:
    const ulong element0 = ((ulong)b * (ulong)L + (ulong)row) * (ulong)S;
% endif

    for (${index_t} n0 = 0; n0 < n_end; n0 += ${block_n}) {
        barrier(CLK_LOCAL_MEM_FENCE);
        ${stage_rows("k_tile", "kb", "n0", block_n, "S", "DK", "DK4", "GROUP", "lid")}
        ${stage_rows("v_tile", "vb", "n0", block_n, "S", "DV", "DV4", "GROUP", "lid")}
        ${stage_bias("bias_tile", block_m, block_n, block_n + 1, "row0", "n0", "GROUP", "lid")}
        barrier(CLK_LOCAL_MEM_FENCE);
        // The same count for every item (the lanes sum across items).
        const int keys = (int)min((${index_t})${block_n}, n_end - n0);
        for (int j = 0; j < keys; ++j) {
            ${dot_slice("x", "qr", "k_tile", "j", "DK4", "DK4L")}
            ${dot_slice("dp", "gr", "v_tile", "j", "DV4", "DV4L")}
            ${lane_sum("x", "dp")}
            const ${index_t} key = n0 + j;
% if has_mask:
            x += bias_tile[slot * (${block_n} + 1) + j];
% endif
            const float p = (causal && key > row) ? 0.0f : exp2(x - row_lse);
% if dropout:
            dp = (element_word(element0 + key, seed0, seed1, stream0, stream1) >> 8) >= threshold
                 ? dp * keep_scale : 0.0f;
% endif
            const float ds = p * (dp - row_delta);
            __local const float4 *krow = k_tile + j * DK4 + lane * DK4L;
            for (int e = 0; e < DK4L; ++e) acc[e] = mad((float4)(ds), krow[e], acc[e]);
        }
    }
    if (!active) return;
    __global float *dqrow = dq + ((${index_t})b * L + row) * DK;
    ${store_slice("dqrow", "acc", "DK", "DK4L", "scale")}
}

#undef GROUP
#define GROUP (${kv_block} * LANES)

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void attention_backward_kv(${common_args()}, const float scale,
                           __global const float *dout, const ${index_t} dout_off,
                           __global const float *lse, __global const float *delta,
                           __global float *dk, __global float *dv,
                           ${dropout_args()})
{
    __local float4 q_tile[${q_tile} * DK4];
    __local float4 g_tile[${q_tile} * DV4];
    __local float lse_tile[${q_tile}], delta_tile[${q_tile}];
% if has_mask:
    // Row i, key slot at i * kv_block + slot: the items of a row read consecutive words.
    __local float bias_tile[${q_tile} * ${kv_block}];
% endif
    ${exchange_buffer()}
    const int lid = get_local_id(0);
    const int lane = lid % LANES, slot = lid / LANES;
    const ${index_t} b = get_group_id(1);
    const ${index_t} kv0 = (${index_t})get_group_id(0) * ${kv_block};
    const ${index_t} key = kv0 + slot;
    const bool active = key < S;
    ${operand_bases()}
    __global const float *gb = dout + dout_off + (${index_t})b * L * DV;

    float4 kr[DK4L], vr[DV4L], dkr[DK4L], dvr[DV4L];
    ${load_slice("kr", "(kb + key * DK)", "DK", "DK4L", "active")}
    ${load_slice("vr", "(vb + key * DV)", "DV", "DV4L", "active")}
    for (int e = 0; e < DK4L; ++e) {
        kr[e] *= scale2;
        dkr[e] = (float4)(0.0f);
    }
    for (int e = 0; e < DV4L; ++e) dvr[e] = (float4)(0.0f);
    // Causal: query rows before the block's first key see none of its keys.
    const ${index_t} i_begin = causal ? kv0 : 0;

    for (${index_t} i0 = i_begin; i0 < L; i0 += ${q_tile}) {
        barrier(CLK_LOCAL_MEM_FENCE);
        ${stage_rows("q_tile", "qb", "i0", q_tile, "L", "DK", "DK4", "GROUP", "lid")}
        ${stage_rows("g_tile", "gb", "i0", q_tile, "L", "DV", "DV4", "GROUP", "lid")}
        for (int t = lid; t < ${q_tile}; t += GROUP) {
            const ${index_t} row = i0 + t;
            lse_tile[t] = row < L ? lse[(${index_t})b * L + row] : INFINITY;
            delta_tile[t] = row < L ? delta[(${index_t})b * L + row] : 0.0f;
        }
        ${stage_bias("bias_tile", q_tile, kv_block, kv_block, "i0", "kv0", "GROUP", "lid")}
        barrier(CLK_LOCAL_MEM_FENCE);
        // The same count for every item (the lanes sum across items).
        const int rows = (int)min((${index_t})${q_tile}, L - i0);
        for (int i = 0; i < rows; ++i) {
            const ${index_t} row = i0 + i;
            ${dot_slice("x", "kr", "q_tile", "i", "DK4", "DK4L")}
            ${dot_slice("dp", "vr", "g_tile", "i", "DV4", "DV4L")}
            ${lane_sum("x", "dp")}
% if has_mask:
            x += bias_tile[i * ${kv_block} + slot];
% endif
            const float p = (causal && key > row) ? 0.0f : exp2(x - lse_tile[i]);
% if dropout:
            const bool kept = (element_word(((ulong)b * (ulong)L + (ulong)row) * (ulong)S + key,
                                            seed0, seed1, stream0, stream1) >> 8) >= threshold;
            const float pv = kept ? p * keep_scale : 0.0f;
            dp = kept ? dp * keep_scale : 0.0f;
% else:
            const float pv = p;
% endif
            const float ds = p * (dp - delta_tile[i]);
            __local const float4 *grow = g_tile + i * DV4 + lane * DV4L;
            __local const float4 *qrow = q_tile + i * DK4 + lane * DK4L;
            for (int e = 0; e < DV4L; ++e) dvr[e] = mad((float4)(pv), grow[e], dvr[e]);
            for (int e = 0; e < DK4L; ++e) dkr[e] = mad((float4)(ds), qrow[e], dkr[e]);
        }
    }
    if (!active) return;
    __global float *dkrow = dk + ((${index_t})b * S + key) * DK;
    __global float *dvrow = dv + ((${index_t})b * S + key) * DV;
    ${store_slice("dkrow", "dkr", "DK", "DK4L", "scale")}
    ${store_slice("dvrow", "dvr", "DV", "DV4L", "1.0f")}
}
