"""A plain-text progress bar on stderr (no dependency): one line, redrawn in place on a
terminal, one line per step otherwise (logs and CI keep every step)."""
import sys
import time


class Progress:
    """``Progress(total)``; ``step(label)`` before each item; ``close()`` at the end."""

    def __init__(self, total, stream=None, width=28, enabled=True):
        self.total = max(1, int(total))
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.enabled = enabled
        self.done = 0
        self.started = time.perf_counter()
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self, label):
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.started
        return f"[{bar}] {self.done}/{self.total} {elapsed:6.1f}s {label}"

    def step(self, label=""):
        """Report that item ``done + 1`` (``label``) starts."""
        if not self.enabled:
            self.done += 1
            return
        text = self.line(label)
        if self.interactive:
            self.stream.write("\r" + text[:120].ljust(120))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.done += 1

    def close(self):
        if not self.enabled:
            return
        self.done = min(self.done, self.total)
        text = self.line("done")
        self.stream.write(("\r" + text.ljust(120) + "\n") if self.interactive else text + "\n")
        self.stream.flush()
