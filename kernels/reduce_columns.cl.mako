## Column reductions of a row-major matrix x (R rows of C columns, row stride C): out[c] =
## the fold of x[r, c] over r, the statements those of a ReduceKernel (ops/reduce.py): the
## reduce family's "columns" solver, for one float32 input reduced over its leading dimensions
## with its trailing ones kept (a linear layer's bias gradient: a sum over the rows), where
## the "item" solver runs two launches of one work-item per (column, chunk) each.
##
## Kernels (sizes are run-time arguments):
##   NAME_columns(R, C, chunk_rows, chunks, x, x_off, partials, out, out_off, reduce_size
##                [, done])
##     global (blocks * 256, chunks), local (256, 1): work-group (block, chunk) folds rows
##     [chunk * chunk_rows, ...) of the block's 64 columns. Its 256 items are 16 float4 columns
##     by 16 row lanes: lane l folds rows l, l + 32, ... into one accumulator set and rows
##     l + 16, l + 48, ... into another (a warp reads two rows of 256 contiguous bytes), the
##     sets then combined; the 16 lanes are combined as a tree in local memory. With one chunk
##     that is finalized into out; with several, partials[chunk][C], which the work-group of
##     the block that finishes last combines (LAST_GROUP: ``done`` counts a block's finished
##     chunks, zero before the launch and again after it) or a second launch does
##     (NAME_columns_fold).
##   NAME_columns_fold(C, chunks, partials, out, out_off, reduce_size)
##     global (blocks * 256), local (256): the same fold of a block's chunk partials.
## The order of every fold is fixed by the sizes alone: each set's rows in order, the two sets,
## then the tree; the chunks lane by lane (chunk l, l + 16, ...), then the tree. No sequential
## fold is longer than the host allows (it sizes chunks for that).
##
## Template parameters:
##   name          kernel name prefix
##   VEC           4: C and x_off are multiples of 4 (float4 loads of x); 1: element by element
##   LAST_GROUP    1: the last work-group of a block folds the chunks (one launch); the
##                 partials go between work-groups through atomics
##   FENCE         C statement ordering a work-item's global writes before its later global
##                 accesses for every work-group of the device (LAST_GROUP only; NVIDIA's
##                 mem_fence(CLK_GLOBAL_MEM_FENCE) is a work-group fence, so there it is PTX)
##   input         the input's name (float32)
##   output        the accumulator's and output's name (float32)
##   identity      the accumulator's identity (C expression)
##   map_statement, fold, combine, finalize, preamble: as reduce.cl.mako's; the map sees
##                 `ridx` (the row) and `oidx` (the column), finalize `reduce_size` (R,
##                 or the size of the whole reduction whose partials these rows are)
<%
    comps = ("x", "y", "z", "w")
%>
${preamble}

#define LANES 16
#define QUADS 16

## Folds element `value` (row `row`, column `col` + component) into `acc`'s component, with
## the statements `stmt` (fold for elements, combine for accumulators, which bind `${output}`
## from `value` directly).
<%def name="apply(stmt, acc, value, row, col, mapped)">\
% for k, c in enumerate(comps):
    {
% if mapped:
        const long ridx = ${row}, oidx = ${col} + ${k};
        const float ${input} = (${value}).${c};
        float ${output};
        { ${map_statement} }
% else:
        const float ${output} = (${value}).${c};
% endif
        float acc_${output} = (${acc}).${c};
        { ${stmt} }
        (${acc}).${c} = acc_${output};
    }
% endfor
</%def>

## The finalize statement on each component of `acc`.
<%def name="finalized(acc)">\
% if finalize:
% for c in comps:
    {
        float acc_${output} = (${acc}).${c};
        { ${finalize} }
        (${acc}).${c} = acc_${output};
    }
% endfor
% endif
</%def>

// x[row, c .. c + 3] as a float4, zeros past C (never stored).
inline float4 load4(__global const float *x, long at, int c, int C)
{
% if VEC == 4:
    return c < C ? *(__global const float4 *)(x + at) : (float4)(0.0f);
% else:
    return (float4)(c < C ? x[at] : 0.0f, c + 1 < C ? x[at + 1] : 0.0f,
                    c + 2 < C ? x[at + 2] : 0.0f, c + 3 < C ? x[at + 3] : 0.0f);
% endif
}

// y[at .. at + 3] = v, the elements of columns c .. c + 3 inside C.
inline void store4(__global float *y, long at, int c, int C, float4 v)
{
    if (c < C) y[at] = v.x;
    if (c + 1 < C) y[at + 1] = v.y;
    if (c + 2 < C) y[at + 2] = v.z;
    if (c + 3 < C) y[at + 3] = v.w;
}

// The 16 lanes' float4s of `tree` combined into lane 0's, pairwise (a fixed order).
inline void lane_tree(__local float4 *tree, int lid)
{
    const int lane = lid / QUADS;
    for (int width = LANES / 2; width > 0; width >>= 1) {
        if (lane < width) {
            float4 acc = tree[lid];
            ${apply(combine, "acc", "tree[lid + width * QUADS]", None, None, False)}
            tree[lid] = acc;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

// A chunk partial another work-group of this launch wrote (LAST_GROUP: atomically, so that
// the exchange is defined in OpenCL's memory model and a race checker such as Oclgrind sees
// none; a few dozen values per block), or that an earlier launch wrote.
% if LAST_GROUP:
inline float partial_at(__global const float *partials, long at)
{
    return as_float(atomic_or((volatile __global int *)(partials + at), 0));
}
inline void set_partial(__global float *partials, long at, float v)
{
    atomic_xchg((volatile __global float *)(partials + at), v);
}
% else:
inline float partial_at(__global const float *partials, long at) { return partials[at]; }
inline void set_partial(__global float *partials, long at, float v) { partials[at] = v; }
% endif

// Block `block`'s chunk partials combined and finalized into out: lane l takes chunks l,
// l + 16, ..., in order. Every item of the group calls it (its barriers), ``active`` or not:
// only an active group loads and stores.
inline void fold_chunks(long reduce_size, int C, int chunks, __global const float *partials,
                        __global float *out, long out_off, int block, int lid,
                        __local float4 *tree, bool active)
{
    const int c = block * 4 * QUADS + 4 * (lid % QUADS);
    float4 acc = (float4)(${identity});
    for (int k = lid / QUADS; active && k < chunks; k += LANES) {
        const long at = (long)k * C + c;
        const float4 part = (float4)(c < C ? partial_at(partials, at) : 0.0f,
                                     c + 1 < C ? partial_at(partials, at + 1) : 0.0f,
                                     c + 2 < C ? partial_at(partials, at + 2) : 0.0f,
                                     c + 3 < C ? partial_at(partials, at + 3) : 0.0f);
        ${apply(combine, "acc", "part", None, None, False)}
    }
    tree[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    lane_tree(tree, lid);
    if (active && lid < QUADS) {
        float4 result = tree[lid];
        ${finalized("result")}
        store4(out + out_off, c, c, C, result);
    }
}

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void ${name}_columns(int R, int C, int chunk_rows, int chunks,
                     __global const float *restrict x, long x_off,
                     __global float *partials, __global float *out, long out_off,
                     long reduce_size
% if LAST_GROUP:
                     , __global volatile int *done
% endif
                     )
{
    __local float4 tree[256];
% if LAST_GROUP:
    __local int is_last;
% endif
    const int lid = get_local_id(0);
    const int block = get_group_id(0);
    const int chunk = get_group_id(1);
    const int c = block * 4 * QUADS + 4 * (lid % QUADS);
    const int r_end = min(R, (chunk + 1) * chunk_rows);
    x += x_off;
    // Two accumulator sets, each load of a step issued before either is folded.
    float4 acc0 = (float4)(${identity}), acc1 = acc0;
    int r = chunk * chunk_rows + lid / QUADS;
    for (; r + LANES < r_end; r += 2 * LANES) {
        const float4 a = load4(x, (long)r * C + c, c, C);
        const float4 b = load4(x, (long)(r + LANES) * C + c, c, C);
        ${apply(fold, "acc0", "a", "r", "c", True)}
        ${apply(fold, "acc1", "b", "r + LANES", "c", True)}
    }
    if (r < r_end) {
        const float4 a = load4(x, (long)r * C + c, c, C);
        ${apply(fold, "acc0", "a", "r", "c", True)}
    }
    ${apply(combine, "acc0", "acc1", None, None, False)}
    tree[lid] = acc0;
    barrier(CLK_LOCAL_MEM_FENCE);
    lane_tree(tree, lid);
    if (lid < QUADS) {
        float4 v = tree[lid];
        if (chunks == 1) {
            ${finalized("v")}
            store4(out + out_off, c, c, C, v);
        } else {
            const long at = (long)chunk * C + c;
            if (c < C) set_partial(partials, at, v.x);
            if (c + 1 < C) set_partial(partials, at + 1, v.y);
            if (c + 2 < C) set_partial(partials, at + 2, v.z);
            if (c + 3 < C) set_partial(partials, at + 3, v.w);
        }
    }
% if LAST_GROUP:
    // Release: this chunk's partials reach global memory before the group counts itself done.
    // Every group then runs the fold's barriers, the last one alone loading and storing (PoCL's
    // optimized kernels went wrong with the barriers inside a branch or after a return).
    ${FENCE}
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    if (lid == 0) {
        is_last = chunks > 1 && atomic_inc(done + block) == chunks - 1;
        // Zero again for the next launch (nothing else counts this block any more).
        if (is_last)
            atomic_xchg(done + block, 0);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Acquire: the other groups' partials (read atomically, past any cached copy).
    ${FENCE}
    fold_chunks(reduce_size, C, chunks, partials, out, out_off, block, lid, tree, is_last);
% endif
}

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void ${name}_columns_fold(int C, int chunks, __global const float *partials,
                          __global float *out, long out_off, long reduce_size)
{
    __local float4 tree[256];
    fold_chunks(reduce_size, C, chunks, partials, out, out_off, get_group_id(0),
                get_local_id(0), tree, true);
}
