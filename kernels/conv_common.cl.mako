## Definitions shared by the convolution kernel families (conv_direct, conv_direct_small,
## conv_implicit_gemm, conv_im2col, conv_depthwise, conv_winograd); not a kernel family of its
## own. Import with
##     <%namespace name="common" file="conv_common.cl.mako"/>
<%namespace name="links" file="fusion_fold.cl.mako"/>
##
## Tensor addressing: every kernel takes the problem geometry and the element strides of the
## three tensors as run-time arguments (geometry_params), so one compile serves every shape and
## both layouts. x: the convolution input (N, C, H, W); w: the weights (K, C/groups, R, S);
## y: the output (N, K, Ho, Wo); strides are given in that logical order whatever the layout.
##
## The fused forward epilogue, per output element of channel k (store):
##     y = act(alpha * acc * scale[k] + shift[k] + residual_alpha * z) + beta * y_old
## Template parameters it reads from the including template's context:
##   has_scale     bool: multiply by the per-output-channel vector `scale`
##   has_shift     bool: add the per-output-channel vector `shift` (the bias)
##   has_residual  bool: add residual_alpha * z, z laid out exactly like y
##   activation    OpenCL C expression of act(v) over the float variable `v` ("(v)" for none)
##   affine_per_position  optional bool (default False): `scale` and `shift` hold one value per
##                 output position (k, oh, ow) of an NCHW y instead of one per channel, read at
##                 index % ysN (per-activation batch norm folded into the epilogue)
##   chain         optional list (default empty) of (kind, per_position), kind "bias" or "bn":
##                 a fusion plan's bias / batch-norm-inference chain (fusion_fold.cl.mako). The
##                 kernel then takes the chain's own parameters after the epilogue's
##                 (chain_params) and computes scale[k] and shift[k] (or per output position,
##                 index % ysN) from them itself, instead of reading has_scale / has_shift
##                 vectors (both False then): no separate kernel folds the chain first. Every
##                 forward kernel of every algorithm takes it: the store computes the pair per
##                 element, unless the kernel called chain_per_channel(channel) where a work
##                 item keeps one channel for many stores (Winograd's output transform) and
##                 passes hoisted=True to store.
## y_old is read only when beta != 0 (MIOpen's rule), so an uninitialised y is fine with beta = 0.
## The stores declare a float `v` in their own block: the accumulator expression must not be `v`.

<%def name="geometry_params()">
    int N, int C, int H, int W, int K, int R, int S, int Ho, int Wo,
    int pad_h, int pad_w, int stride_h, int stride_w, int dil_h, int dil_w, int groups,
    int xsN, int xsC, int xsH, int xsW,
    int wsK, int wsC, int wsR, int wsS,
    int ysN, int ysC, int ysH, int ysW</%def>

<%def name="epilogue_params()">
    __global const float *scale, int scale_off,
    __global const float *shift, int shift_off,
    __global const float *residual, int residual_off,
    float alpha, float beta, float residual_alpha
% if context.get("chain"):
    ${links.chain_params(context.get("chain"))}
% endif
</%def>

## The chain's (ep_scale, ep_shift) of `channel`, declared in the enclosing block, when the
## chain is per channel (nothing otherwise: stores then compute it per element).
<%def name="chain_per_channel(channel)">
<%
    chain = context.get("chain") or []
%>
% if chain and not any(p for _, p in chain):
        ${links.apply_chain(channel, channel, chain, "ep_scale", "ep_shift")}
% endif
</%def>

<%def name="store(out, out_off, index, channel, acc, hoisted=False)">
<%
    affine = f"({index}) % ysN" if context.get("affine_per_position", False) else channel
    chain = context.get("chain") or []
    hoisted = hoisted and not any(p for _, p in chain)
%>
        {
            float v = alpha * (${acc});
% if chain:
%   if not hoisted:
            ${links.apply_chain(channel, f"({index}) % ysN", chain, "ep_scale", "ep_shift")}
%   endif
            v = v * ep_scale + ep_shift;
% endif
% if has_scale:
            v *= scale[scale_off + (${affine})];
% endif
% if has_shift:
            v += shift[shift_off + (${affine})];
% endif
% if has_residual:
            v += residual_alpha * residual[residual_off + (${index})];
% endif
            v = ${activation};
            if (beta != 0.0f)
                v += beta * ${out}[${out_off} + (${index})];
            ${out}[${out_off} + (${index})] = v;
        }</%def>

## out = alpha * acc + beta * out_old (gradients: no epilogue beyond scaling).
<%def name="store_scaled(out, out_off, index, acc)">
        {
            float v = alpha * (${acc});
            if (beta != 0.0f)
                v += beta * ${out}[${out_off} + (${index})];
            ${out}[${out_off} + (${index})] = v;
        }</%def>
