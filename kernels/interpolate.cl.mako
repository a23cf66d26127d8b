## Resampling of NCHW planes (torch's interpolate, modes nearest and (bi)linear).
##
## Each output axis comes with a table made once per (input size, output size, mode) on the host:
##   index[0 .. out)            first source index of output o
##   index[out .. 2*out)        second source index (linear modes; equal to the first at the edge)
##   index[2*out .. 2*out+in)   first output that reads input i (backward's gather range)
##   index[2*out+in .. 2*out+2*in)   one past the last output that reads input i
##   lambda[0 .. out)           weight of the second source index (linear modes)
## interpolate_forward: one work item per output element.
## interpolate_backward: one work item per input element, summing the outputs that read it with
## their weights (gather: no atomics, fixed order).
##
## Template parameters:
##   mode     "nearest" (one source per axis) or "linear" (two sources, weights 1 - lambda, lambda)
##   index_t  "int" when every element index fits in 31 bits, else "long" (64-bit division is
##            many times slower on GPUs)
#define I ${index_t}

#define AXIS_ARGS(name) __global const int* restrict name##_index, __global const float* restrict name##_lambda

__kernel void interpolate_forward(I total, int H, int W, int OH, int OW, AXIS_ARGS(h), AXIS_ARGS(w),
    __global const float* restrict x, I x_off, __global float* restrict y, I y_off)
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int ow = (int)(i % OW);
        const I r = i / OW;
        const int oh = (int)(r % OH);
        const I plane = r / OH;
        __global const float* src = x + x_off + plane * H * W;
        const int h0 = h_index[oh], w0 = w_index[ow];
% if mode == "nearest":
        y[y_off + i] = src[h0 * W + w0];
% else:
        const int h1 = h_index[OH + oh], w1 = w_index[OW + ow];
        const float lh = h_lambda[oh], lw = w_lambda[ow];
        y[y_off + i] = (1.0f - lh) * ((1.0f - lw) * src[h0 * W + w0] + lw * src[h0 * W + w1])
                     + lh * ((1.0f - lw) * src[h1 * W + w0] + lw * src[h1 * W + w1]);
% endif
    }
}

% if mode == "nearest":
#define WEIGHT(name, o, in_index, out_size) (name##_index[o] == (in_index) ? 1.0f : 0.0f)
% else:
#define WEIGHT(name, o, in_index, out_size) \
    ((name##_index[o] == (in_index) ? 1.0f - name##_lambda[o] : 0.0f) \
     + (name##_index[(out_size) + (o)] == (in_index) ? name##_lambda[o] : 0.0f))
% endif

__kernel void interpolate_backward(I total, int H, int W, int OH, int OW, AXIS_ARGS(h), AXIS_ARGS(w),
    __global const float* restrict dy, I dy_off, __global float* restrict dx, I dx_off)
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int iw = (int)(i % W);
        const I r = i / W;
        const int ih = (int)(r % H);
        const I plane = r / H;
        __global const float* grad = dy + dy_off + plane * OH * OW;
        const int oh_lo = h_index[2 * OH + ih], oh_hi = h_index[2 * OH + H + ih];
        const int ow_lo = w_index[2 * OW + iw], ow_hi = w_index[2 * OW + W + iw];
        float sum = 0.0f;
        for (int oh = oh_lo; oh < oh_hi; ++oh) {
            const float wh = WEIGHT(h, oh, ih, OH);
            float row = 0.0f;
            for (int ow = ow_lo; ow < ow_hi; ++ow)
                row += grad[oh * OW + ow] * WEIGHT(w, ow, iw, OW);
            sum += wh * row;
        }
        dx[dx_off + i] = sum;
    }
}
