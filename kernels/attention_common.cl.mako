## Definitions shared by the attention templates (attention.cl.mako, attention_tiled.cl.mako,
## attention_mma.cl.mako); not a kernel family of its own. Import with
##     <%namespace name="attention" file="attention_common.cl.mako"/>
<%def name="delta_kernel(index_t, dv, group=64)">
<% lanes = min(16, group) %>
// delta[r] = sum_e dout[r, e] * o[r, e]. ${lanes} work-items share a row, item `lane` reading
// columns lane, lane + ${lanes}, ...: a row's items read contiguous runs of each operand (one
// item walking a row alone read one word per row per load: 32 us for the 49152 rows of 64 of
// a b8 h12 s512 backward on the H200, against 12.5 with 16 items a row). The lanes' sums are
// added in local memory by the row's first item, in lane order. Work-groups of ${group} items
// (64 where the device allows: 4 rows), ${group // lanes} rows each.
__kernel __attribute__((reqd_work_group_size(${group}, 1, 1)))
void attention_delta(const ${index_t} rows,
                     __global const float *o, const ${index_t} o_off,
                     __global const float *dout, const ${index_t} dout_off,
                     __global float *delta)
{
    __local float lane_sums[${group}];
    const int lid = get_local_id(0);
    const int lane = lid % ${lanes};
    // The loop's bounds depend on the group only: every item meets every barrier.
    for (${index_t} r0 = (${index_t})get_group_id(0) * ${group // lanes}; r0 < rows;
         r0 += (${index_t})get_num_groups(0) * ${group // lanes}) {
        const ${index_t} r = r0 + lid / ${lanes};
        float total = 0.0f;
        if (r < rows) {
            __global const float *orow = o + o_off + r * ${dv};
            __global const float *grow = dout + dout_off + r * ${dv};
            for (int e = lane; e < ${dv}; e += ${lanes}) total = mad(orow[e], grow[e], total);
        }
        lane_sums[lid] = total;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lane == 0 && r < rows) {
            float sum = 0.0f;
            for (int i = 0; i < ${lanes}; ++i) sum += lane_sums[lid + i];
            delta[r] = sum;
        }
        // The next rows overwrite the sums only after they are read.
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
</%def>
