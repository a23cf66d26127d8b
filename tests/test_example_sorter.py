"""examples/train_sorter.py, shortened: the example's transformer (nn.Embedding,
nn.TransformerEncoder, AdamW, one-cycle schedule) learns to sort (the full run's 400 steps sort
about 99% of sequences; see the example's docstring)."""
import importlib.util
import pathlib

import numpy as np

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train_sorter.py"


def test_short_run_learns():
    spec = importlib.util.spec_from_file_location("train_sorter", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, tokens, sequences, losses = example.train(steps=120, log=False)
    assert len(losses) == 120 and all(np.isfinite(losses))
    assert np.mean(losses[-10:]) < 0.4 * np.mean(losses[:10])
    assert tokens >= 0.6, f"token accuracy {tokens:.3f} after 120 steps"
    assert len(list(model.parameters())) > 10
