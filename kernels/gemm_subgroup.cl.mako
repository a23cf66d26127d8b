## gemm_subgroup: for devices with cl_intel_subgroups and cl_intel_required_subgroup_size, a
## register block per work-item, A broadcast across the subgroup with shuffles instead of local
## memory. The "subgroup" solver of ops/gemm.py.
<%namespace name="common" file="gemm_common.cl.mako"/>
${common.header()}
// gemm_subgroup only:
//   SG_SIZE       subgroup size the kernel requires (intel_reqd_sub_group_size): 8 or 16. Each
//                 subgroup computes an SG_WPT_M x (SG_SIZE * SG_WPT_N) block of C, lane l the
//                 columns l, l + SG_SIZE, ... of it (SG_WPT_M x SG_WPT_N registers); K is walked
//                 SG_SIZE at a time, lane l holding op(A)[row][k + l] of every row, broadcast
//                 to the subgroup with intel_sub_group_shuffle (no local memory, no barrier)
//   SG_WPT_M, SG_WPT_N  rows, and column groups of SG_SIZE, per subgroup
//   SG_GROUPS     subgroups per work-group, stacked along M (work-group SG_SIZE x SG_GROUPS)
//   BLOCK_A, BLOCK_B  1: blocks wholly inside the matrices read A's rows (not TRANS_A, not
//                 folded) or B's rows (not TRANS_B, not folded) with intel_sub_group_block_read;
//                 needs leading dimension, offset and batch stride multiples of 4 (the host
//                 checks). 0: plain loads
<%
    SG = SG_SIZE
    WM = SG_WPT_M
    WN = SG_WPT_N
    def a_at(row, k):
        if TRANS_A:
            return f"(long)({k}) * lda + ({row})"
        if FOLD_A:
            return f"(long)({row}) * lda + a_kof"
        return f"(long)({row}) * lda + ({k})"
    def b_at(k, j):
        col = f"n0 + {j * SG} + lane"
        if TRANS_B:
            kof = common.attr.fold(FOLD_B, "b", k) if FOLD_B else f"({k})"
            return f"(long)({col}) * ldb + {kof}"
        if FOLD_B:
            return f"(long)({k}) * ldb + b_col{j}"
        return f"(long)({k}) * ldb + {col}"
%>
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
// Subgroup s of work-group (gx, gy) computes rows m0 .. m0 + SG_WPT_M - 1,
// m0 = (gy * SG_GROUPS + s) * SG_WPT_M, and columns n0 + j * SG_SIZE + lane, n0 = gx * SG_SIZE *
// SG_WPT_N.
// Global size (ceil(N / (SG_SIZE * SG_WPT_N)) * SG_SIZE, ceil(M / SG_WPT_M) rounded up to
// SG_GROUPS, batch). Lanes past N or M still take part in the shuffles; only stores are masked.
__kernel __attribute__((intel_reqd_sub_group_size(${SG})))
__attribute__((reqd_work_group_size(${SG}, ${SG_GROUPS}, 1)))
void gemm_subgroup(int M, int N, int K,
                   __global const float *restrict A, long a_off, int lda, long stride_a,
                   __global const float *restrict B, long b_off, int ldb, long stride_b,
                   __global float *C, long c_off, int ldc, long stride_c,
                   float alpha, float beta,
                   __global const float *restrict bias, long bias_off,
                   __global const float *restrict scale, long scale_off,
                   __global const float *restrict R, long r_off, float residual_alpha,
                   int fa_p, long fa_img, int fa_w, int fa_row, int fa_col,
                   int fb_p, long fb_img, int fb_w, int fb_row, int fb_col,
                   int fc_p, long fc_img
                   ${common.chain_params()})
{
    // Lane and subgroup as the shuffles and block reads number them (whatever the mapping of
    // local ids to subgroups).
    const int lane = get_sub_group_local_id();
    const int m0 = (get_group_id(1) * ${SG_GROUPS} + get_sub_group_id()) * ${WM};
    const int n0 = get_group_id(0) * ${SG * WN};
    const int batch = get_global_id(2);
    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;
    C += c_off + batch * stride_c;
    R += r_off + batch * stride_c;
    // Uniform over the subgroup: blocks wholly inside load without masks.
    const bool rows_inside = m0 + ${WM} <= M;
    const bool cols_inside = n0 + ${SG * WN} <= N;
% if FOLD_B and not TRANS_B:
    // Folded along N: each column's offset is the same at every K step (clamped into the
    // matrix; columns past N are masked).
%   for j in range(WN):
    const long b_col${j} = ${common.attr.fold(FOLD_B, "b", f"min(n0 + {j * SG} + lane, N - 1)")};
%   endfor
% endif

    float acc[${WM}][${WN}];
% for i in range(WM):
%   for j in range(WN):
    acc[${i}][${j}] = 0.0f;
%   endfor
% endfor

    for (int k0 = 0; k0 < K; k0 += ${SG}) {
        // Lane l holds op(A)[m0 + i][k0 + l] of every row i.
        const int ka = k0 + lane;
% if FOLD_A:
        const long a_kof = ${common.attr.fold(FOLD_A, "a", "min(ka, K - 1)")};
% endif
        const bool k_inside = k0 + ${SG} <= K;
% for i in range(WM):
        float a${i};
% endfor
        if (rows_inside && k_inside) {
% for i in range(WM):
%   if BLOCK_A:
            a${i} = as_float(intel_sub_group_block_read((const __global uint *)(A + (long)(m0 + ${i}) * lda + k0)));
%   else:
            a${i} = A[${a_at(f"m0 + {i}", "ka")}];
%   endif
% endfor
        } else {
% for i in range(WM):
            a${i} = (m0 + ${i} < M && ka < K) ? A[${a_at(f"m0 + {i}", "ka")}] : 0.0f;
% endfor
        }
% for masked in (False, True):
%   if not masked:
        if (cols_inside && k_inside) {
%   else:
        } else {
%   endif
            #pragma unroll
            for (int kk = 0; kk < ${SG}; ++kk) {
                const int k = k0 + kk;
%   for j in range(WN):
%     if masked:
                const float b${j} = (n0 + ${j * SG} + lane < N && k < K) ? B[${b_at("k", j)}] : 0.0f;
%     elif BLOCK_B:
                const float b${j} = as_float(intel_sub_group_block_read((const __global uint *)(B + (long)k * ldb + n0 + ${j * SG})));
%     else:
                const float b${j} = B[${b_at("k", j)}];
%     endif
%   endfor
%   for i in range(WM):
                {
                    const float a = intel_sub_group_shuffle(a${i}, kk);
%     for j in range(WN):
                    acc[${i}][${j}] = fma(a, b${j}, acc[${i}][${j}]);
%     endfor
                }
%   endfor
            }
% endfor
        }
    }

% for j in range(WN):
    {
        const int col = n0 + ${j * SG} + lane;
        if (col < N) {
            const long c_at = ${common.attr.fold(FOLD_C, "c", "col")};
%   for i in range(WM):
            {
                const int row = m0 + ${i};
                if (row < M)
                    ${common.epilogue(f"acc[{i}][{j}]", "row", "col", "(long)row * ldc + c_at")}
            }
%   endfor
        }
    }
% endfor
}
