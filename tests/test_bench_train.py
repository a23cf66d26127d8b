"""The train suite's step pair (dlprim_py/bench/train.py): our dp.models + dp.optim step and
PyTorch's from one state dict agree after a step, and the suite lists every net and optimizer."""
import types

import pytest

from dlprim_py.bench import train


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_one_step_agrees_with_torch(ctx, optimizer):
    pair = train.TrainPair(ctx, "resnet18", optimizer, batch=2, image_size=64,
                           torch_device="cpu")
    before = pair.model.fc.weight.numpy().copy()
    errors = pair.check()
    assert set(errors) == {"loss", "conv1.weight", "fc.weight"}
    assert all(e <= 1.0 for e in errors.values()), errors
    assert (pair.model.fc.weight.numpy() != before).any(), "the step changed nothing"


def test_suite_lists_nets_and_optimizers(ctx):
    torch_side = types.SimpleNamespace(device="cpu")
    bench = types.SimpleNamespace(ctx=ctx, quick=True, batch=None, nets=["resnet50", "vgg16"],
                                  reference=types.SimpleNamespace(torch=object()),
                                  torch=torch_side)
    names = [spec.name for spec in train.cases(bench)]
    assert names == ["resnet50 sgd n2 64x64", "resnet50 adamw n2 64x64"]
    bench.nets = ["vgg16"]   # none of the suite's: all three
    assert len(train.cases(bench)) == 6
    bench.torch = None
    with pytest.raises(Exception, match="torch"):
        train.cases(bench)
