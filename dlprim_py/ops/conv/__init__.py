"""Convolution: the 2-D operator (``Convolution``), its algorithms, selection, and the
functional entry points ``conv1d`` / ``conv2d`` / ``conv3d`` and their transposes (1-D on the
2-D machinery, 3-D through the "conv3d" family of ``volumetric.py``)."""
from .api import Convolution, conv1d, conv2d, conv_transpose1d, conv_transpose2d
from .volumetric import conv3d, conv_transpose3d
from .problem import ConvolutionDesc, ConvProblem, make_problem
from .selection import ALGORITHMS, applicable, choose, find

__all__ = ["Convolution", "ConvolutionDesc", "ConvProblem", "conv1d", "conv2d", "conv3d",
           "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
           "make_problem", "ALGORITHMS", "applicable", "choose", "find"]
