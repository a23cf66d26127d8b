"""Known limitations of dlprim_py.functional against PyTorch's OpInfo samples (tests/test_opinfo.py).

REFUSALS: the samples the library refuses with one of its errors, and why. A sample refused but
not listed fails the test, and so does a listed sample that no longer raises the error listed.
KNOWN_WRONG: samples that give wrong numbers, each with its reason; the test expects them wrong,
and fails once one turns right or refused (take it out then).

Regenerate REFUSALS with ``python tests/opinfo_table.py --write`` and review the diff: the reasons
of the entries that remain are kept, and a new entry's reason is the library's message. A
sample is named by its description (tensors as dtype[shape], then the other arguments), "*"
stands for every sample of the op.
"""

# op_db name[.variant] -> [(error class, reason, [sample descriptions])]
REFUSALS = {
    'div.trunc_rounding': [
        ('UnsupportedError', "rounding modes of div ('trunc', 'floor') are not implemented: true division only", [
            '*',
        ]),
    ],
    'div.floor_rounding': [
        ('UnsupportedError', "rounding modes of div ('trunc', 'floor') are not implemented: true division only", [
            '*',
        ]),
    ],
    'softmax.with_dtype': [
        ('DTypeError', 'a float64 result: the library has no float64 tensors', [
            '*',
        ]),
    ],
    'nn.functional.conv_transpose2d': [
        ('ShapeError', 'an unbatched (C, H, W) input: only batched (N, C, H, W) inputs are taken', [
            'input f32[3,4,4]; args (f32[3,3,3,3], f32[3]); kwargs {stride=(2, 2), padding=2, output_padding=(1, 1), groups=1}',
            'input f32[2,4,4]; args (f32[2,2,4,5], f32[4]); kwargs {stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=(4, 4)}',
            'input f32[1,4,5]; args (f32[1,1,4,3], f32[1]); kwargs {stride=2, padding=1, output_padding=1, groups=1, dilation=(2, 3)}',
            'input f32[1,4,3]; args (f32[1,2,3,4], None); kwargs {stride=2, padding=1, output_padding=1, groups=1}',
            'input f32[4,4,4]; args (f32[4,1,3,3], None); kwargs {groups=4}',
            'input f32[2,5,5]; args (f32[2,4,3,3], None)',
        ]),
    ],
    'nn.functional.conv2d': [
        ('ShapeError', 'an unbatched (C, H, W) input: only batched (N, C, H, W) inputs are taken', [
            'input f32[3,4,4]; args (f32[3,3,3,3], f32[3]); kwargs {stride=(2, 2), padding=2, groups=1}',
            'input f32[4,8,8]; args (f32[2,2,3,3], f32[2]); kwargs {stride=(3, 2), padding=(2, 1), groups=2, dilation=(4, 4)}',
            'input f32[4,5,5]; args (f32[1,4,2,3], f32[1]); kwargs {stride=2, padding=1, groups=1, dilation=(2, 3)}',
            'input f32[4,5,5]; args (f32[1,4,2,3], f32[1]); kwargs {stride=2, padding=1, groups=1, dilation=(2, 3)} #2',
            'input f32[2,4,3]; args (f32[4,2,3,4], None); kwargs {stride=2, padding=1, groups=1}',
            "input f32[4,5,5]; args (f32[1,4,2,3], f32[1]); kwargs {stride=2, padding='valid'}",
            "input f32[4,5,5]; args (f32[1,4,2,3], f32[1]); kwargs {stride=1, padding='same', dilation=3}",
            'input f32[4,6,6]; args (f32[4,1,3,3], f32[4]); kwargs {groups=4}',
            'input f32[4,6,6]; args (f32[8,1,3,3], f32[8]); kwargs {groups=4}',
            'input f32[4,6,6]; args (f32[8,1,3,3], None); kwargs {groups=4}',
            'input f32[4,6,6]; args (f32[4,1,3,3], f32[4]); kwargs {groups=4, stride=(3, 2)}',
            'input f32[4,6,6]; args (f32[4,1,3,3], f32[4]); kwargs {groups=4, padding=(1, 1)}',
            'input f32[4,5,5]; args (f32[4,1,2,2], f32[4]); kwargs {groups=4, dilation=(2, 2)}',
            'input f32[4,6,5]; args (f32[6,2,3,2], f32[6]); kwargs {groups=2}',
            'input f32[4,5,5]; args (f32[3,4,3,3], None)',
        ]),
        ('UnsupportedError', "padding='same' with an even kernel (asymmetric padding) is not implemented", [
            "input f32[1,4,5,5]; args (f32[1,4,2,3], f32[1]); kwargs {stride=1, padding='same', dilation=3}",
        ]),
    ],
    'nn.functional.pad.reflect': [
        ('UnsupportedError', 'negative padding (cropping) is not implemented for reflect and replicate', [
            "input f32[1,3,4,4]; args ((-1, 1, -2, 1), 'reflect')",
        ]),
    ],
    'nn.functional.pad.replicate': [
        ('UnsupportedError', 'negative padding (cropping) is not implemented for reflect and replicate', [
            "input f32[1,3,4,4]; args ((-1, 1, -2, 1), 'replicate')",
        ]),
    ],
    'nn.functional.pad.replicate_negative': [
        ('UnsupportedError', 'negative padding (cropping) is not implemented for reflect and replicate', [
            '*',
        ]),
    ],
    'nn.functional.pad.circular': [
        ('UnsupportedError', 'circular padding is not implemented', [
            '*',
        ]),
    ],
    'nn.functional.interpolate.nearest': [
        ('UnsupportedError', 'nearest interpolation of 3-d images (5-d inputs) is not implemented', [
            "input f32[2,3,4,4,4]; args ((3, 3, 3),); kwargs {scale_factor=None, mode='nearest', align_corners=None}",
            "input f32[2,3,4,4,4]; args ((5, 5, 5),); kwargs {scale_factor=None, mode='nearest', align_corners=None}",
            "input f32[2,2,5,2,3]; args ((5, 6, 7),); kwargs {scale_factor=None, mode='nearest', align_corners=None}",
            "input f32[2,3,4,3,5]; args ((3, 2, 4),); kwargs {scale_factor=None, mode='nearest', align_corners=None}",
            "input f32[2,3,4,3,5]; args ((5, 4, 6),); kwargs {scale_factor=None, mode='nearest', align_corners=None}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=1.7, mode='nearest', align_corners=None, recompute_scale_factor=False}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=0.6, mode='nearest', align_corners=None, recompute_scale_factor=False}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=1.7, mode='nearest', align_corners=None, recompute_scale_factor=True}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=0.6, mode='nearest', align_corners=None, recompute_scale_factor=True}",
        ]),
    ],
    'nn.functional.interpolate.nearest-exact': [
        ('UnsupportedError', "mode 'nearest-exact' is not implemented", [
            '*',
        ]),
    ],
    'nn.functional.interpolate.bicubic': [
        ('UnsupportedError', "mode 'bicubic' is not implemented", [
            '*',
        ]),
    ],
    'nn.functional.interpolate.trilinear': [
        ('UnsupportedError', "mode 'trilinear' is not implemented", [
            '*',
        ]),
    ],
    'nn.functional.interpolate.area': [
        ('UnsupportedError', 'area interpolation of 1-d and 3-d images (3-d and 5-d inputs) is not implemented', [
            "input f32[2,3,4]; args ((3,),); kwargs {scale_factor=None, mode='area', align_corners=None}",
            "input f32[2,3,4]; args ((5,),); kwargs {scale_factor=None, mode='area', align_corners=None}",
            "input f32[2,3,4]; kwargs {size=None, scale_factor=1.7, mode='area', align_corners=None, recompute_scale_factor=False}",
            "input f32[2,3,4]; kwargs {size=None, scale_factor=0.6, mode='area', align_corners=None, recompute_scale_factor=False}",
            "input f32[2,3,4]; kwargs {size=None, scale_factor=1.7, mode='area', align_corners=None, recompute_scale_factor=True}",
            "input f32[2,3,4]; kwargs {size=None, scale_factor=0.6, mode='area', align_corners=None, recompute_scale_factor=True}",
            "input f32[2,3,4,4,4]; args ((3, 3, 3),); kwargs {scale_factor=None, mode='area', align_corners=None}",
            "input f32[2,3,4,4,4]; args ((5, 5, 5),); kwargs {scale_factor=None, mode='area', align_corners=None}",
            "input f32[2,3,4,3,5]; args ((3, 2, 4),); kwargs {scale_factor=None, mode='area', align_corners=None}",
            "input f32[2,3,4,3,5]; args ((5, 4, 6),); kwargs {scale_factor=None, mode='area', align_corners=None}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=1.7, mode='area', align_corners=None, recompute_scale_factor=False}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=0.6, mode='area', align_corners=None, recompute_scale_factor=False}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=1.7, mode='area', align_corners=None, recompute_scale_factor=True}",
            "input f32[2,3,4,4,4]; kwargs {size=None, scale_factor=0.6, mode='area', align_corners=None, recompute_scale_factor=True}",
        ]),
    ],
    'nn.functional.avg_pool2d': [
        ('ShapeError', 'a negative divisor_override is refused (torch divides by it as given)', [
            'input f32[1,1,4,4]; args ((2, 2), (), (0,), False, True, -2)',
        ]),
    ],
    'nn.functional.linear': [
        ('UnsupportedError', 'in_features == 0 (an empty weight) is refused; torch gives the bias (or zeros)', [
            'input f32[3,4,0]; args (f32[5,0],)',
            'input f32[3,4,0]; args (f32[5,0], f32[5])',
        ]),
    ],
    'nn.functional.batch_norm': [
        ('ShapeError', 'an empty 1-d input is refused: batch norm needs (N, C, ...)', [
            'input f32[0]; args (f32[0], f32[0], None, None); kwargs {training=True}',
            'input f32[0]; args (f32[0], f32[0], None, None); kwargs {training=False}',
        ]),
    ],
    'cat': [
        ('ShapeError', "torch's legacy rule that cat skips 1-d empty tensors is not followed", [
            'input [f32[0], f32[5,5]]; kwargs {dim=1}',
        ]),
    ],
    'log_softmax.with_dtype': [
        ('DTypeError', 'a float64 result: the library has no float64 tensors', [
            '*',
        ]),
    ],
    'norm': [
        ('UnsupportedError', 'norms of negative order p are not implemented', [
            'input f32[5,5]; args (-1,)',
            'input f32[5,5]; args (-2,)',
            'input f32[5,5]; args (-0.5,)',
            'input f32[5,5]; args (-1.5,)',
            'input f32[5,5]; args (-2, 1)',
            'input f32[5,5]; args (-1, 1)',
            'input f32[5,5]; args (-2, -1)',
            'input f32[5,5]; args (-1, -1)',
        ]),
    ],
    'norm.nuc': [
        ('UnsupportedError', 'the nuclear norm is not implemented', [
            '*',
        ]),
    ],
}

# op_db name[.variant] -> {sample description: why it is wrong}
KNOWN_WRONG = {}
