## gemm_gemv: a GEMM with M == 1 or N == 1, a matrix-vector product (the "gemv" solver of
## ops/gemm.py). The tiled kernels give such a product one row or column of output per tile, so
## most of each tile's work is thrown away and few work-groups run; here every work-item reads
## its share of the matrix once, which is what bounds a matrix-vector product (its bytes).
<%namespace name="common" file="gemm_common.cl.mako"/>
${common.header()}
// gemm_gemv only. The product is NV vectors of `outputs` values, y_v[i] = sum_k W(i, k) x_v[k]:
//   W_IS_A   1: W = op(A), x_v = op(B)'s column v, y_v C's column v (outputs = M, NV = N);
//            0: W = op(B)^T, x_v = op(A)'s row v, y_v C's row v (outputs = N, NV = M)
//   NV       the vectors (1 to 8), each element of W read once for all of them
//   LANES, GROUP  the work-group, LANES x GROUP work-items (GROUP a power of two). Where W's
//            rows (k) are contiguous, each output has LANES work-items walking its row
//            LANES (x VEC) elements apart, summed across the lanes in local memory; GROUP
//            outputs per work-group. Where W's columns (i) are contiguous, each work-item
//            holds VEC consecutive outputs and walks k GROUP apart (coalesced along i), the
//            GROUP partial sums added in local memory
//   VEC      4: W read as aligned float4: the host checks that its offset, leading dimension
//            and batch stride and the K chunks are multiples of 4, float32 operands and no
//            fold; 1: element by element (any layout, folds, 16-bit storage)
//   XVEC     with VEC 4 along W's rows: 4 where each x_v is contiguous along k and aligned as
//            W (its own row of B^T or A, or one dense vector), read as float4 too; 1: the x_v
//            read element by element (the columns of a K x NV matrix)
//   SPLIT_K  1: each work-group sums one K chunk (group id 2 = batch * splits + split) into
//            the workspace ([batch * splits][M][N]); gemm_splitk_reduce adds the chunks and
//            applies the epilogue, as for gemm_tiled. 0: the epilogue is applied here
<%
    # Which of W's dimensions is contiguous: k (rows) or i (columns).
    ROWS = (W_IS_A and not TRANS_A) or (not W_IS_A and TRANS_B)
    fold = common.attr.fold
    if W_IS_A:
        w_base, x_base = "A", "B"
        # W(i, k) = op(A)[i, k]; x_v[k] = op(B)[k, v].
        w_at = (lambda i, k: f"(long)({i}) * lda + {fold(FOLD_A, 'a', k)}") if ROWS else \
               (lambda i, k: f"(long)({k}) * lda + ({i})")
        x_at = (lambda v, k: f"(long)({v}) * ldb + {fold(FOLD_B, 'b', k)}") if TRANS_B else \
               (lambda v, k: f"(long)({k}) * ldb + {fold(FOLD_B, 'b', v)}")
        # x_v's start where it is contiguous along k (XVEC 4: TRANS_B, or one vector of unit
        # stride).
        x_row = (lambda v: f"(long)({v}) * ldb") if TRANS_B else (lambda v: "0")
    else:
        w_base, x_base = "B", "A"
        # W(i, k) = op(B)[k, i]; x_v[k] = op(A)[v, k].
        w_at = (lambda i, k: f"(long)({i}) * ldb + {fold(FOLD_B, 'b', k)}") if ROWS else \
               (lambda i, k: f"(long)({k}) * ldb + {fold(FOLD_B, 'b', i)}")
        x_at = (lambda v, k: f"(long)({k}) * lda + ({v})") if TRANS_A else \
               (lambda v, k: f"(long)({v}) * lda + {fold(FOLD_A, 'a', k)}")
        x_row = (lambda v: "0") if TRANS_A else (lambda v: f"(long)({v}) * lda")
    # Output i of vector v in C: (row, column, element offset), and in a split's workspace.
    if W_IS_A:
        out_rc = lambda i, v: (i, v, f"(long)({i}) * ldc + {fold(FOLD_C, 'c', v)}")
        plane_at = lambda i, v: f"(long)({i}) * N + ({v})"
    else:
        out_rc = lambda i, v: (v, i, f"(long)({v}) * ldc + {fold(FOLD_C, 'c', i)}")
        plane_at = lambda i, v: f"(long)({v}) * N + ({i})"
    assert VEC == 1 or (AB_TYPE == "float" and not (FOLD_A or FOLD_B or FOLD_C))
%>

__kernel __attribute__((reqd_work_group_size(${LANES}, ${GROUP}, 1)))
void gemm_gemv(int M, int N, int K,
               __global const AB_T *restrict A, long a_off, int lda, long stride_a,
               __global const AB_T *restrict B, long b_off, int ldb, long stride_b,
               __global C_T *C, long c_off, int ldc, long stride_c,
               float alpha, float beta,
               __global const C_T *restrict bias, long bias_off,
               __global const float *restrict scale, long scale_off,
               __global const float *restrict R, long r_off, float residual_alpha,
               int fa_p, long fa_img, int fa_w, int fa_row, int fa_col,
               int fb_p, long fb_img, int fb_w, int fb_row, int fb_col,
               int fc_p, long fc_img,
               int splits, int k_chunk
               ${common.chain_params()})
{
    const int outputs = ${"M" if W_IS_A else "N"};
% if SPLIT_K:
    const int split = get_group_id(2) % splits;
    const int batch = get_group_id(2) / splits;
    const int k0 = split * k_chunk;
    const int k1 = min(K, k0 + k_chunk);
% else:
    const int batch = get_group_id(2);
    const int k0 = 0;
    const int k1 = K;
% endif
    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;
% if not SPLIT_K:
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
% endif
    __global const AB_T *W = ${w_base};
    __global const AB_T *X = ${x_base};
% if ROWS:
    // W's rows contiguous: LANES work-items per output, GROUP outputs per work-group. The
    // loops over the vectors are left to the compiler (constant trip counts): one copy of the
    // epilogue, not one per vector.
    __local float part[${GROUP}][${NV}][${LANES}];
    const int lane = get_local_id(0);
    const int slot = get_local_id(1);
    const int i = get_group_id(1) * ${GROUP} + slot;
    float sum[${NV}];
    for (int v = 0; v < ${NV}; ++v)
        sum[v] = 0.0f;
    if (i < outputs) {
%   if VEC == 4:
        __global const float *w = W + ${w_at("i", "0")};
        // k0 and the row starts are multiples of 4 (the host checks): aligned float4 reads.
        const int kv = k0 + ((k1 - k0) & ~3);
        for (int k = k0 + 4 * lane; k < kv; k += 4 * ${LANES}) {
            const float4 a = *(__global const float4 *)(w + k);
            for (int v = 0; v < ${NV}; ++v) {
%     if XVEC == 4:
                const float4 b = *(__global const float4 *)(X + ${x_row("v")} + k);
%     else:
                const float4 b = (float4)(X[${x_at("v", "k")}], X[${x_at("v", "k + 1")}],
                                          X[${x_at("v", "k + 2")}], X[${x_at("v", "k + 3")}]);
%     endif
                sum[v] = fma(a.x, b.x, fma(a.y, b.y, fma(a.z, b.z, fma(a.w, b.w, sum[v]))));
            }
        }
        for (int k = kv + lane; k < k1; k += ${LANES}) {
            const float a = w[k];
            for (int v = 0; v < ${NV}; ++v)
                sum[v] = fma(a, X[${x_at("v", "k")}], sum[v]);
        }
%   else:
        for (int k = k0 + lane; k < k1; k += ${LANES}) {
            const float a = LOAD_AB(W, ${w_at("i", "k")});
            for (int v = 0; v < ${NV}; ++v)
                sum[v] = fma(a, LOAD_AB(X, ${x_at("v", "k")}), sum[v]);
        }
%   endif
    }
    for (int v = 0; v < ${NV}; ++v)
        part[slot][v][lane] = sum[v];
    barrier(CLK_LOCAL_MEM_FENCE);
%   if LANES & (LANES - 1):
    // LANES not a power of two: the first lane adds the others.
    if (lane == 0)
        for (int l = 1; l < ${LANES}; ++l)
            for (int v = 0; v < ${NV}; ++v)
                sum[v] += part[slot][v][l];
%   else:
    for (int s = ${LANES // 2}; s > 0; s >>= 1) {
        if (lane < s)
            for (int v = 0; v < ${NV}; ++v)
                part[slot][v][lane] += part[slot][v][lane + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int v = 0; v < ${NV}; ++v)
        sum[v] = part[slot][v][0];
%   endif
    if (lane == 0 && i < outputs) {
        for (int v = 0; v < ${NV}; ++v) {
            const float value = sum[v];
<%          row, col, index = out_rc("i", "v") %>
            ${store("value", row, col, index, plane_at("i", "v"))}
        }
    }
% else:
    // W's columns contiguous: VEC outputs per work-item, GROUP work-items down k.
    __local float part[${GROUP}][${LANES * VEC}];
    const int lx = get_local_id(0);
    const int ky = get_local_id(1);
    const int i0 = (get_group_id(0) * ${LANES} + lx) * ${VEC};
    float acc[${VEC}][${NV}];
    for (int e = 0; e < ${VEC}; ++e)
        for (int v = 0; v < ${NV}; ++v)
            acc[e][v] = 0.0f;
%   if VEC == 4:
    if (i0 + 4 <= outputs) {
        for (int k = k0 + ky; k < k1; k += ${GROUP}) {
            const float4 a = *(__global const float4 *)(W + ${w_at("i0", "k")});
            for (int v = 0; v < ${NV}; ++v) {
                const float b = X[${x_at("v", "k")}];
                acc[0][v] = fma(a.x, b, acc[0][v]);
                acc[1][v] = fma(a.y, b, acc[1][v]);
                acc[2][v] = fma(a.z, b, acc[2][v]);
                acc[3][v] = fma(a.w, b, acc[3][v]);
            }
        }
    } else
%   endif
    if (i0 < outputs) {
        for (int k = k0 + ky; k < k1; k += ${GROUP})
            for (int e = 0; e < ${VEC}; ++e)
                if (i0 + e < outputs) {
                    const float a = LOAD_AB(W, ${w_at("i0 + e", "k")});
                    for (int v = 0; v < ${NV}; ++v)
                        acc[e][v] = fma(a, LOAD_AB(X, ${x_at("v", "k")}), acc[e][v]);
                }
    }
    // The GROUP partial sums of each vector in turn through the same local rows.
    for (int v = 0; v < ${NV}; ++v) {
        if (v)
            barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = 0; e < ${VEC}; ++e)
            part[ky][lx * ${VEC} + e] = acc[e][v];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = ${GROUP // 2}; s > 0; s >>= 1) {
            if (ky < s)
                for (int e = 0; e < ${VEC}; ++e)
                    part[ky][lx * ${VEC} + e] += part[ky + s][lx * ${VEC} + e];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (ky == 0)
            for (int e = 0; e < ${VEC}; ++e) {
                const int i = i0 + e;
                if (i < outputs) {
                    const float value = part[0][lx * ${VEC} + e];
<%                  row, col, index = out_rc("i", "v") %>
                    ${store("value", row, col, index, plane_at("i", "v"))}
                }
            }
    }
% endif
}

<%def name="store(value, row, col, index, plane)">
% if SPLIT_K:
            // Raw partial sums: [batch * splits][M][N], dense.
            C[(long)get_group_id(2) * M * N + ${plane}] = ${value};
% else:
            ${common.epilogue(value, row, col, index)}
% endif
</%def>

<%include file="gemm_splitk.cl.mako"/>
