## torch.nn.functional.grid_sample: the input sampled at the grid's points (ops/grid_sample.py).
##
## Layout: input (N, C, [D,] H, W) dense, grid (N, P, DIMS) dense with P output points and each
## point's coordinates in the order x (W), y (H)[, z (D)], normalized to [-1, 1]; output and its
## gradient (N, C, P). One work-item per (n, point) in a grid-stride loop: the point's source
## coordinates and weights are computed once, then every channel is read (forward) or
## scattered to (backward).
##
## Kernels (sizes are run-time arguments):
##   grid_sample_forward(total, C, P, D, H, W, x, x_off, grid, grid_off, y, y_off)
##   grid_sample_backward(total, C, P, D, H, W, x, x_off, grid, grid_off, gy, gy_off,
##                        gx, gx_off, ggrid, ggrid_off)
##     gx (INPUT_GRAD; zeros before the launch) gets every weighted output gradient added
##     atomically (compare-and-swap, in no fixed order, as torch's CUDA kernels); ggrid
##     (GRID_GRAD) is written, one value per coordinate.
## D is 1 for a 2-D input. Coordinates follow torch's GridSampler: unnormalized by
## align_corners, then (bilinear, nearest) clipped or reflected by the padding mode; bicubic
## unnormalizes only and pads each of its 16 taps. Corners outside the input read 0 and take no
## gradient.
##
## Template parameters:
##   DIMS         2 or 3 spatial dimensions
##   MODE         "bilinear" (trilinear for DIMS 3), "nearest" (rint: halves to even, as torch)
##                or "bicubic" (DIMS 2; Keys' cubic convolution, A = -0.75)
##   PADDING      "zeros", "border" or "reflection"
##   ALIGN        1: -1 and 1 are the centres of the corner elements; 0: their outer edges
##   INPUT_GRAD, GRID_GRAD   which gradients the backward computes
<%
    axes = ["x", "y", "z"][:DIMS]
    sizes = {"x": "W", "y": "H", "z": "D"}
%>

<%namespace name="access" file="memory_access.cl.mako"/>
// A float added to global memory atomically: the compare-and-swap form on every device (the
// input's gradient starts zeroed, the first guess of the loop).
${access.atomic_add_float(False)}

// A coordinate from [-1, 1] to the input's index space; *g: its derivative.
inline float unnormalize(float c, int size, float *g)
{
% if ALIGN:
    *g = 0.5f * (size - 1);
    return (c + 1.0f) * 0.5f * (size - 1);
% else:
    *g = 0.5f * size;
    return ((c + 1.0f) * size - 1.0f) * 0.5f;
% endif
}

// Clamped to [0, size - 1]; *g: 1 inside, 0 where clamped (the borders count as clamped).
inline float clip(float c, int size, float *g)
{
    if (c <= 0.0f) { *g = 0.0f; return 0.0f; }
    const float last = (float)(size - 1);
    if (c >= last) { *g = 0.0f; return last; }
    *g = 1.0f;
    return c;
}

// Reflected into [twice_low / 2, twice_high / 2]; *g: +1 or -1 by the number of reflections.
inline float reflect(float c, int twice_low, int twice_high, float *g)
{
    if (twice_low == twice_high) { *g = 0.0f; return 0.0f; }
    const float low = twice_low * 0.5f, span = (twice_high - twice_low) * 0.5f;
    c -= low;
    float sign = 1.0f;
    if (c < 0.0f) { sign = -1.0f; c = -c; }
    const float extra = fmod(c, span);
    const int flips = (int)floor(c / span);
    if (flips % 2 == 0) { *g = sign; return extra + low; }
    *g = -sign;
    return span - extra + low;
}

// The padding mode applied to an index-space coordinate; *g: its derivative.
inline float pad_coordinate(float c, int size, float *g)
{
% if PADDING == "border":
    return clip(c, size, g);
% elif PADDING == "reflection":
    float gr, gc;
%   if ALIGN:
    c = reflect(c, 0, 2 * (size - 1), &gr);
%   else:
    c = reflect(c, -1, 2 * size - 1, &gr);
%   endif
    c = clip(c, size, &gc);
    *g = gr * gc;
    return c;
% else:
    *g = 1.0f;
    return c;
% endif
}

// The source coordinate of a grid value (bilinear, nearest); *g: d coordinate / d grid value.
inline float source_index(float c, int size, float *g)
{
    float gu, gp;
    c = unnormalize(c, size, &gu);
    c = pad_coordinate(c, size, &gp);
    *g = gu * gp;
    return c;
}

% if MODE == "bicubic":
#define CUBIC_A (-0.75f)
// Keys' weights of the taps at -1, 0, 1, 2 for fraction t, and their derivatives by t.
inline float4 cubic_weights(float t)
{
    const float a = CUBIC_A, x0 = t + 1.0f, x1 = t, x2 = 1.0f - t, x3 = 2.0f - t;
    return (float4)(((a * x0 - 5.0f * a) * x0 + 8.0f * a) * x0 - 4.0f * a,
                    ((a + 2.0f) * x1 - (a + 3.0f)) * x1 * x1 + 1.0f,
                    ((a + 2.0f) * x2 - (a + 3.0f)) * x2 * x2 + 1.0f,
                    ((a * x3 - 5.0f * a) * x3 + 8.0f * a) * x3 - 4.0f * a);
}
inline float4 cubic_weight_derivatives(float t)
{
    const float a = CUBIC_A, x0 = -1.0f - t, x1 = -t, x2 = 1.0f - t, x3 = 2.0f - t;
    return (float4)((-3.0f * a * x0 - 10.0f * a) * x0 - 8.0f * a,
                    (-3.0f * (a + 2.0f) * x1 - 2.0f * (a + 3.0f)) * x1,
                    (3.0f * (a + 2.0f) * x2 - 2.0f * (a + 3.0f)) * x2,
                    (3.0f * a * x3 - 10.0f * a) * x3 + 8.0f * a);
}

// A tap's element index after padding, or -1 outside the input.
inline long tap_index(int tx, int ty, int H, int W)
{
    float unused;
    const int x = (int)pad_coordinate((float)tx, W, &unused);
    const int y = (int)pad_coordinate((float)ty, H, &unused);
    return (x >= 0 && x < W && y >= 0 && y < H) ? (long)y * W + x : -1;
}
% endif

## The point's setup: n, p, and per axis the coordinate (and its derivative by the grid value).
<%def name="point_setup()">\
        const long n = i / P, p = i - n * P;
        __global const float *g = grid + grid_off + i * ${DIMS};
        const long in_plane = (long)D * H * W;
% for k, a in enumerate(axes):
        float d${a};
%   if MODE == "bicubic":
        const float c${a} = unnormalize(g[${k}], ${sizes[a]}, &d${a});
%   else:
        const float c${a} = source_index(g[${k}], ${sizes[a]}, &d${a});
%   endif
% endfor
</%def>

## Bilinear / trilinear corners: per axis the lower index, the fraction, and per corner
## (bits: x 1, y 2, z 4) its element index (-1 outside) and weight.
<%def name="corners()">\
% for a in axes:
        const float f${a}0 = floor(c${a});
        const int ${a}0 = (int)f${a}0;
        const float t${a} = c${a} - f${a}0;
% endfor
% for corner in range(2 ** DIMS):
<%
    bits = [(corner >> k) & 1 for k in range(DIMS)]
    conds, offs, ws = [], [], []
    for a, b in zip(axes, bits):
        conds.append(f"{a}0 + {b} >= 0 && {a}0 + {b} < {sizes[a]}")
        ws.append(f"t{a}" if b else f"(1.0f - t{a})")
    index = f"(long)(x0 + {bits[0]})"
    index = f"(long)(y0 + {bits[1]}) * W + " + index
    if DIMS == 3:
        index = f"(long)(z0 + {bits[2]}) * H * W + " + index
%>\
        const long at${corner} = (${" && ".join(conds)}) ? ${index} : -1;
        const float w${corner} = ${" * ".join(ws)};
% endfor
</%def>

__kernel void grid_sample_forward(const long total, const long C, const long P, const int D,
                                  const int H, const int W,
                                  __global const float *x, const long x_off,
                                  __global const float *grid, const long grid_off,
                                  __global float *y, const long y_off)
{
    for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
${point_setup()}\
% if MODE == "bilinear":
${corners()}\
% elif MODE == "nearest":
% for a in axes:
        const int ${a}n = (int)rint(c${a});
% endfor
        const bool inside = ${" && ".join(f"{a}n >= 0 && {a}n < {sizes[a]}" for a in axes)};
        const long at = ${"(long)zn * H * W + " if DIMS == 3 else ""}(long)yn * W + xn;
% else:
        const float fx0 = floor(cx), fy0 = floor(cy);
        const int x0 = (int)fx0, y0 = (int)fy0;
        const float4 wx = cubic_weights(cx - fx0), wy = cubic_weights(cy - fy0);
        long taps[16];
        for (int r = 0; r < 4; ++r)
            for (int s = 0; s < 4; ++s)
                taps[r * 4 + s] = tap_index(x0 - 1 + s, y0 - 1 + r, H, W);
        const float wxs[4] = {wx.x, wx.y, wx.z, wx.w}, wys[4] = {wy.x, wy.y, wy.z, wy.w};
% endif
        __global const float *src = x + x_off + n * C * in_plane;
        __global float *dst = y + y_off + n * C * P + p;
        for (long c = 0; c < C; ++c, src += in_plane, dst += P) {
% if MODE == "bilinear":
            float v = 0.0f;
%   for corner in range(2 ** DIMS):
            if (at${corner} >= 0) v += src[at${corner}] * w${corner};
%   endfor
            *dst = v;
% elif MODE == "nearest":
            *dst = inside ? src[at] : 0.0f;
% else:
            float v = 0.0f;
            for (int r = 0; r < 4; ++r) {
                float row = 0.0f;
                for (int s = 0; s < 4; ++s) {
                    const long at = taps[r * 4 + s];
                    row += (at >= 0 ? src[at] : 0.0f) * wxs[s];
                }
                v += row * wys[r];
            }
            *dst = v;
% endif
        }
    }
}

__kernel void grid_sample_backward(const long total, const long C, const long P, const int D,
                                   const int H, const int W,
                                   __global const float *x, const long x_off,
                                   __global const float *grid, const long grid_off,
                                   __global const float *gy, const long gy_off,
                                   __global float *gx, const long gx_off,
                                   __global float *ggrid, const long ggrid_off)
{
    for (long i = get_global_id(0); i < total; i += get_global_size(0)) {
${point_setup()}\
% for a in axes:
        float grad_${a} = 0.0f;
% endfor
% if MODE == "bilinear":
${corners()}\
% elif MODE == "nearest":
% for a in axes:
        const int ${a}n = (int)rint(c${a});
% endfor
        const bool inside = ${" && ".join(f"{a}n >= 0 && {a}n < {sizes[a]}" for a in axes)};
        const long at = ${"(long)zn * H * W + " if DIMS == 3 else ""}(long)yn * W + xn;
% else:
        const float fx0 = floor(cx), fy0 = floor(cy);
        const int x0 = (int)fx0, y0 = (int)fy0;
        const float4 wx = cubic_weights(cx - fx0), wy = cubic_weights(cy - fy0);
        const float4 vx = cubic_weight_derivatives(cx - fx0);
        const float4 vy = cubic_weight_derivatives(cy - fy0);
        const float wxs[4] = {wx.x, wx.y, wx.z, wx.w}, wys[4] = {wy.x, wy.y, wy.z, wy.w};
        const float dxs[4] = {vx.x, vx.y, vx.z, vx.w}, dys[4] = {vy.x, vy.y, vy.z, vy.w};
        long taps[16];
        for (int r = 0; r < 4; ++r)
            for (int s = 0; s < 4; ++s)
                taps[r * 4 + s] = tap_index(x0 - 1 + s, y0 - 1 + r, H, W);
% endif
        __global const float *src = x + x_off + n * C * in_plane;
        __global const float *go = gy + gy_off + n * C * P + p;
% if INPUT_GRAD:
        __global float *gin = gx + gx_off + n * C * in_plane;
% endif
        for (long c = 0; c < C; ++c, src += in_plane, go += P) {
            const float gout = *go;
% if MODE == "bilinear":
%   for corner in range(2 ** DIMS):
<%
    bits = [(corner >> k) & 1 for k in range(DIMS)]
    others = {a: [f"t{b_a}" if b else f"(1.0f - t{b_a})" for b_a, b in zip(axes, bits) if b_a != a]
              for a in axes}
%>\
            if (at${corner} >= 0) {
%     if INPUT_GRAD:
                atomic_add_float(gin + c * in_plane + at${corner}, gout * w${corner});
%     endif
%     if GRID_GRAD:
                const float vg = src[at${corner}] * gout;
%       for a, b in zip(axes, bits):
                grad_${a} ${"+=" if b else "-="} vg * ${" * ".join(others[a])};
%       endfor
%     endif
            }
%   endfor
% elif MODE == "nearest":
%   if INPUT_GRAD:
            if (inside) atomic_add_float(gin + c * in_plane + at, gout);
%   endif
% else:
            for (int r = 0; r < 4; ++r)
                for (int s = 0; s < 4; ++s) {
                    const long at = taps[r * 4 + s];
                    if (at < 0) continue;
%   if INPUT_GRAD:
                    atomic_add_float(gin + c * in_plane + at, gout * wxs[s] * wys[r]);
%   endif
%   if GRID_GRAD:
                    const float vg = src[at] * gout;
                    grad_x -= vg * dxs[s] * wys[r];
                    grad_y -= vg * dys[r] * wxs[s];
%   endif
                }
% endif
        }
% if GRID_GRAD:
        __global float *gg = ggrid + ggrid_off + i * ${DIMS};
%   for k, a in enumerate(axes):
        gg[${k}] = ${"0.0f" if MODE == "nearest" else f"d{a} * grad_{a}"};
%   endfor
% endif
    }
}
