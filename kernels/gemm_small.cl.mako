## gemm_small: one work-item per element of C, for problems too small to fill a device with
## tiles. The "small" solver of ops/gemm.py.
<%namespace name="common" file="gemm_common.cl.mako"/>
${common.header()}
// gemm_small only:
//   SMALL_M, SMALL_N  work-group shape; one work-item per C element, K walked from global memory
// 16-bit A and B (AB_TYPE) are converted to float32 as they are read: the portable path of
// float16 / bfloat16 GEMM. One work-item per C element; global size (N rounded up to SMALL_N, M rounded up to
// SMALL_M, batch). For problems too small to fill a device with tiles.
__kernel __attribute__((reqd_work_group_size(${SMALL_N}, ${SMALL_M}, 1)))
void gemm_small(int M, int N, int K,
                __global const AB_T *restrict A, long a_off, int lda, long stride_a,
                __global const AB_T *restrict B, long b_off, int ldb, long stride_b,
                __global C_T *C, long c_off, int ldc, long stride_c,
                float alpha, float beta,
                __global const C_T *restrict bias, long bias_off,
                __global const float *restrict scale, long scale_off,
                __global const float *restrict R, long r_off, float residual_alpha,
                int fa_p, long fa_img, int fa_w, int fa_row, int fa_col,
                int fb_p, long fb_img, int fb_w, int fb_row, int fb_col,
                int fc_p, long fc_img
                ${common.chain_params()})
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const int batch = get_global_id(2);
    if (col >= N || row >= M)
        return;
    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
% if TRANS_A:
    __global const AB_T *a_row = A + row;
    const int a_step = lda;
% else:
    __global const AB_T *a_row = A + (long)row * lda;
    const int a_step = 1;
% endif
% if TRANS_B:
    __global const AB_T *b_col = B + (long)col * ldb;
    const int b_step = 1;
% else:
    __global const AB_T *b_col = B + ${common.attr.fold(FOLD_B, "b", "col")};
    const int b_step = ldb;
% endif
<%
    a_at = (lambda k: common.attr.fold(FOLD_A, "a", k)) if FOLD_A else (lambda k: f"(long){k} * a_step")
    b_at = (lambda k: common.attr.fold(FOLD_B, "b", k)) if FOLD_B and TRANS_B else (lambda k: f"(long){k} * b_step")
%>
    float sum = 0.0f;
    for (int k = 0; k < K; ++k)
        sum = fma(LOAD_AB(a_row, ${a_at("k")}), LOAD_AB(b_col, ${b_at("k")}), sum);
    ${common.epilogue("sum", "row", "col", f"(long)row * ldc + {common.attr.fold(FOLD_C, 'c', 'col')}")}
}
