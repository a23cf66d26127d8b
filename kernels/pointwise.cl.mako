## Pointwise and broadcast kernels generated from a C statement.
##
## The kernel walks "groups" of VECTOR consecutive output elements. Each work item handles
## UNROLL groups per loop step, then moves on by UNROLL * global_size groups (grid-stride loop);
## without GRID_STRIDE the caller launches enough work items for one step to cover every group,
## and the kernel has no loop (on an H200 the loop's trip-count arithmetic and unrolled copies
## took registers enough to lower occupancy, and with it the loads in flight).
## INTERLEAVE says which: "grid", groups base + u * global_size (base = the global id); "block",
## groups base + u * local_size with base = group id * UNROLL * local_size + local id, so that a
## work-group covers UNROLL * local_size consecutive groups (PyTorch's elementwise layout). All
## UNROLL groups' inputs are loaded before any is used, so that each work item keeps several
## independent loads in flight: one 4-byte load at a time leaves a GPU's memory system idle
## (about 70% of copy bandwidth on an H200).
##
## VECTOR == 1 is the general (scalar) variant. With VECTOR > 1, a group is VECTOR elements that
## are consecutive along the innermost dimension for the output and for every input of
## `vector_inputs`: these move as one VECTOR-wide access (16 bytes for float with VECTOR 4),
## which the caller guarantees aligned (offsets and outer strides multiples of VECTOR, the
## innermost size a multiple of VECTOR unless NDIM == 1). The other inputs have stride 0 along
## the innermost dimension: one scalar load serves the group's VECTOR elements. When NDIM == 1
## the last `tail` (< VECTOR) elements after the groups are handled one per work item.
##
## The index space has NDIM dimensions (after the caller merged every pair of dimensions that is
## contiguous for all operands), counted in groups: size<NDIM-1> is the innermost size over
## VECTOR, and stride<NDIM-1> of an input is VECTOR or 0. Each input reads group coordinates at
## off + sum_k coord_k * stride_k, with stride 0 along broadcast dimensions. Outputs are dense.
##
## Template parameters:
##   name           kernel name
##   ndim           number of dimensions of the index space (>= 1)
##   unroll         groups per work item and loop step (>= 1)
##   interleave     optional, "grid" (the default) or "block": where a work item's UNROLL groups lie
##   grid_stride    optional, True (the default): loop over the index space; False: one step, the
##                  global size times UNROLL covers every group
##   vector         elements per group (1, 2, 4, 8 or 16); 1 (the default) is the scalar variant
##   vector_inputs  with vector > 1 (else optional): one bool per input, True where the input is contiguous along
##                  the innermost dimension (read VECTOR-wide), False where it has stride 0 there
##   inputs         list of (name, OpenCL C type) read before the statement
##   outputs        list of (name, OpenCL C type) the statement assigns
##   scalars        list of (name, OpenCL C type) passed by value
##   statement      C statement(s) that assign every output from inputs and scalars; it may use
##                  i, the output element's index (so <out>_buf[<out>_off + i] is its old value)
##   index_t        "int" when every index (including base + unroll * global size) fits in 31 bits,
##                  else "long" (integer division is several times cheaper in 32 bits on GPUs)
##   preamble       extra C code placed before the kernel (helper functions), may be ""
## Operand names must not collide with the kernel's own: i, total, tail, tail_index, step, lane_step, base,
## rest, coord, size<k>, group_at<u>, or <operand>_buf/_off/_stride<k>/_index/_vec/<u>.
<%
    # Optional, so that callers written for the scalar kernel render it unchanged.
    vector = context.get("vector", 1)
    vector_inputs = context.get("vector_inputs", [])
    interleave = context.get("interleave", "grid")
    grid_stride = context.get("grid_stride", True)
    assert interleave in ("grid", "block"), interleave
    dims = range(ndim)
    lanes = range(unroll)
    wide = dict(zip([nm for nm, ty in inputs], vector_inputs)) if vector > 1 else {}
    def vty(ty):
        return ty if vector == 1 else f"{ty}{vector}"
%>
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
${preamble}

## The element at index `index` (an expression) with its inputs already in scalar variables
## `<name>` declared by the caller: runs the statement and leaves the outputs in `<name>`.
<%def name="element(index)">
            const ${index_t} i = ${index};
    % for nm, ty in outputs:
            ${ty} ${nm};
    % endfor
            { ${statement} }
</%def>

__kernel void ${name}(
    ${index_t} total
% for k in dims:
    , ${index_t} size${k}
% endfor
% for nm, ty in inputs:
    , __global const ${ty}* restrict ${nm}_buf, ${index_t} ${nm}_off
  % for k in dims:
    , ${index_t} ${nm}_stride${k}
  % endfor
% endfor
% for nm, ty in outputs:
    , __global ${ty}* restrict ${nm}_buf, ${index_t} ${nm}_off
% endfor
% for nm, ty in scalars:
    , ${ty} ${nm}
% endfor
% if vector > 1:
    , ${index_t} tail
% endif
    )
{
<%
    if interleave == "block" and unroll > 1:
        lane_step = "get_local_size(0)"
        start = f"({index_t})get_group_id(0) * {unroll} * lane_step + get_local_id(0)"
    else:
        lane_step, start = "step", "get_global_id(0)"
%>
    const ${index_t} step = get_global_size(0);
    const ${index_t} lane_step = ${lane_step};
% if grid_stride:
    for (${index_t} base = ${start}; base < total; base += ${unroll} * step) {
% else:
    {
        const ${index_t} base = ${start};
% endif
% for u in lanes:
        const ${index_t} group_at${u} = base + ${u} * lane_step;
    % for nm, ty in inputs:
        ${vty(ty) if wide.get(nm) else ty} ${nm}${u} = (${vty(ty) if wide.get(nm) else ty})(0);
    % endfor
        if (group_at${u} < total) {
    % if ndim == 1:
        % for nm, ty in inputs:
            const ${index_t} ${nm}_index = ${nm}_off + group_at${u} * ${nm}_stride0;
        % endfor
    % else:
            ${index_t} rest = group_at${u};
        % for nm, ty in inputs:
            ${index_t} ${nm}_index = ${nm}_off;
        % endfor
        % for k in reversed(list(dims)):
            {
            % if k > 0:
                ${index_t} coord = rest % size${k};
                rest /= size${k};
            % else:
                ${index_t} coord = rest;
            % endif
            % for nm, ty in inputs:
                ${nm}_index += coord * ${nm}_stride${k};
            % endfor
            }
        % endfor
    % endif
    % for nm, ty in inputs:
        % if wide.get(nm):
            ${nm}${u} = *(__global const ${vty(ty)}*)(${nm}_buf + ${nm}_index);
        % else:
            ${nm}${u} = ${nm}_buf[${nm}_index];
        % endif
    % endfor
        }
% endfor
% for u in lanes:
        if (group_at${u} < total) {
    % if vector == 1:
        % for nm, ty in inputs:
            ${ty} ${nm} = ${nm}${u};
        % endfor
            ${element(f"group_at{u}")}
        % for nm, ty in outputs:
            ${nm}_buf[${nm}_off + group_at${u}] = ${nm};
        % endfor
    % else:
        % for nm, ty in outputs:
            ${vty(ty)} ${nm}_vec;
        % endfor
        % for lane in range(vector):
            {
            % for nm, ty in inputs:
            ${ty} ${nm} = ${nm}${u}${f".s{lane:x}" if wide[nm] else ""};
            % endfor
            ${element(f"group_at{u} * {vector} + {lane}")}
            % for nm, ty in outputs:
            ${nm}_vec.s${f"{lane:x}"} = ${nm};
            % endfor
            }
        % endfor
        % for nm, ty in outputs:
            *(__global ${vty(ty)}*)(${nm}_buf + ${nm}_off + group_at${u} * ${vector}) = ${nm}_vec;
        % endfor
    % endif
        }
% endfor
    }
% if vector > 1 and ndim == 1:
    // The elements after the last whole group (NDIM == 1 only).
    if (get_global_id(0) < tail) {
        const ${index_t} tail_index = total * ${vector} + get_global_id(0);
    % for nm, ty in inputs:
        ${ty} ${nm} = ${nm}_buf[${nm}_off${" + tail_index" if wide[nm] else ""}];
    % endfor
        ${element("tail_index")}
    % for nm, ty in outputs:
        ${nm}_buf[${nm}_off + tail_index] = ${nm};
    % endfor
    }
% endif
}
