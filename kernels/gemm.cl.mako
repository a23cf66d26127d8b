// GEMM family: C = act(alpha * op(A) @ op(B) + beta * C + bias), float32, row-major.
//
// Every matrix is a (buffer, element offset, leading dimension) triple; a batch adds an element
// stride per operand (0 broadcasts one matrix over the batch). op(A) is M x K, op(B) is K x N,
// C is M x N. Sizes, offsets, leading dimensions, strides, alpha and beta are run-time
// arguments; beta == 0 never reads C (C may hold NaN).
//
// Template parameters (all required; those of the kernel not rendered are passed as 0):
//   KERNEL        "tiled" (gemm_tiled + gemm_splitk_reduce) or "small" (gemm_small)
//   TRANS_A       1: A is stored K x M (op(A) = A^T); 0: stored M x K
//   TRANS_B       1: B is stored N x K (op(B) = B^T); 0: stored K x N
//   BIAS          0: none; 1: bias[N] added to every row ("n", linear layers);
//                 2: bias[M] added to every column ("m", convolution: M = output channels)
//   ACTIVATION    OpenCL C expression of act(x) in the variable x, or "" for none
// "tiled" only:
//   TILE_M, TILE_N  the C tile one work-group computes
//   TILE_K        depth of the A and B slices staged in local memory per step
//   WPT_M, WPT_N  C elements per work-item along M and N (register block)
//   VEC           width of local-memory reads of A and B fragments (1, 2 or 4); a work-item
//                 owns VEC consecutive rows (columns) every TILE_M/WPT_M*VEC rows (columns),
//                 so that neighbouring work-items read neighbouring words (no bank conflicts)
//   PAD           floats added to each local-memory row (a multiple of VEC) against bank
//                 conflicts when the global tile is written transposed into local memory
//   DOUBLE_BUFFER 1: two local-memory stages, one barrier per step, the next slice is loaded
//                 from global memory while the current one is multiplied; 0: one stage
//   SPLIT_K       1: each work-group sums only its K chunk (group id 2 = batch * splits +
//                 split) and writes the raw sum to a workspace; gemm_splitk_reduce adds the
//                 chunks and applies the epilogue. 0: the epilogue is applied directly.
// "small" only:
//   SMALL_M, SMALL_N  work-group shape; one work-item per C element, K walked from global memory
<%
    tiled = KERNEL == "tiled"
%>
% if tiled:
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
#define STAGES ${2 if DOUBLE_BUFFER else 1}
<%
    nthreads = (TILE_M // WPT_M) * (TILE_N // WPT_N)
    a_loads = TILE_M * TILE_K // nthreads
    b_loads = TILE_N * TILE_K // nthreads
    # The contiguous extent of each operand's tile in global memory: loads walk it fastest.
    a_contig = TILE_M if TRANS_A else TILE_K
    b_contig = TILE_K if TRANS_B else TILE_N
    vtype = "float" if VEC == 1 else f"float{VEC}"
    comps = ["x", "y", "z", "w"] if VEC > 1 else [""]
    def comp(v):
        return f".s{v}" if VEC > 1 else ""
%>
% endif

<%def name="epilogue(value, row, col, index)">
        {
            float x = alpha * (${value});
            if (beta != 0.0f)
                x += beta * C[${index}];
% if BIAS == 1:
            x += bias[bias_off + (${col})];
% elif BIAS == 2:
            x += bias[bias_off + (${row})];
% endif
% if ACTIVATION:
            x = ${ACTIVATION};
% endif
            C[${index}] = x;
        }
</%def>

% if tiled:
// Work-item (tm, tn) = (lid / TN_THREADS, lid % TN_THREADS) owns rows
// (j * TM_THREADS + tm) * VEC + v and columns (j * TN_THREADS + tn) * VEC + v of the tile.
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void gemm_tiled(int M, int N, int K,
                __global const float *restrict A, long a_off, int lda, long stride_a,
                __global const float *restrict B, long b_off, int ldb, long stride_b,
                __global float *C, long c_off, int ldc, long stride_c,
                float alpha, float beta,
                __global const float *restrict bias, long bias_off,
                int splits, int k_chunk)
{
    __local float a_stage[STAGES * STAGE_A] __attribute__((aligned(16)));
    __local float b_stage[STAGES * STAGE_B] __attribute__((aligned(16)));

    const int lid = get_local_id(0);
    const int tm = lid / TN_THREADS;
    const int tn = lid % TN_THREADS;
    const int m0 = get_group_id(1) * TILE_M;
    const int n0 = get_group_id(0) * TILE_N;
    const int batch = get_group_id(2) / splits;
    const int split = get_group_id(2) % splits;
    const int k_begin = split * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);

    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;

    // Global -> local staging: load number r of this work-item covers linear element
    // lid + r * NTHREADS of the tile, walking the operand's contiguous dimension fastest.
% for r in range(a_loads):
<%
    l = f"(lid + {r * nthreads})"
%>
%   if TRANS_A:
    const int a_m${r} = ${l} % TILE_M, a_k${r} = ${l} / TILE_M;
%   else:
    const int a_k${r} = ${l} % TILE_K, a_m${r} = ${l} / TILE_K;
%   endif
    const bool a_in${r} = m0 + a_m${r} < M;
% endfor
% for r in range(b_loads):
<%
    l = f"(lid + {r * nthreads})"
%>
%   if TRANS_B:
    const int b_k${r} = ${l} % TILE_K, b_n${r} = ${l} / TILE_K;
%   else:
    const int b_n${r} = ${l} % TILE_N, b_k${r} = ${l} / TILE_N;
%   endif
    const bool b_in${r} = n0 + b_n${r} < N;
% endfor
% if TRANS_A:
    __global const float *a_tile = A + (long)k_begin * lda + m0;
    const long a_step = (long)TILE_K * lda;
% else:
    __global const float *a_tile = A + (long)m0 * lda + k_begin;
    const long a_step = TILE_K;
% endif
% if TRANS_B:
    __global const float *b_tile = B + (long)n0 * ldb + k_begin;
    const long b_step = TILE_K;
% else:
    __global const float *b_tile = B + (long)k_begin * ldb + n0;
    const long b_step = (long)TILE_K * ldb;
% endif

% for r in range(a_loads):
    float a_next${r};
% endfor
% for r in range(b_loads):
    float b_next${r};
% endfor

<%def name="load_global(k, a_loads, b_loads)">
% for r in range(a_loads):
%   if TRANS_A:
        a_next${r} = (a_in${r} && ${k} + a_k${r} < k_end) ? a_tile[a_k${r} * lda + a_m${r}] : 0.0f;
%   else:
        a_next${r} = (a_in${r} && ${k} + a_k${r} < k_end) ? a_tile[a_m${r} * lda + a_k${r}] : 0.0f;
%   endif
% endfor
% for r in range(b_loads):
%   if TRANS_B:
        b_next${r} = (b_in${r} && ${k} + b_k${r} < k_end) ? b_tile[b_n${r} * ldb + b_k${r}] : 0.0f;
%   else:
        b_next${r} = (b_in${r} && ${k} + b_k${r} < k_end) ? b_tile[b_k${r} * ldb + b_n${r}] : 0.0f;
%   endif
% endfor
</%def>
<%def name="store_local(stage, a_loads, b_loads)">
% for r in range(a_loads):
        a_stage[${stage} * STAGE_A + a_k${r} * LDS_A + a_m${r}] = a_next${r};
% endfor
% for r in range(b_loads):
        b_stage[${stage} * STAGE_B + b_k${r} * LDS_B + b_n${r}] = b_next${r};
% endfor
</%def>

    float acc[WPT_M][WPT_N];
% for i in range(WPT_M):
%   for j in range(WPT_N):
    acc[${i}][${j}] = 0.0f;
%   endfor
% endfor

    int k = k_begin;
    ${load_global("k", a_loads, b_loads)}
    ${store_local(0, a_loads, b_loads)}
    barrier(CLK_LOCAL_MEM_FENCE);

    int stage = 0;
    for (; k < k_end; ) {
        const int k_next = k + TILE_K;
% if DOUBLE_BUFFER:
        if (k_next < k_end) {
            a_tile += a_step;
            b_tile += b_step;
            ${load_global("k_next", a_loads, b_loads)}
        }
% endif
        __local const float *a_local = a_stage + stage * STAGE_A + tm * VEC;
        __local const float *b_local = b_stage + stage * STAGE_B + tn * VEC;
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
% if DOUBLE_BUFFER:
        if (k_next < k_end) {
            ${store_local("(stage ^ 1)", a_loads, b_loads)}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        stage ^= 1;
        k = k_next;
% else:
        k = k_next;
        if (k < k_end) {
            a_tile += a_step;
            b_tile += b_step;
            ${load_global("k", a_loads, b_loads)}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k < k_end) {
            ${store_local(0, a_loads, b_loads)}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
% endif
    }

% if SPLIT_K:
    // Raw partial sums: workspace C is [batch * splits][M][N], dense.
    C += (long)get_group_id(2) * M * N;
% else:
    C += c_off + batch * stride_c;
% endif
% for i in range(WPT_M):
    {
        const int row = m0 + (${i // VEC} * TM_THREADS + tm) * VEC + ${i % VEC};
        if (row < M) {
%   for j in range(WPT_N):
            {
                const int col = n0 + (${j // VEC} * TN_THREADS + tn) * VEC + ${j % VEC};
                if (col < N) {
%     if SPLIT_K:
                    C[(long)row * N + col] = acc[${i}][${j}];
%     else:
                    ${epilogue(f"acc[{i}][{j}]", "row", "col", "(long)row * ldc + col")}
%     endif
                }
            }
%   endfor
        }
    }
% endfor
}

// Adds the split-K partial sums of gemm_tiled and applies the epilogue; one work-item per C
// element, columns fastest. Global size (N rounded up, M, batch).
__kernel void gemm_splitk_reduce(int M, int N, int splits,
                                 __global const float *restrict partial,
                                 __global float *C, long c_off, int ldc, long stride_c,
                                 float alpha, float beta,
                                 __global const float *restrict bias, long bias_off)
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const int batch = get_global_id(2);
    if (col >= N || row >= M)
        return;
    const long plane = (long)M * N;
    partial += (long)batch * splits * plane + (long)row * N + col;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s)
        sum += partial[s * plane];
    C += c_off + batch * stride_c;
    ${epilogue("sum", "row", "col", "(long)row * ldc + col")}
}
% else:
// One work-item per C element; global size (N rounded up to SMALL_N, M rounded up to
// SMALL_M, batch). For problems too small to fill a device with tiles.
__kernel __attribute__((reqd_work_group_size(${SMALL_N}, ${SMALL_M}, 1)))
void gemm_small(int M, int N, int K,
                __global const float *restrict A, long a_off, int lda, long stride_a,
                __global const float *restrict B, long b_off, int ldb, long stride_b,
                __global float *C, long c_off, int ldc, long stride_c,
                float alpha, float beta,
                __global const float *restrict bias, long bias_off)
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const int batch = get_global_id(2);
    if (col >= N || row >= M)
        return;
    A += a_off + batch * stride_a;
    B += b_off + batch * stride_b;
    C += c_off + batch * stride_c;
% if TRANS_A:
    __global const float *a_row = A + row;
    const int a_step = lda;
% else:
    __global const float *a_row = A + (long)row * lda;
    const int a_step = 1;
% endif
% if TRANS_B:
    __global const float *b_col = B + (long)col * ldb;
    const int b_step = 1;
% else:
    __global const float *b_col = B + col;
    const int b_step = ldb;
% endif
    float sum = 0.0f;
    for (int k = 0; k < K; ++k)
        sum = fma(a_row[(long)k * a_step], b_col[(long)k * b_step], sum);
    ${epilogue("sum", "row", "col", "(long)row * ldc + col")}
}
% endif
