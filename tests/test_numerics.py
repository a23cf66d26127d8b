"""DLPRIM_CHECK_NUMERICS: the first functional call that makes a NaN or an infinity from finite
inputs raises NumericsError naming it; off, the functions are the plain ones."""
import numpy as np
import pytest

import dlprim_py as dp
import dlprim_py.functional as F


@pytest.fixture
def numerics(monkeypatch):
    plain = F.div
    monkeypatch.setenv("DLPRIM_CHECK_NUMERICS", "1")
    dp.config.reload()
    yield plain
    monkeypatch.delenv("DLPRIM_CHECK_NUMERICS")
    dp.config.reload()
    assert F.div is plain, "the checks stayed installed after the switch was cleared"


def test_first_operator_making_a_nonfinite_value_is_named(ctx, numerics):
    x = dp.Tensor.from_numpy(ctx, np.array([1.0, -2.0, 3.0], np.float32))
    zero = dp.Tensor.from_numpy(ctx, np.array([1.0, 0.0, 2.0], np.float32))
    assert F.div is not numerics
    np.testing.assert_allclose(F.relu(x).numpy(), [1, 0, 3])
    with pytest.raises(dp.NumericsError, match=r"div produced -inf from finite inputs .*flat index 1"):
        F.div(x, zero)
    # A NaN that came in is passed on, not reported again.
    nan = dp.Tensor.from_numpy(ctx, np.array([np.nan, 1.0], np.float32))
    assert np.isnan(F.relu(nan).numpy()[0])


def test_off_by_default(ctx):
    x = dp.Tensor.from_numpy(ctx, np.array([1.0], np.float32))
    zero = dp.Tensor.from_numpy(ctx, np.array([0.0], np.float32))
    assert np.isinf(F.div(x, zero).numpy()[0])
    assert not getattr(F.div, "__wrapped_numerics__", False)
