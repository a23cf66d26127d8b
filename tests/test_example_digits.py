"""examples/train_digits.py, shortened: the example's model, optimizer and schedule learn the
digits (the full run reaches at least 97% test accuracy; see the example's docstring)."""
import importlib.util
import pathlib

import numpy as np
import pytest

pytest.importorskip("sklearn")

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_run_learns(capsys):
    example = _example()
    model, accuracy, losses = example.train(epochs=3, batch_size=64, lr=3e-3, seed=0,
                                            log=example.Progress())
    out = capsys.readouterr().out
    assert "\r" not in out and out.count("epoch") == 3   # plain lines when not a terminal
    assert len(losses) == 3 * -(-1438 // 64)
    assert all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert accuracy >= 0.85, f"test accuracy {accuracy:.3f} after three epochs"


def test_plot_flag_needs_matplotlib(monkeypatch):
    example = _example()
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--plot", "loss.png", "--epochs", "1"])
    assert exit_info.value.code == 2   # refused before any training
