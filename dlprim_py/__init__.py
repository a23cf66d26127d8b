"""dlprim_py: deep-learning primitives on OpenCL.

    import dlprim_py as dp
    ctx = dp.Context()                       # DLPRIM_DEVICE, else first GPU, else first CPU
    x = dp.Tensor.from_numpy(ctx, array)     # float32 numpy in
    y = (x * 2.0 + x).numpy()                # numpy out
"""
from .activation import Activation, ActivationDesc
from .autograd import enable_grad, no_grad
from .context import Context, DeviceInfo, default_context, devices
from .dtypes import bfloat16, bool_, float16, float32, int32, int64
from .dtypes import bool_ as bool  # noqa: A004,F401  (torch's name: dp.bool, as torch.bool)
from .errors import (CacheWarning, DeviceError, DeviceMemoryError, DlprimError, DTypeError,
                     GraphError, KernelBuildError, ModelFileError, NumericsError, ShapeError,
                     UnsupportedError)
from .tensor import Tensor, TensorDesc
from .ops.gemm import gemm, gemm_batched
from .ops.indexing import arange, linspace
from . import tensor_methods  # noqa: F401  (sets the operator methods on Tensor)
from .ops.conv import Convolution, ConvolutionDesc
from .seed import manual_seed
from .version import __version__
from . import backends  # noqa: E402
from . import config  # noqa: E402
from . import functional  # noqa: E402
from . import fusion  # noqa: E402
from . import optim  # noqa: E402
from . import nn  # noqa: E402
from . import models  # noqa: E402
from . import onnx  # noqa: E402

__all__ = [
    "Activation", "ActivationDesc", "Context", "DeviceInfo", "devices", "default_context", "Tensor", "TensorDesc",
    "no_grad", "enable_grad", "bfloat16", "float16", "float32", "int32", "int64", "bool_",
    "DlprimError", "ShapeError", "DTypeError", "DeviceError", "DeviceMemoryError", "NumericsError", "UnsupportedError",
    "GraphError", "ModelFileError",
    "KernelBuildError", "CacheWarning", "__version__", "Convolution", "ConvolutionDesc",
]
__all__ += ["gemm", "gemm_batched"]
__all__ += ["manual_seed"]
__all__ += ["arange", "linspace"]
