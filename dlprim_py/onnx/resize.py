"""ONNX Resize on the device through ``dlprim_py.ops.interpolate.resize``: every coordinate
transformation but tf_crop_and_resize, every nearest rounding mode, cubic with its coefficient
and exclude_outside, on the two spatial axes of a 4-D input."""
import numpy as np

from ..ops.interpolate import resize


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
    return resize(x, size, mode=mode, coordinate_transformation_mode=ctm,
                  nearest_mode=nearest_mode, cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
                  exclude_outside=bool(node.attr("exclude_outside", 0)), scales=scales)
