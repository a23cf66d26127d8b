## gemm_splitk: how a GEMM split along K (the "splitk" solver of ops/gemm.py, and the mma and gemv
## kernels' splits) adds its chunks' raw partial sums and applies the epilogue. Rendered into
## the splitting kernel's program by its include, with its template parameters:
##   gemm_splitk_reduce  a second launch, one work-item per C element;
##   last_group_fold()   (SPLIT_FOLD 1) the same sums in the splitting kernel itself, by the
##                       work-group of each tile that finishes its chunk last: one launch.
## Both add the chunks in the same order (split_sum), so the two give the same bits.
<%namespace name="common" file="gemm_common.cl.mako"/>

<%def name="split_sum(partial, plane)">
    // Four independent sums: their loads are in flight together (long splits of filter
    // gradients run into the hundreds). The same order in both forms of the fold.
    float sum0 = 0.0f, sum1 = 0.0f, sum2 = 0.0f, sum3 = 0.0f;
    int s = 0;
    for (; s + 4 <= splits; s += 4) {
        sum0 += ${f"{partial}[s * {plane}]"};
        sum1 += ${f"{partial}[(s + 1) * {plane}]"};
        sum2 += ${f"{partial}[(s + 2) * {plane}]"};
        sum3 += ${f"{partial}[(s + 3) * {plane}]"};
    }
    for (; s < splits; ++s)
        sum0 += ${f"{partial}[s * {plane}]"};
    const float sum = (sum0 + sum1) + (sum2 + sum3);
</%def>

## The tail of a splitting kernel with SPLIT_FOLD, after its raw partial sums are written.
## In scope: M, N, splits, batch, lid, m0, n0, the kernel's epilogue parameters (bias, scale,
## R, r_off, residual_alpha, chain), ``part``: this work-group's partial tile's workspace plane
## ([batch * splits][M][N]); the kernel parameters of split_fold_params(). C's own arguments
## come from there: the kernel's C arguments name the workspace.
<%def name="split_fold_params()">
% if SPLIT_FOLD:
    , __global float *c_final, long cf_off, int cf_ld, long cf_stride, float cf_alpha,
    float cf_beta, int cf_fold_p, long cf_fold_img, __global volatile int *tile_done
% endif
</%def>

<%def name="last_group_fold(nthreads, tile_m, tile_n)">
    // At the kernel's outermost scope, where OpenCL C wants a __local declaration.
    __local int is_last;
    {
        // Release: this group's partial sums reach global memory before it counts itself done
        // for its tile (every split of a tile has the same group ids 0 and 1).
        ${DEVICE_FENCE}
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (lid == 0) {
            volatile __global int *done = tile_done
                + ((long)batch * get_num_groups(1) + get_group_id(1)) * get_num_groups(0)
                + get_group_id(0);
            is_last = atomic_inc(done) == splits - 1;
            // Zero again for the next launch (nothing else counts this tile any more).
            if (is_last)
                *done = 0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!is_last)
            return;
        // Acquire: the other groups' partial sums, read past any cached copy (volatile).
        ${DEVICE_FENCE}
        __global const volatile float *first = part - (long)(get_group_id(2) % splits) * M * N;
        __global const float *r_base = R + r_off + batch * cf_stride;
        {
            // The epilogue's names for C's own arguments.
            __global float *C = c_final + cf_off + batch * cf_stride;
            __global const float *R = r_base;
            const float alpha = cf_alpha, beta = cf_beta;
            const int fc_p = cf_fold_p;
            const long fc_img = cf_fold_img;
            const long plane = (long)M * N;
            for (int e = lid; e < (${tile_m}) * (${tile_n}); e += ${nthreads}) {
                const int row = m0 + e / (${tile_n});
                const int col = n0 + e % (${tile_n});
                if (row < M && col < N) {
                    __global const volatile float *partial = first + (long)row * N + col;
${split_sum("partial", "plane")}
                    ${common.epilogue("sum", "row", "col", f"(long)row * cf_ld + {common.attr.fold(FOLD_C, 'c', 'col')}")}
                }
            }
        }
    }
</%def>

// Adds the split-K partial sums of the splitting kernel and applies the epilogue; one
// work-item per C element, columns fastest. Global size (N rounded up, M, batch).
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
${split_sum("partial", "plane")}
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
    ${common.epilogue("sum", "row", "col", f"(long)row * ldc + {common.attr.fold(FOLD_C, 'c', 'col')}")}
}
