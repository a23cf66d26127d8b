## Definitions shared by the convolution kernel families (conv_direct, conv_implicit_gemm,
## conv_depthwise, conv_winograd); not a kernel family of its own. Import with
##     <%namespace name="common" file="conv_common.cl.mako"/>
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
    float alpha, float beta, float residual_alpha</%def>

<%def name="store(out, out_off, index, channel, acc)">
<%
    affine = f"({index}) % ysN" if context.get("affine_per_position", False) else channel
%>
        {
            float v = alpha * (${acc});
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
