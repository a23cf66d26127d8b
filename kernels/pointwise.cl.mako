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
## A 16-bit operand's group moves as one aligned access of VECTOR / 2 32-bit words (16 bytes for
## VECTOR 8), not through vload_halfN / vloadN: those assume only the element's 2-byte alignment,
## so a compiler that cannot prove more splits them into one 2-byte access per element (PTX's
## vector accesses need the whole vector's alignment): four times float32's load and store
## instructions for half its bytes, and stores of parts of a sector. The words are converted in registers: float16 by the core vload_halfN / vstore_halfN_rte on a
## private copy (the device's conversion instructions, no cl_khr_fp16), bfloat16 by shifting or
## masking each word's halves into floats and packing float_to_bf16's roundings back.
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
##   vector         elements per group (1, 2, 4, 8 or 16; at most 8 with 16-bit operands); 1 (the
##                  default) is the scalar variant
##   vector_inputs  with vector > 1 (else optional): one bool per input, True where the input is contiguous along
##                  the innermost dimension (read VECTOR-wide), False where it has stride 0 there
##   inputs         list of (name, type) read before the statement: an OpenCL C type, or "half" /
##                  "bfloat16" for 16-bit floating point storage (see below)
##   outputs        list of (name, type) the statement assigns, types as for inputs
##   scalars        list of (name, OpenCL C type) passed by value
##   statement      C statement(s) that assign every output from inputs and scalars; it may use
##                  i, the output element's index (so <out>_buf[<out>_off + i] is its old value)
##   index_t        "int" when every index (including base + unroll * global size) fits in 31 bits,
##                  else "long" (integer division is several times cheaper in 32 bits on GPUs)
##   preamble       extra C code placed before the kernel (helper functions), may be ""
##
## 16-bit storage: an operand of type "half" (float16) or "bfloat16" lives in a `half *` or
## `ushort *` (bfloat16's bits) buffer and is a float in the statement: loaded through the core
## vload_half / vload_halfN (legal without cl_khr_fp16, which NVIDIA's OpenCL lacks) or by
## shifting bfloat16's bits into a float's, and stored rounded to nearest even (vstore_half_rte /
## float_to_bf16 of memory_access.cl.mako). So every statement computes in float32 and rounds
## once, as torch's CUDA kernels do for these types (their "opmath" type), on every device.
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
    # 16-bit storage: the buffer's element type, and the statement's (float).
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
        # VECTOR elements from index on, aligned to the whole access (the caller's guarantee).
        if ty in storage16:
            return f"load_{ty}_x{vector}({nm}_buf + {index})"
        return f"*(__global const {vty(ty)}*)({nm}_buf + {index})"
    def store(nm, ty, index, value):
        if ty == "half":
            return f"vstore_half_rte({value}, {index}, {nm}_buf);"
        if ty == "bfloat16":
            return f"{nm}_buf[{index}] = float_to_bf16({value});"
        return f"{nm}_buf[{index}] = {value};"
    any_bfloat16 = any(ty == "bfloat16" for nm, ty in list(inputs) + list(outputs))
    # The 16-bit types moved VECTOR-wide: the wide inputs' and (with VECTOR > 1) every output's.
    wide16 = sorted({ty for nm, ty in inputs if wide.get(nm) and ty in storage16} |
                    ({ty for nm, ty in outputs if ty in storage16} if vector > 1 else set()))
    # 16 16-bit elements per access (32 bytes) are not offered: PoCL 3.0 (LLVM 14, AVX2) built
    # such a kernel without error and without the kernel in it.
    assert vector <= 8 or not wide16, "16-bit operands move at most 8 elements per access"
    # A group of a 16-bit operand as 32-bit words.
    words_ty = "uint" if vector == 2 else f"uint{vector // 2}"
    words = range(vector // 2)
    def word(w):
        return "w" if vector == 2 else f"w.s{w:x}"
%>
<%namespace name="access" file="memory_access.cl.mako"/>\
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
% if any_bfloat16:
${access.bfloat16_conversions()}
% endif
% for ty in wide16:
${wide16_access(ty)}
% endfor
${preamble}

## VECTOR consecutive 16-bit values at p (aligned to 2 * VECTOR bytes) as float${vector}, and back
## rounded to nearest even; `ty` "half" or "bfloat16".
<%def name="wide16_access(ty)">
% if ty == "half":
inline float${vector} load_half_x${vector}(__global const half *p)
{
    // Through a union: the word and its halves are one object to the compiler (a store as
    // half and a load as words of one private object are otherwise unordered under C's
    // aliasing rules).
    union { ${words_ty} w; half h[${vector}]; } u;
    u.w = *(__global const ${words_ty} *)p;
    return vload_half${vector}(0, u.h);
}

inline void store_half_x${vector}(__global half *p, float${vector} v)
{
    union { ${words_ty} w; half h[${vector}]; } u;
    vstore_half${vector}_rte(v, 0, u.h);
    *(__global ${words_ty} *)p = u.w;
}
% else:
inline float${vector} load_bfloat16_x${vector}(__global const ushort *p)
{
    // Element 2k is word k's low half on a little-endian device, its high half otherwise.
    const ${words_ty} w = *(__global const ${words_ty} *)p;
#if defined(__ENDIAN_LITTLE__)
    const ${words_ty} even = w << 16, odd = w & 0xffff0000u;
#else
    const ${words_ty} even = w & 0xffff0000u, odd = w << 16;
#endif
    return as_float${vector}((uint${vector})(${", ".join(f"{h}{'' if vector == 2 else f'.s{k:x}'}" for k in words for h in ("even", "odd"))}));
}

inline void store_bfloat16_x${vector}(__global ushort *p, float${vector} v)
{
    ${words_ty} w;
#if defined(__ENDIAN_LITTLE__)
    % for k in words:
    ${word(k)} = (uint)float_to_bf16(v.s${f"{2 * k:x}"}) | ((uint)float_to_bf16(v.s${f"{2 * k + 1:x}"}) << 16);
    % endfor
#else
    % for k in words:
    ${word(k)} = ((uint)float_to_bf16(v.s${f"{2 * k:x}"}) << 16) | (uint)float_to_bf16(v.s${f"{2 * k + 1:x}"});
    % endfor
#endif
    *(__global ${words_ty} *)p = w;
}
% endif
</%def>\
## The element at index `index` (an expression) with its inputs already in scalar variables
## `<name>` declared by the caller: runs the statement and leaves the outputs in `<name>`.
<%def name="element(index)">
            const ${index_t} i = ${index};
    % for nm, ty in outputs:
            ${val_ty(ty)} ${nm};
    % endfor
            { ${statement} }
</%def>

__kernel void ${name}(
    ${index_t} total
% for k in dims:
    , ${index_t} size${k}
% endfor
% for nm, ty in inputs:
    , __global const ${buf_ty(ty)}* restrict ${nm}_buf, ${index_t} ${nm}_off
  % for k in dims:
    , ${index_t} ${nm}_stride${k}
  % endfor
% endfor
% for nm, ty in outputs:
    , __global ${buf_ty(ty)}* restrict ${nm}_buf, ${index_t} ${nm}_off
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
        ${vty(val_ty(ty)) if wide.get(nm) else val_ty(ty)} ${nm}${u} = (${vty(val_ty(ty)) if wide.get(nm) else val_ty(ty)})(0);
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
            ${nm}${u} = ${load_wide(nm, ty, f"{nm}_index")};
        % else:
            ${nm}${u} = ${load(nm, ty, f"{nm}_index")};
        % endif
    % endfor
        }
% endfor
% for u in lanes:
        if (group_at${u} < total) {
    % if vector == 1:
        % for nm, ty in inputs:
            ${val_ty(ty)} ${nm} = ${nm}${u};
        % endfor
            ${element(f"group_at{u}")}
        % for nm, ty in outputs:
            ${store(nm, ty, f"{nm}_off + group_at{u}", nm)}
        % endfor
    % else:
        % for nm, ty in outputs:
            ${vty(val_ty(ty))} ${nm}_vec;
        % endfor
        % for lane in range(vector):
            {
            % for nm, ty in inputs:
            ${val_ty(ty)} ${nm} = ${nm}${u}${f".s{lane:x}" if wide[nm] else ""};
            % endfor
            ${element(f"group_at{u} * {vector} + {lane}")}
            % for nm, ty in outputs:
            ${nm}_vec.s${f"{lane:x}"} = ${nm};
            % endfor
            }
        % endfor
        % for nm, ty in outputs:
            % if ty in storage16:
            store_${ty}_x${vector}(${nm}_buf + ${nm}_off + group_at${u} * ${vector}, ${nm}_vec);
            % else:
            *(__global ${vty(ty)}*)(${nm}_buf + ${nm}_off + group_at${u} * ${vector}) = ${nm}_vec;
            % endif
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
        ${val_ty(ty)} ${nm} = ${load(nm, ty, nm + "_off" + (" + tail_index" if wide[nm] else ""))};
    % endfor
        ${element("tail_index")}
    % for nm, ty in outputs:
        ${store(nm, ty, nm + "_off + tail_index", nm)}
    % endfor
    }
% endif
}
