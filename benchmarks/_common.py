"""What every benchmark prints beside its numbers: the machine's load before and after, and each result's spread.

A timing taken while other processes compete for the cores says little on its own: every benchmark prints the
1-minute load average (``os.getloadavg()``) when it starts and ends, the min / median / max over its repeats, and
marks its verdict ``[loaded]`` when the load was above :data:`LOADED` at either end (then rerun it on a quiet
machine before quoting it). Ratios are taken from interleaved repeats so noise hits both sides alike.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

LOADED = 1.5  # 1-minute load average above which a result is marked as taken on a loaded machine


def load() -> float:
    """The 1-minute load average (NaN where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


class LoadWatch:
    """The load average when a benchmark starts and ends; :meth:`mark` says whether results were taken loaded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.before = load()
        self.after: float | None = None
        print(f"[{name}] load average before: {self.before:.2f} ({os.cpu_count()} cores)")

    def done(self) -> None:
        self.after = load()
        print(f"[{self.name}] load average after: {self.after:.2f}{'  ' + self.mark() if self.loaded else ''}")

    @property
    def loaded(self) -> bool:
        return any(v > LOADED for v in (self.before, self.after if self.after is not None else load()))

    def mark(self) -> str:
        """``[loaded: 2.3 > 1.5]`` when the load was above the limit at either end, else ``""``."""
        peak = max(self.before, self.after if self.after is not None else load())
        return f"[loaded: {peak:.2f} > {LOADED}]" if self.loaded else ""


def spread(values: Sequence[float], scale: float = 1.0, unit: str = "", digits: int = 3) -> str:
    """``median (min .. max)`` of repeated measurements, times ``scale``."""
    v = sorted(x * scale for x in values)
    return f"{statistics.median(v):.{digits}f}{unit} (min {v[0]:.{digits}f}, max {v[-1]:.{digits}f}, n={len(v)})"
