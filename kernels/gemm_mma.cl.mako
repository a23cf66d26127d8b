## gemm_mma: the C tile of a work-group computed on NVIDIA tensor cores by warp-level mma.sync
## issued as inline PTX: in TF32 (float32 A and B, mma.sync.aligned.m16n8k8.row.col.f32.tf32.
## tf32.f32) or on 16-bit A and B (AB_TYPE "half": m16n8k16 .f16.f16, "bfloat16": m16n8k16
## .bf16.bf16), float32 accumulators either way. The "mma" solver of ops/gemm.py (compute
## capability 8.0 and later; TF32 only where allowed).
##
## Why mma.sync: NVIDIA's OpenCL compiles for sm_90, not sm_90a, so Hopper's wgmma (the
## instruction cuBLAS reaches ~400 TFLOP/s of TF32 with) cannot be issued from OpenCL; the
## warp-level mma.sync of Ampere is the ceiling of this path.
<%namespace name="common" file="gemm_common.cl.mako"/>
<%namespace name="access" file="memory_access.cl.mako"/>
${common.header()}
// gemm_mma only:
//   TILE_M, TILE_N  the C tile one work-group computes
//   TILE_K        depth of the A and B slices staged in local memory per step (multiple of
//                 KSTEP, the mma's depth: 8 for TF32, 16 for 16-bit operands)
//   WARPS_M, WARPS_N  warps of 32 work-items along M and N; warp (wm, wn) owns the
//                 WTM x WTN = TILE_M / WARPS_M x TILE_N / WARPS_N block of the tile, as
//                 WTM / 16 x WTN / 8 mma tiles of 16 x 8 accumulators (4 per work-item)
//   STAGES        local-memory stages (>= 2): the copies of slice s + STAGES - 1 are in flight
//                 while slice s is multiplied; one barrier per slice
//   GVEC_A, GVEC_B  elements per copy of the operand: 4 floats or 8 16-bit values, copies of
//                 16 bytes (its rows start on 16-byte boundaries, and a folded one's four
//                 consecutive columns from a multiple of 4 lie in one image, contiguously: the
//                 host checks leading dimensions, offsets, batch strides and folds); 1: one
//                 element (16-bit ones copied plainly)
//   NV_ASYNC      1: copies are cp.async (PTX); 0: plain loads and stores
//   GROUP_M       as gemm_tiled's: > 1 walks GROUP_M rows of tiles down M before stepping N
//   CVEC          2: rows of C start on 8-byte boundaries (the host checks ldc, offset, batch
//                 stride and C's fold: even positions and image stride): work-groups inside C
//                 store their two adjacent accumulators at once (without a chain and without
//                 values per position); 1: one at a time
//   ROUND         "cvt": operands rounded to TF32 by cvt.rna.tf32.f32; "int": the same
//                 rounding (nearest, ties away from zero) in two integer operations, NaN kept
//   STAGED        (TF32 only) 0: slices copied straight into local memory (cp.async with NV_ASYNC), each
//                 work-item rounding the fragments it reads to TF32 (a value is rounded by
//                 every warp that reads it). 1: slices go global -> registers -> local memory,
//                 rounded once on the way; two stages, the next slice's loads in flight while
//                 the current one is multiplied (STAGES must be 2, NV_ASYNC unused)
//   STAGE_MN      (with STAGED) 1: both slices stored with M (N) contiguous, as a transposed A
//                 (a plain B) is, whatever the operands' layout: a K-contiguous operand's values
//                 are transposed on their way from registers. Rows of TILE_M + 4 words instead
//                 of TILE_K + 8 (a 256-row A slice 16 deep: 16.6 KB against 24.6)
//   SPLIT_K       (float32 operands) 1: each work-group sums only its K chunk (group id 2 =
//                 batch * splits + split) into a workspace; gemm_splitk_reduce (rendered into
//                 this program) adds the chunks and applies the epilogue. 0: one pass.
//   EMULATE       0: mma.sync and cvt.rna.tf32.f32 as PTX (NVIDIA only). 1: the same
//                 instruction, fragment for fragment, computed by the warp's work-items through
//                 local memory, with TF32 rounding done in integer arithmetic and 16-bit values
//                 unpacked from their registers in integer arithmetic: it runs on any OpenCL
//                 device, to check this kernel's addressing where no tensor core is
//   AB_TYPE, C_TYPE  (gemm_common.cl.mako) "float" for TF32; "half" / "bfloat16": 16-bit A and B
//                 staged as they are (ushort), two values packed per 32-bit fragment register
//
// Folded operands (FOLD_A, FOLD_B, FOLD_C of gemm_common; float32 A and B only, as is the
// "conv" epilogue order): a copy's source is the operand's row times its leading dimension
// plus the folded offset of its column. Where the folded dimension is the tile's own (B along
// N, not TRANS_B) a work-item's column offsets are computed once; where it is K (A, or B with
// TRANS_B) once per slice and copy. C's folded column offsets are computed once per column of
// accumulators in the epilogue.
//
// Local memory. Each operand's slice is stored as it lies in global memory (rows of its
// contiguous dimension), so that the copies need no transposition and can be cp.async:
//   A (not TRANS_A): [TILE_M][LDA], LDA = TILE_K + pad; TRANS_A: [TILE_K][LDA], LDA = TILE_M + 4
//   B (TRANS_B):     [TILE_N][LDB], LDB = TILE_K + pad; else:    [TILE_K][LDB], LDB = TILE_N + 4
// Within each 8-deep step the K index of the mma fragments is permuted, the same way for A and
// B (the sum over K does not change): fragment column t (t = lane % 4) reads K offset 2t and
// column t + 4 reads 2t + 1. Where K is contiguous a work-item's two values are then adjacent
// (one 8-byte load); rows of LDA = TILE_K + pad words with LDA / 8 odd put the 8 rows of a
// half-warp's 8-byte loads on distinct banks, and rows of TILE_M + 4 (TILE_N + 4) words do so
// for the 4-byte loads where M (N) is contiguous.
//
// 16-bit operands (m16n8k16). PTX's fragments hold two values per register, the lower K index
// in the low half: a0 (g, 2t..2t+1), a1 (g + 8, 2t..2t+1), a2 (g, 2t+8..2t+9), a3 (g + 8,
// 2t+8..2t+9); b0 (2t..2t+1, g), b1 (2t+8..2t+9, g); accumulators as for TF32. Within each
// 16-deep step the K index is permuted the same way for A and B: logical 2t, 2t+1, 2t+8, 2t+9
// are stored at 4t, 4t+1, 4t+2, 4t+3, so that where K is contiguous a work-item's a0 and a2
// (b0 and b1) are one 8-byte load; where M (N) is contiguous each register packs two 2-byte
// loads. Slices are stored in ushort elements; rows where K is contiguous take
// 2 * k_contiguous_ld(TILE_K / 2) elements (the TF32 rule in words: 8-byte loads of a
// half-warp on distinct banks), rows of TILE_M + 8 (TILE_N + 8) elements otherwise (16 bytes
// of pad, as for TF32; the 2-byte loads of lanes t and t + 2 then share a bank).
<%!
def k_contiguous_ld(tile_k):
    """Row length in words of a slice stored with K contiguous: at least TILE_K + 8, with
    LD / 8 odd (the 8-byte fragment loads of a half-warp then meet distinct banks)."""
    ld = tile_k + 8
    return ld if (ld // 8) % 2 == 1 else tile_k + 16


def local_ld(tile, k_contiguous, half):
    """Elements per local row of a slice: words for TF32, 16-bit values for half."""
    if half:
        return 2 * k_contiguous_ld(tile // 2) if k_contiguous else tile + 8
    return k_contiguous_ld(tile) if k_contiguous else tile + 4


def layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B,
           HALF=False, STAGE_MN=0):
    """The derived constants of the header, as a dict: work-items, warp tile and mma tile
    counts, local row lengths, each operand's slice as (contiguous, strided) extents in its
    storage order and the copies per work-item."""
    nthreads = WARPS_M * WARPS_N * 32
    d = dict(nthreads=nthreads, wtm=TILE_M // WARPS_M, wtn=TILE_N // WARPS_N)
    d["mt_count"], d["nt_count"] = d["wtm"] // 16, d["wtn"] // 8
    # Local slices: A with M contiguous ([TILE_K][LDA]) where A is transposed or STAGE_MN,
    # B with N contiguous ([TILE_K][LDB]) where B is not transposed or STAGE_MN.
    d["a_mn"], d["b_kn"] = bool(TRANS_A or STAGE_MN), bool(not TRANS_B or STAGE_MN)
    d["lda"] = local_ld(TILE_M, False, HALF) if d["a_mn"] else local_ld(TILE_K, True, HALF)
    d["ldb"] = local_ld(TILE_N, False, HALF) if d["b_kn"] else local_ld(TILE_K, True, HALF)
    d["a_x"], d["a_s"] = (TILE_M, TILE_K) if TRANS_A else (TILE_K, TILE_M)
    d["b_x"], d["b_s"] = (TILE_K, TILE_N) if TRANS_B else (TILE_N, TILE_K)
    d["a_copies"] = d["a_x"] * d["a_s"] // (GVEC_A * nthreads)
    d["b_copies"] = d["b_x"] * d["b_s"] // (GVEC_B * nthreads)
    return d


def operand(name, k, TRANS_A, TRANS_B, FOLD_A, FOLD_B, GVEC_A, GVEC_B):
    """How a slice of operand ``name`` ("a" or "b") starting at K offset ``k`` is addressed:
    its storage's (rows, columns), the slice's origin (r0, c0) in it, its leading dimension,
    copy width, fold mode and whether the folded columns move with K (else they are the
    work-group's own, fixed)."""
    if name == "a":
        rows, cols, r0, c0 = ("K", "M", k, "m0") if TRANS_A else ("M", "K", "m0", k)
        return dict(rows=rows, cols=cols, r0=r0, c0=c0, ld="lda", gvec=GVEC_A, fold=FOLD_A,
                    moving=not TRANS_A, base="A")
    rows, cols, r0, c0 = ("N", "K", "n0", k) if TRANS_B else ("K", "N", k, "n0")
    return dict(rows=rows, cols=cols, r0=r0, c0=c0, ld="ldb", gvec=GVEC_B, fold=FOLD_B,
                moving=bool(TRANS_B), base="B")


def operand_copies(name, k, L, TRANS_A, TRANS_B, FOLD_A, FOLD_B, GVEC_A, GVEC_B):
    """``operand`` with the copies per work-item ("copies") and their folded column "slots"
    (``col_slots``), for ``layout``'s dict ``L``."""
    op = operand(name, k, TRANS_A, TRANS_B, FOLD_A, FOLD_B, GVEC_A, GVEC_B)
    op["copies"] = L[name + "_copies"]
    op["slots"] = col_slots(op["copies"], L[name + "_x"] // op["gvec"], L["nthreads"])
    return op


def col_slots(copies, chunks, nthreads):
    """The copies whose folded column offsets are computed: all of them, or only the first
    where every copy of a work-item has its column (NTHREADS a multiple of the ``chunks`` per
    slice row), which the others then share."""
    return [0] if nthreads % chunks == 0 else list(range(copies))


def source(op, name, r):
    """Address of the first element of copy ``r`` of operand ``name`` (``op``: ``operand``'s
    dict, with "slots" from col_slots): in the slice, or for a folded operand the row's start
    plus the column's offset."""
    if not op["fold"]:
        return f"{name}_slice + {name}_src{r}"
    slot = r if r in op["slots"] else 0
    return f"{op['base']} + (long)(({op['r0']}) + {name}_s{r}) * {op['ld']} + {name}_col{slot}"
%>
<%
    HALF = AB_TYPE != "float"
    KSTEP, KPAIR = (16, 4) if HALF else (8, 2)
    if HALF and (FOLD_A or FOLD_B or FOLD_C or EPILOGUE != "gemm"):
        # The host (GemmPlan) refuses these first; 16-bit operands take the plain "gemm" order.
        raise ValueError("gemm_mma: 16-bit operands take neither folds nor the conv epilogue")
    L = layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B, HALF, STAGE_MN)
    nthreads, wtm, wtn, lda, ldb = L["nthreads"], L["wtm"], L["wtn"], L["lda"], L["ldb"]
    mt_count, nt_count = L["mt_count"], L["nt_count"]
    a_x, a_s, b_x, b_s, a_copies, b_copies = (L[k] for k in ("a_x", "a_s", "b_x", "b_s", "a_copies", "b_copies"))
%>
#define NTHREADS ${nthreads}
#define TILE_M ${TILE_M}
#define TILE_N ${TILE_N}
#define TILE_K ${TILE_K}
#define LDA ${lda}
#define LDB ${ldb}
#define STAGE_A ${lda * (TILE_K if L["a_mn"] else TILE_M)}
#define STAGE_B ${ldb * (TILE_K if L["b_kn"] else TILE_N)}
#define STAGES ${STAGES}
// Local slices hold floats (TF32) or the 16-bit values' bits.
#define STAGE_T ${"ushort" if HALF else "float"}

${access.async_copies(bool(NV_ASYNC))}

% if HALF:
// 16-bit operands: two values packed into a fragment register, the lower K index low.
#define PACK2(lo, hi) ((uint)(lo) | ((uint)(hi) << 16))
% elif EMULATE or ROUND == "int":
// TF32 of x as cvt.rna.tf32.f32 rounds it (to nearest, ties away from zero, on the 13 dropped
// mantissa bits), in two integer operations, kept as the float bit pattern; infinities pass
// unchanged and a NaN stays a NaN.
inline uint to_tf32(float x)
{
    const uint u = as_uint(x);
    return isnan(x) ? u : (u + 0x1000u) & 0xffffe000u;
}
% else:
inline uint to_tf32(float x)
{
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
% endif

% if EMULATE and HALF:
// The float value of the 16-bit operand in the low (hi = 0) or high half of a register: for
// bfloat16 its bits are a float's top half; a half is decoded (exactly) in integer
// arithmetic, subnormals included.
inline float unpack16(uint word, int hi)
{
    const uint h = hi ? word >> 16 : word & 0xffffu;
%   if AB_TYPE == "bfloat16":
    return as_float(h << 16);
%   else:
    const uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0u)
        return as_float(sign | as_uint((float)m * 5.9604644775390625e-8f));   // m * 2^-24
    return as_float(sign | ((e + 112u) << 23) | (m << 13));
%   endif
}

// One m16n8k16 mma of a warp on 16-bit operands: as mma_emulated below for TF32, with the
// fragment layout of the header (two values per register). Logical K index k of the 16 is in
// register k / 8 of the pair (a0/a2 for row g, a1/a3 for g + 8; b0/b1), held by the lane of
// t = (k % 8) / 2, in its high half when k is odd.
inline float4 mma_emulated(float4 c, uint a0, uint a1, uint a2, uint a3, uint b0, uint b1,
                           __local uint *x, int lane)
{
    x[lane * 6 + 0] = a0;
    x[lane * 6 + 1] = a1;
    x[lane * 6 + 2] = a2;
    x[lane * 6 + 3] = a3;
    x[lane * 6 + 4] = b0;
    x[lane * 6 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int g = lane / 4, t = lane % 4;
    for (int k = 0; k < 16; ++k) {
        const int reg = k / 8, q = (k % 8) / 2, odd = k & 1;
        const float a_g = unpack16(x[(g * 4 + q) * 6 + 2 * reg], odd);
        const float a_g8 = unpack16(x[(g * 4 + q) * 6 + 1 + 2 * reg], odd);
        const float b_0 = unpack16(x[((2 * t) * 4 + q) * 6 + 4 + reg], odd);
        const float b_1 = unpack16(x[((2 * t + 1) * 4 + q) * 6 + 4 + reg], odd);
        c.x = fma(a_g, b_0, c.x);
        c.y = fma(a_g, b_1, c.y);
        c.z = fma(a_g8, b_0, c.z);
        c.w = fma(a_g8, b_1, c.w);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return c;
}
#define MMA(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) { \
    const float4 mma_d = mma_emulated((float4)(d0, d1, d2, d3), a0, a1, a2, a3, b0, b1, \
                                      mma_scratch + warp * 192, lane); \
    d0 = mma_d.x; d1 = mma_d.y; d2 = mma_d.z; d3 = mma_d.w; }
% elif EMULATE:
// One m16n8k8 mma of a warp: every work-item puts its fragments (a0..a3, b0, b1) into the
// warp's 32 x 6 words of `x`, then reads the rows and columns of its four accumulators
// (fragment layout as PTX documents it for .tf32; groupID = lane / 4, t = lane % 4):
//   a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); b0 (t, g), b1 (t + 4, g);
//   c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
// Every work-item of the group calls it the same number of times (it holds barriers).
inline float4 mma_emulated(float4 c, uint a0, uint a1, uint a2, uint a3, uint b0, uint b1,
                           __local uint *x, int lane)
{
    x[lane * 6 + 0] = a0;
    x[lane * 6 + 1] = a1;
    x[lane * 6 + 2] = a2;
    x[lane * 6 + 3] = a3;
    x[lane * 6 + 4] = b0;
    x[lane * 6 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int g = lane / 4, t = lane % 4;
    for (int k = 0; k < 8; ++k) {
        const int hi = k / 4;
        const float a_g = as_float(x[(g * 4 + k % 4) * 6 + 2 * hi]);
        const float a_g8 = as_float(x[(g * 4 + k % 4) * 6 + 1 + 2 * hi]);
        const float b_0 = as_float(x[((2 * t) * 4 + k % 4) * 6 + 4 + hi]);
        const float b_1 = as_float(x[((2 * t + 1) * 4 + k % 4) * 6 + 4 + hi]);
        c.x = fma(a_g, b_0, c.x);
        c.y = fma(a_g, b_1, c.y);
        c.z = fma(a_g8, b_0, c.z);
        c.w = fma(a_g8, b_1, c.w);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return c;
}
#define MMA(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) { \
    const float4 mma_d = mma_emulated((float4)(d0, d1, d2, d3), a0, a1, a2, a3, b0, b1, \
                                      mma_scratch + warp * 192, lane); \
    d0 = mma_d.x; d1 = mma_d.y; d2 = mma_d.z; d3 = mma_d.w; }
% elif HALF:
// D = A (16 x 16, row) * B (16 x 8, col) + D on the warp's tensor cores, 16-bit operands two
// per register; the TF32 form's operands otherwise.
#define MMA(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) \
    asm("mma.sync.aligned.m16n8k16.row.col.f32.${"bf16.bf16" if AB_TYPE == "bfloat16" else "f16.f16"}.f32 {%0, %1, %2, %3}, " \
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};" \
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3) \
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), \
          "f"(d0), "f"(d1), "f"(d2), "f"(d3))
% else:
// D = A (16 x 8, row) * B (8 x 8, col) + D on the warp's tensor cores; separate output and
// input operands for the accumulators (PTX registers are virtual: no tie is needed).
#define MMA(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) \
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, " \
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};" \
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3) \
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), \
          "f"(d0), "f"(d1), "f"(d2), "f"(d3))
% endif

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void gemm_mma(int M, int N, int K,
              __global const AB_T *restrict A, long a_off, int lda, long stride_a,
              __global const AB_T *restrict B, long b_off, int ldb, long stride_b,
              __global C_T *C, long c_off, int ldc, long stride_c,
              float alpha, float beta,
              __global const C_T *restrict bias, long bias_off,
              __global const float *restrict scale, long scale_off,
              __global const float *restrict R, long r_off, float residual_alpha,
              int fa_p, long fa_img, int fa_w, int fa_row, int fa_col,
              int fb_p, long fb_img, int fb_w, int fb_row, int fb_col,
              int fc_p, long fc_img, int splits, int k_chunk
              ${common.chain_params()})
{
    __local STAGE_T a_stage[STAGES * STAGE_A] __attribute__((aligned(16)));
    __local STAGE_T b_stage[STAGES * STAGE_B] __attribute__((aligned(16)));
% if EMULATE:
    __local uint mma_scratch[NTHREADS * 6];
% endif
    const int lid = get_local_id(0);
    const int lane = lid % 32;
    const int warp = lid / 32;
    const int wm = warp % ${WARPS_M};
    const int wn = warp / ${WARPS_M};
    const int g = lane / 4;
    const int t = lane % 4;
% if GROUP_M > 1:
    // Tile t (row-major over the groups) -> GROUP_M tile rows walked down M first.
    const int tiles_n = get_num_groups(0);
    const int tiles_m = get_num_groups(1);
    const int tile = get_group_id(1) * tiles_n + get_group_id(0);
    const int band = tile / (${GROUP_M} * tiles_n);
    const int band_rows = min(tiles_m - band * ${GROUP_M}, ${GROUP_M});
    const int in_band = tile - band * ${GROUP_M} * tiles_n;
    const int m0 = (band * ${GROUP_M} + in_band % band_rows) * TILE_M;
    const int n0 = (in_band / band_rows) * TILE_N;
% else:
    const int m0 = get_group_id(1) * TILE_M;
    const int n0 = get_group_id(0) * TILE_N;
% endif
% if SPLIT_K:
    // Group id 2 = batch * splits + split: this work-group sums only K's chunk from k_begin
    // (K narrowed to the chunk's end, k_chunk a multiple of TILE_K) and stores the raw sums.
    const int batch = get_group_id(2) / splits;
    const int k_begin = (get_group_id(2) % splits) * k_chunk;
    K = min(K, k_begin + k_chunk);
% else:
    const int batch = get_group_id(2);
    const int k_begin = 0;
% endif
    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;

    // Copy r of this work-item: chunk lid + r * NTHREADS of the slice, GVEC_A (GVEC_B) elements of the
    // contiguous dimension (x) in row s; consecutive work-items take consecutive chunks.
% for name, xs, ss, copies, ld in (("a", a_x, a_s, a_copies, "lda"), ("b", b_x, b_s, b_copies, "ldb")):
<%  op = operand_copies(name, "0", L, TRANS_A, TRANS_B, FOLD_A, FOLD_B, GVEC_A, GVEC_B) %>\
%   for r in range(copies):
    const int ${name}_s${r} = (lid + ${r * nthreads}) / ${xs // op["gvec"]};
    const int ${name}_x${r} = ((lid + ${r * nthreads}) % ${xs // op["gvec"]}) * ${op["gvec"]};
    const int ${name}_src${r} = ${name}_s${r} * ${ld} + ${name}_x${r};
    const int ${name}_dst${r} = ${name}_s${r} * LD${name.upper()} + ${name}_x${r};
%     if op["fold"] and not op["moving"] and r in op["slots"]:
    // The work-group's own folded columns (clamped into the matrix: the columns past its end
    // are never read).
    const long ${name}_col${r} = ${common.attr.fold(op["fold"], name, f"min(({op['c0']}) + {name}_x{r}, {op['cols']} - 1)")};
%     endif
%   endfor
% endfor
    // Slices of work-groups whose tile rows (columns) lie inside A (B) copy without checks,
    // but the last one along K when K is not a multiple of TILE_K.
    const bool a_inside = m0 + TILE_M <= M;
    const bool b_inside = n0 + TILE_N <= N;

<%def name="copy_slice(k, stage)">
<%
    HALF = AB_TYPE != "float"
    L = layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B, HALF, STAGE_MN)
%>
        {
% for name in ("a", "b"):
<%
    op = operand_copies(name, k, L, TRANS_A, TRANS_B, FOLD_A, FOLD_B, GVEC_A, GVEC_B)
    copies, inside, M_ = L[name + "_copies"], name + "_inside", name.upper()
    wide = {1: "copy2", 8: "copy16"}[op["gvec"]] if HALF else {1: "copy4", 4: "copy16"}[op["gvec"]]
%>\
            __global const AB_T *${name}_slice = ${M_} + (long)(${op["r0"]}) * ${op["ld"]} + (${op["c0"]});
            __local STAGE_T *${name}_to = ${name}_stage + (${stage}) * STAGE_${M_};
%   if op["fold"] and op["moving"]:
%     for r in op["slots"]:
            const long ${name}_col${r} = ${common.attr.fold(op["fold"], name, f"min(({op['c0']}) + {name}_x{r}, {op['cols']} - 1)")};
%     endfor
%   endif
            if (${inside} && ${k} + TILE_K <= K) {
%   for r in range(copies):
%     if wide == "copy2":
                ${name}_to[${name}_dst${r}] = *(${source(op, name, r)});
%     elif HALF:
                copy16((__local float *)(${name}_to + ${name}_dst${r}), (__global const float *)(${source(op, name, r)}));
%     else:
                ${wide}(${name}_to + ${name}_dst${r}, ${source(op, name, r)});
%     endif
%   endfor
            } else {
                // Elements outside the matrix are zeros; their source address is the
                // matrix's first element (never read). 16-bit ones are plain copies (cp.async
                // has no 2-byte form), done when issued.
%   for r in range(copies):
%     for v in range(op["gvec"]):
                { const bool ok = (${op["r0"]}) + ${name}_s${r} < ${op["rows"]} && (${op["c0"]}) + ${name}_x${r} + ${v} < ${op["cols"]};
%       if HALF:
                  ${name}_to[${name}_dst${r} + ${v}] = ok ? (${source(op, name, r)})[${v}] : (ushort)0; }
%       else:
                  copy4_masked(${name}_to + ${name}_dst${r} + ${v}, ok ? ${source(op, name, r)} + ${v} : ${M_}, ok); }
%       endif
%     endfor
%   endfor
            }
% endfor
        }
</%def>

    // This work-item's fragments in a stage: the element (row, K offset 2t; 4t for 16-bit
    // operands) of its first mma tile, in the permuted K order of the header.
% if L["a_mn"]:
    const int a_frag = (${KPAIR} * t) * LDA + wm * ${wtm} + g;
% else:
    const int a_frag = (wm * ${wtm} + g) * LDA + ${KPAIR} * t;
% endif
% if not L["b_kn"]:
    const int b_frag = (wn * ${wtn} + g) * LDB + ${KPAIR} * t;
% else:
    const int b_frag = (${KPAIR} * t) * LDB + wn * ${wtn} + g;
% endif

% for mt in range(mt_count):
%   for nt in range(nt_count):
    float c${mt}_${nt}_0 = 0.0f, c${mt}_${nt}_1 = 0.0f, c${mt}_${nt}_2 = 0.0f, c${mt}_${nt}_3 = 0.0f;
%   endfor
% endfor

<%def name="load_slice(k)">
<%
    L = layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B, False, STAGE_MN)
%>
        {
% for name in ("a", "b"):
<%
    op = operand_copies(name, k, L, TRANS_A, TRANS_B, FOLD_A, FOLD_B, GVEC_A, GVEC_B)
    copies, inside = L[name + "_copies"], name + "_inside"
    gtype = "float4" if op["gvec"] == 4 else "float"
%>\
            __global const float *${name}_slice = ${name.upper()} + (long)(${op["r0"]}) * ${op["ld"]} + (${op["c0"]});
%   if op["fold"] and op["moving"]:
%     for r in op["slots"]:
            const long ${name}_col${r} = ${common.attr.fold(op["fold"], name, f"min(({op['c0']}) + {name}_x{r}, {op['cols']} - 1)")};
%     endfor
%   endif
            if (${inside} && ${k} + TILE_K <= K) {
%   for r in range(copies):
                ${name}_reg${r} = *(__global const ${gtype} *)(${source(op, name, r)});
%   endfor
            } else {
%   for r in range(copies):
%     for v in range(op["gvec"]):
                ${name}_reg${r}${".s%d" % v if op["gvec"] > 1 else ""} = (${op["r0"]}) + ${name}_s${r} < ${op["rows"]} && (${op["c0"]}) + ${name}_x${r} + ${v} < ${op["cols"]} ? (${source(op, name, r)})[${v}] : 0.0f;
%     endfor
%   endfor
            }
% endfor
        }
</%def>

<%def name="store_slice(stage)">
<%
    L = layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B, False, STAGE_MN)
%>
% for name, copies, gvec in (("a", L["a_copies"], GVEC_A), ("b", L["b_copies"], GVEC_B)):
<%
    # STAGE_MN with a K-contiguous global operand (A plain, B transposed): its values land
    # transposed, each element of a copy in its own local row of K.
    turn = STAGE_MN and ((name == "a" and not TRANS_A) or (name == "b" and TRANS_B))
    ld = "LD" + name.upper()
%>\
%   for r in range(copies):
%     if turn:
%       for v in range(gvec):
        ${name}_stage[(${stage}) * STAGE_${name.upper()} + (${name}_x${r} + ${v}) * ${ld} + ${name}_s${r}] = as_float(to_tf32(${name}_reg${r}${".s%d" % v if gvec > 1 else ""}));
%       endfor
%     elif gvec == 4:
        *(__local float4 *)(${name}_stage + (${stage}) * STAGE_${name.upper()} + ${name}_dst${r}) = (float4)(
            as_float(to_tf32(${name}_reg${r}.x)), as_float(to_tf32(${name}_reg${r}.y)),
            as_float(to_tf32(${name}_reg${r}.z)), as_float(to_tf32(${name}_reg${r}.w)));
%     else:
        ${name}_stage[(${stage}) * STAGE_${name.upper()} + ${name}_dst${r}] = as_float(to_tf32(${name}_reg${r}));
%     endif
%   endfor
% endfor
</%def>

<%def name="multiply(stage)">
<%
    HALF = AB_TYPE != "float"
    L = layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B, HALF, STAGE_MN)
    lda, ldb, mt_count, nt_count = L["lda"], L["ldb"], L["mt_count"], L["nt_count"]
    # Staged slices hold TF32 bit patterns already.
    conv = "as_uint" if STAGED else "to_tf32"
%>
        {
        __local const STAGE_T *a_at = a_stage + (${stage}) * STAGE_A + a_frag;
        __local const STAGE_T *b_at = b_stage + (${stage}) * STAGE_B + b_frag;
% if HALF:
%   for kb in range(TILE_K // 16):
        {
%     for mt in range(mt_count):
%       if L["a_mn"]:
            const uint a${mt}_0 = PACK2(a_at[${kb * 16 * lda + mt * 16}], a_at[${(kb * 16 + 1) * lda + mt * 16}]);
            const uint a${mt}_1 = PACK2(a_at[${kb * 16 * lda + mt * 16 + 8}], a_at[${(kb * 16 + 1) * lda + mt * 16 + 8}]);
            const uint a${mt}_2 = PACK2(a_at[${(kb * 16 + 2) * lda + mt * 16}], a_at[${(kb * 16 + 3) * lda + mt * 16}]);
            const uint a${mt}_3 = PACK2(a_at[${(kb * 16 + 2) * lda + mt * 16 + 8}], a_at[${(kb * 16 + 3) * lda + mt * 16 + 8}]);
%       else:
            const uint2 a${mt}_lo = *(__local const uint2 *)(a_at + ${mt * 16 * lda + kb * 16});
            const uint2 a${mt}_hi = *(__local const uint2 *)(a_at + ${(mt * 16 + 8) * lda + kb * 16});
            const uint a${mt}_0 = a${mt}_lo.x, a${mt}_2 = a${mt}_lo.y;
            const uint a${mt}_1 = a${mt}_hi.x, a${mt}_3 = a${mt}_hi.y;
%       endif
%     endfor
%     for nt in range(nt_count):
%       if not L["b_kn"]:
            const uint2 b${nt}_v = *(__local const uint2 *)(b_at + ${nt * 8 * ldb + kb * 16});
            const uint b${nt}_0 = b${nt}_v.x, b${nt}_1 = b${nt}_v.y;
%       else:
            const uint b${nt}_0 = PACK2(b_at[${kb * 16 * ldb + nt * 8}], b_at[${(kb * 16 + 1) * ldb + nt * 8}]);
            const uint b${nt}_1 = PACK2(b_at[${(kb * 16 + 2) * ldb + nt * 8}], b_at[${(kb * 16 + 3) * ldb + nt * 8}]);
%       endif
%     endfor
%     for mt in range(mt_count):
%       for nt in range(nt_count):
            MMA(c${mt}_${nt}_0, c${mt}_${nt}_1, c${mt}_${nt}_2, c${mt}_${nt}_3,
                a${mt}_0, a${mt}_1, a${mt}_2, a${mt}_3, b${nt}_0, b${nt}_1);
%       endfor
%     endfor
        }
%   endfor
% else:
% for kb in range(TILE_K // 8):
        {
%   for mt in range(mt_count):
%     if L["a_mn"]:
            const uint a${mt}_0 = ${conv}(a_at[${kb * 8 * lda + mt * 16}]);
            const uint a${mt}_1 = ${conv}(a_at[${kb * 8 * lda + mt * 16 + 8}]);
            const uint a${mt}_2 = ${conv}(a_at[${(kb * 8 + 1) * lda + mt * 16}]);
            const uint a${mt}_3 = ${conv}(a_at[${(kb * 8 + 1) * lda + mt * 16 + 8}]);
%     else:
            const float2 a${mt}_lo = *(__local const float2 *)(a_at + ${mt * 16 * lda + kb * 8});
            const float2 a${mt}_hi = *(__local const float2 *)(a_at + ${(mt * 16 + 8) * lda + kb * 8});
            const uint a${mt}_0 = ${conv}(a${mt}_lo.x), a${mt}_2 = ${conv}(a${mt}_lo.y);
            const uint a${mt}_1 = ${conv}(a${mt}_hi.x), a${mt}_3 = ${conv}(a${mt}_hi.y);
%     endif
%   endfor
%   for nt in range(nt_count):
%     if not L["b_kn"]:
            const float2 b${nt}_v = *(__local const float2 *)(b_at + ${nt * 8 * ldb + kb * 8});
            const uint b${nt}_0 = ${conv}(b${nt}_v.x), b${nt}_1 = ${conv}(b${nt}_v.y);
%     else:
            const uint b${nt}_0 = ${conv}(b_at[${kb * 8 * ldb + nt * 8}]);
            const uint b${nt}_1 = ${conv}(b_at[${(kb * 8 + 1) * ldb + nt * 8}]);
%     endif
%   endfor
%   for mt in range(mt_count):
%     for nt in range(nt_count):
            MMA(c${mt}_${nt}_0, c${mt}_${nt}_1, c${mt}_${nt}_2, c${mt}_${nt}_3,
                a${mt}_0, a${mt}_1, a${mt}_2, a${mt}_3, b${nt}_0, b${nt}_1);
%     endfor
%   endfor
        }
% endfor
% endif
        }
</%def>

% if STAGED:
<%
    L = layout(TRANS_A, TRANS_B, TILE_M, TILE_N, TILE_K, WARPS_M, WARPS_N, GVEC_A, GVEC_B, False, STAGE_MN)
%>
% for name, gvec in (("a", GVEC_A), ("b", GVEC_B)):
%   for r in range(L[name + "_copies"]):
    ${"float4" if gvec == 4 else "float"} ${name}_reg${r};
%   endfor
% endfor
    // Slice s + 1 is loaded into registers while slice s is multiplied, then rounded into the
    // other stage; the barrier after it publishes that stage, and tells that every warp is done
    // with slice s, whose stage the next step refills.
    ${load_slice("k_begin")}
    ${store_slice(0)}
    barrier(CLK_LOCAL_MEM_FENCE);
    int stage = 0;
    for (int k = k_begin; k < K; k += TILE_K) {
        const bool more = k + TILE_K < K;
        if (more) {
            ${load_slice("(k + TILE_K)")}
        }
        ${multiply("stage")}
        if (more) {
            ${store_slice("(stage ^ 1)")}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        stage ^= 1;
    }
% else:
    // Slices s + 1 .. s + STAGES - 1 are in flight while slice s is multiplied. Copy groups
    // are committed once per slice (empty past K's end), so that waiting until STAGES - 2
    // groups remain pending means slice s has landed.
    int k_copy = k_begin;
% for s in range(STAGES - 1):
    if (k_copy < K) {
        ${copy_slice("k_copy", s)}
    }
    k_copy += TILE_K;
    COPY_COMMIT();
% endfor
    int stage = 0;
    int copy_stage = STAGES - 1;
    for (int k = k_begin; k < K; k += TILE_K) {
        COPY_WAIT(${STAGES - 2});
        // Publishes slice s to every work-item, and frees the stage multiplied last step,
        // which the copies issued next refill.
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k_copy < K) {
            ${copy_slice("k_copy", "copy_stage")}
        }
        k_copy += TILE_K;
        COPY_COMMIT();
        ${multiply("stage")}
        stage = stage == STAGES - 1 ? 0 : stage + 1;
        copy_stage = copy_stage == STAGES - 1 ? 0 : copy_stage + 1;
    }
% endif

% if SPLIT_K:
    // Raw partial sums into the workspace, [batch * splits][M][N], dense; gemm_splitk_reduce
    // adds them and applies the epilogue.
    C += (long)get_group_id(2) * M * N;
%   for mt in range(mt_count):
%     for half in range(2):
    {
        const int row = m0 + wm * ${wtm} + ${mt * 16 + half * 8} + g;
        if (row < M) {
%       for nt in range(nt_count):
%         for odd in range(2):
            {
                const int col = n0 + wn * ${wtn} + ${nt * 8 + odd} + 2 * t;
                if (col < N)
                    C[(long)row * N + col] = c${mt}_${nt}_${half * 2 + odd};
            }
%         endfor
%       endfor
        }
    }
%     endfor
%   endfor
    return;
% endif
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
<%
    # (mt, half, nt) of every row-half and column of accumulators, in the order of the stores:
    # rows outer where C is plain; where C is folded, columns outer, so that a column's folded
    # offset is computed once.
    if FOLD_C:
        order = [(mt, half, nt) for nt in range(nt_count) for mt in range(mt_count) for half in range(2)]
    else:
        order = [(mt, half, nt) for mt in range(mt_count) for half in range(2) for nt in range(nt_count)]
    def row_of(mt, half):
        return f"m0 + wm * {wtm} + {mt * 16 + half * 8} + g"
    def col_of(nt, odd):
        return f"n0 + wn * {wtn} + {nt * 8 + odd} + 2 * t"
    def at(row, col):
        """Element offset of (row, col) in C: ``col`` the column, or C's folded offset of it."""
        return f"(long)({row}) * ldc + {'c_col' if FOLD_C else col}"
%>
% if CVEC == 2 and not CHAIN and BIAS in (0, 1, 2) and SCALE in (0, 1, 2) and C_TYPE == "float":
    if (m0 + TILE_M <= M && n0 + TILE_N <= N) {
        // Whole tile inside C, rows (a folded C's images) on 8-byte boundaries: accumulators
        // r and r + 1 are adjacent columns, stored as one float2.
%   for mt, half, nt in order:
        {
            const int row = ${row_of(mt, half)};
            const int col = ${col_of(nt, 0)};
%     if FOLD_C:
            const long c_col = ${common.attr.fold(FOLD_C, "c", "col")};
%     endif
            __global float2 *target = (__global float2 *)(C + ${at("row", "col")});
            float2 value = alpha * (float2)(c${mt}_${nt}_${half * 2}, c${mt}_${nt}_${half * 2 + 1});
%     if EPILOGUE == "conv":
%       if SCALE == 1:
            value *= vload2(0, scale + scale_off + col);
%       elif SCALE == 2:
            value *= scale[scale_off + row];
%       endif
%       if BIAS == 1:
            value += vload2(0, bias + bias_off + col);
%       elif BIAS == 2:
            value += bias[bias_off + row];
%       endif
%       if RESIDUAL:
            value += residual_alpha * vload2(0, R + ${at("row", "col")});
%       endif
%       if ACTIVATION:
            { float x = value.s0; value.s0 = ${ACTIVATION}; }
            { float x = value.s1; value.s1 = ${ACTIVATION}; }
%       endif
            if (beta != 0.0f)
                value += beta * *target;
%     else:
            if (beta != 0.0f)
                value += beta * *target;
%       if BIAS == 1:
            value += vload2(0, bias + bias_off + col);
%       elif BIAS == 2:
            value += bias[bias_off + row];
%       endif
%       if ACTIVATION:
            { float x = value.s0; value.s0 = ${ACTIVATION}; }
            { float x = value.s1; value.s1 = ${ACTIVATION}; }
%       endif
%     endif
            *target = value;
        }
%   endfor
        return;
    }
% endif
    // Accumulator r of mma tile (mt, nt): row g (+ 8 for r >= 2), column 2t (+ 1 for odd r).
% if FOLD_C:
%   for nt in range(nt_count):
%     for odd in range(2):
    {
        const int col = ${col_of(nt, odd)};
        if (col < N) {
            const long c_col = ${common.attr.fold(FOLD_C, "c", "col")};
%       for mt in range(mt_count):
%         for half in range(2):
            {
                const int row = ${row_of(mt, half)};
                if (row < M)
                    ${common.epilogue(f"c{mt}_{nt}_{half * 2 + odd}", "row", "col", at("row", "col"))}
            }
%         endfor
%       endfor
        }
    }
%     endfor
%   endfor
% else:
%   for mt in range(mt_count):
%     for half in range(2):
    {
        const int row = ${row_of(mt, half)};
        if (row < M) {
%       for nt in range(nt_count):
%         for odd in range(2):
            {
                const int col = ${col_of(nt, odd)};
                if (col < N)
                    ${common.epilogue(f"c{mt}_{nt}_{half * 2 + odd}", "row", "col", at("row", "col"))}
            }
%         endfor
%       endfor
        }
    }
%     endfor
%   endfor
% endif
}

<%include file="gemm_splitk.cl.mako"/>
