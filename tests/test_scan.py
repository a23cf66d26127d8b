"""cumsum, sort and topk (dlprim_py/ops/scan.py) against torch on the CPU in float64 on seeded
data: every path (one chunk / several, rows / columns; one tile / several rows per tile /
the whole bitonic network; topk by tile rounds and by a full sort), every algorithm of the
"cumsum" and "topk" families forced on its own (look-back / chunks, radix / bitonic), ties and
NaN, gradients, refusals, empty tensors, repeated calls building nothing."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F

from conftest import assert_close, assert_repeats_build_nothing, random
from test_indexing import backward_check, poison_pool, ref, t_


def ties(rng, shape, nan=True):
    """float32 values with many ties (halves in [-10, 10)) and, with ``nan``, some NaNs."""
    x = (rng.integers(-20, 20, shape) / 2).astype(np.float32)
    if nan and x.size:
        x.reshape(-1)[rng.random(x.size) < 0.05] = np.nan
    return x


# ---- cumsum ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((3, 7), 1), ((2, 5000), -1), ((6, 4, 3), 1),
                                       ((5, 3), 0), ((), 0)])
def test_cumsum_and_its_gradient(ctx, rng, shape, dim):
    x = random(rng, shape)
    X, XR = t_(ctx, x, True), ref(x, True)
    poison_pool(ctx)
    out = F.cumsum(X, dim)
    out_ref = torch.cumsum(XR, dim)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR)])


def test_cumsum_dtypes(ctx, rng):
    ints = rng.integers(-1000, 1000, (3, 3000))
    for array in (ints, ints.astype(np.int32), ints > 0):
        got = t_(ctx, array).cumsum(1)
        assert got.dtype == dp.int64
        np.testing.assert_array_equal(got.numpy(), torch.cumsum(torch.tensor(array), 1).numpy())
    as_float = F.cumsum(t_(ctx, ints), 0, dtype=dp.float32)
    assert as_float.dtype == dp.float32
    np.testing.assert_array_equal(as_float.numpy(), np.cumsum(ints, 0).astype(np.float32))
    with pytest.raises(dp.DTypeError, match="dtype"):
        F.cumsum(t_(ctx, ints), 0, dtype=dp.int32)
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.cumsum(t_(ctx, ints), 2)


# ---- cumsum's algorithms, each forced ----------------------------------------------------------

_POISON = (8, 64, 256, 1024, 4096, 16384, 65536, 262144)


def _offset(ctx, data, offset):
    """A tensor holding ``data`` at ``offset`` elements into a larger buffer."""
    whole = np.concatenate([np.full(offset, 7, data.dtype), data.ravel()])
    base = dp.Tensor.from_numpy(ctx, whole)
    return dp.Tensor(ctx, base.buffer, data.shape, dtype=base.dtype,
                     offset=base.offset + data.itemsize * offset)


def _tile(ctx):
    from dlprim_py.ops import scan
    return scan.group_size(ctx, 256) * scan._LOOKBACK_PER


@pytest.mark.parametrize("algorithm", ["lookback", "chunks"])
def test_cumsum_algorithms_forced(ctx, rng, algorithm):
    """Each algorithm on its own against float64: one element, tile multiples and one either
    side (look-back tiles and chunks), several tiles, several rows, every dimension of a 3-d
    tensor, an input at an offset that breaks 4-vectors, and the gradient (a reversed scan)."""
    T = _tile(ctx)
    shapes = [(1,), (5,), (T - 1,), (T,), (T + 1,), (3 * T - 1,), (3 * T,), (3 * T + 1,),
              (3, 2 * T + 3), (4, T // 2 + 1), (2, 3, T + 5)]
    for shape in shapes:
        x = random(rng, shape)
        poison_pool(ctx, _POISON)
        out = F.cumsum(t_(ctx, x), -1, algorithm=algorithm)
        assert_close(out.numpy(), np.cumsum(x.astype(np.float64), -1))
    x = random(rng, (3, 5, 2 * T + 7))
    for dim in range(3):
        out = F.cumsum(t_(ctx, x), dim, algorithm=algorithm)
        assert_close(out.numpy(), np.cumsum(x.astype(np.float64), dim))
    # Non-contiguous inputs become dense rows first (a permuted view, a row at an odd offset).
    permuted = F.permute(t_(ctx, x), (0, 2, 1))
    assert_close(F.cumsum(permuted, 1, algorithm=algorithm).numpy(),
                 np.cumsum(x.transpose(0, 2, 1).astype(np.float64), 1))
    long = random(rng, (2 * T + 9,))
    for offset in (1, 3, 4):
        poison_pool(ctx, _POISON)
        out = F.cumsum(_offset(ctx, long, offset), 0, algorithm=algorithm)
        assert_close(out.numpy(), np.cumsum(long.astype(np.float64)))
    g = random(rng, (2, 3 * T + 1))
    X, XR = t_(ctx, g, True), ref(g, True)
    out = F.cumsum(X, 1, algorithm=algorithm)
    backward_check(ctx, rng, out, torch.cumsum(XR, 1), [(X, XR)])


@pytest.mark.parametrize("algorithm", ["lookback", "chunks"])
def test_cumsum_algorithms_integers(ctx, rng, algorithm, monkeypatch):
    """int64 sums (int32 and bool inputs converted), exact; through DLPRIM_CUMSUM_ALGO."""
    monkeypatch.setenv("DLPRIM_CUMSUM_ALGO", algorithm)
    dp.config.reload()
    T = _tile(ctx)
    ints = rng.integers(-2 ** 40, 2 ** 40, (3, 2 * T + 1))
    for array in (ints, (ints % 1000).astype(np.int32), ints > 0):
        poison_pool(ctx, _POISON)
        got = t_(ctx, array).cumsum(1)
        np.testing.assert_array_equal(got.numpy(), np.cumsum(array.astype(np.int64), 1))


def test_repeated_cumsum_replays_on_new_buffers(rng, monkeypatch):
    """A repeated cumsum replays its first call's launches: on other inputs of the same shape
    and offset (each result right, including after a call of more tiles that reallocates the
    look-back status buffer), and an input at another offset is a call of its own."""
    from dlprim_py.ops import scan
    monkeypatch.setattr(scan, "_STATUS_TILES", 4)
    ctx = dp.Context()                        # its first status buffer holds 4 tiles here
    T = _tile(ctx)
    for algorithm in ("lookback", "chunks"):
        xs = [random(rng, (2, 3 * T + 1)) for _ in range(3)]
        for x in xs:
            assert_close(F.cumsum(t_(ctx, x), 1, algorithm=algorithm).numpy(),
                         np.cumsum(x.astype(np.float64), 1))
        big = random(rng, (20 * T,))           # more tiles than the first status buffer holds
        assert_close(F.cumsum(t_(ctx, big), 0, algorithm=algorithm).numpy(),
                     np.cumsum(big.astype(np.float64)))
        for x in xs:
            assert_close(F.cumsum(t_(ctx, x), 1, algorithm=algorithm).numpy(),
                         np.cumsum(x.astype(np.float64), 1))
        long = random(rng, (T + 7,))
        for offset in (0, 4, 0):
            out = F.cumsum(_offset(ctx, long, offset), 0, algorithm=algorithm)
            assert_close(out.numpy(), np.cumsum(long.astype(np.float64)))
    assert ctx.plans.get(("scan.status",))[1] >= 20


def test_lookback_launches_in_a_row(ctx, rng):
    """The status buffer is set back by each launch: many launches of changing tile counts
    (more, then fewer, then more) in a row, without a wait between them, all correct."""
    T = _tile(ctx)
    inputs = [random(rng, (n,)) for n in (7 * T + 3, T + 1, 2, 5 * T, 3 * T - 1)]
    outs = [F.cumsum(t_(ctx, x), 0, algorithm="lookback") for x in inputs * 2]
    for x, out in zip(inputs * 2, outs):
        assert_close(out.numpy(), np.cumsum(x.astype(np.float64)))


def test_cumsum_algorithm_choice_and_refusals(ctx, rng, monkeypatch):
    from dlprim_py import solver
    from dlprim_py.ops import scan
    assert set(solver.family("cumsum").solvers) == {"lookback", "chunks"}
    # The rules: look-back for long rows on GPUs, chunks for rows of two chunks and on CPUs.
    long_choice = scan._cumsum_algorithm(ctx, 1, 1 << 24, None)
    assert long_choice == ("lookback" if ctx.info.is_gpu else "chunks")
    assert scan._cumsum_algorithm(ctx, 4096, 4096, None) == (
        "lookback" if ctx.info.is_gpu else "chunks")
    assert scan._cumsum_algorithm(ctx, 64, 1000, None) == "chunks"
    x = t_(ctx, random(rng, (3, 10)))
    with pytest.raises(dp.UnsupportedError, match="cumsum algorithm"):
        F.cumsum(x, 1, algorithm="bogus")
    monkeypatch.setenv("DLPRIM_CUMSUM_ALGO", "bogus")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="bogus"):
        F.cumsum(x, 1)


# ---- sort ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((4, 9), 1), ((3, 300), -1), ((50, 3), 0), ((1, 1), 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_torchs_stable_sort(ctx, rng, shape, dim, descending):
    """Values exactly, and indices exactly as torch's stable sort gives them, with ties and
    NaN; rows of one tile, several rows per tile, and the whole bitonic network (300 > the
    tile on PoCL)."""
    x = ties(rng, shape)
    poison_pool(ctx)
    values, indices = F.sort(t_(ctx, x), dim, descending=descending)
    want = torch.sort(torch.tensor(x), dim=dim, descending=descending, stable=True)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    assert indices.dtype == dp.int64


def test_sort_integers_gradient_and_method(ctx, rng):
    x = rng.integers(-50, 50, (3, 200))
    result = t_(ctx, x).sort(-1, descending=True, stable=True)
    want = torch.sort(torch.tensor(x), descending=True, stable=True)
    np.testing.assert_array_equal(result.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(result.indices.numpy(), want.indices.numpy())
    f = random(rng, (4, 6))
    X, XR = t_(ctx, f, True), ref(f, True)
    out = F.sort(X, 0).values
    backward_check(ctx, rng, out, torch.sort(XR, 0).values, [(X, XR)])


# ---- topk ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,k,dim", [((3, 20), 4, 1), ((2, 1000), 5, -1),
                                         ((2, 300), 100, 1), ((40, 3), 2, 0), ((5, 7), 0, 1)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(ctx, rng, shape, k, dim, largest):
    """Values exactly with ties and NaN; indices point at the values; distinct values give
    torch's indices. 1000 entries take the tile rounds, k = 100 the full sort (on PoCL)."""
    x = ties(rng, shape)
    poison_pool(ctx)
    values, indices = F.topk(t_(ctx, x), k, dim, largest=largest)
    want = torch.topk(torch.tensor(x), k, dim, largest=largest)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(x, indices.numpy(), dim), values.numpy())
    distinct = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32)
    values, indices = t_(ctx, distinct).topk(k, dim, largest)
    want = torch.topk(torch.tensor(distinct), k, dim, largest)
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


@pytest.fixture(params=["radix", "radix1024", "bitonic"])
def topk_algorithm(request, ctx, monkeypatch):
    """Each topk algorithm forced; "radix1024": radix with the GPUs' 1024-item work-groups."""
    name = request.param
    if name == "radix1024":
        from dlprim_py.ops import scan
        if ctx.info.max_work_group_size < 1024:
            pytest.skip("work-groups of 1024 items are not available")
        monkeypatch.setattr(scan, "_radix_group", lambda ctx: 1024)
        name = "radix"
    monkeypatch.setenv("DLPRIM_TOPK_ALGO", name)
    dp.config.reload()
    return name


@pytest.mark.parametrize("shape,k", [((3, 20), 4), ((2, 1000), 5), ((3, 1001), 1),
                                     ((2, 300), 100), ((4, 7), 7), ((2, 3001), 1024),
                                     ((1, 5), 1), ((5, 1), 1)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_algorithms_forced(ctx, rng, topk_algorithm, shape, k, largest):
    """Each algorithm on its own: values exactly with ties and NaN, indices pointing at them and
    the same as the lowest positions among equal values (torch's stable sort's); distinct
    values give torch's indices; k = 1, k = n, rows shorter than a tile and not whole 4-vectors;
    int32 and int64 keys; an input at an offset."""
    if k > 512 and topk_algorithm == "bitonic" and ctx.info.is_cpu:
        pytest.skip("the full bitonic network at this size is slow on a CPU")
    for x in (ties(rng, shape), rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32),
              rng.integers(-2 ** 40, 2 ** 40, shape), rng.integers(-9, 9, shape).astype(np.int32)):
        poison_pool(ctx)
        values, indices = F.topk(t_(ctx, x), k, -1, largest=largest)
        want = torch.sort(torch.tensor(x), dim=-1, descending=largest, stable=True)
        np.testing.assert_array_equal(values.numpy(), want.values[..., :k].numpy())
        np.testing.assert_array_equal(indices.numpy(), want.indices[..., :k].numpy())
    x = ties(rng, shape)
    values, indices = F.topk(_offset(ctx, x, 3), k, -1, largest=largest)
    want = torch.sort(torch.tensor(x), dim=-1, descending=largest, stable=True)
    np.testing.assert_array_equal(values.numpy(), want.values[..., :k].numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices[..., :k].numpy())


def test_topk_algorithm_choice_and_refusals(ctx, rng):
    from dlprim_py import solver
    from dlprim_py.ops import scan
    assert set(solver.family("topk").solvers) == {"radix", "bitonic"}
    assert scan._topk_algorithm(ctx, 64, 32000, 50, None) == "radix"
    assert scan._topk_algorithm(ctx, 64, 32000, 2000, None) == "bitonic"
    x = t_(ctx, random(rng, (2, 3000)))
    with pytest.raises(dp.UnsupportedError, match="does not apply"):
        F.topk(x, 1025, algorithm="radix")
    with pytest.raises(dp.UnsupportedError, match="topk algorithm"):
        F.topk(x, 3, algorithm="heap")
    values, _ = F.topk(x, 2000)
    np.testing.assert_array_equal(values.numpy(), np.sort(x.numpy(), -1)[:, ::-1][:, :2000])


def test_topk_gradient_and_refusals(ctx, rng):
    x = random(rng, (3, 40))
    X, XR = t_(ctx, x, True), ref(x, True)
    out = F.topk(X, 5).values
    backward_check(ctx, rng, out, torch.topk(XR, 5).values, [(X, XR)])
    with pytest.raises(dp.ShapeError, match="k"):
        F.topk(X, 41)
    with pytest.raises(dp.DTypeError, match="float32, int32 and int64"):
        F.topk(t_(ctx, x > 0), 1)
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.sort(x)


def test_empty(ctx):
    x = t_(ctx, np.zeros((3, 0), np.float32))
    assert F.sort(x, 1).values.shape == (3, 0)
    assert F.topk(x, 0).indices.shape == (3, 0)
    assert F.cumsum(x, 1).shape == (3, 0)
    assert F.sort(t_(ctx, np.zeros((0, 4), np.float32)), 1).values.shape == (0, 4)


def test_repeated_calls_build_nothing(ctx, rng):
    x = t_(ctx, random(rng, (3, 300)), True)

    def run():
        y = F.cumsum(x, 1).sum() + F.sort(x, 1, descending=True).values.sum() + \
            F.topk(x, 3).values.sum() + F.topk(x, 100).values.sum() + \
            F.cumsum(x, 1, algorithm="lookback").sum() + \
            F.cumsum(x, 1, algorithm="chunks").sum() + \
            F.topk(x, 3, algorithm="radix").values.sum() + \
            F.topk(x, 3, algorithm="bitonic").values.sum()
        y.backward()
        x.grad = None

    assert_repeats_build_nothing(ctx, run)


def test_lookback_long_rows_repeated(ctx, rng):
    """Long rows of many tiles, scanned again and again forwards and backwards (the published
    totals and prefixes of one launch, the reset status of the last): every result against
    float64. Where publication is misordered across work-groups this fails now and then."""
    n = (1 << 20) + 3
    x = random(rng, (n,))
    inputs = (dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, x[::-1].copy()))
    wants = (np.cumsum(x.astype(np.float64)), np.cumsum(x[::-1].astype(np.float64)))
    for _ in range(4):
        for X, want in zip(inputs, wants):
            assert_close(F.cumsum(X, 0, algorithm="lookback").numpy(), want)


@pytest.mark.parametrize("per", [8, 32])
def test_lookback_tile_lengths(ctx, rng, tuning_rules, per):
    """A rule's per_item sets the look-back tile (elements per work item): rows across tile
    boundaries of that length scan right, and a value the kernel cannot take is refused."""
    from dlprim_py.ops import scan
    tuning_rules("cumsum", [{"when": {}, "params": {"solver": "lookback", "per_item": per}}])
    assert scan.lookback_per(ctx, 1, 5000) == per
    T = scan._lookback_group(ctx, 4, per) * per
    for shape in ((T - 1,), (T + 1,), (3 * T + 5,), (2, T + 3)):
        x = random(rng, shape)
        poison_pool(ctx, _POISON)
        out = F.cumsum(t_(ctx, x), -1, algorithm="lookback")
        assert_close(out.numpy(), np.cumsum(x.astype(np.float64), -1))
    tuning_rules("cumsum", [{"when": {}, "params": {"solver": "lookback", "per_item": 12}}])
    with pytest.raises(dp.DlprimError, match="per_item"):
        F.cumsum(t_(ctx, random(rng, (100,))), -1, algorithm="lookback")
