"""ONNX models in, a planned network out.

    import dlprim_py as dp
    model = dp.onnx.load("resnet50.onnx")            # a path, bytes or an onnx.ModelProto
    out = model.run({"input": images})               # numpy in, {output name: numpy} out
    y = model(x_tensor)                              # dp.Tensors in and out, nothing on the host
    model.input_names, model.output_names, model.inputs, model.memory_bytes

The graph is read and checked when it is loaded (an operator or attribute value the engine does
not support raises ``UnsupportedError`` naming the op type, the node and the opset; a file that
cannot be read raises ``ModelFileError`` naming it), constants are folded, BatchNormalization
is folded into the convolution before it, activations and residual additions into the
convolution's epilogue, and convolutions feeding a Concat write into its slices where the layout
allows. Each new input shape is planned once (shape arithmetic folded on the
host, one recorded launch list, intermediate buffers shared by liveness) and replayed after.
Needs the ``onnx`` package (``pip install dlprim_py[onnx]``).
"""
from ..errors import ModelFileError, UnsupportedError
from .engine import Model
from .graph import ValueInfo
from .ops import SUPPORTED_OPS

__all__ = ["load", "Model", "ValueInfo", "UnsupportedError", "ModelFileError", "SUPPORTED_OPS"]


def load(source, ctx=None):
    """Load an ONNX model for inference on ``ctx`` (default: the thread's default context).

    Parameters
    ----------
    source : str, os.PathLike, bytes or onnx.ModelProto
        The model: a file path, its serialized bytes, or a parsed ModelProto.
    ctx : dlprim_py.Context, optional
        The device to run on.

    Returns
    -------
    Model
        ``model.run({name: array})`` returns {output name: numpy array}; ``model(*tensors)``
        returns device tensors.

    Raises
    ------
    ModelFileError
        The file is missing, truncated, damaged or not a valid ONNX model.
    UnsupportedError
        An operator, attribute value or opset the engine does not support.
    """
    return Model(source, ctx)
