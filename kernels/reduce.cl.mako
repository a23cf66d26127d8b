## Broadcast + reduce kernels generated from C statements.
##
## The problem: inputs broadcast to one full index space; that space splits into kept
## dimensions (KEPT_NDIM after merging, flat index `oidx`) and reduced dimensions (RED_NDIM
## after merging, flat index `ridx` in row-major order of the reduced dimensions). For every
## element the map statement computes one value per accumulator; the combine statement folds
## values into accumulators; after the last value the finalize statement turns accumulators
## into results. Sizes and strides are run-time arguments.
##
## Run-time argument segment_shift ("group" only): a unit has segment = 1 << segment_shift
## items (<= group_size); a group works on group_size / segment units at once, so short
## reductions fill the group, and each unit's items fold their accumulators as a tree of
## that width.
##
## Work is cut into units u = chunk * kept_total + oidx: unit u folds the reduced indices
## [chunk * chunk_len, min((chunk + 1) * chunk_len, red_total)) of output oidx and writes its
## accumulators to out[u]. With one chunk that is the result (finalized); with several the caller
## reduces the [chunks, kept_total] partials again. Bounding chunk_len bounds the length of every
## sequential float sum, so long reductions stay accurate (partials combine as a tree).
##
## Template parameters:
##   name          kernel name
##   variant       "group": `segment` items of a work-group per unit, striding over the chunk
##                 and folding their accumulators as a tree in local memory (coalesced when
##                 the innermost reduced dimension is contiguous);
##                 "item": one work item per unit, folding its chunk sequentially (coalesced
##                 when the innermost kept dimension is contiguous)
##   group_size    work-group size, a power of two
##   vector        "group": 4 to load 4 consecutive reduced elements as one vector (16 bytes
##                 for 4-byte inputs): needs one reduced dimension of stride 1 for every
##                 input, red_total and chunk_len multiples of 4 and every input's element
##                 base (offset + kept index . kept strides) a multiple of 4; else 1.
##                 "item": 1
##   unroll        independent accumulator sets per work item (>= 1): each step loads `unroll`
##                 elements or vectors ("group": at step + j * segment * vector, "item": at
##                 step + j), then folds load j into set j; the sets combine at the end of the
##                 unit. More
##                 loads in flight per item, and each set's sequential sum is `unroll` times
##                 shorter than the item's share of the chunk
##   kept_ndim     number of kept dimensions (>= 1)
##   red_ndim      number of reduced dimensions (>= 1)
##   index_t       "int" when every index fits in 31 bits, else "long"
##   inputs        list of (name, type), loaded per element before the map statement: an OpenCL
##                 C type, or "half" / "bfloat16" for 16-bit floating point storage, which the
##                 statements see as float (loaded through vload_half / vload_half4, or
##                 bfloat16's bits shifted into a float's: no cl_khr_fp16 needed)
##   accumulators  list of (name, accumulator C type, identity C expression, output C type):
##                 each is also an output, converted to its output type when written (an
##                 index accumulator can be `index_t` for an int64 output); INDEX_MAX is the
##                 largest index_t
##   scalars       list of (name, OpenCL C type) passed by value
##   map_statement C code assigning every accumulator's name from the inputs, `ridx`, `oidx`
##   combine       C code folding the values `<name>` into `acc_<name>` (for every accumulator),
##                 associative and commutative: merges accumulator sets and the tree
##   fold          C code like combine, for folding one element into a set: a set sees its
##                 elements in increasing `ridx`, so order-dependent rules (argmax's lowest
##                 index on ties) can be cheaper here; combine when there is no such rule
##   finalize      C code run on `acc_<name>` before the final write, may use `reduce_size`
##                 (the size of the whole reduction), may be ""
##   apply_finalize  True for a launch whose results are final, False for partials
##   last_group    "group" with kept_total == 1 and several chunks: the units' results go to
##                 out (the partials), and the work-group that finishes last (an atomic count
##                 in done_count, zero before the launch and again after it) combines them in
##                 the order of their index and writes the finalized result to final: one
##                 launch instead of two, and the same result whatever group finishes last
##   device_fence  C statement that orders a work item's global writes before its later
##                 global accesses for every work-group of the device ("last_group" only):
##                 NVIDIA compiles mem_fence(CLK_GLOBAL_MEM_FENCE) to a work-group fence
##                 (membar.cta), so there it is PTX's membar.gl
##   preamble      extra C code before the kernel (helper functions), may be ""
<%
    kdims = range(kept_ndim)
    rdims = range(red_ndim)
    # 16-bit storage: the buffer's element type, and the statements' (float).
    storage16 = {"half": "half", "bfloat16": "ushort"}
    def buf_ty(ty):
        return storage16.get(ty, ty)
    def val_ty(ty):
        return "float" if ty in storage16 else ty
    def load(nm, ty, index):
        if ty == "half":
            return f"vload_half({index}, {nm}_buf)"
        if ty == "bfloat16":
            return f"bf16_to_float({nm}_buf[{index}])"
        return f"{nm}_buf[{index}]"
    def load_wide(nm, ty, index):
        if ty == "half":
            return f"vload_half{vector}(0, {nm}_buf + {index})"
        if ty == "bfloat16":
            return f"as_float{vector}(convert_uint{vector}(vload{vector}(0, {nm}_buf + {index})) << 16)"
        return f"*((__global const {ty}{vector}*)({nm}_buf + {index}))"
    any_bfloat16 = any(ty == "bfloat16" for nm, ty in inputs)
%>
<%namespace name="access" file="memory_access.cl.mako"/>\
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
% if any_bfloat16:
${access.bfloat16_conversions()}
% endif
#define INDEX_MAX ${"INT_MAX" if index_t == "int" else "LONG_MAX"}
${preamble}

<%def name="load_element(j, ridx_expr)">\
            const ${index_t} ridx${j} = ${ridx_expr};
            const bool valid${j} = ridx${j} < chunk_end;
% if vector > 1:
    % for nm, ty in inputs:
            const ${val_ty(ty)}${vector} ${nm}${j} = valid${j}
                ? ${load_wide(nm, ty, f"{nm}_base + ridx{j}")}
                : (${val_ty(ty)}${vector})((${val_ty(ty)})0);
    % endfor
% elif red_ndim == 1:
    % for nm, ty in inputs:
            const ${val_ty(ty)} ${nm}${j} = valid${j} ? ${load(nm, ty, f"{nm}_base + ridx{j} * {nm}_rstride0")} : (${val_ty(ty)})0;
    % endfor
% else:
            ${index_t} rest${j} = ridx${j};
    % for nm, ty in inputs:
            ${index_t} ${nm}_index${j} = ${nm}_base;
    % endfor
    % for k in reversed(list(rdims)):
            {
        % if k > 0:
                ${index_t} coord = rest${j} % rsize${k};
                rest${j} /= rsize${k};
        % else:
                ${index_t} coord = rest${j};
        % endif
        % for nm, ty in inputs:
                ${nm}_index${j} += coord * ${nm}_rstride${k};
        % endfor
            }
    % endfor
    % for nm, ty in inputs:
            const ${val_ty(ty)} ${nm}${j} = valid${j} ? ${load(nm, ty, f"{nm}_index{j}")} : (${val_ty(ty)})0;
    % endfor
% endif
</%def>

## Folds the loaded element j into accumulator set j. The inner names shadow the loop's, so the
## caller's map and combine statements see plain `ridx`, `<input>`, `<name>` and `acc_<name>`.
<%def name="fold_element(j)">\
            if (valid${j}) {
% for c in range(vector):
                {
                const ${index_t} ridx = ridx${j} + ${c};
    % for nm, ty in inputs:
                ${val_ty(ty)} ${nm} = ${nm}${j}${".s%d" % c if vector > 1 else ""};
    % endfor
    % for nm, ty, ident, out_ty in accumulators:
                ${ty} acc_${nm} = acc${j}_${nm};
                ${ty} ${nm};
    % endfor
                { ${map_statement} }
                { ${fold} }
    % for nm, ty, ident, out_ty in accumulators:
                acc${j}_${nm} = acc_${nm};
    % endfor
                }
% endfor
            }
</%def>

## Loads first, folds after: `unroll` independent loads are in flight before any is used.
<%def name="fold_step(stride)">\
% for j in range(unroll):
${load_element(j, "step" if j == 0 else "step + %d * %s" % (j, stride))}\
% endfor
% for j in range(unroll):
${fold_element(j)}\
% endfor
</%def>

## The accumulator sets, combined into acc_<name> (set 0 first, then the others in order).
<%def name="merge_sets()">\
% for nm, ty, ident, out_ty in accumulators:
        ${ty} acc_${nm} = acc0_${nm};
% endfor
% for j in range(1, unroll):
        {
    % for nm, ty, ident, out_ty in accumulators:
            ${ty} ${nm} = acc${j}_${nm};
    % endfor
            { ${combine} }
        }
% endfor
</%def>

## `unit_valid`: false for the group variant's slots past the last unit, which fold nothing.
<%def name="unit_setup(unit_valid)">\
        const ${index_t} oidx = u % kept_total;
        const ${index_t} chunk = u / kept_total;
% if kept_ndim == 1:
    % for nm, ty in inputs:
        const ${index_t} ${nm}_base = ${nm}_off + oidx * ${nm}_kstride0;
    % endfor
% else:
    % for nm, ty in inputs:
        ${index_t} ${nm}_base = ${nm}_off;
    % endfor
        {
            ${index_t} rest = oidx;
    % for k in reversed(list(kdims)):
            {
        % if k > 0:
                ${index_t} coord = rest % ksize${k};
                rest /= ksize${k};
        % else:
                ${index_t} coord = rest;
        % endif
        % for nm, ty in inputs:
                ${nm}_base += coord * ${nm}_kstride${k};
        % endfor
            }
    % endfor
        }
% endif
        const ${index_t} chunk_begin = chunk * chunk_len;
        const ${index_t} chunk_end = ${unit_valid} ? min(chunk_begin + chunk_len, red_total) : chunk_begin;
% for j in range(unroll):
    % for nm, ty, ident, out_ty in accumulators:
        ${ty} acc${j}_${nm} = ${ident};
    % endfor
% endfor
</%def>

<%def name="write_unit()">\
% if apply_finalize and not last_group:
        { ${finalize} }
% endif
% for nm, ty, ident, out_ty in accumulators:
        ${nm}_out[${nm}_out_off + u] = (${out_ty})acc_${nm};
% endfor
</%def>

__kernel
% if variant == "group":
__attribute__((reqd_work_group_size(${group_size}, 1, 1)))
% endif
void ${name}(
    ${index_t} kept_total, ${index_t} red_total, ${index_t} chunk_len, ${index_t} chunks,
    ${index_t} reduce_size, int segment_shift
% for k in kdims:
    , ${index_t} ksize${k}
% endfor
% for k in rdims:
    , ${index_t} rsize${k}
% endfor
% for nm, ty in inputs:
    , __global const ${buf_ty(ty)}* restrict ${nm}_buf, ${index_t} ${nm}_off
  % for k in kdims:
    , ${index_t} ${nm}_kstride${k}
  % endfor
  % for k in rdims:
    , ${index_t} ${nm}_rstride${k}
  % endfor
% endfor
% for nm, ty, ident, out_ty in accumulators:
    , __global ${out_ty}* restrict ${nm}_out, ${index_t} ${nm}_out_off
% endfor
% if last_group:
  % for nm, ty, ident, out_ty in accumulators:
    , __global ${out_ty}* restrict ${nm}_final, ${index_t} ${nm}_final_off
  % endfor
    , __global volatile int* done_count
% endif
% for nm, ty in scalars:
    , ${ty} ${nm}
% endfor
    )
{
    const ${index_t} units = kept_total * chunks;
% if variant == "group":
% for nm, ty, ident, out_ty in accumulators:
    __local ${ty} tree_${nm}[${group_size}];
% endfor
    const int lid = get_local_id(0);
    const int segment = 1 << segment_shift;
    const int seg_lid = lid & (segment - 1);
    const int units_per_group = ${group_size} >> segment_shift;
    // The unit loop's bounds depend on the group only, so every item meets every barrier.
    for (${index_t} first = get_group_id(0) * units_per_group; first < units;
         first += get_num_groups(0) * units_per_group) {
        const ${index_t} slot = first + (lid >> segment_shift);
        const bool unit_valid = slot < units;
        const ${index_t} u = unit_valid ? slot : units - 1;
${unit_setup("unit_valid")}
        const ${index_t} load_stride = segment * ${vector};
        for (${index_t} step = chunk_begin + seg_lid * ${vector}; step < chunk_end;
             step += load_stride * ${unroll}) {
${fold_step("load_stride")}\
        }
${merge_sets()}\
% for nm, ty, ident, out_ty in accumulators:
        tree_${nm}[lid] = acc_${nm};
% endfor
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int width = segment >> 1; width > 0; width >>= 1) {
            if (seg_lid < width) {
% for nm, ty, ident, out_ty in accumulators:
                ${ty} ${nm} = tree_${nm}[lid + width];
% endfor
                { ${combine} }
% for nm, ty, ident, out_ty in accumulators:
                tree_${nm}[lid] = acc_${nm};
% endfor
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (seg_lid == 0 && unit_valid) {
${write_unit()}
        }
        // The next units overwrite the tree only after their first items have read it.
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% if last_group:
    // Release: this group's partials reach global memory before it counts itself done.
    __local int is_last;
    ${device_fence}
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    if (lid == 0) {
        is_last = atomic_inc(done_count) == (int)get_num_groups(0) - 1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (is_last) {
        ${device_fence}
    % for nm, ty, ident, out_ty in accumulators:
        ${ty} acc_${nm} = ${ident};
    % endfor
        // Item lid combines partials lid, lid + group_size, ... then the tree: a fixed order.
        // Volatile loads (other groups wrote these in this launch, past any cached copy), all
        // of a step issued before any is used: one round trip per step, not one per partial
        // (eight per item: up to 8 * group_size partials in one round trip).
        for (${index_t} first = lid; first < units; first += ${group_size * 8}) {
    % for j in range(8):
        % for nm, ty, ident, out_ty in accumulators:
            const ${ty} ${nm}${j} = (first + ${j * group_size} < units)
                ? (${ty})((__global volatile const ${out_ty}*)${nm}_out)[${nm}_out_off + first + ${j * group_size}]
                : ${ident};
        % endfor
    % endfor
    % for j in range(8):
            {
        % for nm, ty, ident, out_ty in accumulators:
                ${ty} ${nm} = ${nm}${j};
        % endfor
                { ${combine} }
            }
    % endfor
        }
    % for nm, ty, ident, out_ty in accumulators:
        tree_${nm}[lid] = acc_${nm};
    % endfor
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int width = ${group_size // 2}; width > 0; width >>= 1) {
            if (lid < width) {
    % for nm, ty, ident, out_ty in accumulators:
                ${ty} ${nm} = tree_${nm}[lid + width];
    % endfor
                { ${combine} }
    % for nm, ty, ident, out_ty in accumulators:
                tree_${nm}[lid] = acc_${nm};
    % endfor
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (lid == 0) {
            { ${finalize} }
    % for nm, ty, ident, out_ty in accumulators:
            ${nm}_final[${nm}_final_off] = (${out_ty})acc_${nm};
    % endfor
            // Zero again for the next launch (which starts after this one ends).
            *done_count = 0;
        }
    }
% endif
% else:
    for (${index_t} u = get_global_id(0); u < units; u += get_global_size(0)) {
${unit_setup("true")}
        for (${index_t} step = chunk_begin; step < chunk_end; step += ${unroll}) {
${fold_step(1)}\
        }
${merge_sets()}\
${write_unit()}
    }
% endif
}
