## gemm_splitk_reduce: the second pass of a GEMM split along K (the "splitk" solver of
## ops/gemm.py): adds gemm_tiled's raw partial sums and applies the epilogue. Rendered into
## gemm_tiled's program by gemm_tiled.cl.mako's include, with its template parameters.
<%namespace name="common" file="gemm_common.cl.mako"/>

// Adds the split-K partial sums of gemm_tiled and applies the epilogue; one work-item per C
// element, columns fastest. Global size (N rounded up, M, batch).
__kernel void gemm_splitk_reduce(int M, int N, int splits,
                                 __global const float *restrict partial,
                                 __global float *C, long c_off, int ldc, long stride_c,
                                 float alpha, float beta,
                                 __global const float *restrict bias, long bias_off,
                                 __global const float *restrict scale, long scale_off,
                                 __global const float *restrict R, long r_off,
                                 float residual_alpha, int fc_p, long fc_img
                                 ${common.chain_params()})
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const int batch = get_global_id(2);
    if (col >= N || row >= M)
        return;
    const long plane = (long)M * N;
    partial += (long)batch * splits * plane + (long)row * N + col;
    // Four independent sums: their loads are in flight together (long splits of filter
    // gradients run into the hundreds).
    float sum0 = 0.0f, sum1 = 0.0f, sum2 = 0.0f, sum3 = 0.0f;
    int s = 0;
    for (; s + 4 <= splits; s += 4) {
        sum0 += partial[s * plane];
        sum1 += partial[(s + 1) * plane];
        sum2 += partial[(s + 2) * plane];
        sum3 += partial[(s + 3) * plane];
    }
    for (; s < splits; ++s)
        sum0 += partial[s * plane];
    const float sum = (sum0 + sum1) + (sum2 + sum3);
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
    ${common.epilogue("sum", "row", "col", f"(long)row * ldc + {common.attr.fold(FOLD_C, 'c', 'col')}")}
}
