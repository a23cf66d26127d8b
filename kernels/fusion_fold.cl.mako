## Folding a chain of bias and batch-norm-inference ops into one affine map, the (scale, shift)
## that a convolution epilogue applies as acc * scale + shift.
##
## Work item i computes the fold of parameter position i (a channel, or a (c, h, w) position
## for per-activation batch norm), applying the ops in chain order to the map v -> v * 1 + 0:
##   bias b:                 shift += b
##   batch norm (m, v, s, t): g = s / sqrt(v + eps); scale *= g; shift = (shift - m) * g + t
## Every parameter is read at (buffer, element offset) + index, where index is i for a
## parameter with one value per position and i / spatial for a per-channel parameter.
##
## Template parameters:
##   chain   list of (kind, per_position) in chain order: kind "bias" or "bn"; per_position
##           True when the op's parameters have one value per position (per-activation
##           batch norm), False when they have one per channel
##
## Run-time arguments: count (positions), spatial (positions per channel), then per op its
## parameter buffers with element offsets (bias: b; bn: mean, variance, scale, bias) and, for
## a batch norm, its epsilon; then the scale and shift outputs with offsets.

__kernel void fold_affine(
    int count, int spatial
% for n, (kind, per_position) in enumerate(chain):
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
    , __global float* restrict scale_out, int scale_out_off
    , __global float* restrict shift_out, int shift_out_off)
{
    for (int i = get_global_id(0); i < count; i += get_global_size(0)) {
        const int channel = i / spatial;
        float scale = 1.0f, shift = 0.0f;
% for n, (kind, per_position) in enumerate(chain):
        {
            const int p = ${"i" if per_position else "channel"};
  % if kind == "bias":
            shift += b${n}[b${n}_off + p];
  % else:
            const float g = scale${n}[scale${n}_off + p] / sqrt(variance${n}[variance${n}_off + p] + epsilon${n});
            scale *= g;
            shift = (shift - mean${n}[mean${n}_off + p]) * g + bias${n}[bias${n}_off + p];
  % endif
        }
% endfor
        scale_out[scale_out_off + i] = scale;
        shift_out[shift_out_off + i] = shift;
    }
}
