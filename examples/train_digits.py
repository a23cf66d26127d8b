"""Train a small convolutional network on scikit-learn's bundled 8x8 digits images with dp.nn and
dp.optim: no download, a few minutes on a CPU through PoCL, about 98% test accuracy.

    pip install ".[pocl,examples]"
    python examples/train_digits.py [--epochs 15] [--plot loss.png] [--device GPU]

It prints a progress line per epoch (one updating line on a terminal), the test accuracy at the
end, and with --plot draws the loss curve (matplotlib, the "plot" extra).
"""
import argparse
import sys
import time

import numpy as np

import dlprim_py as dp
from dlprim_py import nn


def load_digits(seed, test_fraction=0.2):
    """(train images, train labels, test images, test labels): float32 (N, 1, 8, 8) scaled to
    [0, 1] and int64 labels, split at random with ``seed``."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install \".[examples]\"") from None
    data = sklearn_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    test = int(len(labels) * test_fraction)
    return images[order[test:]], labels[order[test:]], images[order[:test]], labels[order[:test]]


class DigitsNet(nn.Module):
    """Three 3x3 convolutions with batch norm and ReLU, a max pool, global average pooling and a
    linear classifier: about 24k parameters."""

    def __init__(self, ctx=None):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False, ctx=ctx), nn.BatchNorm2d(16, ctx=ctx),
            nn.ReLU(ctx=ctx),
            nn.Conv2d(16, 32, 3, padding=1, bias=False, ctx=ctx), nn.BatchNorm2d(32, ctx=ctx),
            nn.ReLU(ctx=ctx), nn.MaxPool2d(2, ctx=ctx),
            nn.Conv2d(32, 64, 3, padding=1, bias=False, ctx=ctx), nn.BatchNorm2d(64, ctx=ctx),
            nn.ReLU(ctx=ctx), nn.AdaptiveAvgPool2d(1, ctx=ctx), nn.Flatten(ctx=ctx))
        self.classifier = nn.Linear(64, 10, ctx=ctx)

    def forward(self, x):
        return self.classifier(self.features(x))


def evaluate(model, ctx, images, labels, batch_size=256):
    """Accuracy of ``model`` (put in eval mode) over ``images``."""
    model.eval()
    correct = 0
    with dp.no_grad():
        for start in range(0, len(labels), batch_size):
            x = dp.Tensor.from_numpy(ctx, images[start:start + batch_size])
            logits = model(x).numpy()
            correct += int((logits.argmax(axis=1) == labels[start:start + batch_size]).sum())
    return correct / len(labels)


class Progress:
    """One updating line on a terminal, plain lines otherwise (a log file gets no carriage
    returns)."""

    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.tty = stream.isatty()

    def update(self, text, done=False):
        if self.tty:
            self.stream.write("\r" + text.ljust(78) + ("\n" if done else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def bar(fraction, width=20):
    filled = int(round(fraction * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def train(epochs=15, batch_size=64, lr=3e-3, weight_decay=1e-4, seed=0, device=None,
          max_steps=None, log=None):
    """Train DigitsNet with AdamW and a one-cycle schedule; returns (model, test accuracy, loss
    per step). ``max_steps`` stops early (tests); ``log``: a Progress or None for silence."""
    ctx = dp.Context(device) if device is not None else dp.default_context()
    dp.manual_seed(seed)
    train_x, train_y, test_x, test_y = load_digits(seed)
    model = DigitsNet(ctx=ctx)
    optimizer = dp.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = -(-len(train_y) // batch_size)
    total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    schedule = dp.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total)
    criterion = nn.CrossEntropyLoss(ctx=ctx)
    rng = np.random.default_rng(seed)
    losses, step, started = [], 0, time.perf_counter()
    for epoch in range(epochs):
        model.train()
        order = rng.permutation(len(train_y))
        for start in range(0, len(order), batch_size):
            if step == total:
                break
            index = order[start:start + batch_size]
            x = dp.Tensor.from_numpy(ctx, train_x[index])
            y = dp.Tensor.from_numpy(ctx, train_y[index])
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss)   # read back once per epoch, not per step
            step += 1
        losses[-steps_per_epoch:] = [float(v.item()) if isinstance(v, dp.Tensor) else v
                                     for v in losses[-steps_per_epoch:]]
        if log is not None:
            recent = np.mean(losses[-steps_per_epoch:])
            log.update(f"epoch {epoch + 1:3d}/{epochs} {bar((epoch + 1) / epochs)} loss "
                       f"{recent:.4f}  {time.perf_counter() - started:6.1f} s",
                       done=epoch + 1 == epochs or step == total)
        if step == total:
            break
    losses = [float(v.item()) if isinstance(v, dp.Tensor) else v for v in losses]
    return model, evaluate(model, ctx, test_x, test_y), losses


def plot(losses, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install \".[plot]\"", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(losses) + 1), losses, linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.set_title("DigitsNet on scikit-learn digits (dlprim_py)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description="Train a small CNN on scikit-learn's digits.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (one-cycle)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="OpenCL device: P:D or part of its name")
    parser.add_argument("--plot", metavar="PNG", default=None, help="draw the loss curve here")
    args = parser.parse_args(argv)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (checked before training, not after it)
        except ImportError:
            parser.error("--plot needs matplotlib: pip install \".[plot]\"")
    model, accuracy, losses = train(args.epochs, args.batch_size, args.lr, seed=args.seed,
                                    device=args.device, log=Progress())
    print(f"test accuracy {100 * accuracy:.2f}% after {len(losses)} steps")
    if args.plot is not None and plot(losses, args.plot):
        print(f"loss curve: {args.plot}")
    return 0 if accuracy >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
