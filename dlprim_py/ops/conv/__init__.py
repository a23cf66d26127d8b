"""2-D convolution: the operator (``Convolution``), its algorithms, selection, and the
functional entry points ``conv2d`` / ``conv_transpose2d``."""
from .api import Convolution, conv1d, conv2d, conv_transpose1d, conv_transpose2d
from .problem import ConvolutionDesc, ConvProblem, make_problem
from .selection import ALGORITHMS, applicable, choose, find

__all__ = ["Convolution", "ConvolutionDesc", "ConvProblem", "conv2d", "conv_transpose2d",
           "make_problem", "ALGORITHMS", "applicable", "choose", "find"]
