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
    'masked_fill': [
        ('ShapeError', "a mask larger than the input is refused: the mask must broadcast to the input's shape (torch broadcasts the result to the mask's shape)", [
            'input f32[5]; args (bool[5,5], f32[])',
            'input f32[5]; args (bool[5,5], 10)',
        ]),
    ],
    'softmax.with_dtype': [
        ('DTypeError', 'a float64 result: the library has no float64 tensors', [
            '*',
        ]),
    ],
    'nn.functional.softmin.with_dtype': [
        ('DTypeError', 'a float64 result: the library has no float64 tensors', [
            '*',
        ]),
    ],
    'nn.functional.cosine_similarity': [
        ('ShapeError', '0-d inputs are refused: the similarity is taken along a dimension the inputs must have (torch reads a 0-d input as one element)', [
            'input f32[]; args (f32[],); kwargs {dim=0}',
        ]),
    ],
    'nn.functional.multi_margin_loss': [
        ('ShapeError', 'a 0-d input is refused: the input must have a class dimension, (N, C) or (C)', [
            'input f32[]; args (i64[],)',
        ]),
        ('ShapeError', 'an unbatched (C) input needs a 0-d target; torch also takes a one-element (1,) target', [
            'input f32[5]; args (i64[1],); kwargs {p=2}',
        ]),
    ],
    'nn.functional.multilabel_margin_loss': [
        ('ShapeError', 'a 0-d input is refused: the input must have a class dimension, (N, C) or (C)', [
            'input f32[]; args (i64[],)',
        ]),
    ],
    'nn.functional.rrelu': [
        ('UnsupportedError', 'rrelu with training=True (a random slope per element) is not implemented; training=False is', [
            'input f32[20]; kwargs {lower=0, upper=1, training=True}',
            'input f32[1,0,3]; kwargs {lower=0, upper=1, training=True}',
            'input f32[]; kwargs {lower=0, upper=1, training=True}',
        ]),
    ],
    'nn.functional.batch_norm': [
        ('ShapeError', 'an empty 1-d input is refused: batch norm needs (N, C, ...)', [
            'input f32[0]; args (f32[0], f32[0], None, None); kwargs {training=True}',
            'input f32[0]; args (f32[0], f32[0], None, None); kwargs {training=False}',
        ]),
    ],
    'gather': [
        ('DTypeError', 'uint8 tensors are not supported by the library (these samples pass an empty uint8 index)', [
            'input f32[5]; args (0, uint8[0])',
            'input f32[5]; args (0, uint8[2,0])',
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
    'norm.nuc': [
        ('UnsupportedError', 'the nuclear norm is not implemented', [
            '*',
        ]),
    ],
}

# op_db name[.variant] -> {sample description: why it is wrong}
KNOWN_WRONG = {}
