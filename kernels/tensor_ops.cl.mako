## Data movement between dense tensors: strided copies (narrow, split, cat, permute) and padding
## (constant, reflect, replicate, circular) with its backward.
##
## strided_copy walks an index space of NDIM dimensions (the caller merges dimensions that are
## contiguous in both source and destination) and copies src[src_off + sum c_k*src_stride_k] to
## dst[dst_off + sum c_k*dst_stride_k]. Strides are in elements and may be anything, so one compile
## serves every slice, concatenation and permutation of the same rank.
##
## pad writes a dense output of NDIM dimensions; along dimension k output coordinate o reads input
## coordinate o - before_k, resolved by MODE when it falls outside [0, in_size_k).
## pad_backward_1d works on one padded dimension at a time, seen as (outer, length, inner): each
## input element sums the output positions that read it (gather, so no atomics and a fixed order).
##
## transpose_tiles is the strided copy of a transposition: dimension p is contiguous in the source
## (stride 1) and dimension q in the destination. A 32 x 32 tile goes through local memory so that
## both the reads and the writes are contiguous; BATCH_DIMS further dimensions come from the
## third grid dimension.
##
## Template parameters:
##   dtype       OpenCL C element type ("float", "half", "int", "long")
##   ndim        number of dimensions of strided_copy and pad (>= 1)
##   batch_dims  number of batch dimensions of transpose_tiles (>= 0)
##   index_t   "int" when every index fits in 31 bits, else "long"
##   mode      padding mode: "constant", "reflect", "replicate" or "circular" (circular with
##             pads >= 0, at most the dimension's size; the others take negative pads, which
##             crop, reading the input at the same coordinates as torch does)
<%
    dims = range(ndim)
    batch = range(batch_dims)
%>
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#define T ${dtype}
#define I ${index_t}

__kernel void strided_copy(I total
% for k in dims:
    , I size${k}
% endfor
    , __global const T* restrict src, I src_off
% for k in dims:
    , I src_stride${k}
% endfor
    , __global T* restrict dst, I dst_off
% for k in dims:
    , I dst_stride${k}
% endfor
    )
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        I rest = i;
        I s = src_off;
        I d = dst_off;
% for k in reversed(list(dims)):
        {
    % if k > 0:
            I coord = rest % size${k};
            rest /= size${k};
    % else:
            I coord = rest;
    % endif
            s += coord * src_stride${k};
            d += coord * dst_stride${k};
        }
% endfor
        dst[d] = src[s];
    }
}

__kernel void pad(I total
% for k in dims:
    , I out_size${k}, I in_size${k}, I before${k}
% endfor
    , __global const T* restrict src, I src_off
    , __global T* restrict dst, I dst_off
    , T value)
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        I rest = i;
        I s = 0;
        I in_stride = 1;
        int outside = 0;
% for k in reversed(list(dims)):
        {
    % if k > 0:
            I coord = rest % out_size${k};
            rest /= out_size${k};
    % else:
            I coord = rest;
    % endif
            I j = coord - before${k};
    % if mode == "constant":
            outside |= (j < 0) | (j >= in_size${k});
    % elif mode == "reflect":
            j = max(j, -j);   // |j|
            j = j >= in_size${k} ? 2 * (in_size${k} - 1) - j : j;
    % elif mode == "circular":
            // -in_size <= j < 2 * in_size (pads are at most the size): one wrap either way.
            j = j < 0 ? j + in_size${k} : (j >= in_size${k} ? j - in_size${k} : j);
    % else:
            j = clamp(j, (I)0, in_size${k} - 1);
    % endif
            s += j * in_stride;
            in_stride *= in_size${k};
        }
% endfor
% if mode == "constant":
        dst[dst_off + i] = outside ? value : src[src_off + s];
% else:
        dst[dst_off + i] = src[src_off + s];
% endif
    }
}

// grad_out is (outer, out_len, inner), grad_in is (outer, in_len, inner); out_len = before +
// in_len + after (before or after may be negative for constant padding, which crops).
__kernel void pad_backward_1d(I total, I in_len, I out_len, I inner, I before, I after
    , __global const T* restrict grad_out, I grad_out_off
    , __global T* restrict grad_in, I grad_in_off)
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        I b = i % inner;
        I r = i / inner;
        I c = r % in_len;
        I a = r / in_len;
        __global const T* row = grad_out + grad_out_off + a * out_len * inner + b;
        T sum = 0;
% if mode == "constant":
        I o = c + before;
        if (o >= 0 && o < out_len)
            sum = row[o * inner];
% elif mode == "reflect":
        // Pads may be negative (torch reads the input at the same coordinates then): the direct
        // position may fall outside the output.
        if (c + before >= 0 && c + before < out_len)
            sum = row[(c + before) * inner];
        if (c >= 1 && c <= before)
            sum += row[(before - c) * inner];
        if (c >= in_len - 1 - after && c <= in_len - 2)
            sum += row[(before + 2 * (in_len - 1) - c) * inner];
% elif mode == "circular":
        // The output positions c + before + m * in_len inside [0, out_len).
        for (I o = c + before - (c + before) / in_len * in_len; o < out_len; o += in_len)
            sum += row[o * inner];
% else:
        // Clipped to the output: negative pads crop it.
        I lo = max(c == 0 ? (I)0 : c + before, (I)0);
        I hi = min(c == in_len - 1 ? out_len - 1 : c + before, out_len - 1);
        for (I o = lo; o <= hi; ++o)
            sum += row[o * inner];
% endif
        grad_in[grad_in_off + i] = sum;
    }
}

#define TILE 32
#define TILE_ROWS 8

// src[p + q*src_q_stride + batch], dst[p*dst_p_stride + q + batch] for p < P, q < Q.
__kernel __attribute__((reqd_work_group_size(TILE, TILE_ROWS, 1)))
void transpose_tiles(I P, I Q
% for k in batch:
    , I batch_size${k}, I src_batch_stride${k}, I dst_batch_stride${k}
% endfor
    , __global const T* restrict src, I src_off, I src_q_stride
    , __global T* restrict dst, I dst_off, I dst_p_stride)
{
    __local T tile[TILE][TILE + 1];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const I p0 = (I)get_group_id(0) * TILE, q0 = (I)get_group_id(1) * TILE;
    I s = src_off, d = dst_off;
% if batch_dims:
    I rest = get_global_id(2);
% endif
% for k in reversed(list(batch)):
    {
    % if k > 0:
        const I coord = rest % batch_size${k};
        rest /= batch_size${k};
    % else:
        const I coord = rest;
    % endif
        s += coord * src_batch_stride${k};
        d += coord * dst_batch_stride${k};
    }
% endfor
    for (int r = ly; r < TILE; r += TILE_ROWS) {
        const I p = p0 + lx, q = q0 + r;
        if (p < P && q < Q)
            tile[r][lx] = src[s + p + q * src_q_stride];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = ly; r < TILE; r += TILE_ROWS) {
        const I q = q0 + lx, p = p0 + r;
        if (p < P && q < Q)
            dst[d + p * dst_p_stride + q] = tile[lx][r];
    }
}
