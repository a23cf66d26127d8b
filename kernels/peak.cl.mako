## Device peak probes (clpeak-style): FP32 multiply-add rate, copy bandwidth, launch cost.
##
## fma_peak: each work item runs CHAINS independent float4 multiply-add chains
##   a <- a * m + c, UNROLL steps per loop trip, for `trips` trips, then writes the sum of every
##   lane of every chain to y. The chains are independent so that the arithmetic units never wait
##   on the latency of the previous multiply-add; m and c are kernel arguments so the compiler
##   cannot fold the loop. With 0 < m < 1 the recurrence contracts, so the result has a closed
##   form the host checks: f^n(a) = m^n (a - L) + L with L = c / (1 - m).
##   Work: 8 * CHAINS * UNROLL * trips flops per work item (a float4 multiply-add counts 8).
## copy_float4: dst[i] = src[i] over n4 float4 elements; offsets are in float4 elements (the
##   host checks that tensor offsets are multiples of 4 floats so that loads stay 16-byte wide).
## read_float4: every work item reads `passes` passes over its share (a stride of the global
##   size) of src's n4 float4 elements, four loads in flight, and writes their sum to y[i]. A src
##   that the L2 cache holds after the first pass gives the L2-to-compute-unit read bandwidth (what
##   a GEMM's tiles are fed from); one far larger than the cache, the memory's. The host fills src
##   with ones: each y[i] is then the exact count of floats the item read.
## launch_probe: one work item increments counter[off]; K launches leave K there, which proves
##   every launch ran.
## tf32_mma_peak (only rendered with mma=1, NVIDIA compute capability 8.0+): every warp issues
##   CHAINS independent mma.sync.m16n8k8 TF32 products per step from registers (no memory
##   traffic), UNROLL steps per loop trip, `trips` trips, every fragment element a or b; each
##   accumulator ends at 8 * a * b * steps, and y gets the sum of a work item's accumulators,
##   which the host checks. Work: 2048 * CHAINS * UNROLL * trips flops per warp. The ceiling of
##   warp-level TF32 tensor-core math from OpenCL, against which the mma GEMM is measured.
##
## Template parameters:
##   chains   number of independent float4 chains per work item (hides multiply-add latency)
##   unroll   multiply-add steps per chain in one loop trip (hides loop overhead)

__kernel void fma_peak(__global const float* restrict x, int x_off,
                       __global float* restrict y, int y_off,
                       int trips, float m, float c)
{
    int i = get_global_id(0);
    float start = x[x_off + i];
    float4 m4 = (float4)(m);
    float4 c4 = (float4)(c);
% for k in range(chains):
    float4 a${k} = (float4)(start) + (float4)(${k * 0.125}f, ${k * 0.125 + 0.03125}f, ${k * 0.125 + 0.0625}f, ${k * 0.125 + 0.09375}f);
% endfor
    for (int t = 0; t < trips; ++t) {
% for u in range(unroll):
  % for k in range(chains):
        a${k} = mad(a${k}, m4, c4);
  % endfor
% endfor
    }
    float4 total = (float4)(0.0f);
% for k in range(chains):
    total += a${k};
% endfor
    y[y_off + i] = total.s0 + total.s1 + total.s2 + total.s3;
}

% if mma:
__kernel void tf32_mma_peak(__global float* restrict y, int y_off, int trips, float a, float b)
{
    uint ta, tb;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(ta) : "f"(a));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(tb) : "f"(b));
% for k in range(chains):
    float c${k}0 = 0.0f, c${k}1 = 0.0f, c${k}2 = 0.0f, c${k}3 = 0.0f;
% endfor
    for (int t = 0; t < trips; ++t) {
% for u in range(unroll):
  % for k in range(chains):
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                     : "=f"(c${k}0), "=f"(c${k}1), "=f"(c${k}2), "=f"(c${k}3)
                     : "r"(ta), "r"(ta), "r"(ta), "r"(ta), "r"(tb), "r"(tb),
                       "f"(c${k}0), "f"(c${k}1), "f"(c${k}2), "f"(c${k}3));
  % endfor
% endfor
    }
    float total = 0.0f;
% for k in range(chains):
    total += (c${k}0 + c${k}1) + (c${k}2 + c${k}3);
% endfor
    y[y_off + get_global_id(0)] = total;
}

% endif
__kernel void copy_float4(__global const float4* restrict src, long src_off,
                          __global float4* restrict dst, long dst_off, long n4)
{
    long i = get_global_id(0);
    if (i < n4)
        dst[dst_off + i] = src[src_off + i];
}

__kernel void read_float4(__global const float4* restrict src, long n4, int passes,
                          __global float* restrict y)
{
    const long gid = get_global_id(0), size = get_global_size(0);
    float4 a0 = (float4)(0.0f), a1 = a0, a2 = a0, a3 = a0;
    for (int p = 0; p < passes; ++p) {
        long i = gid;
        for (; i + 3 * size < n4; i += 4 * size) {
            a0 += src[i];
            a1 += src[i + size];
            a2 += src[i + 2 * size];
            a3 += src[i + 3 * size];
        }
        for (; i < n4; i += size)
            a0 += src[i];
    }
    const float4 t = (a0 + a1) + (a2 + a3);
    y[gid] = (t.x + t.y) + (t.z + t.w);
}

__kernel void launch_probe(__global int* counter, int off)
{
    if (get_global_id(0) == 0)
        counter[off] += 1;
}
