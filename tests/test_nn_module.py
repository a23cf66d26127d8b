"""dp.nn.Module's bookkeeping, as torch.nn.Module's: registration by attribute assignment,
traversal order and names, train/eval, zero_grad, Parameter, and state dicts: keys in torch's
order, round trips, loading torch modules' state dicts (torch tensors) and dp.Tensors, and the
errors for missing, unexpected and mis-shaped keys (nothing is copied when one is raised)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlprim_py as dp  # noqa: E402
from dlprim_py import nn  # noqa: E402


class Block(nn.Module):
    def __init__(self, lib, **kw):
        super().__init__()
        self.conv = lib.Conv2d(3, 4, 3, bias=False, **kw)
        self.bn = lib.BatchNorm2d(4, **kw)
        self.act = lib.ReLU()
        self.head = lib.Sequential(lib.Flatten(), lib.Linear(4, 2, **kw))


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.act = torch.nn.ReLU()
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))


def test_registration_and_traversal_follow_torch(ctx):
    ours, theirs = Block(nn, ctx=ctx), TorchBlock()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert len(list(ours.children())) == 4 and len(list(ours.modules())) == 7
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in ours.parameters())
    assert len(list(ours.buffers())) == 3
    assert [n for n, _ in ours.named_parameters(recurse=False)] == []
    assert ours.head[1] is ours.head._modules["1"]


def test_attribute_assignment_rules(ctx):
    m = nn.Module()
    m.w = nn.Parameter(dp.Tensor.zeros(ctx, (3,)))
    m.sub = nn.Linear(2, 2, ctx=ctx)
    m.register_buffer("stat", dp.Tensor.zeros(ctx, (2,)))
    m.register_buffer("scratch", dp.Tensor.zeros(ctx, (2,)), persistent=False)
    m.plain = 5
    assert list(m._parameters) == ["w"] and list(m._modules) == ["sub"]
    assert list(m.state_dict()) == ["w", "stat", "sub.weight", "sub.bias"]
    assert {n for n, _ in m.named_buffers()} == {"stat", "scratch"}
    with pytest.raises(dp.DTypeError, match="Parameter or None expected"):
        m.w = dp.Tensor.zeros(ctx, (3,))
    with pytest.raises(dp.DTypeError, match="Tensor or None expected"):
        m.stat = np.zeros(2, np.float32)
    m.w = None
    assert "w" not in m.state_dict() and m.w is None
    m.stat = dp.Tensor.full(ctx, (2,), 3.0)
    np.testing.assert_array_equal(m.state_dict()["stat"], 3.0)
    # A module replacing a parameter of the same name moves it.
    m.w = nn.Identity()
    assert "w" in m._modules and "w" not in m._parameters
    del m.sub
    assert not hasattr(m, "sub")
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        m.missing

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(dp.Tensor.zeros(ctx, (1,)))
    with pytest.raises(AttributeError, match="Module.__init__"):
        Early()


def test_apply_and_get_submodule(ctx):
    m = Block(nn, ctx=ctx)
    seen = []
    assert m.apply(lambda x: seen.append(type(x).__name__)) is m
    assert seen == ["Conv2d", "BatchNorm2d", "ReLU", "Flatten", "Linear", "Sequential", "Block"]
    m.apply(lambda x: nn.init.zeros_(x.weight) if isinstance(x, nn.Linear) else None)
    assert not m.head[1].weight.numpy().any()
    assert m.get_submodule("head.1") is m.head[1] and m.get_submodule("") is m
    with pytest.raises(AttributeError, match="no submodule 'x'"):
        m.get_submodule("head.x")


def test_shared_modules_and_parameters_are_listed_once(ctx):
    shared = nn.Linear(3, 3, ctx=ctx)
    seq = nn.Sequential(shared, nn.ReLU(), shared)
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.modules())) == 3
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_parameter_shares_memory_and_is_a_leaf(ctx):
    t = dp.Tensor.from_numpy(ctx, np.arange(4, dtype=np.float32))
    p = nn.Parameter(t)
    assert isinstance(p, dp.Tensor) and p.requires_grad and p.is_leaf
    assert p.buffer is t.buffer and p.shape == (4,)
    assert not nn.Parameter(t, requires_grad=False).requires_grad
    assert repr(p).startswith("Parameter containing:")
    y = (p * 2.0).sum()
    assert type(y) is dp.Tensor
    y.backward()
    np.testing.assert_array_equal(p.grad.numpy(), 2.0)
    with pytest.raises(dp.DTypeError, match="Parameter needs"):
        nn.Parameter(np.zeros(3, np.float32))


def test_train_eval_and_zero_grad(ctx, rng):
    m = Block(nn, ctx=ctx)
    assert all(x.training for x in m.modules())
    assert m.eval() is m and not any(x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    m.head.train(False)
    assert m.training and not m.head[1].training
    with pytest.raises(dp.DTypeError):
        m.train("yes")
    m.train()
    x = dp.Tensor.from_numpy(ctx, rng.standard_normal((2, 3, 3, 3)).astype(np.float32))
    m.head(m.act(m.bn(m.conv(x)))).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())


def test_nn_functional_is_the_functional_module():
    import dlprim_py.nn.functional as NF
    assert NF is dp.functional and nn.functional is dp.functional


def test_default_context_when_no_ctx_is_given():
    m = nn.Linear(2, 3)
    assert m.weight.ctx is dp.default_context()
    y = m(dp.Tensor.from_numpy(np.ones((1, 2), np.float32)))
    assert y.shape == (1, 3)
    with pytest.raises(dp.DeviceError):
        nn.Linear(2, 3, ctx="cpu")


def test_to_moves_parameters_and_buffers_to_another_context(ctx, rng):
    m = Block(nn)   # the default context
    assert m.conv.weight.ctx is not ctx
    weight, state = m.conv.weight, m.state_dict()
    assert m.to(ctx) is m
    assert m.conv.weight is weight and weight.ctx is ctx
    assert all(t.ctx is ctx for t in [*m.parameters(), *m.buffers()])
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, state[k])
    x = dp.Tensor.from_numpy(ctx, rng.standard_normal((2, 3, 3, 3)).astype(np.float32))
    m.head(m.act(m.bn(m.conv(x)))).sum().backward()
    assert m.state_dict()["bn.num_batches_tracked"] == 1 and weight.grad.ctx is ctx


# ---- state dicts ----------------------------------------------------------------------------

def test_state_dict_round_trip_and_sources(ctx, rng):
    a, b = Block(nn, ctx=ctx), Block(nn, ctx=ctx)
    state = a.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    assert state["bn.num_batches_tracked"].dtype == np.int64
    assert state["bn.num_batches_tracked"].shape == ()
    b.load_state_dict(state)
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, state[k])
    # dp.Tensors (keep_vars gives the module's own), torch tensors of any float dtype.
    c = Block(nn, ctx=ctx)
    c.load_state_dict(a.state_dict(keep_vars=True))
    assert a.state_dict(keep_vars=True)["conv.weight"] is a.conv.weight
    np.testing.assert_array_equal(c.conv.weight.numpy(), a.conv.weight.numpy())
    theirs = TorchBlock().double()
    theirs.bn.num_batches_tracked.fill_(4)
    result = c.load_state_dict(theirs.state_dict())
    assert result == ([], [])
    for k, v in theirs.state_dict().items():
        np.testing.assert_allclose(c.state_dict()[k], v.numpy(), rtol=1e-6)
    assert c.state_dict()["bn.num_batches_tracked"] == 4
    # And back into torch, strictly.
    TorchBlock().load_state_dict({k: torch.from_numpy(v) for k, v in c.state_dict().items()})
    # Loading copies: the loaded module does not share the source's memory.
    b.load_state_dict(a.state_dict(keep_vars=True))
    a.conv.weight.fill_(0.0)
    assert b.conv.weight.numpy().any()


def test_loaded_torch_module_computes_the_same(ctx, rng):
    theirs = TorchBlock().double().eval()
    ours = Block(nn, ctx=ctx).eval()
    with torch.no_grad():
        theirs.bn.running_mean.uniform_(-1, 1)
        theirs.bn.running_var.uniform_(0.5, 2)
    ours.load_state_dict(theirs.state_dict())
    x = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    y = ours.head(ours.act(ours.bn(ours.conv(dp.Tensor.from_numpy(ctx, x))))).numpy()
    with torch.no_grad():
        expected = theirs.head(theirs.act(theirs.bn(theirs.conv(torch.from_numpy(x).double()))))
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_load_state_dict_names_missing_unexpected_and_misshaped_keys(ctx):
    m = Block(nn, ctx=ctx)
    good = m.state_dict()
    bad = dict(good)
    del bad["bn.running_var"]
    del bad["head.1.bias"]
    bad["bn.extra"] = np.zeros(1, np.float32)
    bad["conv.weight"] = np.zeros((4, 3, 5, 5), np.float32)
    before = {k: v.copy() for k, v in good.items()}
    with pytest.raises(nn.StateDictError) as info:
        m.load_state_dict(bad)
    message = str(info.value)
    assert "missing key(s): bn.running_var, head.1.bias" in message
    assert "unexpected key(s): bn.extra" in message
    assert "conv.weight: the state dict has shape (4, 3, 5, 5), the module (4, 3, 3, 3)" in message
    assert isinstance(info.value, dp.DlprimError) and isinstance(info.value, RuntimeError)
    # Nothing was copied.
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    # strict=False tolerates missing and unexpected keys, not shapes.
    with pytest.raises(nn.StateDictError, match="size mismatch for conv.weight"):
        m.load_state_dict(bad, strict=False)
    bad["conv.weight"] = good["conv.weight"] + 1
    result = m.load_state_dict(bad, strict=False)
    assert result.missing_keys == ["bn.running_var", "head.1.bias"]
    assert result.unexpected_keys == ["bn.extra"]
    np.testing.assert_array_equal(m.conv.weight.numpy(), good["conv.weight"] + 1)
    # A batch counter may be absent (older checkpoints), as torch allows; it keeps its value.
    m.bn.num_batches_tracked.fill_(3)
    old = {k: v for k, v in good.items() if k != "bn.num_batches_tracked"}
    assert m.load_state_dict(old) == ([], [])
    assert m.state_dict()["bn.num_batches_tracked"] == 3
    with pytest.raises(dp.DTypeError, match="'conv.weight' is a list"):
        m.load_state_dict({**good, "conv.weight": [1, 2]})
    with pytest.raises(dp.DTypeError, match="mapping"):
        m.load_state_dict([("conv.weight", good["conv.weight"])])


def test_containers(ctx):
    layers = nn.ModuleList([nn.ReLU(), nn.Tanh()])
    layers.append(nn.Sigmoid())
    layers += [nn.Identity()]
    layers.insert(1, nn.GELU())
    assert [type(x).__name__ for x in layers] == ["ReLU", "GELU", "Tanh", "Sigmoid", "Identity"]
    assert list(layers._modules) == ["0", "1", "2", "3", "4"]
    assert isinstance(layers[-1], nn.Identity) and len(layers[1:3]) == 2
    layers[0] = nn.SiLU()
    assert isinstance(layers[0], nn.SiLU)
    with pytest.raises(dp.ShapeError):
        layers[5]
    from collections import OrderedDict
    seq = nn.Sequential(OrderedDict(first=nn.Linear(2, 3, ctx=ctx), act=nn.ReLU()))
    assert list(seq.state_dict()) == ["first.weight", "first.bias"]
    assert isinstance(seq[-1], nn.ReLU) and isinstance(seq[:1], nn.Sequential)
    seq.append(nn.Linear(3, 1, ctx=ctx))
    assert seq(dp.Tensor.zeros(ctx, (4, 2))).shape == (4, 1)
    assert "(first): Linear(in_features=2, out_features=3, bias=True)" in repr(seq)
    heads = nn.ModuleDict({"a": nn.Linear(2, 2, ctx=ctx)})
    heads.update([("b", nn.Linear(2, 1, ctx=ctx))])
    heads["c"] = nn.ReLU()
    assert list(heads) == ["a", "b", "c"] and "b" in heads and len(heads) == 3
    assert list(heads.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    assert isinstance(heads.pop("c"), nn.ReLU) and list(heads.keys()) == ["a", "b"]
    del heads["a"]
    assert [n for n, _ in heads.named_parameters()] == ["b.weight", "b.bias"]


# ---- gradient clipping --------------------------------------------------------------------------

@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(ctx, rng, norm_type, max_norm):
    shapes = [(3, 4), (5,), (2, 1, 3), (4,)]
    ours = [nn.Parameter(dp.Tensor.zeros(ctx, s)) for s in shapes]
    theirs = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    for p, t in list(zip(ours, theirs))[:-1]:   # the last one has no gradient
        g = rng.standard_normal(p.shape).astype(np.float32)
        p.grad = dp.Tensor.from_numpy(ctx, g)
        t.grad = torch.from_numpy(g).double()
    total = nn.utils.clip_grad_norm_(ours, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert total.shape == ()
    np.testing.assert_allclose(total.item(), expected.item(), rtol=1e-6)
    for p, t in list(zip(ours, theirs))[:-1]:
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-7)
    assert ours[-1].grad is None


def test_clip_grad_value_and_nonfinite_norms(ctx):
    p = nn.Parameter(dp.Tensor.zeros(ctx, (4,)))
    p.grad = dp.Tensor.from_numpy(ctx, np.array([-3.0, -0.5, 0.25, 7.0], np.float32))
    nn.utils.clip_grad_value_(p, 1.0)
    np.testing.assert_array_equal(p.grad.numpy(), [-1.0, -0.5, 0.25, 1.0])
    p.grad = dp.Tensor.from_numpy(ctx, np.array([np.inf, 1.0, 0.0, 0.0], np.float32))
    with pytest.raises(dp.NumericsError, match="non-finite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert nn.utils.clip_grad_norm_([], 1.0).item() == 0.0
