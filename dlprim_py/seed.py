"""``dp.manual_seed``: one seed for every random number the library draws.

Two generators follow it: the device's dropout masks (Philox, ``dlprim_py.ops.dropout``) and a
numpy ``Generator`` on the host that ``dp.nn`` modules draw their initial weights from
(``dlprim_py.nn.init``). Both are per thread, as contexts are. The numbers are this library's
own: the same seed gives the same weights and masks here on every device, but not the numbers
``torch.manual_seed`` gives torch (its generators are different algorithms). To start from
torch's weights, load its ``state_dict()``.
"""
import threading

import numpy as np

from .ops import dropout

_state = threading.local()


def manual_seed(seed):
    """Seed the dropout generator (stream 0 next) and the host generator of initial weights
    (a non-negative int below 2^64)."""
    dropout.manual_seed(seed)   # validates the seed
    _state.generator = np.random.default_rng(int(seed))


def host_generator():
    """The thread's numpy Generator for initial weights (seeded with the dropout generator's
    default seed until ``manual_seed`` is called)."""
    generator = getattr(_state, "generator", None)
    if generator is None:
        generator = _state.generator = np.random.default_rng(dropout._DEFAULT_SEED)
    return generator
