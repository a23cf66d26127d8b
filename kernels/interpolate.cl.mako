## Separable resampling of (planes, D, H, W) volumes: torch's interpolate (nearest,
## nearest-exact, linear, bilinear, bicubic, trilinear, area, antialiased bilinear and bicubic)
## and ONNX's Resize.
##
## Every output element is a weighted sum of input elements, separable over the three axes: an
## axis with input size n and output size m has, for each output o, T taps (input index, weight).
## Its tables are made once per (sizes, mode, options) on the host and kept on the device:
##   index[0 .. m*T)                 tap t of output o at o*T + t (clamped into [0, n))
##   index[m*T .. m*T + n + 1)       backward's row pointers: the entries of input i are
##                                   ptr[i] .. ptr[i + 1) of the two lists below
##   index[m*T + n + 1 ..)           each entry's output index (the outputs that read input i)
##   weight[0 .. m*T)                tap weights
##   weight[m*T ..)                  each entry's weight (taps of one output that hit the same
##                                   input merged into one)
## 1-d and 2-d inputs are volumes with D = 1 (and H = 1): those axes have one tap, index 0,
## weight 1.
## interpolate_forward: one work item per output element, summing its T_D * T_H * T_W taps.
## interpolate_backward: one work item per input element, summing the outputs that read it with
## their weights (a gather: no atomics, a fixed order).
##
## Template parameters:
##   taps     (T_D, T_H, T_W) taps per axis fixed at compile time (1 nearest, 2 linear, 4 cubic),
##            0 where the count is the run-time argument (area, antialiasing: the longest
##            window); the run-time counts are passed either way (they place the backward lists)
##   index_t  "int" when every element index fits in 31 bits, else "long" (64-bit division is
##            many times slower on GPUs)
#define I ${index_t}
<% names = ("D", "H", "W") %>
% for name, taps_fixed in zip(names, taps):
#define TAPS_${name} ${taps_fixed if taps_fixed else "taps_" + name.lower()}
% endfor

#define AXIS_ARGS(name) __global const int* restrict name##_index, __global const float* restrict name##_weight

#define SIZE_ARGS int D, int H, int W, int OD, int OH, int OW, int taps_d, int taps_h, int taps_w

__kernel void interpolate_forward(I total, SIZE_ARGS, AXIS_ARGS(d), AXIS_ARGS(h), AXIS_ARGS(w),
    __global const float* restrict x, I x_off, __global float* restrict y, I y_off)
{
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int ow = (int)(i % OW);
        I r = i / OW;
        const int oh = (int)(r % OH);
        r /= OH;
        const int od = (int)(r % OD);
        const I plane = r / OD;
        __global const float* src = x + x_off + plane * ((I)D * H * W);
        float acc = 0.0f;
        for (int td = 0; td < TAPS_D; ++td) {
            const int k_d = od * TAPS_D + td;
            __global const float* slice = src + (I)d_index[k_d] * H * W;
            float acc_h = 0.0f;
            for (int th = 0; th < TAPS_H; ++th) {
                const int k_h = oh * TAPS_H + th;
                __global const float* row = slice + h_index[k_h] * W;
                float acc_w = 0.0f;
                for (int tw = 0; tw < TAPS_W; ++tw) {
                    const int k_w = ow * TAPS_W + tw;
                    acc_w += w_weight[k_w] * row[w_index[k_w]];
                }
                acc_h += h_weight[k_h] * acc_w;
            }
            acc += d_weight[k_d] * acc_h;
        }
        y[y_off + i] = acc;
    }
}

__kernel void interpolate_backward(I total, SIZE_ARGS, AXIS_ARGS(d), AXIS_ARGS(h), AXIS_ARGS(w),
    __global const float* restrict dy, I dy_off, __global float* restrict dx, I dx_off)
{
    // Each axis's row pointers and entries follow its forward taps.
    __global const int* d_ptr = d_index + OD * taps_d;
    __global const int* h_ptr = h_index + OH * taps_h;
    __global const int* w_ptr = w_index + OW * taps_w;
    __global const int* d_out = d_ptr + D + 1;
    __global const int* h_out = h_ptr + H + 1;
    __global const int* w_out = w_ptr + W + 1;
    __global const float* d_entry = d_weight + OD * taps_d;
    __global const float* h_entry = h_weight + OH * taps_h;
    __global const float* w_entry = w_weight + OW * taps_w;
    for (I i = get_global_id(0); i < total; i += get_global_size(0)) {
        const int iw = (int)(i % W);
        I r = i / W;
        const int ih = (int)(r % H);
        r /= H;
        const int id = (int)(r % D);
        const I plane = r / D;
        __global const float* grad = dy + dy_off + plane * ((I)OD * OH * OW);
        const int w_lo = w_ptr[iw], w_hi = w_ptr[iw + 1];
        float sum = 0.0f;
        for (int kd = d_ptr[id]; kd < d_ptr[id + 1]; ++kd) {
            __global const float* slice = grad + (I)d_out[kd] * OH * OW;
            float sum_h = 0.0f;
            for (int kh = h_ptr[ih]; kh < h_ptr[ih + 1]; ++kh) {
                __global const float* row = slice + h_out[kh] * OW;
                float sum_w = 0.0f;
                for (int kw = w_lo; kw < w_hi; ++kw)
                    sum_w += w_entry[kw] * row[w_out[kw]];
                sum_h += h_entry[kh] * sum_w;
            }
            sum += d_entry[kd] * sum_h;
        }
        dx[dx_off + i] = sum;
    }
}
