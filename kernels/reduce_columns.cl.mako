## Column sums of a row-major float32 matrix x (R rows of C columns, row stride C): out[c] =
## sum over r of x[r, c]. The reduce family's form for a gradient summed over its leading
## dimensions (a linear layer's bias gradient: sum_to_shape in ops/reduce.py), where the
## generic kernels run two launches of one work-item per (column, chunk) each.
##
## Kernels (sizes are run-time arguments):
##   column_sums(R, C, chunk_rows, chunks, x, x_off, partials, out, out_off[, done])
##     global (blocks * 256, chunks), local (256, 1): work-group (block, chunk) sums rows
##     [chunk * chunk_rows, ...) of the block's 64 columns. Its 256 items are 16 float4 columns
##     by 16 row lanes: lane l sums rows l, l + 16, ... of its four columns (a warp reads two
##     rows of 256 contiguous bytes), in two accumulator sets; the 16 lanes are added as a
##     tree in local memory. With one chunk that is out; with several, partials[chunk][C],
##     which the work-group of the block that finishes last adds (LAST_GROUP: ``done`` counts
##     a block's finished chunks, zero before the launch and again after it) or a second
##     launch does (column_sums_fold).
##   column_sums_fold(C, chunks, partials, out, out_off)
##     global (blocks * 256), local (256): the same fold of a block's chunk partials.
## The order of every sum is fixed by the sizes alone: each lane's rows in order, its two sets,
## then the tree; the chunks lane by lane (chunk l, l + 16, ...), then the tree. No sequential
## sum is longer than the host allows (it sizes chunks for that).
##
## Template parameters:
##   VEC          4: C and x_off are multiples of 4 (float4 loads of x); 1: element by element
##   LAST_GROUP   1: the last work-group of a block folds the chunks (one launch); the partials
##                go between work-groups through atomics
##   FENCE        C statement ordering a work-item's global writes before its later global
##                accesses for every work-group of the device (LAST_GROUP only; NVIDIA's
##                mem_fence(CLK_GLOBAL_MEM_FENCE) is a work-group fence, so there it is PTX)

#define LANES 16
#define QUADS 16

// x[row, c .. c + 3] as a float4, zeros past C.
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

// The 16 lanes' float4s of `tree` added into lane 0's, pairwise (a fixed order).
inline void lane_tree(__local float4 *tree, int lid)
{
    const int lane = lid / QUADS;
    for (int width = LANES / 2; width > 0; width >>= 1) {
        if (lane < width)
            tree[lid] += tree[lid + width * QUADS];
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

// Block `block`'s chunk partials added into out: lane l takes chunks l, l + 16, ..., in order.
// Every item of the group calls it (its barriers), ``active`` or not: only an active group
// loads and stores.
inline void fold_chunks(int C, int chunks, __global const float *partials,
                        __global float *out, long out_off, int block, int lid,
                        __local float4 *tree, bool active)
{
    const int c = block * 4 * QUADS + 4 * (lid % QUADS);
    float4 acc = (float4)(0.0f);
    for (int k = lid / QUADS; active && k < chunks; k += LANES) {
        const long at = (long)k * C + c;
        acc += (float4)(c < C ? partial_at(partials, at) : 0.0f,
                        c + 1 < C ? partial_at(partials, at + 1) : 0.0f,
                        c + 2 < C ? partial_at(partials, at + 2) : 0.0f,
                        c + 3 < C ? partial_at(partials, at + 3) : 0.0f);
    }
    tree[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    lane_tree(tree, lid);
    if (active && lid < QUADS)
        store4(out + out_off, c, c, C, tree[lid]);
}

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void column_sums(int R, int C, int chunk_rows, int chunks,
                 __global const float *restrict x, long x_off,
                 __global float *partials, __global float *out, long out_off
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
    // Two accumulator sets, each load of a step issued before either is added.
    float4 acc0 = (float4)(0.0f), acc1 = (float4)(0.0f);
    int r = chunk * chunk_rows + lid / QUADS;
    for (; r + LANES < r_end; r += 2 * LANES) {
        const float4 a = load4(x, (long)r * C + c, c, C);
        const float4 b = load4(x, (long)(r + LANES) * C + c, c, C);
        acc0 += a;
        acc1 += b;
    }
    if (r < r_end)
        acc0 += load4(x, (long)r * C + c, c, C);
    tree[lid] = acc0 + acc1;
    barrier(CLK_LOCAL_MEM_FENCE);
    lane_tree(tree, lid);
    if (lid < QUADS) {
        if (chunks == 1)
            store4(out + out_off, c, c, C, tree[lid]);
        else {
            const long at = (long)chunk * C + c;
            const float4 v = tree[lid];
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
    fold_chunks(C, chunks, partials, out, out_off, block, lid, tree, is_last);
% endif
}

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void column_sums_fold(int C, int chunks, __global const float *partials,
                      __global float *out, long out_off)
{
    __local float4 tree[256];
    fold_chunks(C, chunks, partials, out, out_off, get_group_id(0), get_local_id(0), tree, true);
}
