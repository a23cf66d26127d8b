"""Train a small transformer encoder to sort sequences of digits with dp.nn and dp.optim: the
data is generated, nothing is downloaded; about a minute on a CPU through PoCL.

    pip install ".[pocl]"
    python examples/train_sorter.py [--steps 400] [--device GPU]

Each input is 10 random digits; the target at position i is the i-th smallest of them. The model
(token and position embeddings, two encoder layers, a linear read-out per position) has to
compare every digit with every other one, which is what attention does. It prints the loss and
the token accuracy on fresh sequences as it goes, and the share of whole sequences sorted right
at the end.
"""
import argparse
import time

import numpy as np

import dlprim_py as dp
from dlprim_py import nn
from dlprim_py import functional as F

LENGTH, DIGITS = 10, 10


class Sorter(nn.Module):
    """Token and learned position embeddings, a TransformerEncoder (pre-norm layers, GELU),
    a linear read-out of the digit at each position: about 27k parameters."""

    def __init__(self, width=32, heads=4, layers=2, ctx=None):
        super().__init__()
        self.tokens = nn.Embedding(DIGITS, width, ctx=ctx)
        self.positions = nn.Embedding(LENGTH, width, ctx=ctx)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True,
                                           ctx=ctx)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(width, ctx=ctx))
        self.readout = nn.Linear(width, DIGITS, ctx=ctx)
        self.register_buffer("steps", dp.Tensor.from_numpy(
            self.tokens.weight.ctx, np.arange(LENGTH, dtype=np.int64)), persistent=False)

    def forward(self, digits):
        x = F.add(self.tokens(digits), self.positions(self.steps))   # (N, L, width)
        return self.readout(self.encoder(x))                          # (N, L, DIGITS)


def batch(rng, size):
    digits = rng.integers(0, DIGITS, (size, LENGTH))
    return digits, np.sort(digits, axis=1)


def accuracy(model, ctx, rng, size=512):
    """(token accuracy, whole-sequence accuracy) on fresh sequences."""
    model.eval()
    digits, target = batch(rng, size)
    with dp.no_grad():
        guess = model(dp.Tensor.from_numpy(ctx, digits)).numpy().argmax(-1)
    model.train()
    return float((guess == target).mean()), float((guess == target).all(axis=1).mean())


def train(steps=400, batch_size=128, lr=3e-3, seed=0, device=None, log=True):
    """Train the Sorter with AdamW and a one-cycle schedule; returns (model, token accuracy,
    sequence accuracy, loss per step)."""
    ctx = dp.Context(device) if device is not None else dp.default_context()
    dp.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = Sorter(ctx=ctx)
    optimizer = dp.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-2)
    schedule = dp.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    losses, started = [], time.perf_counter()
    for step in range(1, steps + 1):
        digits, target = batch(rng, batch_size)
        optimizer.zero_grad()
        logits = model(dp.Tensor.from_numpy(ctx, digits))
        loss = F.cross_entropy(logits.reshape(batch_size * LENGTH, DIGITS),
                               dp.Tensor.from_numpy(ctx, target.reshape(-1)))
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss)     # read back every 50 steps, not every step
        if step % 50 == 0 or step == steps:
            losses = [float(v.item()) if isinstance(v, dp.Tensor) else v for v in losses]
            if log:
                tokens, _ = accuracy(model, ctx, rng)
                print(f"step {step:4d}/{steps}  loss {np.mean(losses[-50:]):.4f}  token "
                      f"accuracy {tokens:.3f}  {time.perf_counter() - started:6.1f} s",
                      flush=True)
    tokens, sequences = accuracy(model, ctx, np.random.default_rng(seed + 1), 2048)
    return model, tokens, sequences, [float(v) for v in losses]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", help="OpenCL device (as DLPRIM_DEVICE), default: the first")
    args = ap.parse_args()
    _, tokens, sequences, _ = train(args.steps, args.batch_size, args.lr, args.seed, args.device)
    print(f"token accuracy {tokens:.3f}, sequences sorted right {sequences:.3f}")


if __name__ == "__main__":
    main()
