## gemm_tiled: local-memory tiles, a register block per work-item, optionally split along K
## (its raw partial sums then go through gemm_splitk_reduce, gemm_splitk.cl.mako, rendered into
## the same program). The "tiled" and "splitk" solvers of ops/gemm.py.
<%namespace name="common" file="gemm_common.cl.mako"/>
<%namespace name="links" file="fusion_fold.cl.mako"/>
<%namespace name="access" file="memory_access.cl.mako"/>
${common.header()}
// gemm_tiled (and gemm_splitk_reduce) only:
//   TILE_M, TILE_N  the C tile one work-group computes
//   TILE_K        depth of the A and B slices staged in local memory per step
//   WPT_M, WPT_N  C elements per work-item along M and N (register block)
//   VEC           width of local-memory reads of A and B fragments (1, 2 or 4); a work-item
//                 owns VEC consecutive rows (columns) every TILE_M/WPT_M*VEC rows (columns),
//                 so that neighbouring work-items read neighbouring words (no bank conflicts)
//   GVEC          width of global loads (1, 2 or 4); > 1 needs leading dimensions, offsets
//                 and batch strides of A and B that are multiples of it (the host checks)
//   PAD           floats added to each local-memory row (a multiple of VEC and GVEC) against bank
//                 conflicts when the global tile is written transposed into local memory
//   DOUBLE_BUFFER 1: two local-memory stages, one barrier per step, the next slice is loaded
//                 from global memory while the current one is multiplied; 0: one stage
//   CVEC          1, or VEC when C's leading dimension, offset and batch stride are multiples
//                 of VEC (the host checks): work-groups inside C store VEC columns at once
//   SPLIT_K       1: each work-group sums only its K chunk (group id 2 = batch * splits +
//                 split) and writes the raw sum to a workspace; gemm_splitk_reduce adds the
//                 chunks and applies the epilogue. 0: the epilogue is applied directly.
//   LANES_N       0: work-item lid computes row block lid / TN_THREADS, column block
//                 lid % TN_THREADS. > 0: work-items come in runs of 32 (one NVIDIA warp), each
//                 run a LANES_N (along N) by 32 / LANES_N (along M) patch of the work-item
//                 grid, so that one run reads fewer distinct A and B fragments from local
//                 memory per step (4 x 8 reads 64 + 128 bytes where 2 x 16 reads 32 + 256)
//   GROUP_M       1: work-groups take the tiles of C row by row (group id 0 walks N). > 1:
//                 consecutive work-groups walk GROUP_M rows of tiles down M, then step along
//                 N, so that the work-groups resident together share A and B slices in cache
//   PIPELINE      0: slices go global -> registers -> local memory (DOUBLE_BUFFER says how
//                 many stages). >= 2: PIPELINE local-memory stages, the copies of slice
//                 s + PIPELINE - 1 are issued (straight into local memory, no registers)
//                 before slice s is multiplied; one barrier per slice. DOUBLE_BUFFER unused
//   NV_ASYNC      with PIPELINE: 1 issues the copies as cp.async (PTX, NVIDIA compute
//                 capability 8.0 and later; the host decides); 0 as plain loads and stores
//   REQD_SIZE     1: gemm_tiled declares its work-group size (reqd_work_group_size); 0: it
//                 does not, so that a register cap passed to NVIDIA's compiler
//                 (-cl-nv-maxrregcount) applies: the declaration takes precedence over the
//                 cap there (an H200 build reported 130 and 165 registers under a cap of 128)
// "small" only:
<%!
def load_slots(contig, total, threads, gvec):
    """(contiguous, strided) coordinate expressions of each GVEC-wide load of a work-item
    that walks a tile of ``total`` elements, ``contig`` of them contiguous, with ``threads``
    work-items. Both extents are powers of two, so one divides the other."""
    per_row = contig // gvec
    slots = []
    for r in range(total // (threads * gvec)):
        if threads % per_row == 0:
            slots.append((f"(lid % {per_row}) * {gvec}", f"(lid / {per_row} + {r * threads // per_row})"))
        else:
            wrap = per_row // threads
            slots.append((f"(lid + {(r % wrap) * threads}) * {gvec}", f"{r // wrap}"))
    return slots

def distinct_contiguous(slots):
    """For each load slot, the index of its contiguous coordinate among the distinct ones, and
    the first slot of each distinct one: slots that share a column share its folded offset
    (one register and one division instead of one per slot)."""
    firsts, index = [], []
    for r, (contig, _) in enumerate(slots):
        known = [slots[f][0] for f in firsts]
        if contig not in known:
            firsts.append(r)
            known.append(contig)
        index.append(known.index(contig))
    return index, firsts


def tile_addressing(k, trans_a, trans_b, fold_a, fold_b, tile_m, tile_n, tile_k, wpt_m, wpt_n,
                    gvec):
    """Expressions of load slot r's element v of the A and B tiles at K offset ``k``: its
    offset from a_tile / b_tile, and whether it lies inside the matrix and the K chunk."""
    nthreads = (tile_m // wpt_m) * (tile_n // wpt_n)
    a_at = distinct_contiguous(load_slots(tile_m if trans_a else tile_k, tile_m * tile_k, nthreads, gvec))[0]
    b_at = distinct_contiguous(load_slots(tile_k if trans_b else tile_n, tile_n * tile_k, nthreads, gvec))[0]
    if trans_a:
        a_addr = lambda r, v: f"a_k{r} * lda + a_m{r} + {v}"
    elif fold_a:
        a_addr = lambda r, v: f"a_m{r} * lda + a_kof{a_at[r]} + {v}"
    else:
        a_addr = lambda r, v: f"a_m{r} * lda + a_k{r} + {v}"
    if trans_b:
        b_addr = (lambda r, v: f"b_n{r} * ldb + b_kof{b_at[r]} + {v}") if fold_b else (lambda r, v: f"b_n{r} * ldb + b_k{r} + {v}")
    elif fold_b:
        b_addr = lambda r, v: f"b_k{r} * ldb + b_col{b_at[r]} + {v}"
    else:
        b_addr = lambda r, v: f"b_k{r} * ldb + b_n{r} + {v}"
    a_ok = (lambda r, v: f"m0 + a_m{r} + {v} < M && {k} + a_k{r} < k_end") if trans_a else (lambda r, v: f"m0 + a_m{r} < M && {k} + a_k{r} + {v} < k_end")
    b_ok = (lambda r, v: f"n0 + b_n{r} < N && {k} + b_k{r} + {v} < k_end") if trans_b else (lambda r, v: f"n0 + b_n{r} + {v} < N && {k} + b_k{r} < k_end")
    return a_addr, b_addr, a_ok, b_ok

%>
<%
    # Folded along K: the operand's offsets along K change every step.
    a_kfold = FOLD_A and not TRANS_A
    b_kfold = FOLD_B and TRANS_B
    b_nfold = FOLD_B and not TRANS_B
%>
#define TILE_M ${TILE_M}
#define TILE_N ${TILE_N}
#define TILE_K ${TILE_K}
#define WPT_M ${WPT_M}
#define WPT_N ${WPT_N}
#define VEC ${VEC}
#define TM_THREADS (TILE_M / WPT_M)
#define TN_THREADS (TILE_N / WPT_N)
#define NTHREADS (TM_THREADS * TN_THREADS)
#define LDS_A (TILE_M + ${PAD})
#define LDS_B (TILE_N + ${PAD})
#define STAGE_A (TILE_K * LDS_A)
#define STAGE_B (TILE_K * LDS_B)
#define STAGES ${PIPELINE if PIPELINE else (2 if DOUBLE_BUFFER else 1)}
% if PIPELINE:
## Copies global -> local memory without registers (cp.async with NV_ASYNC); a group of them
## completes at COPY_WAIT, which the issuing work-item must pass before the barrier that
## publishes them. Edge tiles copy element by element with plain loads and stores (visible at
## that barrier too): the interior copies are the ones an H200 run checked.
${access.async_copies(bool(NV_ASYNC))}
% endif
<%
    nthreads = (TILE_M // WPT_M) * (TILE_N // WPT_N)
    a_slots = load_slots(TILE_M if TRANS_A else TILE_K, TILE_M * TILE_K, nthreads, GVEC)
    b_slots = load_slots(TILE_K if TRANS_B else TILE_N, TILE_N * TILE_K, nthreads, GVEC)
    gtype = "float" if GVEC == 1 else f"float{GVEC}"
    vtype = "float" if VEC == 1 else f"float{VEC}"
    comps = ["x", "y", "z", "w"] if VEC > 1 else [""]
    def comp(v):
        return f".s{v}" if VEC > 1 else ""
%>

## VEC consecutive columns from `col` of row `row` of the tile at C + row * ldc + ${at}
## (register block row i, column group jc), with the epilogue.
<%def name="store_vector(i, jc, at)">
<%
    chain_hoisted = common.attr.hoists_chain(CHAIN, CHAIN_CHANNEL, EPILOGUE) and not SPLIT_K
    vtype = f"float{VEC}"
    def affine(name, kind):
        # VEC consecutive columns of one image (P is a multiple of VEC when C is folded).
        if kind == 1:
            return f"vload{VEC}(0, {name} + {name}_off + col)"
        if kind == 2:
            return f"{name}[{name}_off + row]"
        within = "(long)row * fc_p + col % fc_p" if FOLD_C else "(long)row * N + col"
        return f"vload{VEC}(0, {name} + {name}_off + {within})"
%>
                {
                __global ${vtype} *target = (__global ${vtype} *)(C + (long)row * ldc + ${at});
                ${vtype} value = alpha * (${vtype})(${", ".join(f"acc[{i}][{jc * VEC + v}]" for v in range(VEC))});
% if EPILOGUE != "conv":
                if (beta != 0.0f)
                    value += beta * *target;
% endif
% if EPILOGUE == "conv" and CHAIN and chain_hoisted:
                value = value * ep_scale${i} + ep_shift${i};
% elif EPILOGUE == "conv" and CHAIN:
%   for v in range(VEC):
                {
                    const int vcol = col + ${v};
                    ${links.apply_chain("row" if CHAIN_CHANNEL == 2 else "vcol", "(long)row * fc_p + vcol % fc_p" if FOLD_C else "(long)row * N + vcol", CHAIN, "ep_scale", "ep_shift")}
                    value.s${v} = value.s${v} * ep_scale + ep_shift;
                }
%   endfor
% endif
% if EPILOGUE == "conv" and SCALE:
                value *= ${affine("scale", SCALE)};
% endif
% if BIAS:
                value += ${affine("bias", BIAS)};
% endif
% if EPILOGUE == "conv" and RESIDUAL:
                value += residual_alpha * vload${VEC}(0, R + (long)row * ldc + ${at});
% endif
% if ACTIVATION:
%   for v in range(VEC):
                { float x = value.s${v}; value.s${v} = ${ACTIVATION}; }
%   endfor
% endif
% if EPILOGUE == "conv":
                if (beta != 0.0f)
                    value += beta * *target;
% endif
                *target = value;
                }
</%def>

// Work-item (tm, tn) (from lid as LANES_N says) owns rows
// (j * TM_THREADS + tm) * VEC + v and columns (j * TN_THREADS + tn) * VEC + v of the tile.
% if REQD_SIZE:
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
% else:
__kernel
% endif
void gemm_tiled(int M, int N, int K,
                __global const float *restrict A, long a_off, int lda, long stride_a,
                __global const float *restrict B, long b_off, int ldb, long stride_b,
                __global float *C, long c_off, int ldc, long stride_c,
                float alpha, float beta,
                __global const float *restrict bias, long bias_off,
                __global const float *restrict scale, long scale_off,
                __global const float *restrict R, long r_off, float residual_alpha,
                int fa_p, long fa_img, int fa_w, int fa_row, int fa_col,
                int fb_p, long fb_img, int fb_w, int fb_row, int fb_col,
                int fc_p, long fc_img,
                int splits, int k_chunk
                ${common.chain_params()})
{
    __local float a_stage[STAGES * STAGE_A] __attribute__((aligned(16)));
    __local float b_stage[STAGES * STAGE_B] __attribute__((aligned(16)));

    const int lid = get_local_id(0);
% if LANES_N:
    const int lane = lid % 32;
    const int run = lid / 32;
    const int tm = (run / (TN_THREADS / ${LANES_N})) * ${32 // LANES_N} + lane / ${LANES_N};
    const int tn = (run % (TN_THREADS / ${LANES_N})) * ${LANES_N} + lane % ${LANES_N};
% else:
    const int tm = lid / TN_THREADS;
    const int tn = lid % TN_THREADS;
% endif
% if GROUP_M > 1:
    // Tile t (row-major over the groups) -> GROUP_M tile rows walked down M first.
    const int tiles_n = get_num_groups(0);
    const int tiles_m = get_num_groups(1);
    const int t = get_group_id(1) * tiles_n + get_group_id(0);
    const int band = t / (${GROUP_M} * tiles_n);
    const int band_rows = min(tiles_m - band * ${GROUP_M}, ${GROUP_M});
    const int in_band = t - band * ${GROUP_M} * tiles_n;
    const int m0 = (band * ${GROUP_M} + in_band % band_rows) * TILE_M;
    const int n0 = (in_band / band_rows) * TILE_N;
% else:
    const int m0 = get_group_id(1) * TILE_M;
    const int n0 = get_group_id(0) * TILE_N;
% endif
    const int batch = get_group_id(2) / splits;
    const int split = get_group_id(2) % splits;
    const int k_begin = split * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);

    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;

    // Global -> local staging: load slot r of this work-item covers the GVEC consecutive
    // elements at linear vector index lid + r * NTHREADS of the tile, walking the operand's
    // contiguous dimension fastest (coalesced). Coordinates are lid-dependent bases plus
    // compile-time constants, so they cost no registers per slot.
% for r, (c, s_) in enumerate(a_slots):
%   if TRANS_A:
    const int a_m${r} = ${c}, a_k${r} = ${s_};
%   else:
    const int a_k${r} = ${c}, a_m${r} = ${s_};
%   endif
% endfor
% for r, (c, s_) in enumerate(b_slots):
%   if TRANS_B:
    const int b_k${r} = ${c}, b_n${r} = ${s_};
%   else:
    const int b_n${r} = ${c}, b_k${r} = ${s_};
%   endif
% endfor
    // Work-groups whose whole tile is inside C load without bounds checks (but for K's end).
    const bool inside = m0 + TILE_M <= M && n0 + TILE_N <= N;
% if TRANS_A:
    __global const float *a_tile = A + (long)k_begin * lda + m0;
    const long a_step = (long)TILE_K * lda;
% elif a_kfold:
    // Folded along K: the tile stays at row m0, K offsets are computed at every load.
    __global const float *a_tile = A + (long)m0 * lda;
    const long a_step = 0;
% else:
    __global const float *a_tile = A + (long)m0 * lda + k_begin;
    const long a_step = TILE_K;
% endif
% if TRANS_B and b_kfold:
    __global const float *b_tile = B + (long)n0 * ldb;
    const long b_step = 0;
% elif TRANS_B:
    __global const float *b_tile = B + (long)n0 * ldb + k_begin;
    const long b_step = TILE_K;
% elif b_nfold:
    // Folded along N: each load slot's column stays the same at every K step, so its offset
    // is computed once (clamped into the matrix: slots past N are masked).
    __global const float *b_tile = B + (long)k_begin * ldb;
    const long b_step = (long)TILE_K * ldb;
%   for u, r in enumerate(distinct_contiguous(b_slots)[1]):
    const long b_col${u} = ${common.attr.fold(FOLD_B, "b", f"min(n0 + b_n{r}, N - 1)")};
%   endfor
% else:
    __global const float *b_tile = B + (long)k_begin * ldb + n0;
    const long b_step = (long)TILE_K * ldb;
% endif

% if not PIPELINE:
%   for r in range(len(a_slots)):
    ${gtype} a_next${r};
%   endfor
%   for r in range(len(b_slots)):
    ${gtype} b_next${r};
%   endfor
% endif

<%def name="fold_offsets(k)">
<%
    nthreads = (TILE_M // WPT_M) * (TILE_N // WPT_N)
    a_firsts = distinct_contiguous(load_slots(TILE_M if TRANS_A else TILE_K, TILE_M * TILE_K, nthreads, GVEC))[1]
    b_firsts = distinct_contiguous(load_slots(TILE_K if TRANS_B else TILE_N, TILE_N * TILE_K, nthreads, GVEC))[1]
%>
% if FOLD_A and not TRANS_A:
%   for u, r in enumerate(a_firsts):
        const long a_kof${u} = ${common.attr.fold(FOLD_A, "a", f"min({k} + a_k{r}, K - 1)")};
%   endfor
% endif
% if FOLD_B and TRANS_B:
%   for u, r in enumerate(b_firsts):
        const long b_kof${u} = ${common.attr.fold(FOLD_B, "b", f"min({k} + b_k{r}, K - 1)")};
%   endfor
% endif
</%def>
<%def name="load_global(k, na, nb)">
<%
    gtype = "float" if GVEC == 1 else f"float{GVEC}"
    def part(name, v):
        return name if GVEC == 1 else f"{name}.s{v}"
    a_addr, b_addr, a_ok, b_ok = tile_addressing(k, TRANS_A, TRANS_B, FOLD_A, FOLD_B, TILE_M, TILE_N, TILE_K, WPT_M, WPT_N, GVEC)
%>
        {
        ${fold_offsets(k)}
        if (inside && ${k} + TILE_K <= k_end) {
% for r in range(na):
            a_next${r} = *(__global const ${gtype} *)(a_tile + ${a_addr(r, 0)});
% endfor
% for r in range(nb):
            b_next${r} = *(__global const ${gtype} *)(b_tile + ${b_addr(r, 0)});
% endfor
        } else {
% for r in range(na):
%   for v in range(GVEC):
            ${part(f"a_next{r}", v)} = (${a_ok(r, v)}) ? a_tile[${a_addr(r, v)}] : 0.0f;
%   endfor
% endfor
% for r in range(nb):
%   for v in range(GVEC):
            ${part(f"b_next{r}", v)} = (${b_ok(r, v)}) ? b_tile[${b_addr(r, v)}] : 0.0f;
%   endfor
% endfor
        }
        }
</%def>
<%def name="store_local(stage, na, nb)">
<%
    gtype = "float" if GVEC == 1 else f"float{GVEC}"
    def part(name, v):
        return name if GVEC == 1 else f"{name}.s{v}"
%>
% for r in range(na):
%   if TRANS_A:
        *(__local ${gtype} *)(a_stage + ${stage} * STAGE_A + a_k${r} * LDS_A + a_m${r}) = a_next${r};
%   else:
%     for v in range(GVEC):
        a_stage[${stage} * STAGE_A + (a_k${r} + ${v}) * LDS_A + a_m${r}] = ${part(f"a_next{r}", v)};
%     endfor
%   endif
% endfor
% for r in range(nb):
%   if TRANS_B:
%     for v in range(GVEC):
        b_stage[${stage} * STAGE_B + (b_k${r} + ${v}) * LDS_B + b_n${r}] = ${part(f"b_next{r}", v)};
%     endfor
%   else:
        *(__local ${gtype} *)(b_stage + ${stage} * STAGE_B + b_k${r} * LDS_B + b_n${r}) = b_next${r};
%   endif
% endfor
</%def>
<%def name="copy_global(k, stage, na, nb)">
<%
    a_addr, b_addr, a_ok, b_ok = tile_addressing(k, TRANS_A, TRANS_B, FOLD_A, FOLD_B, TILE_M, TILE_N, TILE_K, WPT_M, WPT_N, GVEC)
    def a_dst(r, v):
        if TRANS_A:
            return f"a_stage + ({stage}) * STAGE_A + a_k{r} * LDS_A + a_m{r} + {v}"
        return f"a_stage + ({stage}) * STAGE_A + (a_k{r} + {v}) * LDS_A + a_m{r}"
    def b_dst(r, v):
        if TRANS_B:
            return f"b_stage + ({stage}) * STAGE_B + (b_k{r} + {v}) * LDS_B + b_n{r}"
        return f"b_stage + ({stage}) * STAGE_B + b_k{r} * LDS_B + b_n{r} + {v}"
    wide = {1: "copy4", 2: "copy8", 4: "copy16"}[GVEC]
%>
        {
        ${fold_offsets(k)}
        if (inside && ${k} + TILE_K <= k_end) {
% for r in range(na):
%   if TRANS_A:
            ${wide}(${a_dst(r, 0)}, a_tile + ${a_addr(r, 0)});
%   else:
%     for v in range(GVEC):
            copy4(${a_dst(r, v)}, a_tile + ${a_addr(r, v)});
%     endfor
%   endif
% endfor
% for r in range(nb):
%   if TRANS_B:
%     for v in range(GVEC):
            copy4(${b_dst(r, v)}, b_tile + ${b_addr(r, v)});
%     endfor
%   else:
            ${wide}(${b_dst(r, 0)}, b_tile + ${b_addr(r, 0)});
%   endif
% endfor
        } else {
            // Elements outside the matrix or the K chunk are zeros; their source address is
            // the matrix's first element (never read).
% for r in range(na):
%   for v in range(GVEC):
            { const bool ok = ${a_ok(r, v)};
              copy4_masked(${a_dst(r, v)}, ok ? a_tile + ${a_addr(r, v)} : A, ok); }
%   endfor
% endfor
% for r in range(nb):
%   for v in range(GVEC):
            { const bool ok = ${b_ok(r, v)};
              copy4_masked(${b_dst(r, v)}, ok ? b_tile + ${b_addr(r, v)} : B, ok); }
%   endfor
% endfor
        }
        }
</%def>

    float acc[WPT_M][WPT_N];
% for i in range(WPT_M):
%   for j in range(WPT_N):
    acc[${i}][${j}] = 0.0f;
%   endfor
% endfor

<%def name="multiply(stage)">
<%
    vtype = "float" if VEC == 1 else f"float{VEC}"
    def comp(v):
        return f".s{v}" if VEC > 1 else ""
%>
        __local const float *a_local = a_stage + (${stage}) * STAGE_A + tm * VEC;
        __local const float *b_local = b_stage + (${stage}) * STAGE_B + tn * VEC;
        #pragma unroll
        for (int kk = 0; kk < TILE_K; ++kk) {
% for j in range(WPT_M // VEC):
            const ${vtype} a_frag${j} = *(__local const ${vtype} *)(a_local + kk * LDS_A + ${j * VEC} * TM_THREADS);
% endfor
% for j in range(WPT_N // VEC):
            const ${vtype} b_frag${j} = *(__local const ${vtype} *)(b_local + kk * LDS_B + ${j * VEC} * TN_THREADS);
% endfor
% for i in range(WPT_M):
%   for j in range(WPT_N):
            acc[${i}][${j}] = fma(a_frag${i // VEC}${comp(i % VEC)}, b_frag${j // VEC}${comp(j % VEC)}, acc[${i}][${j}]);
%   endfor
% endfor
        }
</%def>
% if PIPELINE:
    // Slices s + 1 .. s + PIPELINE - 1 are in flight while slice s is multiplied. Copy
    // groups are committed once per slice (empty past the chunk's end), so that waiting
    // until PIPELINE - 2 groups remain pending means slice s has landed.
    int k_copy = k_begin;
%   for s in range(PIPELINE - 1):
    if (k_copy < k_end) {
        ${copy_global("k_copy", s, len(a_slots), len(b_slots))}
        a_tile += a_step;
        b_tile += b_step;
    }
    k_copy += TILE_K;
    COPY_COMMIT();
%   endfor
    int stage = 0;
    int copy_stage = ${PIPELINE - 1};
    for (int k = k_begin; k < k_end; k += TILE_K) {
        COPY_WAIT(${PIPELINE - 2});
        // Publishes slice s to every work-item, and frees the stage multiplied last step,
        // which the copies issued next refill.
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k_copy < k_end) {
            ${copy_global("k_copy", "copy_stage", len(a_slots), len(b_slots))}
            a_tile += a_step;
            b_tile += b_step;
        }
        k_copy += TILE_K;
        COPY_COMMIT();
        ${multiply("stage")}
        stage = stage == ${PIPELINE - 1} ? 0 : stage + 1;
        copy_stage = copy_stage == ${PIPELINE - 1} ? 0 : copy_stage + 1;
    }
% else:
    int k = k_begin;
    ${load_global("k", len(a_slots), len(b_slots))}
    ${store_local(0, len(a_slots), len(b_slots))}
    barrier(CLK_LOCAL_MEM_FENCE);

    int stage = 0;
    for (; k < k_end; ) {
        const int k_next = k + TILE_K;
%   if DOUBLE_BUFFER:
        if (k_next < k_end) {
            a_tile += a_step;
            b_tile += b_step;
            ${load_global("k_next", len(a_slots), len(b_slots))}
        }
%   endif
        ${multiply("stage")}
%   if DOUBLE_BUFFER:
        if (k_next < k_end) {
            ${store_local("(stage ^ 1)", len(a_slots), len(b_slots))}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        stage ^= 1;
        k = k_next;
%   else:
        k = k_next;
        if (k < k_end) {
            a_tile += a_step;
            b_tile += b_step;
            ${load_global("k", len(a_slots), len(b_slots))}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k < k_end) {
            ${store_local(0, len(a_slots), len(b_slots))}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
%   endif
    }
% endif

% if common.attr.hoists_chain(CHAIN, CHAIN_CHANNEL, EPILOGUE) and not SPLIT_K:
    // The chain's scale and shift of each register-block row, once per work item (the loads
    // and the square root would otherwise run for every stored element).
%   for i in range(WPT_M):
    float ep_scale${i}, ep_shift${i};
    {
        const int chain_row = min(m0 + (${i // VEC} * TM_THREADS + tm) * VEC + ${i % VEC}, M - 1);
        ${links.apply_chain("chain_row", "chain_row", CHAIN, "row_scale", "row_shift")}
        ep_scale${i} = row_scale;
        ep_shift${i} = row_shift;
    }
%   endfor
% endif
% if SPLIT_K:
    // Raw partial sums: workspace C is [batch * splits][M][N], dense.
    C += (long)get_group_id(2) * M * N;
% else:
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
% endif
% if FOLD_C and not SPLIT_K:
    // Folded C: columns outer, so that each column's offset (a division) is computed once.
%   if CVEC > 1:
    if (inside) {
        // Whole tile inside C, P a multiple of VEC: VEC consecutive columns per store.
%     for jc in range(WPT_N // VEC):
        {
            const int col = n0 + (${jc} * TN_THREADS + tn) * VEC;
            const long c_at = ${common.attr.fold(FOLD_C, "c", "col")};
%       for i in range(WPT_M):
            {
                const int row = m0 + (${i // VEC} * TM_THREADS + tm) * VEC + ${i % VEC};
                ${store_vector(i, jc, "c_at")}
            }
%       endfor
        }
%     endfor
        return;
    }
%   endif
%   for j in range(WPT_N):
    {
        const int col = n0 + (${j // VEC} * TN_THREADS + tn) * VEC + ${j % VEC};
        if (col < N) {
            const long c_at = ${common.attr.fold(FOLD_C, "c", "col")};
%     for i in range(WPT_M):
            {
                const int row = m0 + (${i // VEC} * TM_THREADS + tm) * VEC + ${i % VEC};
                if (row < M)
                    ${common.epilogue(f"acc[{i}][{j}]", "row", "col", "(long)row * ldc + c_at", i)}
            }
%     endfor
        }
    }
%   endfor
% else:
%   if CVEC > 1 and not SPLIT_K:
    if (inside) {
        // Whole tile inside C, rows aligned: VEC consecutive columns per store.
%     for i in range(WPT_M):
        {
            const int row = m0 + (${i // VEC} * TM_THREADS + tm) * VEC + ${i % VEC};
%       for jc in range(WPT_N // VEC):
            {
                const int col = n0 + (${jc} * TN_THREADS + tn) * VEC;
                ${store_vector(i, jc, "col")}
            }
%       endfor
        }
%     endfor
        return;
    }
%   endif
%   for i in range(WPT_M):
    {
        const int row = m0 + (${i // VEC} * TM_THREADS + tm) * VEC + ${i % VEC};
        if (row < M) {
%     for j in range(WPT_N):
            {
                const int col = n0 + (${j // VEC} * TN_THREADS + tn) * VEC + ${j % VEC};
                if (col < N) {
%       if SPLIT_K:
                    C[(long)row * N + col] = acc[${i}][${j}];
%       else:
                    ${common.epilogue(f"acc[{i}][{j}]", "row", "col", "(long)row * ldc + col", i)}
%       endif
                }
            }
%     endfor
        }
    }
%   endfor
% endif
}

<%include file="gemm_splitk.cl.mako"/>
