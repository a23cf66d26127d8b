"""ONNX Resize on the device: ``dlprim_py.ops.interpolate.resize`` where the library has it
(every coordinate transformation and nearest rounding mode), else ``F.interpolate`` for the
cases it computes exactly as ONNX does (nearest asymmetric/floor; linear half_pixel,
pytorch_half_pixel and align_corners) and UnsupportedError for the others."""
import numpy as np

from .. import functional as F
from ..ops import interpolate as interp_module


def output_size(planner, node, x, values):
    """(H_out, W_out) and the per-axis scales (None when the node gave sizes) of a 4-D Resize."""
    if planner.opset >= 11:
        scales = values[2] if len(values) > 2 else None
        sizes = values[3] if len(values) > 3 else None
    else:
        scales, sizes = values[1], None
    if sizes is not None and np.asarray(planner.host(node, sizes, "sizes")).size:
        sizes = [int(s) for s in planner.host(node, sizes, "sizes").reshape(-1)]
        if len(sizes) != x.ndim or list(sizes[:2]) != list(x.shape[:2]):
            raise planner.unsupported(node, f"sizes {sizes} for input {x.shape}: only the two "
                                            f"spatial axes of a 4-D input may change")
        return tuple(sizes[2:]), None
    if scales is None:
        raise planner.unsupported(node, "neither scales nor sizes given")
    scales = [float(s) for s in planner.host(node, scales, "scales").reshape(-1)]
    if len(scales) != x.ndim or scales[:2] != [1.0, 1.0]:
        raise planner.unsupported(node, f"scales {scales} for input {x.shape}: only the two "
                                        f"spatial axes of a 4-D input may be scaled")
    size = tuple(int(np.floor(s * f)) for s, f in zip(x.shape[2:], scales[2:]))
    return size, tuple(scales[2:])


def resize_node(planner, node, values):
    x = planner.device(values[0])
    if x.ndim != 4:
        raise planner.unsupported(node, f"only 4-D (NCHW) inputs, got shape {x.shape}")
    size, scales = output_size(planner, node, x, values)
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    if ctm == "tf_crop_and_resize":
        raise planner.unsupported(node, "coordinate_transformation_mode tf_crop_and_resize")
    resize = getattr(interp_module, "resize", None)
    if resize is not None:
        return resize(x, size, mode=mode, coordinate_transformation_mode=ctm,
                      nearest_mode=nearest_mode,
                      cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
                      exclude_outside=bool(node.attr("exclude_outside", 0)), scales=scales)
    if mode == "nearest" and ctm == "asymmetric" and nearest_mode == "floor":
        if scales is not None:
            return F.interpolate(x, scale_factor=scales, mode="nearest")
        return F.interpolate(x, size=size, mode="nearest")
    if mode == "linear" and (ctm == "half_pixel" or (ctm == "pytorch_half_pixel"
                                                    and min(size) > 1)):
        if scales is not None:
            return F.interpolate(x, scale_factor=scales, mode="bilinear", align_corners=False)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    if mode == "linear" and ctm == "align_corners":
        return F.interpolate(x, size=size, mode="bilinear", align_corners=True)
    raise planner.unsupported(node, f"mode={mode!r} with coordinate_transformation_mode={ctm!r}"
                                    f" and nearest_mode={nearest_mode!r}")
