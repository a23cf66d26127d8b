## Negative log-likelihood with class-index targets: the gather forward and the scatter backward.
##
## input is (N, C, S) C-contiguous (S = product of the spatial sizes, 1 without them), target is
## (N, S) int64; element e = n * S + s picks class t = target[e]. A target equal to ignore_index
## contributes nothing; any other target outside [0, C) is never used as an index: nll_check
## records it in `bad` (bad[0] = 1, bad[1] = the value, bad[2] = classes, bad[3] = ignore_index)
## for the host to raise on.
##
## nll_check(total, classes, ignore_index, target, t_off, bad)
##     bad = {1, t, classes, ignore_index} for a target t outside [0, classes) other than
##     ignore_index (bad stays set across calls until the host clears it)
## nll_gather(total, classes, spatial, ignore_index, x, x_off, target, t_off, weight, w_off,
##            loss, loss_off, picked_weight, pw_off)
##     loss[e] = -w[t] * x[n, t, s], picked_weight[e] = w[t] (0 and 0 when ignored or bad)
##     shifted: also (shift, shift_off, log_sum, log_sum_off) after x, and
##     (x[n, t, s] - shift[e]) - log_sum[e] in place of x[n, t, s] (cross_entropy: x the logits,
##     shift their max over the classes, log_sum the log of their sum of exp(x - max); the max
##     is subtracted first, so that a logit near the max keeps its few units of difference
##     where max + log_sum would round them to the max's ulp)
## nll_scatter(total, classes, spatial, ignore_index, target, t_off, weight, w_off, g, g_off,
##             g_stride, divisor, d_off, dx, dx_off)
##     dx[n, t, s] = -w[t] * g[e * g_stride] / divisor[0]   (dx is zero-filled beforehand)
##
## Template parameters:
##   weighted   True when a per-class weight vector is given, False for all ones
##   divide     True to divide by divisor[0] (reduction "mean": the sum of picked weights)
##   shifted    True when nll_gather takes per-element shifts subtracted from the picked input
##   index_t    "int" when every index fits in 31 bits, else "long"

__kernel void nll_check(${index_t} total, ${index_t} classes, long ignore_index,
                        __global const long* restrict target, ${index_t} t_off,
                        __global long* restrict bad)
{
    for (${index_t} e = get_global_id(0); e < total; e += get_global_size(0)) {
        const long t = target[t_off + e];
        if (t != ignore_index && (t < 0 || t >= classes)) {
            // Every offender writes the same flag; which value lands in bad[1] is immaterial.
            bad[0] = 1;
            bad[1] = t;
            bad[2] = classes;
            bad[3] = ignore_index;
        }
    }
}

__kernel void nll_gather(${index_t} total, ${index_t} classes, ${index_t} spatial, long ignore_index,
                         __global const float* restrict x, ${index_t} x_off,
% if shifted:
                         __global const float* restrict shift, ${index_t} shift_off,
                         __global const float* restrict log_sum, ${index_t} log_sum_off,
% endif
                         __global const long* restrict target, ${index_t} t_off,
                         __global const float* restrict weight, ${index_t} w_off,
                         __global float* restrict loss, ${index_t} loss_off,
                         __global float* restrict picked_weight, ${index_t} pw_off)
{
    for (${index_t} e = get_global_id(0); e < total; e += get_global_size(0)) {
        const long t = target[t_off + e];
        float l = 0.0f, w = 0.0f;
        if (t != ignore_index) {
            if (t >= 0 && t < classes) {
                const ${index_t} n = e / spatial;
                const ${index_t} s = e - n * spatial;
% if weighted:
                w = weight[w_off + t];
% else:
                w = 1.0f;
% endif
% if shifted:
                l = -w * ((x[x_off + (n * classes + (${index_t})t) * spatial + s] - shift[shift_off + e])
                          - log_sum[log_sum_off + e]);
% else:
                l = -w * x[x_off + (n * classes + (${index_t})t) * spatial + s];
% endif
            }
        }
        loss[loss_off + e] = l;
        picked_weight[pw_off + e] = w;
    }
}

__kernel void nll_scatter(${index_t} total, ${index_t} classes, ${index_t} spatial, long ignore_index,
                          __global const long* restrict target, ${index_t} t_off,
                          __global const float* restrict weight, ${index_t} w_off,
                          __global const float* restrict g, ${index_t} g_off, ${index_t} g_stride,
                          __global const float* restrict divisor, ${index_t} d_off,
                          __global float* restrict dx, ${index_t} dx_off)
{
    for (${index_t} e = get_global_id(0); e < total; e += get_global_size(0)) {
        const long t = target[t_off + e];
        if (t == ignore_index || t < 0 || t >= classes) continue;
        const ${index_t} n = e / spatial;
        const ${index_t} s = e - n * spatial;
% if weighted:
        float w = weight[w_off + t];
% else:
        float w = 1.0f;
% endif
        float grad = -w * g[g_off + e * g_stride];
% if divide:
        grad /= divisor[d_off];
% endif
        dx[dx_off + (n * classes + (${index_t})t) * spatial + s] = grad;
    }
}
