## Helpers imported by other families (<%namespace name="access" file="memory_access.cl.mako"/>):
## 16-byte float loads and stores with cache hints, and reductions across a warp by shuffles.
## Both are inline PTX, so only for NVIDIA's OpenCL; every def has a plain OpenCL form that the
## callers use elsewhere.
##
## Defs:
##   vector_access(load_hint, store_hint, suffix="")
##       defines float4 load4<suffix>(__global const float *p) and
##       void store4<suffix>(__global float *p, float4 v) for 16-byte aligned addresses.
##       load_hint / store_hint: PTX qualifiers after ld.global / st.global, e.g. ".nc.L2::256B"
##       (read-only path, fetch 256 bytes into L2 per miss) or ".cs" (evict first: data used
##       once); None gives plain OpenCL accesses. Streaming data through with evict-first
##       accesses leaves L2 to the data that is read again.
##   atomic_add_float(ptx)
##       defines void atomic_add_float(__global float *p, float v): *p += v atomically, in no
##       fixed order among the items that add to p; red.global.add.f32 when ptx is True
##       (NVIDIA), else a compare-and-swap loop whose first guess of the old value is 0 (so that
##       no plain read races with the other items' swaps)
##   async_copies(ptx)
##       defines copy4 / copy8 / copy16(__local float *dst, __global const float *src): 4, 8
##       and 16-byte copies from global to local memory (aligned to their size) that hold no
##       register while in flight (cp.async on NVIDIA when ptx is True; plain copies, done when
##       issued, otherwise), copy4_masked(dst, src, ok) (a plain copy, 0 where not ok), and
##       COPY_COMMIT() / COPY_WAIT(pending): close the work item's copies issued so far into a
##       group / wait until at most `pending` of its groups are in flight. The issuing work
##       item sees its copies after COPY_WAIT; others after a barrier that follows it.
##   bfloat16_conversions()
##       defines float bf16_to_float(ushort bits) (exact) and ushort float_to_bf16(float x)
##       (round to nearest even on the 16 dropped bits, overflow to infinity, a NaN kept a
##       quiet NaN of its sign: rounding would carry a NaN's payload into the exponent)
##   vectors16(dtype, suffix="")
##       defines float4 load4<suffix>(__global const T *p) and void store4<suffix>(__global T *p,
##       float4 v) for 16-bit storage, p 8-byte aligned, moved as one 8-byte word ("half": T
##       half, converted by vload_half4 / vstore_half4_rte on a private copy; "bfloat16": T
##       ushort, stores through float_to_bf16 of bfloat16_conversions(), defined first): four values per
##       access, converted to float4 and back with one rounding to nearest even, no cl_khr_fp16
##       needed
##   warp_reductions()
##       defines float warp_max(float v) and float warp_sum(float v): the max / sum over the 32
##       lanes of the caller's warp, returned to every lane (shfl.sync.bfly, full mask: every
##       lane of the warp must call it). A one-dimensional work-group's items form warps of 32
##       consecutive local ids on NVIDIA.

<%def name="vector_access(load_hint, store_hint, suffix='')">
% if load_hint is None:
inline float4 load4${suffix}(__global const float *p) { return *(__global const float4 *)p; }
% else:
inline float4 load4${suffix}(__global const float *p)
{
    // Scalars, not vector components, as asm outputs: components are not addressable lvalues.
    float a, b, c, d;
    asm("ld.global${load_hint}.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"((ulong)p));
    return (float4)(a, b, c, d);
}
% endif
% if store_hint is None:
inline void store4${suffix}(__global float *p, float4 v) { *(__global float4 *)p = v; }
% else:
inline void store4${suffix}(__global float *p, float4 v)
{
    asm volatile("st.global${store_hint}.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"((ulong)p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
% endif
</%def>

<%def name="bfloat16_conversions()">
inline float bf16_to_float(ushort bits) { return as_float((uint)bits << 16); }

inline ushort float_to_bf16(float x)
{
    const uint u = as_uint(x);
    if (isnan(x))
        return (ushort)((u >> 16) | 0x40u);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
</%def>

<%def name="vectors16(dtype, suffix='')">
<% storage = {"half": "half", "bfloat16": "ushort"}[dtype] %>\
inline float4 load4${suffix}(__global const ${storage} *p)
{
% if dtype == "half":
    // One aligned 8-byte load, converted from a private copy: vload_half4 on the global
    // pointer may only assume 2-byte alignment (four 2-byte loads on NVIDIA). A union, so
    // that the word and the halves are one object to the compiler.
    union { uint2 w; half h[4]; } u;
    u.w = *(__global const uint2 *)p;
    return vload_half4(0, u.h);
% else:
    return as_float4(convert_uint4(*(__global const ushort4 *)p) << 16);
% endif
}

inline void store4${suffix}(__global ${storage} *p, float4 v)
{
% if dtype == "half":
    // Through a union: a store as half and a load as uint2 of one object are otherwise
    // unordered under C's aliasing rules (PoCL then stores stale words).
    union { uint2 w; half h[4]; } u;
    vstore_half4_rte(v, 0, u.h);
    *(__global uint2 *)p = u.w;
% else:
    *(__global ushort4 *)p = (ushort4)(float_to_bf16(v.x), float_to_bf16(v.y),
                                       float_to_bf16(v.z), float_to_bf16(v.w));
% endif
}
</%def>

<%def name="warp_reductions()">
inline float warp_shuffle_xor(float v, int lane_mask)
{
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(lane_mask));
    return r;
}

inline float warp_max(float v)
{
    for (int mask = 16; mask > 0; mask >>= 1) v = fmax(v, warp_shuffle_xor(v, mask));
    return v;
}

inline float warp_sum(float v)
{
    for (int mask = 16; mask > 0; mask >>= 1) v += warp_shuffle_xor(v, mask);
    return v;
}
</%def>

<%def name="atomic_add_float(ptx)">
inline void atomic_add_float(__global float *p, float v)
{
% if ptx:
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"((ulong)p), "f"(v) : "memory");
% else:
    uint seen = 0u, expected;
    do {
        expected = seen;
        seen = atomic_cmpxchg((volatile __global uint *)p, expected,
                              as_uint(as_float(expected) + v));
    } while (seen != expected);
% endif
}
</%def>

<%def name="async_copies(ptx)">
% if ptx:
inline void copy4(__local float *dst, __global const float *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;"
                 :: "r"((uint)(ulong)dst), "l"((ulong)src) : "memory");
}

inline void copy8(__local float *dst, __global const float *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;"
                 :: "r"((uint)(ulong)dst), "l"((ulong)src) : "memory");
}

inline void copy16(__local float *dst, __global const float *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"((uint)(ulong)dst), "l"((ulong)src) : "memory");
}
#define COPY_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define COPY_WAIT(pending) asm volatile("cp.async.wait_group " #pending ";" ::: "memory")
% else:
inline void copy4(__local float *dst, __global const float *src) { *dst = *src; }
inline void copy8(__local float *dst, __global const float *src)
{
    *(__local float2 *)dst = *(__global const float2 *)src;
}
inline void copy16(__local float *dst, __global const float *src)
{
    *(__local float4 *)dst = *(__global const float4 *)src;
}
#define COPY_COMMIT()
#define COPY_WAIT(pending)
% endif
// A copy that may fall outside the source (zero then): a plain load and store, visible to
// other work-items at the next barrier like the others once COPY_WAIT has passed.
inline void copy4_masked(__local float *dst, __global const float *src, bool ok)
{
    *dst = ok ? *src : 0.0f;
}
</%def>
