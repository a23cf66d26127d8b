"""Helpers of the ONNX tests: seeded random weights for torchvision models, export with both
of torch's exporters (cached per process), and the comparison with onnxruntime."""
import io
import warnings

import numpy as np

from dlprim_py.bench.onnx import randomize

_EXPORTS = {}


def export(key, make, size, exporter="ts13"):
    """ONNX bytes of ``make()`` (randomized) exported on a (1, 3, size, size) input with a
    dynamic batch axis: exporter "ts13" / "ts17" (TorchScript at opset 13 / 17) or "dynamo"."""
    cache_key = (key, size, exporter)
    if cache_key in _EXPORTS:
        return _EXPORTS[cache_key]
    import torch
    torch.manual_seed(0)
    model = randomize(make())
    x = torch.randn(1, 3, size, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            import contextlib
            with contextlib.redirect_stdout(io.StringIO()):
                program = torch.onnx.export(model, (x,), dynamo=True, input_names=["x"],
                                            output_names=["y"], verbose=False,
                                            dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
            data = program.model_proto.SerializeToString()
        else:
            f = io.BytesIO()
            torch.onnx.export(model, (x,), f, dynamo=False, opset_version=int(exporter[2:]),
                              input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
            data = f.getvalue()
    _EXPORTS[cache_key] = data
    return data


def ort_run(data, feeds):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_matches(ours, reference, rtol=1e-4, what=""):
    """Ours within ``rtol`` of the reference's largest magnitude (float32 sums in another
    order), elementwise; same shape and dtype kind."""
    ours, reference = np.asarray(ours), np.asarray(reference)
    assert ours.shape == reference.shape, f"{what}: shape {ours.shape} != {reference.shape}"
    if reference.dtype.kind in "biu":
        np.testing.assert_array_equal(ours, reference, err_msg=what)
        return
    scale = max(float(np.abs(reference).max()) if reference.size else 0.0, 1e-6)
    error = float(np.abs(ours.astype(np.float64) - reference).max()) if reference.size else 0.0
    assert np.isfinite(ours).all() == np.isfinite(reference).all(), f"{what}: non-finite values"
    assert error <= rtol * scale, f"{what}: max error {error:.3g} > {rtol} * {scale:.3g}"
