"""dp.nn modules against torch.nn (CPU, float64) on the same initial weights and data: each
module's weights go from ours to torch through state dicts, then the forward output and the
gradients of the input and of every parameter are compared. Batch norm's training and eval
modes (running statistics, num_batches_tracked, momentum=None's cumulative average), the losses,
dropout and torch's initialisation bounds are checked too."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlprim_py as dp  # noqa: E402
from dlprim_py import nn  # noqa: E402

from conftest import assert_repeats_build_nothing  # noqa: E402


def to_torch(array):
    t = torch.from_numpy(np.array(array))
    return t.double() if t.is_floating_point() else t


def twin(ctx, name, *args, **kwargs):
    """(ours, torch's float64) module ``name`` with the same weights (ours' initial ones)."""
    ours = getattr(nn, name)(*args, ctx=ctx, **kwargs)
    theirs = getattr(torch.nn, name)(*args, **kwargs).double()
    theirs.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    return ours, theirs


def check_close(ours, theirs, what, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=rtol, atol=atol, err_msg=what)


def run_both(ctx, ours, theirs, x_np, rng, grad=True):
    """Forward both on ``x_np``; with ``grad``, backward a random output gradient and compare
    the input's and every parameter's gradient."""
    x = dp.Tensor.from_numpy(ctx, x_np, requires_grad=grad)
    tx = to_torch(x_np).requires_grad_(grad)
    y, ty = ours(x), theirs(tx)
    check_close(y.numpy(), ty, "output")
    if not grad:
        return y, ty
    g_np = rng.standard_normal(ty.shape).astype(np.float32)
    y.backward(dp.Tensor.from_numpy(ctx, g_np))
    ty.backward(to_torch(g_np))
    check_close(x.grad.numpy(), tx.grad, "input gradient")
    theirs_params = dict(theirs.named_parameters())
    ours_params = dict(ours.named_parameters())
    assert set(ours_params) == set(theirs_params)
    for name, p in ours_params.items():
        check_close(p.grad.numpy(), theirs_params[name].grad, f"gradient of {name}")
    return y, ty


# name, args, kwargs, input shape
LAYERS = [
    ("Linear", (5, 3), {}, (4, 5)),
    ("Linear", (6, 2), {"bias": False}, (2, 3, 6)),
    ("Conv2d", (3, 4, 3), {"stride": 2, "padding": 1}, (2, 3, 9, 9)),
    ("Conv2d", (4, 6, (3, 1)), {"groups": 2, "dilation": (2, 1), "bias": False}, (2, 4, 8, 7)),
    ("Conv2d", (2, 3, 3), {"padding": "same"}, (1, 2, 6, 5)),
    ("Conv2d", (2, 3, (3, 2)), {"padding": "valid", "stride": (1, 2)}, (1, 2, 6, 5)),
    ("Conv2d", (2, 3, 3), {"padding": 1, "padding_mode": "reflect"}, (1, 2, 6, 5)),
    ("Conv2d", (2, 3, 3), {"padding": (2, 1), "padding_mode": "replicate"}, (1, 2, 6, 5)),
    ("Conv2d", (2, 3, (2, 4)), {"padding": "same"}, (1, 2, 6, 5)),
    ("Conv2d", (2, 3, 2), {"padding": "same", "padding_mode": "circular"}, (1, 2, 6, 5)),
    ("Conv2d", (2, 3, 3), {"padding": 1}, (2, 6, 5)),
    ("ConvTranspose2d", (4, 2, 3), {"stride": 2, "padding": 1, "output_padding": 1},
     (2, 4, 5, 5)),
    ("ConvTranspose2d", (4, 6, 2), {"groups": 2, "bias": False}, (1, 4, 3, 4)),
    ("LayerNorm", ((4, 5),), {}, (3, 4, 5)),
    ("LayerNorm", (6,), {"elementwise_affine": False}, (2, 6)),
    ("GroupNorm", (2, 4), {}, (2, 4, 3, 3)),
    ("GroupNorm", (3, 6), {"affine": False, "eps": 1e-3}, (2, 6, 5)),
    ("ReLU", (), {}, (3, 7)),
    ("ReLU6", (), {}, (3, 7)),
    ("LeakyReLU", (0.2,), {}, (3, 7)),
    ("GELU", (), {}, (3, 7)),
    ("GELU", (), {"approximate": "tanh"}, (3, 7)),
    ("SiLU", (), {}, (3, 7)),
    ("Sigmoid", (), {}, (3, 7)),
    ("Tanh", (), {}, (3, 7)),
    ("Hardswish", (), {}, (3, 7)),
    ("Hardsigmoid", (), {}, (3, 7)),
    ("Softmax", (1,), {}, (3, 7)),
    ("Softmax", (-1,), {}, (2, 3, 7)),
    ("MaxPool2d", (2,), {}, (2, 3, 6, 6)),
    ("MaxPool2d", (3, 2, 1), {"ceil_mode": True}, (1, 2, 7, 8)),
    ("AvgPool2d", (3, 2, 1), {"count_include_pad": False}, (1, 2, 7, 8)),
    ("AvgPool2d", (2,), {}, (2, 3, 6, 6)),
    ("AdaptiveAvgPool2d", ((2, 3),), {}, (2, 3, 7, 8)),
    ("AdaptiveAvgPool2d", (1,), {}, (2, 3, 5, 5)),
    ("Flatten", (), {}, (2, 3, 4, 5)),
    ("Flatten", (0, 2), {}, (2, 3, 4, 5)),
    ("Identity", (), {}, (2, 3)),
    ("BatchNorm1d", (4,), {}, (6, 4)),
    ("BatchNorm1d", (4,), {"affine": False}, (3, 4, 5)),
    ("BatchNorm2d", (3,), {"momentum": 0.3, "eps": 1e-3}, (2, 3, 4, 4)),
]


@pytest.mark.parametrize("name,args,kwargs,shape", LAYERS,
                         ids=[f"{n}-{i}" for i, (n, *_) in enumerate(LAYERS)])
def test_forward_and_gradients_match_torch(ctx, rng, name, args, kwargs, shape):
    ours, theirs = twin(ctx, name, *args, **kwargs)
    x = rng.standard_normal(shape).astype(np.float32)
    if name in ("ReLU6", "Hardswish", "Hardsigmoid"):
        x *= 4.0   # reach both kinks
    run_both(ctx, ours, theirs, x, rng)
    # Batch norm updated its running statistics as torch did.
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=key)


def test_softmax_without_dim_takes_torchs_legacy_dim(ctx, rng):
    for shape in ((5,), (2, 5), (2, 3, 4), (2, 3, 4, 2)):
        x = rng.standard_normal(shape).astype(np.float32)
        with pytest.warns(UserWarning):
            expected = torch.nn.Softmax()(to_torch(x))
        check_close(nn.Softmax(ctx=ctx)(dp.Tensor.from_numpy(ctx, x)).numpy(), expected,
                    str(shape))


def test_conv_transpose_output_size(ctx, rng):
    ours, theirs = twin(ctx, "ConvTranspose2d", 2, 3, 3, stride=2, padding=1)
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    y = ours(dp.Tensor.from_numpy(ctx, x), output_size=(8, 10))
    check_close(y.numpy(), theirs(to_torch(x), output_size=(8, 10)), "output")
    with pytest.raises(dp.ShapeError, match="valid sizes"):
        ours(dp.Tensor.from_numpy(ctx, x), output_size=(9, 10))


def test_sequential_of_layers_trains_like_torch(ctx, rng):
    def build(lib, **kw):
        return lib.Sequential(lib.Conv2d(3, 4, 3, padding=1, **kw), lib.BatchNorm2d(4, **kw),
                              lib.ReLU(), lib.MaxPool2d(2), lib.Flatten(),
                              lib.Linear(4 * 3 * 3, 5, **kw))
    ours = build(nn, ctx=ctx)
    theirs = build(torch.nn).double()
    theirs.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    x = rng.standard_normal((3, 3, 6, 6)).astype(np.float32)
    target = rng.integers(0, 5, 3)
    loss = nn.CrossEntropyLoss()(ours(dp.Tensor.from_numpy(ctx, x)),
                                 dp.Tensor.from_numpy(ctx, target))
    tloss = torch.nn.CrossEntropyLoss()(theirs(to_torch(x)), to_torch(target))
    loss.backward()
    tloss.backward()
    assert abs(loss.item() - tloss.item()) < 1e-5
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        check_close(p.grad.numpy(), theirs_params[name].grad, name)
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-5, atol=1e-6)


# ---- batch norm: modes and running statistics ------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"momentum": None}, {"momentum": 0.5},
                                    {"track_running_stats": False},
                                    {"affine": False, "momentum": None}],
                         ids=["default", "cumulative", "momentum", "untracked", "plain-cumulative"])
def test_batch_norm_train_then_eval_matches_torch(ctx, rng, kwargs):
    ours, theirs = twin(ctx, "BatchNorm2d", 3, **kwargs)
    for step in range(3):
        x = (rng.standard_normal((4, 3, 5, 5)) * (step + 1) + step).astype(np.float32)
        run_both(ctx, ours, theirs, x, rng)
        state = ours.state_dict()
        for key, value in theirs.state_dict().items():
            np.testing.assert_allclose(state[key], value.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {step}: {key}")
    if ours.track_running_stats:
        assert ours.state_dict()["num_batches_tracked"] == 3
        assert ours.state_dict()["num_batches_tracked"].dtype == np.int64
    ours.eval()
    theirs.eval()
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    before = ours.state_dict()
    run_both(ctx, ours, theirs, x, rng)
    # Eval leaves the statistics and the counter alone.
    for key, value in ours.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_batch_norm_cumulative_average_continues_from_a_loaded_counter(ctx, rng):
    ours, theirs = twin(ctx, "BatchNorm1d", 4, momentum=None)
    state = {k: v.copy() for k, v in ours.state_dict().items()}
    state["num_batches_tracked"] = np.array(9, np.int64)
    state["running_mean"] = rng.standard_normal(4).astype(np.float32)
    ours.load_state_dict(state)
    theirs.load_state_dict({k: to_torch(v) for k, v in state.items()})
    for _ in range(2):
        run_both(ctx, ours, theirs, rng.standard_normal((8, 4)).astype(np.float32), rng)
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-5, atol=1e-6)
    assert ours.state_dict()["num_batches_tracked"] == 11


def test_batch_norm_checks_the_input_rank(ctx):
    with pytest.raises(dp.ShapeError, match="expected 4D input"):
        nn.BatchNorm2d(3, ctx=ctx)(dp.Tensor.zeros(ctx, (2, 3, 4)))
    with pytest.raises(dp.ShapeError, match="2D or 3D"):
        nn.BatchNorm1d(3, ctx=ctx)(dp.Tensor.zeros(ctx, (2, 3, 4, 4)))


# ---- dropout ----------------------------------------------------------------------------------

def test_dropout_is_the_identity_in_eval_and_masks_in_training(ctx, rng):
    x_np = rng.standard_normal((64, 64)).astype(np.float32) + 3.0
    drop = nn.Dropout(0.25, ctx=ctx)
    x = dp.Tensor.from_numpy(ctx, x_np, requires_grad=True)
    y = drop(x).numpy()
    kept = y != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(y[kept], x_np[kept] / 0.75, rtol=1e-6)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), x_np)
    dp.manual_seed(7)
    first = nn.Dropout(0.5, ctx=ctx)(x).numpy()
    dp.manual_seed(7)
    np.testing.assert_array_equal(nn.Dropout(0.5, ctx=ctx)(x).numpy(), first)


# ---- losses -------------------------------------------------------------------------------------

def test_losses_match_torch(ctx, rng):
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    target = rng.integers(0, 4, 6)
    target[2] = 1
    weight = rng.uniform(0.5, 2.0, 4).astype(np.float32)
    probs = rng.uniform(size=(6, 4)).astype(np.float32)
    cases = [
        ("CrossEntropyLoss", {}, logits, target),
        ("CrossEntropyLoss", {"weight": weight}, logits, target),
        ("CrossEntropyLoss", {}, logits, probs),
        ("CrossEntropyLoss", {"ignore_index": 1, "reduction": "sum"}, logits, target),
        ("NLLLoss", {"weight": weight}, logits, target),
        ("NLLLoss", {"reduction": "none"}, logits, target),
        ("MSELoss", {}, logits, probs),
        ("MSELoss", {"reduction": "sum"}, logits, probs),
        ("BCEWithLogitsLoss", {}, logits, probs),
        ("BCEWithLogitsLoss", {"pos_weight": weight, "weight": probs[0]}, logits, probs),
    ]
    for name, kwargs, x_np, t_np in cases:
        ours = getattr(nn, name)(ctx=ctx, **kwargs)
        theirs = getattr(torch.nn, name)(**{k: to_torch(v) if isinstance(v, np.ndarray) else v
                                            for k, v in kwargs.items()})
        x = dp.Tensor.from_numpy(ctx, x_np, requires_grad=True)
        tx = to_torch(x_np).requires_grad_(True)
        loss = ours(x, dp.Tensor.from_numpy(ctx, t_np))
        tloss = theirs(tx, to_torch(t_np))
        check_close(loss.numpy(), tloss, f"{name} {kwargs}", rtol=1e-5)
        loss.sum().backward()
        tloss.sum().backward()
        check_close(x.grad.numpy(), tx.grad, f"{name} {kwargs} gradient", rtol=1e-5)
        # Class weights are buffers, saved under torch's names.
        assert list(ours.state_dict()) == list(theirs.state_dict())


# ---- initialisation ------------------------------------------------------------------------------

def test_initialisation_follows_torchs_bounds(ctx):
    dp.manual_seed(0)
    linear = nn.Linear(400, 300, ctx=ctx)
    w = linear.weight.numpy()
    bound = 1 / math.sqrt(400)   # kaiming_uniform_(a=sqrt(5)) on fan_in 400
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound
    assert np.abs(linear.bias.numpy()).max() <= bound
    conv = nn.ConvTranspose2d(8, 6, 3, groups=2, ctx=ctx)
    fan_in = 3 * 3 * 3   # torch's fan_in of the (in, out / groups, kH, kW) weight
    assert np.abs(conv.bias.numpy()).max() <= 1 / math.sqrt(fan_in)
    bn = nn.BatchNorm2d(5, ctx=ctx)
    np.testing.assert_array_equal(bn.weight.numpy(), 1)
    np.testing.assert_array_equal(bn.bias.numpy(), 0)
    np.testing.assert_array_equal(bn.running_var.numpy(), 1)
    # The same seed gives the same weights; the next module others.
    dp.manual_seed(0)
    np.testing.assert_array_equal(nn.Linear(400, 300, ctx=ctx).weight.numpy(), w)
    assert not np.array_equal(nn.Linear(400, 300, ctx=ctx).weight.numpy(), w)
    t = dp.Tensor.empty(ctx, (64, 32, 3, 3))
    nn.init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / (64 * 9))) < 0.02 * math.sqrt(2 / (64 * 9))


def test_unsupported_arguments_raise_at_construction(ctx):
    with pytest.raises(dp.UnsupportedError, match="padding_mode"):
        nn.Conv2d(2, 2, 3, padding=1, padding_mode="wrap", ctx=ctx)
    with pytest.raises(dp.UnsupportedError, match="zeros"):
        nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect", ctx=ctx)
    with pytest.raises(dp.ShapeError, match="divisible"):
        nn.Conv2d(3, 4, 3, groups=2, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="divisible"):
        nn.GroupNorm(3, 4, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="reduction"):
        nn.MSELoss(reduction="avg")


# ---- repeated calls --------------------------------------------------------------------------

@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_repeated_training_step_builds_nothing_and_leaves_no_cycle(ctx, rng, momentum):
    """A module's call costs the functional calls and no more: after the first training step,
    later ones render, build and create nothing, and free everything by reference counting."""
    import gc

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, ctx=ctx),
                          nn.BatchNorm2d(4, momentum=momentum, ctx=ctx), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3, ctx=ctx))
    criterion = nn.CrossEntropyLoss()
    x = dp.Tensor.from_numpy(ctx, rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    target = dp.Tensor.from_numpy(ctx, np.array([0, 2], np.int64))

    def step():
        model.zero_grad()
        criterion(model(x), target).backward()

    assert_repeats_build_nothing(ctx, step)
    # Until nothing is left: a collection can free objects (through weak references'
    # callbacks) whose own cycles only the next one finds, e.g. an earlier test's kernel
    # objects, whose PyOpenCL invokers are reference cycles.
    while gc.collect():
        pass
    gc.disable()
    try:
        step()
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0
    assert model.state_dict()["1.num_batches_tracked"] == 4


def test_fifty_training_steps_stay_with_torch(ctx, rng):
    """A small CNN (conv, batch norm, relu, pooling, dropout off, linear) trained 50 steps with
    dp.optim.SGD (momentum, weight decay) against torch.optim.SGD on a float64 copy: the losses,
    the final weights and the running statistics stay within float32 drift of torch's run."""
    def build(lib, **kw):
        return lib.Sequential(lib.Conv2d(1, 6, 3, padding=1, **kw), lib.BatchNorm2d(6, **kw),
                              lib.ReLU(), lib.MaxPool2d(2), lib.Conv2d(6, 8, 3, **kw),
                              lib.GroupNorm(2, 8, **kw), lib.SiLU(), lib.AdaptiveAvgPool2d(1),
                              lib.Flatten(), lib.Dropout(0.0), lib.Linear(8, 4, **kw))
    dp.manual_seed(1)
    ours = build(nn, ctx=ctx)
    initial = ours.state_dict()
    theirs = build(torch.nn).double()
    theirs.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    criterion, tcriterion = nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
    steps = 50
    x_all = rng.standard_normal((steps, 8, 1, 10, 10)).astype(np.float32)
    # Labels that depend on the images, so that the loss has something to learn.
    x_all += rng.standard_normal((steps, 8, 1, 1, 1)).astype(np.float32)
    t_all = np.digitize(x_all.mean(axis=(2, 3, 4)), [-0.7, 0.0, 0.7])
    settings = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
    optimizer = dp.optim.SGD(ours.parameters(), **settings)
    reference = torch.optim.SGD(theirs.parameters(), **settings)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        reference.zero_grad()
        loss = criterion(ours(dp.Tensor.from_numpy(ctx, x_all[step])),
                         dp.Tensor.from_numpy(ctx, t_all[step]))
        tloss = tcriterion(theirs(to_torch(x_all[step])), to_torch(t_all[step]))
        loss.backward()
        tloss.backward()
        assert abs(loss.item() - tloss.item()) < 1e-3, step
        losses.append(tloss.item())
        optimizer.step()
        reference.step()
    assert np.mean(losses[-10:]) < np.mean(losses[:10])
    assert not np.allclose(ours.state_dict()["0.weight"], initial["0.weight"], atol=1e-3)
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-3, atol=1e-4,
                                   err_msg=key)


# ---- MultiheadAttention -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, self_attention, masks", [
    ({}, True, False),
    ({"batch_first": True}, True, True),
    ({"kdim": 6, "vdim": 10, "batch_first": True}, False, True),
    ({"add_bias_kv": True, "add_zero_attn": True}, False, True),
    ({"bias": False}, False, False)])
def test_multihead_attention(ctx, rng, kwargs, self_attention, masks):
    """Against torch.nn.MultiheadAttention with ours' weights (state dicts both ways): output,
    averaged weights, the gradients of the inputs and of every parameter."""
    E, H, L, S, N = 16, 4, 5, 7, 3
    ours, theirs = twin(ctx, "MultiheadAttention", E, H, **kwargs)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    first = kwargs.get("batch_first", False)

    def shape(rows, features):
        return (N, rows, features) if first else (rows, N, features)
    q = rng.standard_normal(shape(L, E)).astype(np.float32)
    k = q if self_attention else rng.standard_normal(shape(S, kwargs.get("kdim", E))).astype(
        np.float32)
    v = q if self_attention else rng.standard_normal(shape(S, kwargs.get("vdim", E))).astype(
        np.float32)
    S_ = L if self_attention else S
    attn = rng.standard_normal((L, S_)).astype(np.float32) if masks else None
    padding = (rng.uniform(0, 1, (N, S_)) > 0.7) if masks else None
    if padding is not None:
        padding[:, 0] = False
    mine = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    ref = [to_torch(a).requires_grad_(True) for a in (q, k, v)]
    if self_attention:
        mine, ref = [mine[0]] * 3, [ref[0]] * 3
    extra = dict(attn_mask=None if attn is None else dp.Tensor.from_numpy(ctx, attn),
                 key_padding_mask=None if padding is None else dp.Tensor.from_numpy(ctx, padding))
    extra_ref = dict(attn_mask=None if attn is None else to_torch(attn),
                     key_padding_mask=None if padding is None else torch.tensor(padding))
    out, weights = ours(*mine, **extra)
    ref_out, ref_weights = theirs(*ref, **extra_ref)
    check_close(out.numpy(), ref_out, "output")
    check_close(weights.numpy(), ref_weights, "weights")
    g = rng.standard_normal(tuple(ref_out.shape)).astype(np.float32)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref_out.backward(to_torch(g))
    for a, b, name in zip(mine, ref, "qkv"):
        check_close(a.grad.numpy(), b.grad, f"gradient of {name}")
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        check_close(p.grad.numpy(), theirs_params[name].grad, f"gradient of {name}")


def test_multihead_attention_bad_arguments(ctx):
    with pytest.raises(dp.ShapeError, match="divisible"):
        nn.MultiheadAttention(10, 3, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="positive int"):
        nn.MultiheadAttention(0, 1, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="probability"):
        nn.MultiheadAttention(8, 2, dropout=1.5, ctx=ctx)


# ---- Transformer layers -----------------------------------------------------------------------

def _transformer_twins(ctx, kind, layers, **kwargs):
    """(ours, torch's float64) encoder or decoder of ``layers`` layers, torch's weights ours."""
    ours_layer = getattr(nn, f"Transformer{kind}Layer")(16, 4, ctx=ctx, **kwargs)
    theirs_layer = getattr(torch.nn, f"Transformer{kind}Layer")(16, 4, **kwargs)
    norm = nn.LayerNorm(16, ctx=ctx)
    extra = {"enable_nested_tensor": False} if kind == "Encoder" else {}
    ours = getattr(nn, f"Transformer{kind}")(ours_layer, layers, norm=norm)
    theirs = getattr(torch.nn, f"Transformer{kind}")(theirs_layer, layers,
                                                     norm=torch.nn.LayerNorm(16), **extra)
    theirs = theirs.double()
    assert set(ours.state_dict()) == set(theirs.state_dict())
    theirs.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("kwargs", [
    {"dim_feedforward": 24, "dropout": 0.0},
    {"dim_feedforward": 24, "dropout": 0.0, "norm_first": True, "activation": "gelu",
     "batch_first": True}])
def test_transformer_encoder_and_decoder(ctx, rng, kwargs):
    """Two-layer encoder and decoder (copies of one layer, a final norm) against torch's with
    the same weights: outputs and every parameter's gradient, causal and padding masks."""
    first = kwargs.get("batch_first", False)
    L, S, N = 5, 6, 3

    def data(rows):
        return rng.standard_normal((N, rows, 16) if first else (rows, N, 16)).astype(np.float32)
    causal = np.triu(np.full((L, L), -np.inf, np.float32), 1)
    padding = np.zeros((N, S), bool)
    padding[1, -2:] = True
    for kind in ("Encoder", "Decoder"):
        ours, theirs = _transformer_twins(ctx, kind, 2, **kwargs)
        x = data(L)
        mine = [dp.Tensor.from_numpy(ctx, x, requires_grad=True)]
        ref = [to_torch(x).requires_grad_(True)]
        if kind == "Encoder":
            out = ours(mine[0], mask=dp.Tensor.from_numpy(ctx, causal))
            ref_out = theirs(ref[0], mask=to_torch(causal))
        else:
            memory = data(S)
            mine.append(dp.Tensor.from_numpy(ctx, memory, requires_grad=True))
            ref.append(to_torch(memory).requires_grad_(True))
            out = ours(mine[0], mine[1], tgt_mask=dp.Tensor.from_numpy(ctx, causal),
                       memory_key_padding_mask=dp.Tensor.from_numpy(ctx, padding))
            ref_out = theirs(ref[0], ref[1], tgt_mask=to_torch(causal),
                             memory_key_padding_mask=torch.tensor(padding))
        check_close(out.numpy(), ref_out, f"{kind} output")
        g = rng.standard_normal(tuple(ref_out.shape)).astype(np.float32)
        out.backward(dp.Tensor.from_numpy(ctx, g))
        ref_out.backward(to_torch(g))
        for a, b in zip(mine, ref):
            check_close(a.grad.numpy(), b.grad, f"{kind} input gradient")
        theirs_params = dict(theirs.named_parameters())
        for name, p in ours.named_parameters():
            check_close(p.grad.numpy(), theirs_params[name].grad, f"gradient of {name}")


def test_transformer_layers_copy_their_weights(ctx):
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, ctx=ctx)
    encoder = nn.TransformerEncoder(layer, 3)
    want = layer.linear1.weight.numpy()
    for copy in encoder.layers:
        assert copy is not layer and np.array_equal(copy.linear1.weight.numpy(), want)
    with pytest.raises(dp.ShapeError, match="relu/gelu"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh", ctx=ctx)
    with pytest.raises(dp.ShapeError, match="num_layers"):
        nn.TransformerEncoder(layer, 0)


# ---- Embedding, EmbeddingBag -------------------------------------------------------------------

@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding(ctx, rng, padding_idx):
    """Against torch's with the same table: rows and the table's gradient (none to the padding
    row); torch's initialisation (N(0, 1), the padding row zero)."""
    ours, theirs = twin(ctx, "Embedding", 9, 5, padding_idx=padding_idx)
    if padding_idx is not None:
        assert not ours.weight.numpy()[padding_idx].any()
    index = rng.integers(0, 9, (4, 6))
    index[0, :3] = 2
    out = ours(dp.Tensor.from_numpy(ctx, index))
    ref = theirs(torch.tensor(index))
    check_close(out.numpy(), ref, "rows")
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(to_torch(g))
    check_close(ours.weight.grad.numpy(), theirs.weight.grad, "table gradient")
    # A repeated lookup through the module replays the functional form's plan: no check again.
    from dlprim_py.ops import indexing as ix
    checked = []
    original = ix._check_weight
    ix._check_weight = lambda *a: (checked.append(a), original(*a))[1]
    try:
        again = ours(dp.Tensor.from_numpy(ctx, index))
    finally:
        ix._check_weight = original
    assert not checked
    check_close(again.numpy(), ref, "rows, replayed")
    big = nn.Embedding(2000, 50, ctx=ctx).weight.numpy()
    assert abs(big.mean()) < 0.02 and abs(big.std() - 1.0) < 0.02


def test_embedding_from_pretrained_and_bag(ctx, rng):
    table = rng.standard_normal((7, 4)).astype(np.float32)
    frozen = nn.Embedding.from_pretrained(dp.Tensor.from_numpy(ctx, table))
    assert not frozen.weight.requires_grad
    np.testing.assert_array_equal(frozen(dp.Tensor.from_numpy(ctx, np.array([3, 1]))).numpy(),
                                  table[[3, 1]])
    for mode in ("sum", "mean", "max"):
        ours, theirs = twin(ctx, "EmbeddingBag", 9, 5, mode=mode)
        index, offsets = rng.integers(0, 9, 10), np.array([0, 3, 3, 7])
        out = ours(dp.Tensor.from_numpy(ctx, index), dp.Tensor.from_numpy(ctx, offsets))
        ref = theirs(torch.tensor(index), torch.tensor(offsets))
        check_close(out.numpy(), ref, f"bags ({mode})")
        g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
        out.backward(dp.Tensor.from_numpy(ctx, g))
        ref.backward(to_torch(g))
        check_close(ours.weight.grad.numpy(), theirs.weight.grad, f"table gradient ({mode})")
    with pytest.raises(dp.ShapeError, match="padding_idx"):
        nn.Embedding(5, 3, padding_idx=5, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="positive int"):
        nn.Embedding(0, 3, ctx=ctx)


def test_transformer(ctx, rng):
    """nn.Transformer against torch's with the same weights: the encoder-decoder output under
    the causal target mask (generate_square_subsequent_mask) and every parameter's gradient;
    torch's xavier initialisation of every matrix."""
    kwargs = dict(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=1,
                  dim_feedforward=24, dropout=0.0, batch_first=True)
    ours = nn.Transformer(**kwargs, ctx=ctx)
    theirs = torch.nn.Transformer(**kwargs).double()
    assert set(ours.state_dict()) == set(theirs.state_dict())
    theirs.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    w = ours.encoder.layers[0].linear1.weight.numpy()
    bound = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    src = rng.standard_normal((2, 6, 16)).astype(np.float32)
    tgt = rng.standard_normal((2, 5, 16)).astype(np.float32)
    mask = nn.Transformer.generate_square_subsequent_mask(5, ctx=ctx)
    np.testing.assert_array_equal(mask.numpy(),
                                  torch.nn.Transformer.generate_square_subsequent_mask(5).numpy())
    out = ours(dp.Tensor.from_numpy(ctx, src), dp.Tensor.from_numpy(ctx, tgt), tgt_mask=mask)
    ref = theirs(to_torch(src), to_torch(tgt), tgt_mask=to_torch(mask.numpy()))
    check_close(out.numpy(), ref, "output")
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(to_torch(g))
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        check_close(p.grad.numpy(), theirs_params[name].grad, f"gradient of {name}")
