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
##   each work item handles the four elements of one Philox block.
##
## Template parameters:
##   index_t   "int" when every index fits in 31 bits, else "long"

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

__kernel void dropout_apply(${index_t} total,
                            __global const float* restrict x, ${index_t} x_off,
                            __global float* restrict y, ${index_t} y_off,
                            uint key0, uint key1, uint stream0, uint stream1,
                            uint threshold, float scale)
{
    const ${index_t} blocks = (total + 3) / 4;
    for (${index_t} b = get_global_id(0); b < blocks; b += get_global_size(0)) {
        const ulong block = (ulong)b;
        uint4 r = philox4x32_10((uint4)((uint)block, (uint)(block >> 32), stream0, stream1),
                                (uint2)(key0, key1));
        uint words[4] = {r.x, r.y, r.z, r.w};
        for (int lane = 0; lane < 4; ++lane) {
            ${index_t} i = b * 4 + lane;
            if (i < total) {
                y[y_off + i] = (words[lane] >> 8) >= threshold ? x[x_off + i] * scale : 0.0f;
            }
        }
    }
}
