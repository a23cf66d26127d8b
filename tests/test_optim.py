"""dp.optim (SGD, Adam, AdamW), dp.optim.lr_scheduler and dp.nn.utils.clip_grad_norm_ against
torch on the CPU (torch.optim on float32 copies is the reference), and the fused updates'
repeated steps building nothing."""
import math

import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py import optim, program
from dlprim_py.optim import lr_scheduler

from conftest import assert_close

# More parameters than one launch's slots, of sizes that do not divide the launch geometry.
SHAPES = [(3, 4), (5,), (2, 3, 3), (257,), (1,), (16, 9), (7, 1, 2), (33,), (4, 4), (6,), (2, 50)]


def _weights(rng, shapes=SHAPES):
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]


def _pair(ctx, weights):
    ours = [dp.Tensor.from_numpy(ctx, w, requires_grad=True) for w in weights]
    theirs = [torch.tensor(w, requires_grad=True) for w in weights]
    return ours, theirs


def _set_grads(ctx, rng, ours, theirs, skip=()):
    for i, (p, t) in enumerate(zip(ours, theirs)):
        if i in skip:
            p.grad = None
            t.grad = None
            continue
        g = rng.uniform(-1, 1, p.shape).astype(np.float32)
        p.grad = dp.Tensor.from_numpy(ctx, g)
        t.grad = torch.tensor(g)


def _compare(ours, theirs, tol=None):
    for p, t in zip(ours, theirs):
        assert_close(p.numpy(), t.detach().numpy().astype(np.float64), tol=tol)


CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.5, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("Adam", dict(lr=0.02, amsgrad=True)),
    ("Adam", dict(lr=0.02, amsgrad=True, weight_decay=0.05, maximize=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=0.03, betas=(0.5, 0.9), weight_decay=0.0, maximize=True)),
]


@pytest.mark.parametrize("name,options", CONFIGS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_optimizer_matches_torch(ctx, rng, name, options):
    ours, theirs = _pair(ctx, _weights(rng))
    mine = getattr(optim, name)(ours, **options)
    reference = getattr(torch.optim, name)(theirs, **options)
    for _ in range(6):
        _set_grads(ctx, rng, ours, theirs)
        mine.step()
        reference.step()
    _compare(ours, theirs)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_parameter_groups_with_their_own_options(ctx, rng, name):
    weights = _weights(rng)
    ours, theirs = _pair(ctx, weights)
    if name == "SGD":
        options = [dict(lr=0.1, momentum=0.9), dict(lr=0.01, weight_decay=0.1, nesterov=True,
                                                     momentum=0.5), dict()]
        defaults = dict(lr=0.03)
    else:
        options = [dict(lr=0.01, amsgrad=True), dict(betas=(0.7, 0.95), weight_decay=0.2),
                   dict(maximize=True)]
        defaults = dict(lr=0.005)
    cut = [0, 4, 8, len(weights)]

    def groups(params):
        return [dict(params=params[a:b], **o) for a, b, o in zip(cut, cut[1:], options)]

    mine = getattr(optim, name)(groups(ours)[:2], **defaults)
    reference = getattr(torch.optim, name)(groups(theirs)[:2], **defaults)
    mine.add_param_group(groups(ours)[2])
    reference.add_param_group(groups(theirs)[2])
    assert len(mine.param_groups) == 3
    for key, value in reference.param_groups[1].items():
        if key != "params":
            assert mine.param_groups[1][key] == value, key
    for _ in range(5):
        _set_grads(ctx, rng, ours, theirs)
        mine.step()
        reference.step()
    _compare(ours, theirs)


@pytest.mark.parametrize("name,options", [("SGD", dict(lr=0.1, momentum=0.9)),
                                          ("Adam", dict(lr=0.01, amsgrad=True)),
                                          ("AdamW", dict(lr=0.01))])
def test_parameters_without_gradient_are_skipped(ctx, rng, name, options):
    ours, theirs = _pair(ctx, _weights(rng))
    mine = getattr(optim, name)(ours, **options)
    reference = getattr(torch.optim, name)(theirs, **options)
    untouched = ours[2].numpy()
    for skip in [(2, 3), (2, 5), (0, 2), (2,)]:
        _set_grads(ctx, rng, ours, theirs, skip=skip)
        mine.step()
        reference.step()
    np.testing.assert_array_equal(ours[2].numpy(), untouched)
    assert ours[2] not in mine.state or not mine.state[ours[2]]
    _compare(ours, theirs)
    if name != "SGD":
        # Each parameter's own step count: 5 was skipped once, 3 once, 0 once.
        assert [mine.state[ours[i]]["step"] for i in (0, 1, 3, 5)] == [3.0, 4.0, 3.0, 3.0]


@pytest.mark.parametrize("name,options", [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                                          ("Adam", dict(lr=0.01, amsgrad=True)),
                                          ("AdamW", dict(lr=0.01, weight_decay=0.1))])
def test_state_dict_round_trip_continues_as_uninterrupted(ctx, rng, name, options):
    weights = _weights(rng)
    grads = [[rng.uniform(-1, 1, w.shape).astype(np.float32) for w in weights] for _ in range(6)]

    def set_grads(params, step):
        for p, g in zip(params, grads[step]):
            p.grad = dp.Tensor.from_numpy(ctx, g)

    straight = [dp.Tensor.from_numpy(ctx, w, requires_grad=True) for w in weights]
    opt = getattr(optim, name)(straight, **options)
    for step in range(6):
        set_grads(straight, step)
        opt.step()

    first = [dp.Tensor.from_numpy(ctx, w, requires_grad=True) for w in weights]
    opt = getattr(optim, name)(first, **options)
    for step in range(3):
        set_grads(first, step)
        opt.step()
    saved = opt.state_dict()
    assert sorted(saved) == ["param_groups", "state"]
    assert saved["param_groups"][0]["params"] == list(range(len(weights)))
    for entry in saved["state"].values():
        for key, value in entry.items():
            assert value is None or isinstance(value, np.ndarray), key
    resumed = [dp.Tensor.from_numpy(ctx, p.numpy(), requires_grad=True) for p in first]
    opt = getattr(optim, name)(resumed, lr=123.0)
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == options["lr"]
    for step in range(3, 6):
        set_grads(resumed, step)
        opt.step()
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("name,options", [("SGD", dict(lr=0.1, momentum=0.9)),
                                          ("Adam", dict(lr=0.01, amsgrad=True))])
def test_loads_torch_state_dict(ctx, rng, name, options):
    """A torch optimizer's state dict (torch tensors) continues here as it would in torch."""
    ours, theirs = _pair(ctx, _weights(rng))
    reference = getattr(torch.optim, name)(theirs, **options)
    for _ in range(3):
        _set_grads(ctx, rng, ours, theirs)
        reference.step()
    for p, t in zip(ours, theirs):
        p.copy_(dp.Tensor.from_numpy(ctx, t.detach().numpy()))
    mine = getattr(optim, name)(ours, **options)
    mine.load_state_dict(reference.state_dict())
    for _ in range(3):
        _set_grads(ctx, rng, ours, theirs)
        mine.step()
        reference.step()
    _compare(ours, theirs)


def test_zero_grad_and_closure(ctx, rng):
    ours, _ = _pair(ctx, _weights(rng, [(3,), (2, 2)]))
    opt = optim.SGD(ours, lr=0.1)
    for p in ours:
        p.grad = dp.Tensor.full(ctx, p.shape, 2.0)
    opt.zero_grad(set_to_none=False)
    assert all(not p.grad.numpy().any() for p in ours)
    opt.zero_grad()
    assert all(p.grad is None for p in ours)

    def closure():
        loss = dp.functional.sum(ours[0] * ours[0])
        loss.backward()
        return loss

    before = ours[0].numpy()
    loss = opt.step(closure)
    assert math.isclose(float(loss.numpy()), float((before * before).sum()), rel_tol=1e-6)
    np.testing.assert_allclose(ours[0].numpy(), before - 0.1 * 2 * before, rtol=1e-6)


def _counts():
    return dict(program.stats)


@pytest.mark.parametrize("name,options", [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                                          ("SGD", dict(lr=0.1)),
                                          ("Adam", dict(lr=0.01, amsgrad=True)),
                                          ("AdamW", dict(lr=0.01))])
def test_repeated_step_builds_nothing(ctx, rng, name, options):
    """After the first step, steps with new gradients and a scheduler changing lr (and
    OneCycleLR momentum or betas) render, build and create nothing."""
    ours, theirs = _pair(ctx, _weights(rng))
    opt = getattr(optim, name)(ours, **options)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)
    _set_grads(ctx, rng, ours, theirs)
    opt.step()
    sched.step()
    dp.nn.utils.clip_grad_norm_(ours, 1.0)
    ctx.synchronize()
    before = _counts()
    for _ in range(3):
        _set_grads(ctx, rng, ours, theirs)
        dp.nn.utils.clip_grad_norm_(ours, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    ctx.synchronize()
    assert _counts() == before


def test_one_launch_per_chunk(ctx, rng, monkeypatch):
    """A step of n parameters is ceil(n / slots) launches, not several per parameter."""
    from dlprim_py.launch import kernel_events
    ours, theirs = _pair(ctx, _weights(rng))
    opt = optim.Adam(ours, lr=0.01, amsgrad=True)
    _set_grads(ctx, rng, ours, theirs)
    opt.step()
    with kernel_events() as events:
        opt.step()
    ctx.synchronize()
    slots = optim.fused.slot_count(ctx, optim.fused.slot_bytes(5, 2, 4))
    assert [n for n, _ in events] == ["adam_step"] * math.ceil(len(SHAPES) / slots)


# ---- schedulers -----------------------------------------------------------------------------

def _scheduler_pair(ctx, rng, optimizer, options, make, steps):
    ours, theirs = _pair(ctx, _weights(rng, [(3,), (2,)]))
    mine = getattr(optim, optimizer)([{"params": ours[:1]}, {"params": ours[1:], "lr": 0.02}],
                                     **options)
    reference = getattr(torch.optim, optimizer)([{"params": theirs[:1]},
                                                 {"params": theirs[1:], "lr": 0.02}], **options)
    a, b = make(lr_scheduler, mine), make(torch.optim.lr_scheduler, reference)
    assert a.get_last_lr() == b.get_last_lr()
    for step in range(steps):
        mine.step()
        reference.step()
        a.step()
        b.step()
        assert a.get_last_lr() == b.get_last_lr(), step
        for g, h in zip(mine.param_groups, reference.param_groups):
            for key in ("lr", "momentum", "betas", "initial_lr", "max_lr", "min_lr"):
                if key in h:
                    assert g[key] == h[key], (step, key)
    return a, b, mine


SCHEDULERS = {
    "step": (lambda m, o: m.StepLR(o, step_size=7, gamma=0.5), 60),
    "cosine": (lambda m, o: m.CosineAnnealingLR(o, T_max=10), 60),
    "cosine_eta_min": (lambda m, o: m.CosineAnnealingLR(o, T_max=13, eta_min=1e-4), 80),
    "one_cycle": (lambda m, o: m.OneCycleLR(o, max_lr=0.1, total_steps=50), 49),
    "one_cycle_linear": (lambda m, o: m.OneCycleLR(o, max_lr=[0.1, 0.3], epochs=4,
                                                   steps_per_epoch=10, anneal_strategy="linear",
                                                   pct_start=0.25), 39),
    "one_cycle_three_phase": (lambda m, o: m.OneCycleLR(o, max_lr=0.2, total_steps=60,
                                                        three_phase=True, div_factor=10.0,
                                                        final_div_factor=100.0), 59),
    "one_cycle_no_momentum": (lambda m, o: m.OneCycleLR(o, max_lr=0.1, total_steps=30,
                                                        cycle_momentum=False), 29),
}


@pytest.mark.parametrize("optimizer,options", [("SGD", dict(lr=0.1, momentum=0.9)),
                                               ("AdamW", dict(lr=0.1))])
@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_scheduler_sequence_matches_torch(ctx, rng, kind, optimizer, options):
    make, steps = SCHEDULERS[kind]
    _scheduler_pair(ctx, rng, optimizer, options, make, steps)


def test_scheduler_state_dict_round_trip(ctx, rng):
    ours, _ = _pair(ctx, _weights(rng, [(3,)]))
    opt = optim.SGD(ours, lr=0.1, momentum=0.9)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=40)
    for _ in range(10):
        sched.step()
    saved_sched, saved_opt = sched.state_dict(), opt.state_dict()
    assert "optimizer" not in saved_sched
    expected = []
    for _ in range(10):
        sched.step()
        expected.append(sched.get_last_lr())
    opt2 = optim.SGD(ours, lr=0.1, momentum=0.9)
    opt2.load_state_dict(saved_opt)
    sched2 = lr_scheduler.OneCycleLR(opt2, max_lr=0.1, total_steps=40)
    sched2.load_state_dict(saved_sched)
    got = []
    for _ in range(10):
        sched2.step()
        got.append(sched2.get_last_lr())
    assert got == expected


def test_scheduler_drives_the_update(ctx, rng):
    """OneCycleLR changing lr and betas[0] every step: Adam's weights follow torch's."""
    ours, theirs = _pair(ctx, _weights(rng))
    mine, reference = optim.Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    a = lr_scheduler.OneCycleLR(mine, max_lr=0.05, total_steps=10)
    b = torch.optim.lr_scheduler.OneCycleLR(reference, max_lr=0.05, total_steps=10)
    for _ in range(8):
        _set_grads(ctx, rng, ours, theirs)
        mine.step()
        reference.step()
        a.step()
        b.step()
    _compare(ours, theirs)


# ---- clip_grad_norm_ ------------------------------------------------------------------------

@pytest.mark.parametrize("norm_type", [2.0, 1, math.inf, "inf", 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(ctx, rng, norm_type, max_norm):
    ours, theirs = _pair(ctx, _weights(rng))
    _set_grads(ctx, rng, ours, theirs, skip=(4,))
    total = dp.nn.utils.clip_grad_norm_(ours, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert isinstance(total, dp.Tensor) and total.shape == ()
    assert math.isclose(float(total.numpy()), expected.item(), rel_tol=1e-5)
    for p, t in zip(ours, theirs):
        if t.grad is None:
            assert p.grad is None
        else:
            assert_close(p.grad.numpy(), t.grad.numpy().astype(np.float64))


def test_clip_grad_norm_single_tensor_and_no_grads(ctx, rng):
    ours, theirs = _pair(ctx, _weights(rng, [(40,)]))
    assert float(dp.nn.utils.clip_grad_norm_(ours, 1.0).numpy()) == 0.0
    _set_grads(ctx, rng, ours, theirs)
    total = dp.nn.utils.clip_grad_norm_(ours[0], 0.1)
    expected = torch.nn.utils.clip_grad_norm_(theirs[0], 0.1)
    assert math.isclose(float(total.numpy()), expected.item(), rel_tol=1e-5)
    assert_close(ours[0].grad.numpy(), theirs[0].grad.numpy().astype(np.float64))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_nonfinite(ctx, rng, bad, norm_type):
    ours, theirs = _pair(ctx, _weights(rng))
    _set_grads(ctx, rng, ours, theirs)
    g = ours[3].grad.numpy()
    g[7] = bad
    ours[3].grad = dp.Tensor.from_numpy(ctx, g)
    theirs[3].grad = torch.tensor(g)
    with pytest.raises(dp.NumericsError, match="non-finite"):
        dp.nn.utils.clip_grad_norm_(ours, 1.0, norm_type, error_if_nonfinite=True)
    with pytest.raises(RuntimeError):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type, error_if_nonfinite=True)
    total = dp.nn.utils.clip_grad_norm_(ours, 1.0, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    value = float(total.numpy())
    assert (math.isnan(value) and math.isnan(expected.item())) or value == expected.item()
    for p, t in zip(ours, theirs):
        np.testing.assert_array_equal(np.isnan(p.grad.numpy()), np.isnan(t.grad.numpy()))
        np.testing.assert_allclose(np.nan_to_num(p.grad.numpy()), np.nan_to_num(t.grad.numpy()),
                                   rtol=1e-5, atol=1e-7)


# ---- bad input ------------------------------------------------------------------------------

def test_bad_options_raise_library_errors(ctx, rng):
    ours, _ = _pair(ctx, _weights(rng, [(3,)]))
    cases = [
        (lambda: optim.SGD(ours, lr=-0.1), "learning rate"),
        (lambda: optim.SGD(ours, lr=0.1, momentum=-1), "momentum"),
        (lambda: optim.SGD(ours, lr=0.1, weight_decay=-1), "weight_decay"),
        (lambda: optim.SGD(ours, lr=0.1, nesterov=True), "Nesterov"),
        (lambda: optim.Adam(ours, lr=-1.0), "learning rate"),
        (lambda: optim.Adam(ours, betas=(1.0, 0.999)), "beta parameter at index 0"),
        (lambda: optim.Adam(ours, betas=(0.9, -0.1)), "beta parameter at index 1"),
        (lambda: optim.AdamW(ours, eps=-1e-8), "epsilon"),
        (lambda: optim.Adam(ours, betas=0.9), "betas"),
        (lambda: optim.Adam([]), "empty parameter list"),
        (lambda: optim.Adam(ours + ours), "more than once"),
        (lambda: optim.Adam([{"params": ours}, {"params": ours}]), "more than one parameter group"),
    ]
    for make, match in cases:
        with pytest.raises(dp.ShapeError, match=match):
            make()
        with pytest.raises(ValueError):  # torch's exception type too
            make()
    with pytest.raises(dp.DTypeError, match="numpy"):
        optim.SGD([np.zeros(3, np.float32)], lr=0.1)
    with pytest.raises(dp.DTypeError, match="single Tensor"):
        optim.SGD(ours[0], lr=0.1)
    with pytest.raises(dp.DTypeError):
        optim.SGD(5, lr=0.1)
    with pytest.raises(dp.ShapeError, match="non-leaf"):
        optim.SGD([ours[0] * 2.0], lr=0.1)
    with pytest.raises(dp.DTypeError):
        lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), 3)
    opt = optim.SGD(ours, lr=0.1)
    opt.param_groups[0]["lr"] = -1.0
    ours[0].grad = dp.Tensor.zeros(ctx, (3,))
    with pytest.raises(dp.ShapeError, match="learning rate"):
        opt.step()
    opt.param_groups[0]["lr"] = 0.1
    ours[0].grad = dp.Tensor.zeros(ctx, (4,))
    with pytest.raises(dp.ShapeError, match="shape"):
        opt.step()
    with pytest.raises(dp.ShapeError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(dp.ShapeError):
        dp.nn.utils.clip_grad_norm_(ours, 1.0, norm_type=-1)


def test_parameter_on_another_context_is_refused(ctx, rng):
    other = dp.Context()
    a = dp.Tensor.from_numpy(ctx, np.ones(3, np.float32), requires_grad=True)
    b = dp.Tensor.from_numpy(other, np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(dp.DeviceError, match="another context"):
        optim.Adam([a, b])
    opt = optim.SGD([a], lr=0.1)
    with pytest.raises(dp.DeviceError, match="another context"):
        opt.add_param_group({"params": [b]})
    a.grad = dp.Tensor.zeros(other, (3,))
    with pytest.raises(dp.DeviceError, match="another context"):
        opt.step()
    a.grad = dp.Tensor.zeros(ctx, (3,))
    b.grad = dp.Tensor.zeros(other, (3,))
    with pytest.raises(dp.DeviceError, match="more than one context"):
        dp.nn.utils.clip_grad_norm_([a, b], 1.0)


def test_optim_bench_suite_checks_and_times_both_sides(ctx):
    from dlprim_py.bench import EXTRA_SUITES
    from dlprim_py.bench import optim as optim_suite
    from dlprim_py.bench.harness import Bench, Measurement, measure
    from dlprim_py.bench.torch_baseline import make
    assert "optim" in EXTRA_SUITES
    baseline, reference, _ = make(ctx)
    bench = Bench(ctx, quick=True, batch=1, torch=baseline,
                  measurement=Measurement(warmup=1, repeat=3, min_repeat=2, budget_s=0.05))
    bench.reference = reference
    specs = optim_suite.cases(bench)
    assert [s.name for s in specs] == ["sgd momentum step", "adamw step"]
    for spec in specs:
        row = measure(bench, spec)
        assert row.ok, f"{spec.name}: {row.status}"
        assert row.error <= row.tolerance and row.median_ms > 0
        assert row.torch_median_ms is not None
    assert len(optim_suite.resnet18_shapes()) == 62
    assert sum(math.prod(s) for s in optim_suite.resnet18_shapes()) == 11689512


@pytest.mark.parametrize("name,options", [("SGD", dict(lr=0.1, momentum=0.9)),
                                          ("Adam", dict(lr=0.01, amsgrad=True)),
                                          ("AdamW", dict(lr=0.01))])
def test_views_at_offsets_and_empty_parameters(ctx, rng, name, options):
    """Parameters and gradients that are views into shared buffers at element offsets, and
    an empty parameter (state, no launch slot), as torch."""
    weights = _weights(rng)
    flat = np.concatenate([np.zeros(3, np.float32)] + [w.ravel() for w in weights])
    flat_grad = np.zeros(flat.size + 5, np.float32)
    store = dp.Tensor.from_numpy(ctx, flat)
    ours, offset = [], 3
    for w in weights:
        ours.append(dp.Tensor(ctx, store.buffer, w.shape, offset=offset * 4, requires_grad=True))
        offset += w.size
    ours.append(dp.Tensor.from_numpy(ctx, np.zeros((0, 3), np.float32), requires_grad=True))
    theirs = [torch.tensor(w, requires_grad=True) for w in weights]
    theirs.append(torch.zeros((0, 3), requires_grad=True))
    mine = getattr(optim, name)(ours, **options)
    reference = getattr(torch.optim, name)(theirs, **options)
    for _ in range(3):
        grads = [rng.uniform(-1, 1, w.shape).astype(np.float32) for w in weights]
        offset = 5
        for g in grads:
            flat_grad[offset:offset + g.size] = g.ravel()
            offset += g.size
        grad_store = dp.Tensor.from_numpy(ctx, flat_grad)
        offset = 5
        for p, t, g in zip(ours, theirs, grads):
            p.grad = dp.Tensor(ctx, grad_store.buffer, g.shape, offset=offset * 4)
            t.grad = torch.tensor(g)
            offset += g.size
        ours[-1].grad = dp.Tensor.zeros(ctx, (0, 3))
        theirs[-1].grad = torch.zeros((0, 3))
        mine.step()
        reference.step()
    _compare(ours[:-1], theirs[:-1])
    np.testing.assert_array_equal(store.numpy()[:3], 0)
    if name != "SGD":
        assert mine.state[ours[-1]]["step"] == 3.0
        assert mine.state_dict()["state"][len(weights)]["exp_avg"].shape == (0, 3)


@pytest.mark.parametrize("slots", [1, 3])
def test_other_slot_counts_and_long_indices(ctx, rng, monkeypatch, slots):
    """A device with room for fewer slots per launch, and 64-bit counts and offsets."""
    from dlprim_py.optim import fused
    monkeypatch.setattr(fused, "slot_count", lambda ctx, *a, **k: slots)
    monkeypatch.setattr(fused, "index_type", lambda tensors: ("long", np.int64))
    for name, options in [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                          ("AdamW", dict(lr=0.01, amsgrad=True))]:
        ours, theirs = _pair(ctx, _weights(rng))
        mine = getattr(optim, name)(ours, **options)
        reference = getattr(torch.optim, name)(theirs, **options)
        for _ in range(3):
            _set_grads(ctx, rng, ours, theirs, skip=(1,))
            mine.step()
            reference.step()
        _compare(ours, theirs)
    total = dp.nn.utils.clip_grad_norm_(ours, 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert math.isclose(float(total.numpy()), expected.item(), rel_tol=1e-5)
    for p, t in zip(ours, theirs):
        if t.grad is not None:
            assert_close(p.grad.numpy(), t.grad.numpy().astype(np.float64))


def test_repeated_step_sets_only_what_changed(ctx, rng, monkeypatch):
    """Two groups, each with kernel objects of its own: a step on the same gradients with the
    same options sets no kernel argument; a new lr sets that argument alone, once per launch."""
    from dlprim_py import launch
    ours, theirs = _pair(ctx, _weights(rng))
    opt = optim.SGD([{"params": ours[:9]}, {"params": ours[9:], "lr": 0.5}], lr=0.1,
                    momentum=0.9)
    _set_grads(ctx, rng, ours, theirs)
    opt.step()
    opt.step()   # the first-step mask changes once
    calls = []
    real = launch.set_argument
    monkeypatch.setattr(launch, "set_argument", lambda kernel, index, value: (
        calls.append(index), real(kernel, index, value)))
    opt.step()
    assert calls == []
    opt.param_groups[0]["lr"] = 0.05
    opt.step()
    slots = optim.fused.slot_count(ctx, optim.fused.slot_bytes(3, 0, 4))
    assert calls == [0] * math.ceil(9 / slots)   # lr is argument 0 of each of group 0's launches
    ctx.synchronize()


def test_adam_step_sets_its_bias_corrections_once_per_launch(ctx, rng, monkeypatch):
    """Parameters at one step count share one pair of bias-correction arguments per launch;
    a parameter skipped once (another count) moves its launch to per-slot corrections."""
    from dlprim_py import launch
    ours, theirs = _pair(ctx, _weights(rng))
    opt, reference = optim.Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    _set_grads(ctx, rng, ours, theirs)
    opt.step()
    reference.step()
    calls = []
    real = launch.set_argument
    monkeypatch.setattr(launch, "set_argument", lambda kernel, index, value: (
        calls.append(index), real(kernel, index, value)))
    opt.step()
    reference.step()
    slots = optim.fused.slot_count(ctx, optim.fused.slot_bytes(4, 2, 4))
    assert calls == [6, 7] * math.ceil(len(SHAPES) / slots)
    monkeypatch.setattr(launch, "set_argument", real)
    for skip in [(1,), ()]:
        _set_grads(ctx, rng, ours, theirs, skip=skip)
        opt.step()
        reference.step()
    _compare(ours, theirs)


@pytest.mark.parametrize("setup", ["sgd_step_lr", "adamw_one_cycle_clip"])
def test_training_loop_follows_torch(ctx, rng, setup):
    """A two-layer classifier trained 30 steps with dp.functional, an optimizer, a scheduler
    and clipping: losses and weights stay within float32 drift of torch's run."""
    import torch.nn.functional as TF
    F = dp.functional
    shapes = [(32, 10), (32,), (4, 32), (4,)]
    weights = [rng.uniform(-0.3, 0.3, s).astype(np.float32) for s in shapes]
    x = rng.standard_normal((64, 10)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
    ours, theirs = _pair(ctx, weights)
    xd, yd = dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, y)
    xt, yt = torch.tensor(x), torch.tensor(y)
    if setup == "sgd_step_lr":
        mine = optim.SGD(ours, lr=0.2, momentum=0.9, weight_decay=1e-3)
        reference = torch.optim.SGD(theirs, lr=0.2, momentum=0.9, weight_decay=1e-3)
        sched = lr_scheduler.StepLR(mine, 10, 0.5)
        ref_sched = torch.optim.lr_scheduler.StepLR(reference, 10, 0.5)
        clip = None
    else:
        mine = optim.AdamW(ours, lr=0.01)
        reference = torch.optim.AdamW(theirs, lr=0.01)
        sched = lr_scheduler.OneCycleLR(mine, max_lr=0.05, total_steps=30)
        ref_sched = torch.optim.lr_scheduler.OneCycleLR(reference, max_lr=0.05, total_steps=30)
        clip = 0.5
    for step in range(30):
        mine.zero_grad()
        reference.zero_grad()
        w1, b1, w2, b2 = ours
        loss = F.cross_entropy(F.linear(F.relu(F.linear(xd, w1, b1)), w2, b2), yd)
        loss.backward()
        t1, c1, t2, c2 = theirs
        ref_loss = TF.cross_entropy(TF.linear(TF.relu(TF.linear(xt, t1, c1)), t2, c2), yt)
        ref_loss.backward()
        assert math.isclose(float(loss.numpy()), ref_loss.item(), rel_tol=1e-4), step
        if clip is not None:
            total = dp.nn.utils.clip_grad_norm_(ours, clip)
            ref_total = torch.nn.utils.clip_grad_norm_(theirs, clip)
            assert math.isclose(float(total.numpy()), ref_total.item(), rel_tol=1e-4), step
        mine.step()
        reference.step()
        sched.step()
        ref_sched.step()
    for p, t in zip(ours, theirs):
        assert_close(p.numpy(), t.detach().numpy().astype(np.float64), tol=1e-4)
    assert float(loss.numpy()) < 0.5 * math.log(4)


def test_scheduler_epoch_argument_and_limits(ctx, rng):
    """step(epoch) takes the closed form (with torch's deprecation warning); OneCycleLR past
    its total steps raises a ValueError as torch does."""
    ours, theirs = _pair(ctx, _weights(rng, [(3,)]))
    mine, reference = optim.SGD(ours, lr=0.1), torch.optim.SGD(theirs, lr=0.1)
    for make in (lambda m, o: m.StepLR(o, 3, 0.5), lambda m, o: m.CosineAnnealingLR(o, 7, 0.01)):
        a, b = make(lr_scheduler, mine), make(torch.optim.lr_scheduler, reference)
        for epoch in (4, 9, 2, 20):
            with pytest.warns(UserWarning):
                a.step(epoch)
            with pytest.warns(UserWarning):
                b.step(epoch)
            assert a.get_last_lr() == pytest.approx(b.get_last_lr(), rel=1e-12)
    opt = optim.SGD(ours, lr=0.1, momentum=0.9)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=3)
    for _ in range(2):
        sched.step()
    sched.step()   # the last step lands on total_steps
    with pytest.raises(dp.ShapeError, match="total steps"):
        sched.step()
    with pytest.raises(dp.ShapeError, match="total_steps"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(dp.ShapeError, match="anneal_strategy"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=5, anneal_strategy="exp")
    with pytest.raises(dp.ShapeError, match="momentum or betas"):
        class Plain(optim.Optimizer):
            pass
        lr_scheduler.OneCycleLR(Plain(ours, dict(lr=0.1)), max_lr=0.1, total_steps=5)


def test_clip_grad_value_matches_torch(ctx, rng):
    ours, theirs = _pair(ctx, _weights(rng))
    _set_grads(ctx, rng, ours, theirs, skip=(2,))
    g = ours[0].grad.numpy()
    g[0, 0] = np.nan
    ours[0].grad = dp.Tensor.from_numpy(ctx, g)
    theirs[0].grad = torch.tensor(g)
    assert dp.nn.utils.clip_grad_value_(ours, 0.3) is None
    torch.nn.utils.clip_grad_value_(theirs, 0.3)
    for p, t in zip(ours, theirs):
        if t.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())
    with pytest.raises(dp.ShapeError, match="clip_value"):
        dp.nn.utils.clip_grad_value_(ours, "big")
    before = _counts()
    dp.nn.utils.clip_grad_value_(ours, 0.2)
    ctx.synchronize()
    assert _counts() == before
