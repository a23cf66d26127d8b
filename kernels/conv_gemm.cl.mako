## Data movement around the GEMM-based 1x1 convolution with stride > 1 (ops/conv/gemm1x1.py):
## the GEMM runs on the subsampled pixels only, and these kernels move between the strided
## tensor and a dense (N, C, Ho, Wo) workspace laid out like it (NCHW or NHWC, strides given).
##
## Template parameters: none (sizes, strides, alpha and beta are run-time arguments).
##
## Kernels:
##   conv_gemm_gather   sub[n, c, oh, ow] = x[n, c, oh * stride_h, ow * stride_w]
##   conv_gemm_scatter  dx[n, c, h, w] = alpha * (sub[n, c, h / stride_h, w / stride_w] where h, w
##                      fall on the stride grid, else 0) + beta * dx
<%namespace name="common" file="conv_common.cl.mako"/>

__kernel void conv_gemm_gather(${common.geometry_params()},
    __global const float *x, int x_off, __global float *sub, int sub_off,
    int ssN, int ssC, int ssH, int ssW)
{
    const int total = N * C * Ho * Wo;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int ow = i % Wo, t = i / Wo;
        int oh = t % Ho; t /= Ho;
        int c = t % C, n = t / C;
        sub[sub_off + n * ssN + c * ssC + oh * ssH + ow * ssW] =
            x[x_off + n * xsN + c * xsC + oh * stride_h * xsH + ow * stride_w * xsW];
    }
}

__kernel void conv_gemm_scatter(${common.geometry_params()},
    __global const float *sub, int sub_off, int ssN, int ssC, int ssH, int ssW,
    __global float *dx, int dx_off, float alpha, float beta)
{
    const int total = N * C * H * W;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
        int iw = i % W, t = i / W;
        int ih = t % H; t /= H;
        int c = t % C, n = t / C;
        int oh = ih / stride_h, ow = iw / stride_w;
        float picked = 0.0f;
        if (oh * stride_h == ih && ow * stride_w == iw && oh < Ho && ow < Wo)
            picked = sub[sub_off + n * ssN + c * ssC + oh * ssH + ow * ssW];
${common.store_scaled("dx", "dx_off", "n * xsN + c * xsC + ih * xsH + iw * xsW", "picked")}
    }
}
