## gemm_splitk_reduce (and gemm_splitk_reduce4, N a multiple of 4): the second pass of a GEMM
## split along K (the "splitk" solver of ops/gemm.py, and the mma and gemv kernels' splits):
## adds the raw partial sums and applies the epilogue. Rendered into the splitting kernel's
## program by its include, with its template parameters.
<%namespace name="common" file="gemm_common.cl.mako"/>

## The reduction kernels' parameters: sizes and splits, the partial sums, C with alpha and beta,
## the epilogue's operands and C's fold.
<%def name="reduce_params()">int M, int N, int splits,
        __global const float *restrict partial,
        __global float *C, long c_off, int ldc, long stride_c,
        float alpha, float beta,
        __global const float *restrict bias, long bias_off,
        __global const float *restrict scale, long scale_off,
        __global const float *restrict R, long r_off,
        float residual_alpha, int fc_p, long fc_img
        ${common.chain_params()}</%def>

## ``sum`` (of type ``t``: float or float4) = the ``splits`` partial sums at ``p``, ``plane``
## apart, in four independent sums whose loads are in flight together (long splits of filter
## gradients run into the hundreds); one order for both kernels.
<%def name="split_sum(t, p, plane)">
    ${t} sum0 = (${t})(0.0f), sum1 = (${t})(0.0f), sum2 = (${t})(0.0f), sum3 = (${t})(0.0f);
    int s = 0;
    for (; s + 4 <= splits; s += 4) {
        sum0 += ${p}[s * ${plane}];
        sum1 += ${p}[(s + 1) * ${plane}];
        sum2 += ${p}[(s + 2) * ${plane}];
        sum3 += ${p}[(s + 3) * ${plane}];
    }
    for (; s < splits; ++s)
        sum0 += ${p}[s * ${plane}];
    const ${t} sum = (sum0 + sum1) + (sum2 + sum3);
</%def>

// Adds the split-K partial sums of the splitting kernel and applies the epilogue; one work-item per C
// element, columns fastest. Global size (N rounded up, M, batch).
__kernel void gemm_splitk_reduce(${reduce_params()})
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const int batch = get_global_id(2);
    if (col >= N || row >= M)
        return;
    const long plane = (long)M * N;
    partial += (long)batch * splits * plane + (long)row * N + col;
${split_sum("float", "partial", "plane")}
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
    ${common.epilogue("sum", "row", "col", f"(long)row * ldc + {common.attr.fold(FOLD_C, 'c', 'col')}")}
}

// gemm_splitk_reduce for N a multiple of 4: a work-item per four adjacent C elements of a row,
// float4 loads of the partial sums (the workspace is dense, so its rows start on 16-byte
// boundaries), the sums in gemm_splitk_reduce's order, the epilogue element by element.
// Global size (N / 4 rounded up, M, batch). One element per item kept 16 us of the H200 on a
// 768 x 768 or 3072 x 768 filter gradient split 4-5 (cuBLAS's reduce: 6 us).
__kernel void gemm_splitk_reduce4(${reduce_params()})
{
    const int col0 = 4 * get_global_id(0);
    const int row = get_global_id(1);
    const int batch = get_global_id(2);
    if (col0 >= N || row >= M)
        return;
    const long plane = (long)M * N;
    __global const float4 *p = (__global const float4 *)(partial
        + (long)batch * splits * plane + (long)row * N + col0);
    const long plane4 = plane / 4;
${split_sum("float4", "p", "plane4")}
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
% for c, comp in enumerate("xyzw"):
    {
        const int col = col0 + ${c};
        const float element = sum.${comp};
        ${common.epilogue("element", "row", "col", f"(long)row * ldc + {common.attr.fold(FOLD_C, 'c', 'col')}")}
    }
% endfor
}
