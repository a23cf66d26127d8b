## Dropout with a counter-based generator: Philox4x32-10 (Salmon et al., "Parallel random
## numbers: as easy as 1, 2, 3", SC'11), so the mask is a pure function of (seed, stream, element
## index) and comes out the same on any device and for any launch geometry.
##
## Element i takes word (i % 4) of philox(counter = (i / 4 low, i / 4 high, stream low,
## stream high), key = (seed low, seed high)) and is kept when (word >> 8) >= threshold, with
## threshold = round(p * 2^24): integer arithmetic only. Kept elements are scaled by
## scale = 1 / (1 - p), dropped ones become 0. The backward is the same operation on the
## gradient, so no mask is stored.
##
## dropout_apply(total, x, x_off, y, y_off, key0, key1, stream0, stream1, threshold, scale)
##   A "block" is the four elements of one Philox call. Each work item takes UNROLL whole blocks
##   per step of a grid-stride loop, loading all of their inputs before the generator runs, so
##   that the loads are in flight while it computes; work item 0 also takes the last, partial
##   block (total % 4 elements).
##
## Template parameters:
##   index_t   "int" when every index fits in 31 bits, else "long"
##   vector    1: scalar loads and stores; 4: one 16-byte access per block (the caller checks
##             that x_off and y_off are multiples of 4, so that every access is aligned)
##   unroll    whole blocks per work item and loop step (>= 1)
<%
    lanes = range(unroll)
%>
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

uint4 philox4x32_10(uint4 ctr, uint2 key)
{
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            key.x += PHILOX_W0;
            key.y += PHILOX_W1;
        }
        uint hi0 = mul_hi(PHILOX_M0, ctr.x), lo0 = PHILOX_M0 * ctr.x;
        uint hi1 = mul_hi(PHILOX_M1, ctr.z), lo1 = PHILOX_M1 * ctr.z;
        ctr = (uint4)(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
    }
    return ctr;
}

uint4 block_words(ulong block, uint key0, uint key1, uint stream0, uint stream1)
{
    return philox4x32_10((uint4)((uint)block, (uint)(block >> 32), stream0, stream1),
                         (uint2)(key0, key1));
}

__kernel void dropout_apply(${index_t} total,
                            __global const float* restrict x, ${index_t} x_off,
                            __global float* restrict y, ${index_t} y_off,
                            uint key0, uint key1, uint stream0, uint stream1,
                            uint threshold, float scale)
{
    const ${index_t} blocks = total / 4;
    const ${index_t} step = get_global_size(0);
    for (${index_t} base = get_global_id(0); base < blocks; base += ${unroll} * step) {
% for u in lanes:
        const ${index_t} block${u} = base + ${u} * step;
        float4 in${u} = (float4)(0.0f);
        if (block${u} < blocks) {
    % if vector == 4:
            in${u} = *(__global const float4*)(x + x_off + block${u} * 4);
    % else:
            __global const float* at = x + x_off + block${u} * 4;
            in${u} = (float4)(at[0], at[1], at[2], at[3]);
    % endif
        }
% endfor
% for u in lanes:
        if (block${u} < blocks) {
            const uint4 r = block_words((ulong)block${u}, key0, key1, stream0, stream1);
            const float4 out = (float4)((r.x >> 8) >= threshold ? in${u}.x * scale : 0.0f,
                                        (r.y >> 8) >= threshold ? in${u}.y * scale : 0.0f,
                                        (r.z >> 8) >= threshold ? in${u}.z * scale : 0.0f,
                                        (r.w >> 8) >= threshold ? in${u}.w * scale : 0.0f);
    % if vector == 4:
            *(__global float4*)(y + y_off + block${u} * 4) = out;
    % else:
            __global float* at = y + y_off + block${u} * 4;
            at[0] = out.x;
            at[1] = out.y;
            at[2] = out.z;
            at[3] = out.w;
    % endif
        }
% endfor
    }
    if (get_global_id(0) == 0 && blocks * 4 < total) {
        const uint4 r = block_words((ulong)blocks, key0, key1, stream0, stream1);
        const uint words[4] = {r.x, r.y, r.z, r.w};
        for (int lane = 0; lane < total - blocks * 4; ++lane) {
            const ${index_t} i = blocks * 4 + lane;
            y[y_off + i] = (words[lane] >> 8) >= threshold ? x[x_off + i] * scale : 0.0f;
        }
    }
}
