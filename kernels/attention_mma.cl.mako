## Fused scaled dot-product attention on NVIDIA tensor cores with fp32 accuracy (the "mma"
## solver of the attention family; kernels/attention.cl.mako states the shared conventions: the
## batch offset table, masks, causal, base-2 scores and lse, dropout).
##
## Every product is a warp's mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 with the 3xTF32
## split (as CUTLASS's OpMultiplyAddFastF32, the math of PyTorch's fp32 memory-efficient
## attention): an operand x is taken as big + small, big = tf32(x), small = tf32(x - big), and
## a * b ~= a_big * b_big + a_big * b_small + a_small * b_big, three mma into fp32 accumulators
## (the small terms first; small * small, ~2^-22 relative, is dropped). The result is fp32-level
## accurate: this is not TF32 math and needs no allow_tf32.
##
## Fragments (PTX's layout for .tf32; g = lane / 4, t = lane % 4): a0 (g, t), a1 (g + 8, t),
## a2 (g, t + 4), a3 (g + 8, t + 4); b0 (k = t, n = g), b1 (k = t + 4, n = g); accumulators c0
## (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1). Within each 8-deep step the K
## index is permuted the same way for A and B (as in gemm_mma.cl.mako; the sum over K does not
## change): fragment column t reads K offset 2t, column t + 4 reads 2t + 1. Then an
## accumulator tile of S (rows by 8 keys) is directly the A fragment of the next product over
## those keys: a0 = c0, a1 = c2, a2 = c1, a3 = c3 (P V in the forward, P^T dO and dS^T Q in
## dK/dV, dS K in dQ), with the B operand's rows (keys or query rows) read permuted the same way.
## Operands are kept as float4 (a0, a1, a2, a3) and float2 (b0, b1) of fp32 values, split into
## TF32 pairs (uint4 / uint2 bit patterns) where they meet an mma.
##
## Kernels (sizes are run-time arguments; index_t is int or long; all control flow that reaches
## an mma is uniform across the work-group):
##   attention_mma_forward(the arguments of attention_forward)
##     global (ceil(L / (16 * M_TILES * WARPS)) * 32 * WARPS, B), local (32 * WARPS, 1): each
##     warp owns M_TILES m16 tiles of query rows (q * scale2 in registers for the whole walk,
##     or read again at each step), the group stages BLOCK_N keys and values per step in local
##     memory; S = Q K^T by mma, the online softmax on the accumulators (a work item holds rows
##     g and g + 8 of each tile; their maxima and sums across the quad of items sharing them by
##     warp shuffles, or local memory), O += P V. Each B fragment of k and v is read and split
##     once for the warp's tiles: with 2, half the local reads and conversions per mma.
##   attention_delta(rows, o, o_off, dout, dout_off, delta)   as attention.cl.mako's.
##   attention_mma_backward_kv(the arguments of attention_backward_kv)
##     global (ceil(S / (16 * KV_TILES * KV_WARPS)) * 32 * KV_WARPS, B): each warp owns 16 *
##     KV_TILES keys (k * scale2 and v as A fragments), the group walks the query rows Q_STEP at a
##     time (q, dO, lse, delta staged): S^T = K Q^T and dP^T = V dO^T by mma, P^T and dS^T on
##     the accumulators, dV += P^T dO and dK += dS^T Q.
##   attention_mma_backward_q(the arguments of attention_backward_q)
##     global (ceil(L / (16 * Q_TILES * Q_WARPS)) * 32 * Q_WARPS, B): each warp owns 16 *
##     Q_TILES query rows (q * scale2 and dO as A fragments), the group walks the keys K_STEP at a time
##     (k, v staged): S, dP = dO V^T, dS, dQ += dS K.
##
## Template parameters:
##   dk, dv        head dims of q/k and of v (any up to 128: padded with zeros to multiples of 8)
##   warps, block_n          forward: warps per group (16 * m_tiles query rows each), keys
##                           per step
##   m_tiles       forward: m16 tiles of query rows per warp (1 or 2); 2 shares every k / v
##                 B fragment and its split between two tiles, at twice the registers for the
##                 accumulators, the scores and q (q_split then doubles q's again)
##   kv_warps, q_step        dK/dV: warps per group (16 * kv_tiles keys each), query rows per
##                           step
##   q_warps, k_step         dQ: warps per group (16 * q_tiles query rows each), keys per step
##   kv_tiles, q_tiles       dK/dV, dQ: m16 tiles of keys (query rows) per warp (1 or 2); 2
##                 shares every staged B fragment (q and dO, k and v) and its split between two
##                 tiles, at twice the registers for the accumulators and scores
##                 (block_n, q_step, k_step: multiples of 8)
##   q_frags       forward: q's A fragments kept in registers for the whole walk; else read
##                 again (through the caches) and split at each step, for two row tiles or
##                 large head dims, where the accumulators and scores take the registers
##   q_split       forward (with q_frags): q's fragments kept split (big and small parts) for
##                 the whole walk; else kept as floats and split at each step (half the
##                 registers, for large head dims)
##   fused_dq      dK/dV (q_step a multiple of 16): dQ computed there too (the kernel takes dq,
##                 zeroed, and dq_on): each step's dS tiles through local memory, dQ += dS K
##                 over the group's keys (staged once), added to dq by atomics (red.global.add
##                 on NVIDIA: the sum's order, so its last bits, vary from run to run); the dQ
##                 kernel, which computes S and dP again, is then not run
##   frags_kv, frags_q  backward (dK/dV, dQ): the A fragments of the group's own rows (k and v
##                 in dK/dV, q and dO in dQ) kept in registers; else read again (through the
##                 caches) at each step, for large head dims or two tiles per warp, where the
##                 accumulators take the registers
##   stages        1: each step's tiles loaded between two barriers; 2: two buffers of them, the
##                 next step's copied (cp.async on NVIDIA; plain copies emulated) while this
##                 step computes, one barrier per step
##   presplit      forward (with stages 1): the step's keys and values split into their TF32
##                 parts once, when staged (two tiles each), instead of by every warp that
##                 reads them (a quarter of the conversions with 4 warps, twice the local reads)
##   small         "rna": the small TF32 parts rounded (cvt.rna, or round's integer form);
##                 "trunc": left unrounded, the tensor core truncating them (one conversion per
##                 value, not two; CUTLASS's FastF32 rounds its small parts so)
##   round         (PTX path) "cvt": TF32 parts rounded by cvt.rna.tf32.f32; "int": the same
##                 rounding in integer operations (as gemm_mma.cl.mako's ROUND; the emulation
##                 always rounds so). "fast" (with small "trunc"; the emulation too): the
##                 integer rounding without its NaN test, two operations per value instead of
##                 four: a NaN whose payload lies in the 13 dropped bits (or sets them all)
##                 loses its NaN-ness in the big part, but the small part, x - big, is then a NaN
##                 and goes to the tensor core as it is, so the product is NaN all the same
##   mask, dropout, index_t  as attention.cl.mako
##   emulate       0: mma.sync, cvt.rna.tf32.f32 and shfl.sync as PTX (NVIDIA, compute
##                 capability 8.0+). 1: the same mma, fragment for fragment, computed by the
##                 warp's items through local memory (gemm_mma.cl.mako's emulation), TF32
##                 rounding in integer arithmetic, quad reductions through local memory: any
##                 OpenCL device runs it, which checks this file's addressing where no tensor
##                 core is.
<%namespace name="access" file="memory_access.cl.mako"/>
<%namespace name="attention" file="attention_common.cl.mako"/>
<%
    DKP = -(-dk // 8) * 8
    DVP = -(-dv // 8) * 8
    KS = DKP // 8
    VS = DVP // 8
    def k_contiguous_ld(width):
        """Row length (words) of a tile read by 8-byte fragment loads along its rows: at least
        width + 8 with ld / 8 odd (a half-warp's 8 rows then meet distinct banks), as
        gemm_mma.cl.mako's."""
        ld = width + 8
        return ld if (ld // 8) % 2 == 1 else width + 16
    # Forward: k read along its rows (8-byte loads), v down its columns (4-byte loads of rows
    # 2t and 2t + 1: a pitch of DVP + 4 puts the 32 on distinct banks).
    F_KLD = k_contiguous_ld(DKP)
    F_VLD = DVP + 4
    # dK/dV: q and dO read both ways; dQ: k both ways, v along its rows.
    B_QLD = DKP + 4
    B_GLD = DVP + 4
    # fused_dq: the group's keys (k staged once, rows of DKP + 4: b_cols reads meet distinct
    # banks) and the step's dS (rows of NK + 4 keys).
    NK = 16 * kv_tiles * kv_warps
    DS_LD = NK + 4
    Q_KLD = DKP + 4
    Q_VLD = k_contiguous_ld(DVP)
    NB = block_n // 8
    MT = m_tiles
    KT = kv_tiles
    QT = q_tiles
    QB = q_step // 8
    KB = k_step // 8
    UNROLL = "" if emulate else "#pragma unroll"
    has_mask = mask != "none"
    mask_t = "uchar" if mask == "bool" else "float"
%>
#define DK ${dk}
#define DV ${dv}
#define LOG2E 1.4426950408889634f

% if stages == 2:
${access.async_copies(not emulate)}
% endif

% if round == "fast":
// TF32 of x as cvt.rna.tf32.f32 rounds a number (to nearest, ties away from zero, on the 13
// dropped mantissa bits), in two integer operations. Only for big parts whose small part
// (x - big, a NaN whenever x is one) reaches the tensor core unrounded (small "trunc").
inline uint to_tf32(float x)
{
    return (as_uint(x) + 0x1000u) & 0xffffe000u;
}
% elif emulate or round == "int":
// TF32 of x as cvt.rna.tf32.f32 rounds it (to nearest, ties away from zero, on the 13 dropped
// mantissa bits), in integer arithmetic, kept as the float bit pattern; a NaN stays a NaN.
inline uint to_tf32(float x)
{
    const uint u = as_uint(x);
    return isnan(x) ? u : (u + 0x1000u) & 0xffffe000u;
}
% endif
% if emulate:

// The three m16n8k8 mma of a 3xTF32 product of a warp (gemm_mma.cl.mako's emulation of one,
// done for the three at once: a third of the barriers, which PoCL builds faster): every item
// puts its fragments (a.x..a.w = a0..a3, b.x, b.y = b0, b1; big, then small parts) into the
// warp's 32 x 12 words of `x`, then reads the rows and columns of its four accumulators and
// adds the products in the PTX path's order: a_small b_big, a_big b_small, a_big b_big, each
// over k. Every item of the group calls it the same number of times (it holds barriers).
inline float4 mma3(float4 c, uint4 a_big, uint4 a_small, uint2 b_big, uint2 b_small,
                   __local uint *x, int lane)
{
    __local uint *mine = x + lane * 12;
    mine[0] = a_big.x;
    mine[1] = a_big.y;
    mine[2] = a_big.z;
    mine[3] = a_big.w;
    mine[4] = b_big.x;
    mine[5] = b_big.y;
    mine[6] = a_small.x;
    mine[7] = a_small.y;
    mine[8] = a_small.z;
    mine[9] = a_small.w;
    mine[10] = b_small.x;
    mine[11] = b_small.y;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int g = lane / 4, t = lane % 4;
    // (A part, B part) of each product: small = 6 words on.
    for (int term = 0; term < 3; ++term) {
        const int a_part = term == 0 ? 6 : 0, b_part = term == 1 ? 6 : 0;
        for (int k = 0; k < 8; ++k) {
            const int hi = k / 4;
            // The tensor core reads each operand's top 19 bits (TF32), truncating it.
            const float a_g = as_float(x[(g * 4 + k % 4) * 12 + a_part + 2 * hi] & 0xffffe000u);
            const float a_g8 = as_float(x[(g * 4 + k % 4) * 12 + a_part + 1 + 2 * hi] & 0xffffe000u);
            const float b_0 = as_float(x[((2 * t) * 4 + k % 4) * 12 + b_part + 4 + hi] & 0xffffe000u);
            const float b_1 = as_float(x[((2 * t + 1) * 4 + k % 4) * 12 + b_part + 4 + hi] & 0xffffe000u);
            c.x = fma(a_g, b_0, c.x);
            c.y = fma(a_g, b_1, c.y);
            c.z = fma(a_g8, b_0, c.z);
            c.w = fma(a_g8, b_1, c.w);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return c;
}
#define MMA_AT , mma_scratch + warp * 384, lane
% else:
%   if round == "cvt":
inline uint to_tf32(float x)
{
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
%   endif

// D = A (16 x 8, row) * B (8 x 8, col) + C on the warp's tensor cores (gemm_mma.cl.mako's
// statement).
inline float4 mma_tf32(float4 c, uint4 a, uint2 b)
{
    const uint a0 = a.x, a1 = a.y, a2 = a.z, a3 = a.w, b0 = b.x, b1 = b.y;
    const float c0 = c.x, c1 = c.y, c2 = c.z, c3 = c.w;
    float d0, d1, d2, d3;
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1),
          "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    return (float4)(d0, d1, d2, d3);
}
#define MMA_AT

// c + a * b in 3xTF32: the two small cross terms first, then the big product. (Summing the
// small terms apart and adding them after the big mma, to shorten an accumulator's chain of
// dependent mma, ran 5-15% slower on an H200: the kernels do not wait on mma latency.)
inline float4 mma3(float4 c, uint4 a_big, uint4 a_small, uint2 b_big, uint2 b_small)
{
    c = mma_tf32(c, a_small, b_big);
    c = mma_tf32(c, a_big, b_small);
    return mma_tf32(c, a_big, b_big);
}
% endif

// The big (TF32) part of each value, and the small part: what big leaves (x - big is exact in
// fp32), rounded to TF32 (small "rna"), or left as it is (small "trunc": the tensor core reads
// a TF32 operand's top 19 bits, truncating it, as CUTLASS's FastF32 takes its small parts:
// one conversion per value instead of two, at an error of 2^-10 of the small part).
inline uint4 tf32_big4(float4 x)
{
    return (uint4)(to_tf32(x.x), to_tf32(x.y), to_tf32(x.z), to_tf32(x.w));
}
inline uint4 tf32_small4(float4 x, uint4 big)
{
% if small == "trunc":
    return as_uint4(x - as_float4(big));
% else:
    return tf32_big4(x - as_float4(big));
% endif
}
inline uint2 tf32_big2(float2 x)
{
    return (uint2)(to_tf32(x.x), to_tf32(x.y));
}
inline uint2 tf32_small2(float2 x, uint2 big)
{
% if small == "trunc":
    return as_uint2(x - as_float2(big));
% else:
    return tf32_big2(x - as_float2(big));
% endif
}

// ``c`` += A * B for A fragment values ``a`` (float4 a0..a3) split here, B values ``b`` (float2).
#define MMA3_SPLIT_B(c, a_big, a_small, b) { \
    const float2 mma_b = (b); \
    const uint2 mma_bb = tf32_big2(mma_b); \
    c = mma3(c, a_big, a_small, mma_bb, tf32_small2(mma_b, mma_bb) MMA_AT); }

// The A fragment over 8 keys (or query rows) of an accumulator tile over them: the K
// permutation makes c0 -> a0, c2 -> a1, c1 -> a2, c3 -> a3.
#define AS_A(c) ((float4)((c).x, (c).z, (c).y, (c).w))

% if not emulate:
// The maximum or sum of x over the quad of items sharing rows g and g + 8 (lanes 4g..4g+3);
// every item gets the same bits.
inline float quad_max(float x)
{
    float other;
    asm volatile("shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;" : "=f"(other) : "f"(x));
    x = fmax(x, other);
    asm volatile("shfl.sync.bfly.b32 %0, %1, 2, 0x1f, 0xffffffff;" : "=f"(other) : "f"(x));
    return fmax(x, other);
}
inline float quad_sum(float x)
{
    float other;
    asm volatile("shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;" : "=f"(other) : "f"(x));
    x += other;
    asm volatile("shfl.sync.bfly.b32 %0, %1, 2, 0x1f, 0xffffffff;" : "=f"(other) : "f"(x));
    return x + other;
}
% endif

% if fused_dq:
// *p += v, atomically: red.global.add.f32 on NVIDIA, a compare-and-swap loop elsewhere.
${access.atomic_add_float(not emulate)}
% endif

## In place: ``v0`` and ``v1`` (an item's values of rows g and g + 8) reduced ("max" or "sum")
## over the item's quad; every item of the group must reach it.
<%def name="quad_reduce(v0, v1, op)">
% if not emulate:
    ${v0} = quad_${op}(${v0});
    ${v1} = quad_${op}(${v1});
% else:
    barrier(CLK_LOCAL_MEM_FENCE);
    exchange[2 * lid] = ${v0};
    exchange[2 * lid + 1] = ${v1};
    barrier(CLK_LOCAL_MEM_FENCE);
    {
        __local const float *quad = exchange + 2 * (lid & ~3);
        float r0 = quad[0], r1 = quad[1];
        for (int u = 1; u < 4; ++u) {
            r0 = ${"fmax(r0, quad[2 * u])" if op == "max" else "r0 + quad[2 * u]"};
            r1 = ${"fmax(r1, quad[2 * u + 1])" if op == "max" else "r1 + quad[2 * u + 1]"};
        }
        ${v0} = r0;
        ${v1} = r1;
    }
% endif
</%def>

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
    const uint words[4] = {r.x, r.y, r.z, r.w};
    return (words[i & 3] >> 8) >= threshold;
}
% endif

// The base-2 score x of query row ``row`` and key ``key`` with the mask and causal applied,
// -inf where the key takes no part (or lies outside).
inline float masked_score(float x, ${index_t} row, ${index_t} key, ${index_t} L, ${index_t} S,
                          int causal, __global const ${mask_t} *mb, ${index_t} mask_stride_l,
                          ${index_t} mask_stride_s)
{
    if (key >= S || row >= L || (causal && key > row))
        return -INFINITY;
% if mask == "bool":
    if (!mb[row * mask_stride_l + key * mask_stride_s])
        return -INFINITY;
% elif mask == "float":
    x += mb[row * mask_stride_l + key * mask_stride_s] * LOG2E;
% endif
    return x;
}

## Rows [first, first + count) of a (rows x width) row-major operand at ``base`` into local
## rows of ``pitch`` floats (a multiple of 4), zeros past ``limit`` rows and ``width`` columns;
## consecutive items take consecutive float4s of a row (coalesced). ``split``: into
## ``dst``_big_tile and ``dst``_small_tile, the values' TF32 parts.
<%def name="stage(dst, base, first, count, limit, width, pitch, nthreads, split=False)">
    for (int e = lid; e < ${count * (pitch // 4)}; e += ${nthreads}) {
        const int r = e / ${pitch // 4};
        const int c = (e - r * ${pitch // 4}) * 4;
        const ${index_t} row = ${first} + r;
        float4 x = (float4)(0.0f);
        if (row < ${limit} && c < ${width}) {
            __global const float *p = ${base} + row * ${width} + c;
            if (c + 3 < ${width}) {
                x = vload4(0, p);
            } else {
                x.x = p[0];
                if (c + 1 < ${width}) x.y = p[1];
                if (c + 2 < ${width}) x.z = p[2];
            }
        }
% if split:
        {
            const uint4 big = tf32_big4(x);
            *(__local uint4 *)(${dst}_big_tile + r * ${pitch} + c) = big;
            *(__local uint4 *)(${dst}_small_tile + r * ${pitch} + c) = tf32_small4(x, big);
        }
% else:
        *(__local float4 *)(${dst} + r * ${pitch} + c) = x;
% endif
    }
</%def>

## With stages == 2: rows [first, first + count) of a (rows x width) operand at ``base`` into
## ``dst`` (rows of ``pitch`` floats) by async copies (cp.async on NVIDIA), zeros past ``limit``
## rows and ``width`` columns (up to the width rounded to 8); 16-byte copies where ``vec``
## (the operand's rows start on 16-byte boundaries).
<%def name="copy_tile(dst, base, first, count, limit, width, pitch, nthreads, vec)">
<% wp4 = -(-width // 8) * 2 %>
        for (int e = lid; e < ${count * wp4}; e += ${nthreads}) {
            const int r = e / ${wp4};
            const int c = (e - r * ${wp4}) * 4;
            const ${index_t} row = ${first} + r;
            __local float *d = ${dst} + r * ${pitch} + c;
            __global const float *src = ${base} + row * ${width} + c;
            if (${vec} && row < ${limit} && c + 3 < ${width}) {
                copy16(d, src);
            } else {
                for (int u = 0; u < 4; ++u) {
                    const bool ok = row < ${limit} && c + u < ${width};
                    copy4_masked(d + u, ok ? src + u : ${base}, ok);
                }
            }
        }
</%def>

## The kv kernel's lse and delta of the step's query rows from ``first`` into buffer ``buf``.
<%def name="row_stats(buf, first, nthreads)">
        for (int e = lid; e < ${q_step}; e += ${nthreads}) {
            const ${index_t} row = ${first} + e;
            lse_tile[(${buf}) * ${q_step} + e] = row < L ? lse[(${index_t})b * L + row] : INFINITY;
            delta_tile[(${buf}) * ${q_step} + e] = row < L ? delta[(${index_t})b * L + row] : 0.0f;
        }
</%def>

## A walk over steps of ``step`` rows (keys or query rows) from ``start`` to ``end``: the tiles
## (name, base, limit, width, pitch, count: ``name``_tile of ``stages`` buffers, read through
## ``name``_at) staged at each step. stages 1: loads between two barriers. stages 2: the next
## step's async copies (cp.async on NVIDIA) in flight while this step computes.
<%def name="walk_prologue(tiles, start, end, nthreads, stats=False)">
% if stages == 2:
%   for (name, base, limit, width, pitch, count) in tiles:
    const bool ${name}_vec = ${int(width % 4 == 0)} && ((ulong)${base} & 15) == 0;
%   endfor
    if (${start} < ${end}) {
%   for (name, base, limit, width, pitch, count) in tiles:
        ${copy_tile(name + "_tile", base, start, count, limit, width, pitch, nthreads, name + "_vec")}
%   endfor
%   if stats:
        ${row_stats("0", start, nthreads)}
%   endif
    }
    COPY_COMMIT();
    int buf = 0;
% endif
</%def>
<%def name="walk_step(tiles, first, step, end, nthreads, stats=False)">
% if stages == 2:
        COPY_WAIT(0);
        // Publishes this step's tiles, and tells that every warp is done with the previous
        // step's buffer, which the copies issued next refill.
        barrier(CLK_LOCAL_MEM_FENCE);
        if (${first} + ${step} < ${end}) {
%   for (name, base, limit, width, pitch, count) in tiles:
            ${copy_tile("%s_tile + (buf ^ 1) * %d" % (name, count * pitch), base, "%s + %d" % (first, step), count, limit, width, pitch, nthreads, name + "_vec")}
%   endfor
%   if stats:
            ${row_stats("buf ^ 1", "%s + %d" % (first, step), nthreads)}
%   endif
        }
        COPY_COMMIT();
%   for (name, base, limit, width, pitch, count) in tiles:
        __local const float *${name}_at = ${name}_tile + buf * ${count * pitch};
%   endfor
%   if stats:
        __local const float *lse_at = lse_tile + buf * ${q_step};
        __local const float *delta_at = delta_tile + buf * ${q_step};
%   endif
        buf ^= 1;
% else:
        // Every warp is done with the previous step's tiles.
        barrier(CLK_LOCAL_MEM_FENCE);
%   for (name, base, limit, width, pitch, count) in tiles:
        ${stage(name + "_tile", base, first, count, limit, width, pitch, nthreads)}
%   endfor
%   if stats:
        ${row_stats("0", first, nthreads)}
%   endif
        barrier(CLK_LOCAL_MEM_FENCE);
%   for (name, base, limit, width, pitch, count) in tiles:
        __local const float *${name}_at = ${name}_tile;
%   endfor
%   if stats:
        __local const float *lse_at = lse_tile;
        __local const float *delta_at = delta_tile;
%   endif
% endif
</%def>

## An A fragment (float4 a0..a3, permuted K) of rows lo = ``row`` and hi = ``row`` + 8, K
## offsets ``col`` (= 8 kk + 2t) and ``col`` + 1, of a (limit x width) row-major operand in
## global memory, zeros outside.
<%def name="global_a(base, row, col, limit, width)">(float4)(
        ${row} < ${limit} && ${col} < ${width} ? ${base}[(${row}) * ${width} + ${col}] : 0.0f,
        ${row} + 8 < ${limit} && ${col} < ${width} ? ${base}[(${row} + 8) * ${width} + ${col}] : 0.0f,
        ${row} < ${limit} && ${col} + 1 < ${width} ? ${base}[(${row}) * ${width} + ${col} + 1] : 0.0f,
        ${row} + 8 < ${limit} && ${col} + 1 < ${width} ? ${base}[(${row} + 8) * ${width} + ${col} + 1] : 0.0f)</%def>

## B fragment values (b0, b1) of a local tile: "rows" where the tile's rows are the mma's n (the
## K offsets 2t and 2t + 1 adjacent in row n0 + g: one 8-byte load), "cols" where its rows are
## K (rows k0 + 2t and k0 + 2t + 1, column n0 + g).
<%def name="b_rows(tile, pitch, n0, k0)">*(__local const float2 *)(${tile} + (${n0} + g) * ${pitch} + ${k0} + 2 * t)</%def>
<%def name="b_cols(tile, pitch, k0, n0)">(float2)(${tile}[(${k0} + 2 * t) * ${pitch} + ${n0} + g], ${tile}[(${k0} + 2 * t + 1) * ${pitch} + ${n0} + g])</%def>

## Store an accumulator row pair: values (c.x, c.y) of row lo at columns col, col + 1 and (c.z,
## c.w) of row hi there, times ``factor`` (plus ``extra_lo`` / ``extra_hi``), inside (limit x width).
<%def name="store_pair(dst, c, row_lo, col, limit, width, factor, extra_lo='0.0f', extra_hi='0.0f')">
        if (${row_lo} < ${limit}) {
            __global float *out_row = ${dst} + (${row_lo}) * ${width};
            if (${col} < ${width}) out_row[${col}] = ${c}.x * ${factor} + ${extra_lo};
            if (${col} + 1 < ${width}) out_row[${col} + 1] = ${c}.y * ${factor} + ${extra_lo};
        }
        if (${row_lo} + 8 < ${limit}) {
            __global float *out_row = ${dst} + (${row_lo} + 8) * ${width};
            if (${col} < ${width}) out_row[${col}] = ${c}.z * ${factor} + ${extra_hi};
            if (${col} + 1 < ${width}) out_row[${col} + 1] = ${c}.w * ${factor} + ${extra_hi};
        }
</%def>

## The emulated mma's scratch: 12 words per item.
<%def name="scratch(nthreads)">
% if emulate:
    __local uint mma_scratch[${nthreads * 12}];
% endif
</%def>

<%def name="item_ids()">
    const int lid = get_local_id(0);
    const int lane = lid % 32;
    const int warp = lid / 32;
    const int g = lane / 4, t = lane % 4;
</%def>

## The B fragment (b0, b1) of key tile ``j`` and K step ``kk`` of the forward's S = Q K^T
## (``kind`` "k") or of its value rows ``j`` and columns ``i`` (``kind`` "v", for O += P V), as
## its TF32 parts ``name``_big and ``name``_small: read from the split tiles (presplit) or read
## and split here, once for the warp's m_tiles row tiles.
<%def name="fwd_b(name, kind, j, kk)">
% if presplit and kind == "k":
                const int ${name}_at = (8 * ${j} + g) * ${F_KLD} + 8 * ${kk} + 2 * t;
                const uint2 ${name}_big = *(__local const uint2 *)(k_big_tile + ${name}_at);
                const uint2 ${name}_small = *(__local const uint2 *)(k_small_tile + ${name}_at);
% elif presplit:
                const int ${name}_at = (8 * ${j} + 2 * t) * ${F_VLD} + 8 * ${kk} + g;
                const uint2 ${name}_big = (uint2)(v_big_tile[${name}_at],
                                                  v_big_tile[${name}_at + ${F_VLD}]);
                const uint2 ${name}_small = (uint2)(v_small_tile[${name}_at],
                                                    v_small_tile[${name}_at + ${F_VLD}]);
% else:
                const float2 ${name}_x = ${b_rows("k_at", F_KLD, "8 * " + j, "8 * " + kk) if kind == "k" else b_cols("v_at", F_VLD, "8 * " + j, "8 * " + kk)};
                const uint2 ${name}_big = tf32_big2(${name}_x);
                const uint2 ${name}_small = tf32_small2(${name}_x, ${name}_big);
% endif
</%def>

__kernel __attribute__((reqd_work_group_size(${32 * warps}, 1, 1)))
void attention_mma_forward(const ${index_t} L, const ${index_t} S, const float scale2,
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
% if presplit:
    // The step's keys and values split once, as the TF32 bit patterns of their parts.
    __local uint k_big_tile[${block_n * F_KLD}] __attribute__((aligned(16)));
    __local uint k_small_tile[${block_n * F_KLD}] __attribute__((aligned(16)));
    __local uint v_big_tile[${block_n * F_VLD}] __attribute__((aligned(16)));
    __local uint v_small_tile[${block_n * F_VLD}] __attribute__((aligned(16)));
% else:
    __local float k_tile[${stages * block_n * F_KLD}] __attribute__((aligned(16)));
    __local float v_tile[${stages * block_n * F_VLD}] __attribute__((aligned(16)));
% endif
    ${scratch(32 * warps)}
% if emulate:
    __local float exchange[${2 * 32 * warps}];
% endif
    ${item_ids()}
    const ${index_t} b = get_group_id(1);
    const ${index_t} row0 = (${index_t})get_group_id(0) * ${16 * MT * warps};
    // The item's rows: lo (g) and hi (g + 8) of each of its warp's MT tiles of 16 (tile mt's
    // at r_lo + 16 mt).
    const ${index_t} r_lo = row0 + warp * ${16 * MT} + g;
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];

% if q_frags and q_split:
    // q (scaled to base-2 scores) as A fragments, split once for the whole walk.
    uint4 q_big[${MT}][${KS}], q_small[${MT}][${KS}];
% elif q_frags:
    // q (scaled to base-2 scores) as A fragments, split where used (half the registers).
    float4 q_frag[${MT}][${KS}];
% endif
% if q_frags:
    ${UNROLL}
    for (int mt = 0; mt < ${MT}; ++mt) {
        const ${index_t} r_mt = r_lo + 16 * mt;
        ${UNROLL}
        for (int kk = 0; kk < ${KS}; ++kk) {
            const int col = 8 * kk + 2 * t;
            const float4 a = ${global_a("qb", "r_mt", "col", "L", "DK")} * scale2;
% if q_split:
            q_big[mt][kk] = tf32_big4(a);
            q_small[mt][kk] = tf32_small4(a, q_big[mt][kk]);
% else:
            q_frag[mt][kk] = a;
% endif
        }
    }
% endif
    float4 acc[${MT}][${VS}];
    // The online softmax of each tile's rows lo and hi: running maxima and sums; a NaN score
    // that the running maximum skips (fmax ignores NaN) still reaches the output.
    float m_lo[${MT}], m_hi[${MT}], l_lo[${MT}], l_hi[${MT}], nan_lo[${MT}], nan_hi[${MT}];
    ${UNROLL}
    for (int mt = 0; mt < ${MT}; ++mt) {
        ${UNROLL}
        for (int i = 0; i < ${VS}; ++i) acc[mt][i] = (float4)(0.0f);
        m_lo[mt] = m_hi[mt] = -INFINITY;
        l_lo[mt] = l_hi[mt] = nan_lo[mt] = nan_hi[mt] = 0.0f;
    }
    // Causal: the group's last row sees keys up to itself.
    const ${index_t} n_end = causal ? min(S, row0 + ${16 * MT * warps}) : S;

<% fwd_tiles = [("k", "kb", "S", dk, F_KLD, block_n), ("v", "vb", "S", dv, F_VLD, block_n)] %>
% if not presplit:
    ${walk_prologue(fwd_tiles, "0", "n_end", 32 * warps)}
% endif
    for (${index_t} n0 = 0; n0 < n_end; n0 += ${block_n}) {
% if presplit:
        // Every warp is done with the previous step's tiles.
        barrier(CLK_LOCAL_MEM_FENCE);
        ${stage("k", "kb", "n0", block_n, "S", dk, F_KLD, 32 * warps, split=True)}
        ${stage("v", "vb", "n0", block_n, "S", dv, F_VLD, 32 * warps, split=True)}
        barrier(CLK_LOCAL_MEM_FENCE);
% else:
        ${walk_step(fwd_tiles, "n0", block_n, "n_end", 32 * warps)}
% endif

        // S = (q * scale2) K^T: MT tiles of 16 rows by block_n keys, 8 keys per accumulator
        // tile; each B fragment of k read and split once for the MT tiles.
        float4 s[${MT}][${NB}];
        ${UNROLL}
        for (int mt = 0; mt < ${MT}; ++mt) {
            ${UNROLL}
            for (int j = 0; j < ${NB}; ++j) s[mt][j] = (float4)(0.0f);
        }
        ${UNROLL}
        for (int kk = 0; kk < ${KS}; ++kk) {
            uint4 qa_big[${MT}], qa_small[${MT}];
            ${UNROLL}
            for (int mt = 0; mt < ${MT}; ++mt) {
% if not q_frags:
                // q's fragments read again (through the caches) at each step: the registers
                // go to the accumulators.
                const int col = 8 * kk + 2 * t;
                const float4 qa = ${global_a("qb", "r_lo + 16 * mt", "col", "L", "DK")} * scale2;
                qa_big[mt] = tf32_big4(qa);
                qa_small[mt] = tf32_small4(qa, qa_big[mt]);
% elif q_split:
                qa_big[mt] = q_big[mt][kk];
                qa_small[mt] = q_small[mt][kk];
% else:
                qa_big[mt] = tf32_big4(q_frag[mt][kk]);
                qa_small[mt] = tf32_small4(q_frag[mt][kk], qa_big[mt]);
% endif
            }
            ${UNROLL}
            for (int j = 0; j < ${NB}; ++j) {
                ${fwd_b("kf", "k", "j", "kk")}
                ${UNROLL}
                for (int mt = 0; mt < ${MT}; ++mt)
                    s[mt][j] = mma3(s[mt][j], qa_big[mt], qa_small[mt], kf_big, kf_small MMA_AT);
            }
        }

        ${UNROLL}
        for (int mt = 0; mt < ${MT}; ++mt) {
            const ${index_t} r_mt = r_lo + 16 * mt;
            float max_lo = -INFINITY, max_hi = -INFINITY;
            ${UNROLL}
            for (int j = 0; j < ${NB}; ++j) {
                const ${index_t} key = n0 + 8 * j + 2 * t;
                float4 x = s[mt][j];
                x.x = masked_score(x.x, r_mt, key, L, S, causal, mb, mask_stride_l, mask_stride_s);
                x.y = masked_score(x.y, r_mt, key + 1, L, S, causal, mb, mask_stride_l, mask_stride_s);
                x.z = masked_score(x.z, r_mt + 8, key, L, S, causal, mb, mask_stride_l, mask_stride_s);
                x.w = masked_score(x.w, r_mt + 8, key + 1, L, S, causal, mb, mask_stride_l, mask_stride_s);
                if (isnan(x.x)) nan_lo[mt] = x.x;
                if (isnan(x.y)) nan_lo[mt] = x.y;
                if (isnan(x.z)) nan_hi[mt] = x.z;
                if (isnan(x.w)) nan_hi[mt] = x.w;
                max_lo = fmax(max_lo, fmax(x.x, x.y));
                max_hi = fmax(max_hi, fmax(x.z, x.w));
                s[mt][j] = x;
            }
            ${quad_reduce("max_lo", "max_hi", "max")}
            const float new_lo = fmax(m_lo[mt], max_lo), new_hi = fmax(m_hi[mt], max_hi);
            // Nothing of the row takes part yet: subtract 0, so that the weights (and alpha,
            // for m = -inf) come out 0 rather than exp2(-inf + inf) = NaN.
            const float use_lo = new_lo == -INFINITY ? 0.0f : new_lo;
            const float use_hi = new_hi == -INFINITY ? 0.0f : new_hi;
            const float alpha_lo = exp2(m_lo[mt] - use_lo), alpha_hi = exp2(m_hi[mt] - use_hi);
            m_lo[mt] = new_lo;
            m_hi[mt] = new_hi;
            l_lo[mt] *= alpha_lo;
            l_hi[mt] *= alpha_hi;
            ${UNROLL}
            for (int i = 0; i < ${VS}; ++i)
                acc[mt][i] *= (float4)(alpha_lo, alpha_lo, alpha_hi, alpha_hi);
            ${UNROLL}
            for (int j = 0; j < ${NB}; ++j) {
                float4 p = exp2(s[mt][j] - (float4)(use_lo, use_lo, use_hi, use_hi));
                l_lo[mt] += p.x + p.y;
                l_hi[mt] += p.z + p.w;
% if dropout:
                const ${index_t} key = n0 + 8 * j + 2 * t;
                const ulong e_lo = ((ulong)b * (ulong)L + (ulong)r_mt) * (ulong)S + (ulong)key;
                const ulong e_hi = e_lo + 8 * (ulong)S;
                if (!(key < S && r_mt < L && kept_element(e_lo, seed0, seed1, stream0, stream1, threshold))) p.x = 0.0f;
                if (!(key + 1 < S && r_mt < L && kept_element(e_lo + 1, seed0, seed1, stream0, stream1, threshold))) p.y = 0.0f;
                if (!(key < S && r_mt + 8 < L && kept_element(e_hi, seed0, seed1, stream0, stream1, threshold))) p.z = 0.0f;
                if (!(key + 1 < S && r_mt + 8 < L && kept_element(e_hi + 1, seed0, seed1, stream0, stream1, threshold))) p.w = 0.0f;
% endif
                s[mt][j] = p;
            }
        }

        // O += P V: each accumulator tile of P (8 keys) is an A fragment; V's rows (keys) read
        // permuted as its columns are, each B fragment read and split once for the MT tiles.
        ${UNROLL}
        for (int j = 0; j < ${NB}; ++j) {
            uint4 p_big[${MT}], p_small[${MT}];
            ${UNROLL}
            for (int mt = 0; mt < ${MT}; ++mt) {
                const float4 pa = AS_A(s[mt][j]);
                p_big[mt] = tf32_big4(pa);
                p_small[mt] = tf32_small4(pa, p_big[mt]);
            }
            ${UNROLL}
            for (int i = 0; i < ${VS}; ++i) {
                ${fwd_b("vf", "v", "j", "i")}
                ${UNROLL}
                for (int mt = 0; mt < ${MT}; ++mt)
                    acc[mt][i] = mma3(acc[mt][i], p_big[mt], p_small[mt], vf_big, vf_small MMA_AT);
            }
        }
    }

    __global float *ob = o + o_off + (${index_t})b * L * DV;
    ${UNROLL}
    for (int mt = 0; mt < ${MT}; ++mt) {
        const ${index_t} r_mt = r_lo + 16 * mt;
        float sum_lo = l_lo[mt], sum_hi = l_hi[mt], bad_lo = nan_lo[mt], bad_hi = nan_hi[mt];
        ${quad_reduce("sum_lo", "sum_hi", "sum")}
        ${quad_reduce("bad_lo", "bad_hi", "sum")}
% if dropout:
        const float norm_lo = sum_lo > 0.0f ? keep_scale / sum_lo : 0.0f;
        const float norm_hi = sum_hi > 0.0f ? keep_scale / sum_hi : 0.0f;
% else:
        const float norm_lo = sum_lo > 0.0f ? 1.0f / sum_lo : 0.0f;
        const float norm_hi = sum_hi > 0.0f ? 1.0f / sum_hi : 0.0f;
% endif
        ${UNROLL}
        for (int i = 0; i < ${VS}; ++i) {
            const int col = 8 * i + 2 * t;
            const float4 y = acc[mt][i] * (float4)(norm_lo, norm_lo, norm_hi, norm_hi);
            ${store_pair("ob", "y", "r_mt", "col", "L", "DV", "1.0f", "bad_lo", "bad_hi")}
        }
        if (t == 0) {
            if (r_mt < L)
                lse[(${index_t})b * L + r_mt] = sum_lo > 0.0f ? m_lo[mt] + log2(sum_lo)
                    : (sum_lo == 0.0f ? INFINITY : sum_lo) + bad_lo;
            if (r_mt + 8 < L)
                lse[(${index_t})b * L + r_mt + 8] = sum_hi > 0.0f ? m_hi[mt] + log2(sum_hi)
                    : (sum_hi == 0.0f ? INFINITY : sum_hi) + bad_hi;
        }
    }
}

${attention.delta_kernel(index_t, dv)}

## The weight of score ``x`` (query row ``row``, key ``key``; the row's lse and delta) and with
## dP value ``dp``: ``x`` becomes pv (the weight as dropped and scaled, for dV) and ``dp`` becomes
## dS = p (dP' - delta) (dP' dropped and scaled).
<%def name="weight_and_ds(x, dp, row, key, row_lse, row_delta)">
            {
                float p = 0.0f;
                if (${key} < S && ${row} < L && !(causal && ${key} > ${row})) {
                    const float xs = masked_score(${x}, ${row}, ${key}, L, S, causal, mb,
                                                  mask_stride_l, mask_stride_s);
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
                ${x} = pv;
                ${dp} = p * (dpv - ${row_delta});
            }
</%def>

__kernel __attribute__((reqd_work_group_size(${32 * kv_warps}, 1, 1)))
void attention_mma_backward_kv(const ${index_t} L, const ${index_t} S, const float scale2,
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
% if fused_dq:
                               __global float *dq, const int dq_on,
% endif
                               const uint seed0, const uint seed1, const uint stream0,
                               const uint stream1, const uint threshold, const float keep_scale)
{
    // The step's query rows and output gradient rows: read along rows (B of S^T, dP^T) and down
    // columns (B of dK, dV).
    __local float q_tile[${stages * q_step * B_QLD}] __attribute__((aligned(16)));
    __local float g_tile[${stages * q_step * B_GLD}] __attribute__((aligned(16)));
    __local float lse_tile[${stages * q_step}], delta_tile[${stages * q_step}];
% if fused_dq:
    __local float k_grp[${NK * B_QLD}] __attribute__((aligned(16)));
    __local float ds_tile[${q_step * DS_LD}] __attribute__((aligned(16)));
% endif
    ${scratch(32 * kv_warps)}
    ${item_ids()}
    const ${index_t} b = get_group_id(1);
    const ${index_t} kv0 = (${index_t})get_group_id(0) * ${16 * KT * kv_warps};
    // The item's keys: lo (g) and hi (g + 8) of each of its warp's KT tiles of 16 (tile mt's at
    // k_lo + 16 mt).
    const ${index_t} k_lo = kv0 + warp * ${16 * KT} + g;
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];
    __global const float *gb = dout + dout_off + (${index_t})b * L * DV;

    float4 dk_acc[${KT}][${KS}], dv_acc[${KT}][${VS}];
    ${UNROLL}
    for (int mt = 0; mt < ${KT}; ++mt) {
        ${UNROLL}
        for (int kk = 0; kk < ${KS}; ++kk) dk_acc[mt][kk] = (float4)(0.0f);
        ${UNROLL}
        for (int kk = 0; kk < ${VS}; ++kk) dv_acc[mt][kk] = (float4)(0.0f);
    }
% if frags_kv:
    // k (scaled to base-2 scores) and v of the warp's keys as A fragments, in registers.
    float4 k_frag[${KT}][${KS}], v_frag[${KT}][${VS}];
    ${UNROLL}
    for (int mt = 0; mt < ${KT}; ++mt) {
        ${UNROLL}
        for (int kk = 0; kk < ${KS}; ++kk) {
            const int col = 8 * kk + 2 * t;
            k_frag[mt][kk] = ${global_a("kb", "k_lo + 16 * mt", "col", "S", "DK")} * scale2;
        }
        ${UNROLL}
        for (int kk = 0; kk < ${VS}; ++kk) {
            const int col = 8 * kk + 2 * t;
            v_frag[mt][kk] = ${global_a("vb", "k_lo + 16 * mt", "col", "S", "DV")};
        }
    }
% endif
    // Causal: query rows before the group's first key see none of its keys.
    const ${index_t} i_begin = causal ? kv0 : 0;
% if fused_dq:
    // The group's keys (unscaled: dQ's scale is applied as it is added), for every step's
    // dQ += dS K; the walk's first barrier publishes them.
    ${stage("k_grp", "kb", "kv0", NK, "S", dk, B_QLD, 32 * kv_warps)}
% endif

<% kv_staged = [("q", "qb", "L", dk, B_QLD, q_step), ("g", "gb", "L", dv, B_GLD, q_step)] %>
    ${walk_prologue(kv_staged, "i_begin", "L", 32 * kv_warps, stats=True)}
    for (${index_t} i0 = i_begin; i0 < L; i0 += ${q_step}) {
        ${walk_step(kv_staged, "i0", q_step, "L", 32 * kv_warps, stats=True)}

        // S^T = (k * scale2) Q^T and dP^T = V dO^T: KT tiles of 16 keys by q_step rows; each
        // B fragment of q and dO read and split once for the KT tiles.
        float4 st[${KT}][${QB}], dpt[${KT}][${QB}];
        ${UNROLL}
        for (int mt = 0; mt < ${KT}; ++mt) {
            ${UNROLL}
            for (int j = 0; j < ${QB}; ++j) st[mt][j] = dpt[mt][j] = (float4)(0.0f);
        }
<% kv_products = [("st", "k", "kb", "DK", KS, "q_at", B_QLD, " * scale2"), ("dpt", "v", "vb", "DV", VS, "g_at", B_GLD, "")] %>
% for (acc, src, base, width, steps, tile, pitch, factor) in kv_products:
        ${UNROLL}
        for (int kk = 0; kk < ${steps}; ++kk) {
            uint4 a_big[${KT}], a_small[${KT}];
            ${UNROLL}
            for (int mt = 0; mt < ${KT}; ++mt) {
% if frags_kv:
                const float4 a = ${src}_frag[mt][kk];
% else:
                // Read again (through the caches) at each step: the registers go to the
                // accumulators.
                const int col = 8 * kk + 2 * t;
                const float4 a = ${global_a(base, "k_lo + 16 * mt", "col", "S", width)}${factor};
% endif
                a_big[mt] = tf32_big4(a);
                a_small[mt] = tf32_small4(a, a_big[mt]);
            }
            ${UNROLL}
            for (int j = 0; j < ${QB}; ++j) {
                const float2 bx = ${b_rows(tile, pitch, "8 * j", "8 * kk")};
                const uint2 b_big = tf32_big2(bx), b_small = tf32_small2(bx, b_big);
                ${UNROLL}
                for (int mt = 0; mt < ${KT}; ++mt)
                    ${acc}[mt][j] = mma3(${acc}[mt][j], a_big[mt], a_small[mt], b_big, b_small MMA_AT);
            }
        }
% endfor
        // Element (key, row) of accumulator j: x (lo, 2t), y (lo, 2t + 1), z (hi, 2t),
        // w (hi, 2t + 1), rows 8 j + ... of the step.
        ${UNROLL}
        for (int mt = 0; mt < ${KT}; ++mt) {
            const ${index_t} k_mt = k_lo + 16 * mt;
            ${UNROLL}
            for (int j = 0; j < ${QB}; ++j) {
                const int r = 8 * j + 2 * t;
                const ${index_t} row = i0 + r;
                ${weight_and_ds("st[mt][j].x", "dpt[mt][j].x", "row", "k_mt", "lse_at[r]", "delta_at[r]")}
                ${weight_and_ds("st[mt][j].y", "dpt[mt][j].y", "row + 1", "k_mt", "lse_at[r + 1]", "delta_at[r + 1]")}
                ${weight_and_ds("st[mt][j].z", "dpt[mt][j].z", "row", "k_mt + 8", "lse_at[r]", "delta_at[r]")}
                ${weight_and_ds("st[mt][j].w", "dpt[mt][j].w", "row + 1", "k_mt + 8", "lse_at[r + 1]", "delta_at[r + 1]")}
            }
        }
% if fused_dq:
        if (dq_on) {
            // dQ += dS K over the group's keys for the step's rows: each warp's dS^T tiles
            // (keys by rows) go to local memory as dS (rows by keys); the group's warps then
            // share the (q_step x DKP) product, its 16 x 8 tiles dealt round them, and add it
            // to dq by atomics (the other groups add their keys' share).
            ${UNROLL}
            for (int mt = 0; mt < ${KT}; ++mt) {
                const int kl = warp * ${16 * KT} + 16 * mt + g;
                ${UNROLL}
                for (int j = 0; j < ${QB}; ++j) {
                    const int r = 8 * j + 2 * t;
                    ds_tile[r * ${DS_LD} + kl] = dpt[mt][j].x;
                    ds_tile[(r + 1) * ${DS_LD} + kl] = dpt[mt][j].y;
                    ds_tile[r * ${DS_LD} + kl + 8] = dpt[mt][j].z;
                    ds_tile[(r + 1) * ${DS_LD} + kl + 8] = dpt[mt][j].w;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
<% units = (q_step // 16) * KS %>
            for (int round = 0; round < ${-(-units // kv_warps)}; ++round) {
                // Every warp takes a tile each round (uniform: the emulated mma holds
                // barriers); a warp past the last tile computes one it does not store.
                const int unit_raw = round * ${kv_warps} + warp;
                const int unit = unit_raw < ${units} ? unit_raw : ${units - 1};
                const int m0 = (unit / ${KS}) * 16, n0 = (unit % ${KS}) * 8;
                float4 acc = (float4)(0.0f);
                ${UNROLL}
                for (int kk = 0; kk < ${NK // 8}; ++kk) {
                    __local const float *lo = ds_tile + (m0 + g) * ${DS_LD} + 8 * kk + 2 * t;
                    const float2 x_lo = *(__local const float2 *)lo;
                    const float2 x_hi = *(__local const float2 *)(lo + ${8 * DS_LD});
                    const float4 a = (float4)(x_lo.x, x_hi.x, x_lo.y, x_hi.y);
                    const uint4 a_big = tf32_big4(a), a_small = tf32_small4(a, a_big);
                    const float2 bx = ${b_cols("k_grp", B_QLD, "8 * kk", "n0")};
                    const uint2 b_big = tf32_big2(bx), b_small = tf32_small2(bx, b_big);
                    acc = mma3(acc, a_big, a_small, b_big, b_small MMA_AT);
                }
                if (unit_raw < ${units}) {
                    const ${index_t} row = i0 + m0 + g;
                    const int col = n0 + 2 * t;
                    __global float *dqb = dq + ((${index_t})b * L + row) * DK + col;
                    if (row < L && col < DK) atomic_add_float(dqb, acc.x * scale);
                    if (row < L && col + 1 < DK) atomic_add_float(dqb + 1, acc.y * scale);
                    if (row + 8 < L && col < DK) atomic_add_float(dqb + 8 * DK, acc.z * scale);
                    if (row + 8 < L && col + 1 < DK) atomic_add_float(dqb + 8 * DK + 1, acc.w * scale);
                }
            }
        }
% endif
        // dV += P^T dO and dK += dS^T Q: the accumulator tiles (8 rows each) as A fragments,
        // dO's and q's rows read permuted as their columns are, each B fragment read and split
        // once for the KT tiles.
<% kv_grads = [("dv_acc", "st", VS, "g_at", B_GLD), ("dk_acc", "dpt", KS, "q_at", B_QLD)] %>
% for (acc, src, steps, tile, pitch) in kv_grads:
        ${UNROLL}
        for (int j = 0; j < ${QB}; ++j) {
            uint4 a_big[${KT}], a_small[${KT}];
            ${UNROLL}
            for (int mt = 0; mt < ${KT}; ++mt) {
                const float4 a = AS_A(${src}[mt][j]);
                a_big[mt] = tf32_big4(a);
                a_small[mt] = tf32_small4(a, a_big[mt]);
            }
            ${UNROLL}
            for (int i = 0; i < ${steps}; ++i) {
                const float2 bx = ${b_cols(tile, pitch, "8 * j", "8 * i")};
                const uint2 b_big = tf32_big2(bx), b_small = tf32_small2(bx, b_big);
                ${UNROLL}
                for (int mt = 0; mt < ${KT}; ++mt)
                    ${acc}[mt][i] = mma3(${acc}[mt][i], a_big[mt], a_small[mt], b_big, b_small MMA_AT);
            }
        }
% endfor
    }
    __global float *dkb = dk + (${index_t})b * S * DK;
    __global float *dvb = dv + (${index_t})b * S * DV;
    ${UNROLL}
    for (int mt = 0; mt < ${KT}; ++mt) {
        const ${index_t} k_mt = k_lo + 16 * mt;
        ${UNROLL}
        for (int i = 0; i < ${KS}; ++i) {
            const int col = 8 * i + 2 * t;
            ${store_pair("dkb", "dk_acc[mt][i]", "k_mt", "col", "S", "DK", "scale")}
        }
        ${UNROLL}
        for (int i = 0; i < ${VS}; ++i) {
            const int col = 8 * i + 2 * t;
            ${store_pair("dvb", "dv_acc[mt][i]", "k_mt", "col", "S", "DV", "1.0f")}
        }
    }
}

__kernel __attribute__((reqd_work_group_size(${32 * q_warps}, 1, 1)))
void attention_mma_backward_q(const ${index_t} L, const ${index_t} S, const float scale2,
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
    // The step's keys (read along rows for S, down columns for dQ) and values (along rows).
    __local float k_tile[${stages * k_step * Q_KLD}] __attribute__((aligned(16)));
    __local float v_tile[${stages * k_step * Q_VLD}] __attribute__((aligned(16)));
    ${scratch(32 * q_warps)}
    ${item_ids()}
    const ${index_t} b = get_group_id(1);
    const ${index_t} row0 = (${index_t})get_group_id(0) * ${16 * QT * q_warps};
    // The item's rows: lo (g) and hi (g + 8) of each of its warp's QT tiles of 16.
    const ${index_t} r_lo = row0 + warp * ${16 * QT} + g;
    __global const ${index_t} *offsets = table + 4 * b;
    __global const float *qb = q + q_off + offsets[0];
    __global const float *kb = k + k_off + offsets[1];
    __global const float *vb = v + v_off + offsets[2];
    __global const ${mask_t} *mb = mask + mask_off + offsets[3];
    __global const float *gb = dout + dout_off + (${index_t})b * L * DV;

    float4 dq_acc[${QT}][${KS}];
    float lse_lo[${QT}], lse_hi[${QT}], delta_lo[${QT}], delta_hi[${QT}];
% if frags_q:
    // q (scaled to base-2 scores) and dO of the warp's rows as A fragments, in registers.
    float4 q_frag[${QT}][${KS}], g_frag[${QT}][${VS}];
% endif
    ${UNROLL}
    for (int mt = 0; mt < ${QT}; ++mt) {
        const ${index_t} r_mt = r_lo + 16 * mt;
        ${UNROLL}
        for (int kk = 0; kk < ${KS}; ++kk) dq_acc[mt][kk] = (float4)(0.0f);
% if frags_q:
        ${UNROLL}
        for (int kk = 0; kk < ${KS}; ++kk) {
            const int col = 8 * kk + 2 * t;
            q_frag[mt][kk] = ${global_a("qb", "r_mt", "col", "L", "DK")} * scale2;
        }
        ${UNROLL}
        for (int kk = 0; kk < ${VS}; ++kk) {
            const int col = 8 * kk + 2 * t;
            g_frag[mt][kk] = ${global_a("gb", "r_mt", "col", "L", "DV")};
        }
% endif
        lse_lo[mt] = r_mt < L ? lse[(${index_t})b * L + r_mt] : INFINITY;
        lse_hi[mt] = r_mt + 8 < L ? lse[(${index_t})b * L + r_mt + 8] : INFINITY;
        delta_lo[mt] = r_mt < L ? delta[(${index_t})b * L + r_mt] : 0.0f;
        delta_hi[mt] = r_mt + 8 < L ? delta[(${index_t})b * L + r_mt + 8] : 0.0f;
    }
    const ${index_t} n_end = causal ? min(S, row0 + ${16 * QT * q_warps}) : S;

<% q_staged = [("k", "kb", "S", dk, Q_KLD, k_step), ("v", "vb", "S", dv, Q_VLD, k_step)] %>
    ${walk_prologue(q_staged, "0", "n_end", 32 * q_warps)}
    for (${index_t} n0 = 0; n0 < n_end; n0 += ${k_step}) {
        ${walk_step(q_staged, "n0", k_step, "n_end", 32 * q_warps)}

        // S = (q * scale2) K^T and dP = dO V^T: QT tiles of 16 rows by k_step keys; each B
        // fragment of k and v read and split once for the QT tiles.
        float4 s[${QT}][${KB}], dp[${QT}][${KB}];
        ${UNROLL}
        for (int mt = 0; mt < ${QT}; ++mt) {
            ${UNROLL}
            for (int j = 0; j < ${KB}; ++j) s[mt][j] = dp[mt][j] = (float4)(0.0f);
        }
<% q_products = [("s", "q", "qb", "DK", KS, "k_at", Q_KLD, " * scale2"), ("dp", "g", "gb", "DV", VS, "v_at", Q_VLD, "")] %>
% for (acc, src, base, width, steps, tile, pitch, factor) in q_products:
        ${UNROLL}
        for (int kk = 0; kk < ${steps}; ++kk) {
            uint4 a_big[${QT}], a_small[${QT}];
            ${UNROLL}
            for (int mt = 0; mt < ${QT}; ++mt) {
% if frags_q:
                const float4 a = ${src}_frag[mt][kk];
% else:
                const int col = 8 * kk + 2 * t;
                const float4 a = ${global_a(base, "r_lo + 16 * mt", "col", "L", width)}${factor};
% endif
                a_big[mt] = tf32_big4(a);
                a_small[mt] = tf32_small4(a, a_big[mt]);
            }
            ${UNROLL}
            for (int j = 0; j < ${KB}; ++j) {
                const float2 bx = ${b_rows(tile, pitch, "8 * j", "8 * kk")};
                const uint2 b_big = tf32_big2(bx), b_small = tf32_small2(bx, b_big);
                ${UNROLL}
                for (int mt = 0; mt < ${QT}; ++mt)
                    ${acc}[mt][j] = mma3(${acc}[mt][j], a_big[mt], a_small[mt], b_big, b_small MMA_AT);
            }
        }
% endfor
        ${UNROLL}
        for (int mt = 0; mt < ${QT}; ++mt) {
            const ${index_t} r_mt = r_lo + 16 * mt;
            ${UNROLL}
            for (int j = 0; j < ${KB}; ++j) {
                const ${index_t} key = n0 + 8 * j + 2 * t;
                ${weight_and_ds("s[mt][j].x", "dp[mt][j].x", "r_mt", "key", "lse_lo[mt]", "delta_lo[mt]")}
                ${weight_and_ds("s[mt][j].y", "dp[mt][j].y", "r_mt", "key + 1", "lse_lo[mt]", "delta_lo[mt]")}
                ${weight_and_ds("s[mt][j].z", "dp[mt][j].z", "r_mt + 8", "key", "lse_hi[mt]", "delta_hi[mt]")}
                ${weight_and_ds("s[mt][j].w", "dp[mt][j].w", "r_mt + 8", "key + 1", "lse_hi[mt]", "delta_hi[mt]")}
            }
        }
        // dQ += dS K: dS's accumulator tiles (8 keys each) as A fragments, k's rows permuted,
        // each B fragment read and split once for the QT tiles.
        ${UNROLL}
        for (int j = 0; j < ${KB}; ++j) {
            uint4 d_big[${QT}], d_small[${QT}];
            ${UNROLL}
            for (int mt = 0; mt < ${QT}; ++mt) {
                const float4 da = AS_A(dp[mt][j]);
                d_big[mt] = tf32_big4(da);
                d_small[mt] = tf32_small4(da, d_big[mt]);
            }
            ${UNROLL}
            for (int i = 0; i < ${KS}; ++i) {
                const float2 bx = ${b_cols("k_at", Q_KLD, "8 * j", "8 * i")};
                const uint2 b_big = tf32_big2(bx), b_small = tf32_small2(bx, b_big);
                ${UNROLL}
                for (int mt = 0; mt < ${QT}; ++mt)
                    dq_acc[mt][i] = mma3(dq_acc[mt][i], d_big[mt], d_small[mt], b_big, b_small MMA_AT);
            }
        }
    }
    __global float *dqb = dq + (${index_t})b * L * DK;
    ${UNROLL}
    for (int mt = 0; mt < ${QT}; ++mt) {
        const ${index_t} r_mt = r_lo + 16 * mt;
        ${UNROLL}
        for (int i = 0; i < ${KS}; ++i) {
            const int col = 8 * i + 2 * t;
            ${store_pair("dqb", "dq_acc[mt][i]", "r_mt", "col", "L", "DK", "scale")}
        }
    }
}
