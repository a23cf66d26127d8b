## Softmax and log-softmax over one dimension, forward and backward, max-subtracted.
##
## The tensor is seen as (outer, size, inner), C-contiguous: element k of row (o, i) is at
## off + (o * size + k) * inner + i. Each program holds two kernels:
##   softmax_forward(rows, size, inner, x, x_off, y, y_off)
##       y = exp(x - max) / sum(exp(x - max))       (log: y = (x - max) - log(sum(...)))
##   softmax_backward(rows, size, inner, y, y_off, dy, dy_off, dx, dx_off)
##       dx = y * (dy - sum(dy * y))                  (log: dx = dy - exp(y) * sum(dy))
## rows = outer * inner.
##
## Non-finite values as in torch: a row holding a NaN or +inf, or only -inf, is NaN throughout;
## -inf elements of any other row give 0 (log: -inf). The max folds with fmax, which skips
## NaN; a NaN reaches the sum instead (exp(NaN - m)), and every merge of (max, sum) pairs keeps
## it, an empty side's too. A +inf max gives exp(inf - inf) = NaN in the sum where the element
## is held, and row_sum makes it NaN where the online fold took the +inf as a new max (sum 1).
## log_softmax subtracts the max before anything is rounded: (x - max) - log(sum), exact for the
## largest elements whatever the scale (x - (max + log(sum)) rounds max + log(sum) to max's ulp:
## 0 in place of -log(10) for ten logits of 1e30).
##
## Template parameters:
##   variant     "row": one work-group per row, its items stride along the row and combine
##               their partial (max, sum) pairs as a tree in local memory (coalesced when
##               inner == 1); "column": one work item per row, walking it sequentially
##               (coalesced across items when inner > 1)
##   log         True for log_softmax, False for softmax
##   group_size  work-group size, a power of two
##   cached      "row" only: elements per item kept in registers between the passes, so the
##               input is read once (rows up to group_size * cached long); 0 streams the row
##               twice with an online (max, sum) first pass
##   cached_backward  the same for the backward (elements per item of y and dy, or of dy alone:
##               backward_hold); 0 streams both twice
##   vector      "row" forward only: 4 to load and store 4 consecutive elements of a row as one
##               vector (needs inner == 1, size a multiple of 4 and x_off, y_off multiples of
##               4); else 1. With cached > 0, item i of a row holds its elements
##               (i + j * row_items) * 4 + c; streaming, (lid + j * group_size) * 4 + c
##   row_items   "row" forward with cached > 0 and vector 4: items per row, a power of two
##               dividing group_size (group_size / row_items rows per group, so short rows
##               fill the group); else group_size
##   index_t     "int" when every index fits in 31 bits, else "long"
##   reduce      "row" only: "tree" combines a row's partial values as a tree in local memory
##               (any device); "warp" by shuffles within each warp of 32 and one exchange
##               between warps (NVIDIA only: inline PTX; needs row_items >= 32)
##   hints       None or (load_hint, store_hint): PTX cache hints (memory_access.cl.mako, NVIDIA
##               only) for the forward's 16-byte accesses to x and y
##   backward_hints   the same for the backward's 16-byte accesses to dy and dx (data used
##               once; y, read twice, keeps plain loads)
##   prefetch    "row" forward with cached > 0, vector 4 and row_items == group_size (one row
##               per group): the first `prefetch` vectors of every item's share of the group's
##               next row are staged in local memory during this row (0: none)
##   recompute   softmax with cached > 0 and vector 4: True keeps x in registers (as
##               log_softmax does) and stores exp(x - max - log(sum)), a second exp per element;
##               False keeps exp(x - max) and scales it
##   async_ptx   with prefetch: True stages with cp.async (NVIDIA), False with plain copies
##   backward_vector  "row" backward: 4 for 16-byte accesses (inner == 1, size a multiple of 4,
##               offsets multiples of 4), else 1
##   backward_hold    with cached_backward > 0 and backward_vector 4: "both" keeps y and dy in
##               registers, "dy" keeps dy and reads y twice; else "both"
##   dtype       optional, "float" (the default), "half" or "bfloat16": the storage type of x, y,
##               dy and dx (16-bit: computed in float, stored rounded to nearest even). Vector 4
##               then moves 4 elements (8 bytes) per access, converted to / from float4; no
##               prefetch and no cache hints (their PTX moves float4)
<%
    row = variant == "row"
    # 16-bit storage: x, y, dy and dx in half (vload_half(4) / vstore_half(4)_rte, no
    # cl_khr_fp16 needed) or bfloat16's bits (ushort, ushort4), every value in float.
    dtype = context.get("dtype", "float")
    storage = {"float": "float", "half": "half", "bfloat16": "ushort"}[dtype]
    assert dtype == "float" or (not prefetch and not hints and not backward_hints)
    # The vector paths' plain accesses (the float forms as they were: float4 through a cast
    # pointer; 16-bit: load4 / store4 below, which have no hints for 16-bit storage).
    def plain4(p):
        return f"*((__global const float4*)({p}))" if dtype == "float" else f"load4({p})"
    def plain4_y(p):
        return f"*(__global const float4 *)({p})" if dtype == "float" else f"load4({p})"
    def plain_store4(p, v):
        return f"*((__global float4*)({p})) = {v}" if dtype == "float" else f"store4({p}, {v})"
    def ld(p, i):
        if dtype == "half":
            return f"vload_half({i}, {p})"
        if dtype == "bfloat16":
            return f"bf16_to_float({p}[{i}])"
        return f"{p}[{i}]"
    def st(p, i, v, opening=""):
        # `opening`: text before v (a parenthesis v's expression closes).
        if dtype == "half":
            return f"vstore_half_rte({opening}{v}, {i}, {p})"
        if dtype == "bfloat16":
            return f"{p}[{i}] = float_to_bf16({opening}{v})"
        return f"{p}[{i}] = {opening}{v}"
    def backward_value_text(yv, dyv):
        return f"{dyv} - exp({yv}) * total" if log else f"{yv} * ({dyv} - total)"
%>
<%namespace name="access" file="memory_access.cl.mako"/>
% if dtype == "bfloat16":
${access.bfloat16_conversions()}
% endif
% if dtype == "float":
${access.vector_access(*(hints or (None, None)))}
${access.vector_access(*(backward_hints or (None, None)), suffix="_once")}
% else:
// Four 16-bit values per access (8 bytes: the vector paths' offsets are multiples of 4
// elements).
${access.vectors16(dtype)}
#define load4_once load4
#define store4_once store4
% endif
% if prefetch:
${access.async_copies(async_ptx)}
% endif
% if reduce == "warp":
${access.warp_reductions()}
% endif
#define GROUP_SIZE ${group_size}
#define ROW_ITEMS ${row_items}
#define CACHED ${cached}
#define CACHED_BACKWARD ${cached_backward}

// exp(x - m) where -inf adds 0: exp(-inf - -inf) would be NaN while the max so far is -inf.
// A NaN x gives NaN whatever m is.
inline float exp_from(float x, float m)
{
    return x == -INFINITY ? 0.0f : exp(x - m);
}

// Fold value x into the running (m, s) = (max, sum of exp(. - max)) with one exp. A NaN x
// fails x > *m and makes the sum NaN.
void online_add(float *m, float *s, float x)
{
    // A -inf element adds exp(-inf) = 0; skipping it also avoids exp(-inf - -inf) = NaN while
    // every element so far is -inf.
    if (x == -INFINITY) return;
    if (x > *m) {
        *s = *s * exp(*m - x) + 1.0f;
        *m = x;
    } else {
        *s += exp(x - *m);
    }
}

// Merge two (max, sum) pairs. A side with m == -INFINITY holds no finite element: its s is 0,
// or NaN where it saw a NaN, which the merged sum keeps (adding s is exact either way).
void online_merge(float *m, float *s, float m2, float s2)
{
    if (m2 == -INFINITY) { *s += s2; return; }
    if (*m == -INFINITY) { *m = m2; *s += s2; return; }
    float mm = fmax(*m, m2);
    *s = *s * exp(*m - mm) + s2 * exp(m2 - mm);
    *m = mm;
}

// The sum to divide by for the row's (m, s): NaN for a +inf max, which online_add takes as a
// new max with a sum of 1 (torch: exp(inf - inf) = NaN throughout the row).
inline float row_sum(float m, float s)
{
    return m == INFINITY ? NAN : s;
}

% if row:
// Tree over the group: sum (op_max false) or max (op_max true) of v; every item gets the result.
float group_fold(__local float *tree, float v, bool op_max)
{
    const int lid = get_local_id(0);
% if reduce == "warp":
    // Shuffles within each warp, one exchange between the warps through local memory.
    v = op_max ? warp_max(v) : warp_sum(v);
    % if group_size > 32:
    const int lane = lid % 32;
    if (lane == 0) tree[lid / 32] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    v = lane < GROUP_SIZE / 32 ? tree[lane] : (op_max ? -INFINITY : 0.0f);
    v = op_max ? warp_max(v) : warp_sum(v);
    barrier(CLK_LOCAL_MEM_FENCE);
    % endif
    return v;
% else:
    tree[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = GROUP_SIZE / 2; width > 0; width >>= 1) {
        if (lid < width) {
            float other = tree[lid + width];
            tree[lid] = op_max ? fmax(tree[lid], other) : tree[lid] + other;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = tree[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
% endif
}
% endif

## prefetch: copies of the first `prefetch` vectors of each item's share of row `row` (an
## expression; nothing past the last row) into the stage, closed as one group.
<%def name="stage_row(row)">
    {
        const ${index_t} staged_row = ${row};
        #pragma unroll
        for (int j = 0; j < ${prefetch}; ++j) {
            const ${index_t} k = (lid + (${index_t})j * GROUP_SIZE) * 4;
            if (staged_row < rows && k < size) {
                copy16((__local float *)&stage[j * GROUP_SIZE + lid], x + x_off + staged_row * size + k);
            }
        }
        COPY_COMMIT();
    }
</%def>

__kernel
% if row:
__attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
% endif
void softmax_forward(${index_t} rows, ${index_t} size, ${index_t} inner,
                     __global const ${storage}* restrict x, ${index_t} x_off,
                     __global ${storage}* restrict y, ${index_t} y_off)
{
% if row and cached and vector > 1:
    // ROW_ITEMS items per row, GROUP_SIZE / ROW_ITEMS rows per group at once; each item holds
    // CACHED / 4 vectors of its row (16-byte loads and stores, all loads issued before any is
    // used), one exp per element, one (max, sum) combine per row.
    // The warp reduction exchanges one value per warp; the tree, one per item.
    __local float tree_m[${group_size // 32 if reduce == "warp" else group_size}];
    __local float tree_s[${group_size // 32 if reduce == "warp" else group_size}];
    const int lid = get_local_id(0);
    const int row_lid = lid % ROW_ITEMS;
    const int head = lid - row_lid;
    % if prefetch:
    // One row per group. The first PREFETCH vectors of each item's share of the next row are
    // copied into local memory while this row is reduced and stored (asynchronous copies hold
    // no registers, and every register is taken by this row): the memory system stays busy
    // through the part of a row where the group has no loads of its own in flight. Each item
    // reads back only its own copies, so no barrier guards the stage.
    __local float4 stage[${prefetch} * GROUP_SIZE];
    ${stage_row("get_group_id(0)")}
    % endif
    for (${index_t} first = get_group_id(0) * (GROUP_SIZE / ROW_ITEMS); first < rows;
         first += get_num_groups(0) * (GROUP_SIZE / ROW_ITEMS)) {
        const ${index_t} r = first + lid / ROW_ITEMS;
        // Rows past the end load nothing and store nothing, but meet every barrier.
        const ${index_t} row_size = r < rows ? size : 0;
        __global const ${storage} *xr = x + x_off + (r < rows ? r : 0) * size;
        __global ${storage} *yr = y + y_off + (r < rows ? r : 0) * size;
        float4 v[CACHED / 4];
        #pragma unroll
        for (int j = ${prefetch}; j < CACHED / 4; ++j) {
            ${index_t} k = (row_lid + (${index_t})j * ROW_ITEMS) * 4;
            v[j] = k < row_size ? load4(xr + k) : (float4)(-INFINITY);
        }
    % if prefetch:
        COPY_WAIT(0);
        #pragma unroll
        for (int j = 0; j < ${prefetch}; ++j) {
            ${index_t} k = (lid + (${index_t})j * GROUP_SIZE) * 4;
            v[j] = k < row_size ? stage[j * GROUP_SIZE + lid] : (float4)(-INFINITY);
        }
        ${stage_row("first + get_num_groups(0)")}
    % endif
        float m = -INFINITY, s = 0.0f;
        #pragma unroll
        for (int j = 0; j < CACHED / 4; ++j) {
            m = fmax(m, fmax(fmax(v[j].x, v[j].y), fmax(v[j].z, v[j].w)));
        }
        #pragma unroll
        for (int j = 0; j < CACHED / 4; ++j) {
            float4 e;
            e.x = exp_from(v[j].x, m);
            e.y = exp_from(v[j].y, m);
            e.z = exp_from(v[j].z, m);
            e.w = exp_from(v[j].w, m);
            s += (e.x + e.y) + (e.z + e.w);
        % if not log and not recompute:
            v[j] = e;
        % endif
        }
        const float m_item = m;
    % if reduce == "warp":
        // The row's max, then every item's sum rescaled to it: shuffles within each warp, one
        // exchange through local memory between the row's warps. The next row's first write
        // to tree_m comes after this row's barrier on tree_s, which every item passes only
        // after reading tree_m, and its write to tree_s after its own barrier on tree_m.
        const int lane = lid % 32;
        m = warp_max(m);
        % if row_items > 32:
        if (lane == 0) tree_m[lid / 32] = m;
        barrier(CLK_LOCAL_MEM_FENCE);
        m = warp_max(tree_m[head / 32 + lane % (ROW_ITEMS / 32)]);
        % endif
        // An item without a finite element passes its s (0, or NaN after a NaN).
        s = warp_sum(m_item == -INFINITY ? s : s * exp(m_item - m));
        % if row_items > 32:
        if (lane == 0) tree_s[lid / 32] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        s = warp_sum(lane < ROW_ITEMS / 32 ? tree_s[head / 32 + lane] : 0.0f);
        % endif
    % else:
        tree_m[lid] = m;
        tree_s[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int width = ROW_ITEMS / 2; width > 0; width >>= 1) {
            if (row_lid < width) {
                online_merge(&m, &s, tree_m[lid + width], tree_s[lid + width]);
                tree_m[lid] = m;
                tree_s[lid] = s;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        m = tree_m[head];
        s = tree_s[head];
        // The next rows overwrite the tree only after every item has read it.
        barrier(CLK_LOCAL_MEM_FENCE);
    % endif
        s = row_sum(m, s);
    % if log or recompute:
        const float log_s = log(s);
    % else:
        // An item that holds only padding (or -inf) has m_item = -inf: its e are 0, scale 0.
        const float scale = (m_item == -INFINITY ? 0.0f : exp(m_item - m)) / s;
    % endif
        #pragma unroll
        for (int j = 0; j < CACHED / 4; ++j) {
            ${index_t} k = (row_lid + (${index_t})j * ROW_ITEMS) * 4;
            if (k < row_size) {
    % if log:
                store4(yr + k, (v[j] - m) - log_s);
    % elif recompute:
                store4(yr + k, exp((v[j] - m) - log_s));
    % else:
                store4(yr + k, v[j] * scale);
    % endif
            }
        }
    }
% elif row:
    __local float tree_m[GROUP_SIZE];
    __local float tree_s[GROUP_SIZE];
    const int lid = get_local_id(0);
    for (${index_t} r = get_group_id(0); r < rows; r += get_num_groups(0)) {
        const ${index_t} o = r / inner;
        const ${index_t} base = o * size * inner + (r - o * inner);
        __global const ${storage} *xr = x + x_off + base;
        __global ${storage} *yr = y + y_off + base;
    % if cached:
        // All loads are issued before any is used; then one exp per element: the item's own
        // (max, sum) with exp(v - m_item) kept in place of v (softmax), one tree merging the
        // pairs, and y = e * exp(m_item - m) / s.
        float v[CACHED];
        float m = -INFINITY;
        #pragma unroll
        for (int j = 0; j < CACHED; ++j) {
            ${index_t} k = lid + (${index_t})j * GROUP_SIZE;
            v[j] = k < size ? ${ld("xr", "k * inner")} : -INFINITY;
        }
        #pragma unroll
        for (int j = 0; j < CACHED; ++j) {
            m = fmax(m, v[j]);
        }
        float s = 0.0f;
        #pragma unroll
        for (int j = 0; j < CACHED; ++j) {
            const float e = exp_from(v[j], m);
            s += e;
        % if not log:
            v[j] = e;
        % endif
        }
        const float m_item = m;
        tree_m[lid] = m;
        tree_s[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int width = GROUP_SIZE / 2; width > 0; width >>= 1) {
            if (lid < width) {
                online_merge(&m, &s, tree_m[lid + width], tree_s[lid + width]);
                tree_m[lid] = m;
                tree_s[lid] = s;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        m = tree_m[0];
        s = tree_s[0];
        // The next row overwrites the tree only after every item has read it.
        barrier(CLK_LOCAL_MEM_FENCE);
        s = row_sum(m, s);
        % if log:
        const float log_s = log(s);
        % else:
        // An item that holds only padding (or -inf) has m_item = -inf: its e are 0, scale 0.
        const float scale = (m_item == -INFINITY ? 0.0f : exp(m_item - m)) / s;
        % endif
        #pragma unroll
        for (int j = 0; j < CACHED; ++j) {
            ${index_t} k = lid + (${index_t})j * GROUP_SIZE;
            if (k < size) {
        % if log:
                ${st("yr", "k * inner", "(v[j] - m) - log_s")};
        % else:
                ${st("yr", "k * inner", "v[j] * scale")};
        % endif
            }
        }
    % else:
        float m = -INFINITY, s = 0.0f;
        % if vector > 1:
        // Four vectors per step, all loaded before use; one rescale of the running sum per
        // vector (by its largest element), one exp per element.
        for (${index_t} k0 = lid * 4; k0 < size; k0 += GROUP_SIZE * 16) {
            float4 v[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                ${index_t} k = k0 + (${index_t})j * GROUP_SIZE * 4;
                v[j] = k < size ? ${plain4("xr + k")} : (float4)(-INFINITY);
            }
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float vm = fmax(fmax(v[j].x, v[j].y), fmax(v[j].z, v[j].w));
                if (vm > m) {
                    s *= exp(m - vm);
                    m = vm;
                }
                // Every element adds, so that a NaN reaches the sum while m is still -inf.
                s += (exp_from(v[j].x, m) + exp_from(v[j].y, m))
                     + (exp_from(v[j].z, m) + exp_from(v[j].w, m));
            }
        }
        % else:
        for (${index_t} k = lid; k < size; k += GROUP_SIZE) {
            online_add(&m, &s, ${ld("xr", "k * inner")});
        }
        % endif
        tree_m[lid] = m;
        tree_s[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int width = GROUP_SIZE / 2; width > 0; width >>= 1) {
            if (lid < width) {
                float mm = tree_m[lid], ss = tree_s[lid];
                online_merge(&mm, &ss, tree_m[lid + width], tree_s[lid + width]);
                tree_m[lid] = mm;
                tree_s[lid] = ss;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        m = tree_m[0];
        s = row_sum(m, tree_s[0]);
        barrier(CLK_LOCAL_MEM_FENCE);
        % if vector > 1:
        % if log:
        const float log_s = log(s);
        % else:
        const float scale = 1.0f / s;
        % endif
        for (${index_t} k0 = lid * 4; k0 < size; k0 += GROUP_SIZE * 16) {
            float4 v[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                ${index_t} k = k0 + (${index_t})j * GROUP_SIZE * 4;
                v[j] = k < size ? ${plain4("xr + k")} : (float4)(0.0f);
            }
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                ${index_t} k = k0 + (${index_t})j * GROUP_SIZE * 4;
                if (k < size) {
        % if log:
                    ${plain_store4("yr + k", "(v[j] - m) - log_s")};
        % else:
                    ${plain_store4("yr + k", "exp(v[j] - m) * scale")};
        % endif
                }
            }
        }
        % elif log:
        const float log_s = log(s);
        for (${index_t} k = lid; k < size; k += GROUP_SIZE) {
            ${st("yr", "k * inner", ld("xr", "k * inner") + " - m) - log_s", "(")};
        }
        % else:
        const float scale = 1.0f / s;
        for (${index_t} k = lid; k < size; k += GROUP_SIZE) {
            ${st("yr", "k * inner", "exp(" + ld("xr", "k * inner") + " - m) * scale")};
        }
        % endif
    % endif
    }
% else:
    for (${index_t} r = get_global_id(0); r < rows; r += get_global_size(0)) {
        const ${index_t} o = r / inner;
        const ${index_t} base = o * size * inner + (r - o * inner);
        __global const ${storage} *xr = x + x_off + base;
        __global ${storage} *yr = y + y_off + base;
        float m = -INFINITY, s = 0.0f;
        for (${index_t} k = 0; k < size; ++k) {
            online_add(&m, &s, ${ld("xr", "k * inner")});
        }
        s = row_sum(m, s);
    % if log:
        const float log_s = log(s);
        for (${index_t} k = 0; k < size; ++k) {
            ${st("yr", "k * inner", ld("xr", "k * inner") + " - m) - log_s", "(")};
        }
    % else:
        const float scale = 1.0f / s;
        for (${index_t} k = 0; k < size; ++k) {
            ${st("yr", "k * inner", "exp(" + ld("xr", "k * inner") + " - m) * scale")};
        }
    % endif
    }
% endif
}

<%def name="backward_term(yv, dyv)">${dyv if log else f"{dyv} * {yv}"}</%def>
## The streaming backward's step: yv[j], dyv[j] (j < 4) at k0 + j * GROUP_SIZE * 4, zero past
## the row's end, all loads issued before any is used.
<%def name="load_backward_step()">
            float4 yv[4], dyv[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                ${index_t} k = k0 + (${index_t})j * GROUP_SIZE * 4;
                yv[j] = k < size ? ${plain4_y("yr + k")} : (float4)(0.0f);
                dyv[j] = k < size ? load4_once(dyr + k) : (float4)(0.0f);
            }
</%def>
<%def name="backward_term4(yv, dyv)">${f"(({dyv}).x + ({dyv}).y) + (({dyv}).z + ({dyv}).w)" if log else f"dot({dyv}, {yv})"}</%def>
<%def name="backward_value(yv, dyv)">${f"{dyv} - exp({yv}) * total" if log else f"{yv} * ({dyv} - total)"}</%def>

__kernel
% if row:
__attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
% endif
void softmax_backward(${index_t} rows, ${index_t} size, ${index_t} inner,
                      __global const ${storage}* restrict y, ${index_t} y_off,
                      __global const ${storage}* restrict dy, ${index_t} dy_off,
                      __global ${storage}* restrict dx, ${index_t} dx_off)
{
% if row:
    __local float tree_s[GROUP_SIZE];
    const int lid = get_local_id(0);
    for (${index_t} r = get_group_id(0); r < rows; r += get_num_groups(0)) {
% else:
    for (${index_t} r = get_global_id(0); r < rows; r += get_global_size(0)) {
% endif
        const ${index_t} o = r / inner;
        const ${index_t} base = o * size * inner + (r - o * inner);
        __global const ${storage} *yr = y + y_off + base;
        __global const ${storage} *dyr = dy + dy_off + base;
        __global ${storage} *dxr = dx + dx_off + base;
% if row and backward_vector > 1:
        // 16-byte accesses: item lid takes the vectors at (lid + j * GROUP_SIZE) * 4.
        float total = 0.0f;
    % if cached_backward:
        // dy (and with backward_hold "both", y) stays in registers between the passes; with
        // "dy" the second pass reads y again, from L2 when this row's first read is still there
        // (dy and dx go through with backward_hints, where given, to leave L2 to y).
        float4 dyv[CACHED_BACKWARD / 4];
        % if backward_hold == "both":
        float4 yv[CACHED_BACKWARD / 4];
        % endif
        #pragma unroll
        for (int j = 0; j < CACHED_BACKWARD / 4; ++j) {
            ${index_t} k = (lid + (${index_t})j * GROUP_SIZE) * 4;
            const float4 yj = k < size ? ${plain4_y("yr + k")} : (float4)(0.0f);
            dyv[j] = k < size ? load4_once(dyr + k) : (float4)(0.0f);
            total += ${backward_term4("yj", "dyv[j]")};
        % if backward_hold == "both":
            yv[j] = yj;
        % endif
        }
        total = group_fold(tree_s, total, false);
        #pragma unroll
        for (int j = 0; j < CACHED_BACKWARD / 4; ++j) {
            ${index_t} k = (lid + (${index_t})j * GROUP_SIZE) * 4;
            if (k < size) {
        % if backward_hold == "both":
                const float4 yj = yv[j];
        % else:
                const float4 yj = ${plain4_y("yr + k")};
        % endif
                store4_once(dxr + k, ${backward_value("yj", "dyv[j]")});
            }
        }
    % else:
        // Both passes stream y and dy, four vectors per step, all loaded before use.
        for (${index_t} k0 = lid * 4; k0 < size; k0 += GROUP_SIZE * 16) {
            ${load_backward_step()}
            #pragma unroll
            for (int j = 0; j < 4; ++j) total += ${backward_term4("yv[j]", "dyv[j]")};
        }
        total = group_fold(tree_s, total, false);
        for (${index_t} k0 = lid * 4; k0 < size; k0 += GROUP_SIZE * 16) {
            ${load_backward_step()}
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                ${index_t} k = k0 + (${index_t})j * GROUP_SIZE * 4;
                if (k < size) store4_once(dxr + k, ${backward_value("yv[j]", "dyv[j]")});
            }
        }
    % endif
% elif row:
    % if cached_backward:
        float yv[CACHED_BACKWARD], dyv[CACHED_BACKWARD];
        float total = 0.0f;
        #pragma unroll
        for (int j = 0; j < CACHED_BACKWARD; ++j) {
            ${index_t} k = lid + (${index_t})j * GROUP_SIZE;
            yv[j] = k < size ? ${ld("yr", "k * inner")} : 0.0f;
            dyv[j] = k < size ? ${ld("dyr", "k * inner")} : 0.0f;
            total += ${backward_term("yv[j]", "dyv[j]")};
        }
        total = group_fold(tree_s, total, false);
        #pragma unroll
        for (int j = 0; j < CACHED_BACKWARD; ++j) {
            ${index_t} k = lid + (${index_t})j * GROUP_SIZE;
            if (k < size) ${st("dxr", "k * inner", backward_value_text("yv[j]", "dyv[j]"))};
        }
    % else:
        float total = 0.0f;
        for (${index_t} k = lid; k < size; k += GROUP_SIZE) {
            total += ${backward_term(ld("yr", "k * inner"), ld("dyr", "k * inner"))};
        }
        total = group_fold(tree_s, total, false);
        for (${index_t} k = lid; k < size; k += GROUP_SIZE) {
            ${st("dxr", "k * inner", backward_value_text(ld("yr", "k * inner"), ld("dyr", "k * inner")))};
        }
    % endif
% else:
        float total = 0.0f;
        for (${index_t} k = 0; k < size; ++k) {
            total += ${backward_term(ld("yr", "k * inner"), ld("dyr", "k * inner"))};
        }
        for (${index_t} k = 0; k < size; ++k) {
            ${st("dxr", "k * inner", backward_value_text(ld("yr", "k * inner"), ld("dyr", "k * inner")))};
        }
% endif
    }
}
