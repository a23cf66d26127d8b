## Folding a chain of bias and batch-norm-inference ops that follows a convolution into the
## convolution itself: act(conv(x, w) * scale[k] + shift[k]) = act(conv(x, w * scale[k]) + shift[k]),
## so the convolution runs on scaled weights with only a bias in its epilogue, which every
## convolution algorithm (GEMM, Winograd, implicit GEMM, depthwise, direct) applies in its own
## kernel.
##
## Per output channel k, the chain applied in order to the map v -> v * 1 + 0 gives (scale, shift):
##   bias b:                  shift += b[k]
##   batch norm (m, v, s, t): g = s[k] / sqrt(v[k] + eps); scale *= g; shift = (shift - m[k]) * g + t[k]
## Work item e (a weight element; k = e / per_channel with per_channel = C/groups * R * S)
## writes w_out[e] = w[e] * scale, and the first element of each channel writes shift_out[k].
##
## Template parameters:
##   chain   list of "bias" / "bn" in chain order
##
## Run-time arguments: weight_count (K * per_channel), per_channel, then per op its parameter
## buffers with element offsets (bias: b; bn: mean, variance, scale, bias) and, for a batch
## norm, its epsilon; then w, w_out and shift_out with element offsets.

__kernel void fold_affine_into_weights(
    int weight_count, int per_channel
% for n, kind in enumerate(chain):
  % if kind == "bias":
    , __global const float* restrict b${n}, int b${n}_off
  % else:
    , __global const float* restrict mean${n}, int mean${n}_off
    , __global const float* restrict variance${n}, int variance${n}_off
    , __global const float* restrict scale${n}, int scale${n}_off
    , __global const float* restrict bias${n}, int bias${n}_off
    , float epsilon${n}
  % endif
% endfor
    , __global const float* restrict w, int w_off
    , __global float* restrict w_out, int w_out_off
    , __global float* restrict shift_out, int shift_out_off)
{
    for (int e = get_global_id(0); e < weight_count; e += get_global_size(0)) {
        const int k = e / per_channel;
        float scale = 1.0f, shift = 0.0f;
% for n, kind in enumerate(chain):
  % if kind == "bias":
        shift += b${n}[b${n}_off + k];
  % else:
        {
            const float g = scale${n}[scale${n}_off + k]
                            / sqrt(variance${n}[variance${n}_off + k] + epsilon${n});
            scale *= g;
            shift = (shift - mean${n}[mean${n}_off + k]) * g + bias${n}[bias${n}_off + k];
        }
  % endif
% endfor
        w_out[w_out_off + e] = w[w_off + e] * scale;
        if (e == k * per_channel)
            shift_out[shift_out_off + k] = shift;
    }
}
