## A chain of bias and batch-norm-inference ops folded into the (scale, shift) of the map
## v -> v * scale + shift, computed where it is applied: in a convolution's epilogue
## (conv_common.cl.mako `store`, the GEMM's "conv" epilogue in gemm_common.cl.mako), which imports
## the defs below, and in apply_affine_activation (no convolution). No kernel stores folded
## vectors: the parameters are read by the kernel that applies them, on every run, so that
## new contents of the same tensors are honoured (MIOpen's arguments promise it).
##
## The chain, applied in order to the map v -> v * 1 + 0, gives (scale, shift):
##   bias b:                  shift += b[p]
##   batch norm (m, v, s, t): g = s[p] / sqrt(v[p] + eps); scale *= g; shift = (shift - m[p]) * g + t[p]
## where p is the output channel k, or for a per-activation batch norm the output position
## (k, oh, ow).
##
## Defs (each takes the chain, `links`, explicitly, so that other families import them):
##   chain_params(links)   the kernel parameters of the chain, each line starting with ", "
##                          (append after a parameter list)
##   apply_chain(channel, position, links, scale, shift)  declares and computes the floats
##                          named `scale` and `shift` (default "scale", "shift") for a channel
##                          and a position expression
##
## apply_affine_activation (no convolution; every op per channel): y = act(x * scale[c] +
##   shift[c]) over a (N, C, S) tensor in one pass. Work item q takes packets q, q + G, ...
##   (G = global size) of `vec` elements; with S divisible by vec a packet stays in one (n, c)
##   plane, so its channel costs one division, and the chain's (scale, shift) is recomputed from
##   the parameters (cached reads) per packet.
##
## Template parameters:
##   chain   list of (kind, per_position) in chain order: kind "bias" or "bn"; per_position True
##           when the op's parameters have one value per output position, False when one per
##           channel (apply_affine_activation needs every per_position False)
##   activation  OpenCL C expression of act(z) over `z` for apply_affine_activation, which only
##               exists when this is not None
##   vec         (apply_affine_activation only) elements per packet: 4 (float4 loads and stores;
##               needs S and both offsets divisible by 4, checked by the host) or 1
##
## Run-time arguments: the sizes (packets, C, S), then per op its parameter buffers with
## element offsets (bias: b; bn: mean, variance, scale, bias) and, for a batch norm, its
## epsilon; then x and y with offsets.

<%def name="chain_params(links)">
% for n, (kind, per_position) in enumerate(links):
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
</%def>

<%def name="apply_chain(channel, position, links, scale='scale', shift='shift')">
        float ${scale} = 1.0f, ${shift} = 0.0f;
% for n, (kind, per_position) in enumerate(links):
        {
            const int link_p = ${position if per_position else channel};
  % if kind == "bias":
            ${shift} += b${n}[b${n}_off + link_p];
  % else:
            const float link_g = scale${n}[scale${n}_off + link_p]
                            / sqrt(variance${n}[variance${n}_off + link_p] + epsilon${n});
            ${scale} *= link_g;
            ${shift} = (${shift} - mean${n}[mean${n}_off + link_p]) * link_g + bias${n}[bias${n}_off + link_p];
  % endif
        }
% endfor
</%def>

% if activation is not None:
inline float act_f(float z) { return ${activation}; }

  % if vec == 4:
typedef float4 floatv;
#define LOADV(p, e) (*(__global const float4*)((p) + (e)))
#define STOREV(p, e, v) (*(__global float4*)((p) + (e)) = (v))
#define ACTV(z) ((float4)(act_f((z).x), act_f((z).y), act_f((z).z), act_f((z).w)))
  % else:
typedef float floatv;
#define LOADV(p, e) ((p)[e])
#define STOREV(p, e, v) ((p)[e] = (v))
#define ACTV(z) act_f(z)
  % endif

__kernel void apply_affine_activation(
    int packets, int C, int S
    ${chain_params(chain)}
    , __global const float* restrict x, int x_off
    , __global float* restrict y, int y_off)
{
    for (int q = get_global_id(0); q < packets; q += get_global_size(0)) {
        const int e = q * ${vec};
        const int k = (e / S) % C;
        ${apply_chain("k", "k", chain)}
        floatv z = LOADV(x, x_off + e) * scale + shift;
        STOREV(y, y_off + e, ACTV(z));
    }
}
% endif
