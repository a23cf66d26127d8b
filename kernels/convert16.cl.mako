## convert16: element-wise conversion between float32 and the 16-bit floating point storage
## types (float16, bfloat16), for Tensor.to / dlprim_py.ops.masks.cast. Written so that it
## needs no cl_khr_fp16 (NVIDIA's OpenCL lacks it): float16 is read and written only through
## the core vload_half / vstore_half_rte on `half *` buffers (which OpenCL C allows without the
## extension), and bfloat16 is a ushort bit pattern converted with integer operations.
##
## Layout: dense; element i of dst (at dst_off + i) is the conversion of src[src_off + i],
## i < n. One work-item per element (the caller rounds the global size up).
##
## Template parameters:
##   SOURCE, TARGET  "float", "half" or "bfloat16" (different from each other)
##   INDEX_T         "int" where n and the offsets fit in 31 bits, else "long"
##
## Conversions: half -> float and bfloat16 -> float are exact; float -> half rounds to nearest
## even (vstore_half_rte: overflow to infinity, NaN kept); float -> bfloat16 rounds to nearest
## even on the 16 dropped bits (overflow to infinity) and keeps a NaN a quiet NaN of the same
## sign (rounding would carry a NaN's payload into the exponent otherwise); half <-> bfloat16
## go through float, one rounding.
<%namespace name="access" file="memory_access.cl.mako"/>
<%
    storage = {"float": "float", "half": "half", "bfloat16": "ushort"}
%>
${access.bfloat16_conversions()}

__kernel void convert16(${INDEX_T} n, __global const ${storage[SOURCE]} *src, ${INDEX_T} src_off,
                        __global ${storage[TARGET]} *dst, ${INDEX_T} dst_off)
{
    const ${INDEX_T} i = get_global_id(0);
    if (i >= n)
        return;
% if SOURCE == "float":
    const float x = src[src_off + i];
% elif SOURCE == "half":
    const float x = vload_half(src_off + i, src);
% else:
    const float x = bf16_to_float(src[src_off + i]);
% endif
% if TARGET == "float":
    dst[dst_off + i] = x;
% elif TARGET == "half":
    vstore_half_rte(x, dst_off + i, dst);
% else:
    dst[dst_off + i] = float_to_bf16(x);
% endif
}
