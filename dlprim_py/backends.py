"""Math-mode switches, after ``torch.backends``.

``allow_tf32`` (default False): whether GEMM calls may compute in TF32 on tensor cores, where
the device has them (NVIDIA, compute capability 8.0 and later): operands rounded to TF32 (10
mantissa bits, relative error about 5e-4 per operand), products summed in float32, as
``torch.backends.cuda.matmul.allow_tf32`` does for cuBLAS. False keeps every GEMM exact float32,
the library's reference. A context's ``allow_tf32`` (None: follow this switch) overrides it for
that context::

    import dlprim_py as dp
    dp.backends.allow_tf32 = True        # every context
    ctx.allow_tf32 = False               # but this one

Read when a call's plan is made: it is part of the plan's key, so that a change takes effect at
the next call, and calls on shapes seen before with the same setting build nothing. It applies to
``dp.gemm``, ``dp.gemm_batched`` and ``ops.gemm.enqueue_gemm`` (so to linear layers) and, as
``torch.backends.cudnn.allow_tf32`` does for cuDNN, to convolutions: their choice then takes
the TF32 algorithms ("gemm_tf32" for 1x1, "winograd_tf32", "im2col_gemm_tf32";
``dlprim_py.ops.conv.selection``), in ``dp.functional``, the ``Convolution`` operator, fusion
plans compiled after the change and the ONNX engine. Where no TF32 kernel applies (other
devices) the call runs in float32 as before.
"""

#: Whether GEMM calls may compute in TF32 where a TF32 kernel applies (default False: float32).
allow_tf32 = False


def tf32_allowed(ctx):
    """Whether GEMM calls on ``ctx`` may compute in TF32: the context's ``allow_tf32``, or the
    module's where that is None."""
    own = getattr(ctx, "allow_tf32", None)
    return bool(allow_tf32 if own is None else own)
