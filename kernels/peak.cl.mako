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
## launch_probe: one work item increments counter[off]; K launches leave K there, which proves
##   every launch ran.
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

__kernel void copy_float4(__global const float4* restrict src, long src_off,
                          __global float4* restrict dst, long dst_off, long n4)
{
    long i = get_global_id(0);
    if (i < n4)
        dst[dst_off + i] = src[src_off + i];
}

__kernel void launch_probe(__global int* counter, int off)
{
    if (get_global_id(0) == 0)
        counter[off] += 1;
}
