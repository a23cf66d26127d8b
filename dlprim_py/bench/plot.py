"""``--plot FILE.png``: the speed relative to PyTorch per case (needs matplotlib)."""


def missing_matplotlib():
    """None where matplotlib imports, else what to do about it (checked before a suite runs,
    so that --plot does not find out after the measurements)."""
    try:
        import matplotlib  # noqa: F401
    except Exception as e:   # ImportError, or a broken installation
        return (f"--plot needs matplotlib ({type(e).__name__}: {e}); install the plot extra: "
                f"pip install 'dlprim_py[plot]'")
    return None


def plot_ratios(rows, path, title=""):
    """Draw torch time / library time per measured case (1.0 = as fast as PyTorch).

    Returns None on success, else the reason nothing was drawn.
    """
    measured = [r for r in rows if r.ok and r.speedup_vs_torch]
    if not measured:
        return "no case has a PyTorch time to compare with"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"--plot needs matplotlib ({type(e).__name__}: {e})"
    labels = [f"{r.suite}: {r.name}" for r in measured]
    ratios = [r.speedup_vs_torch for r in measured]
    height = max(3.0, 0.22 * len(labels) + 1.0)
    fig, ax = plt.subplots(figsize=(9, height))
    # A ratio whose medians do not rank (their runs spread too widely) is drawn grey.
    colors = ["tab:gray" if r.rankable is False else "tab:green" if x >= 1 else "tab:red"
              for r, x in zip(measured, ratios)]
    ax.barh(range(len(labels)), ratios, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("speed relative to PyTorch (torch time / dlprim_py time; grey: the times "
                  "spread too widely to rank)")
    ax.set_title(title or "dlprim_py vs PyTorch")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
