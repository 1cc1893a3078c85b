"""Stage 6 — throughput: where step time goes (``perf.throughput``) and which precision is fast and stable
(``perf.precision``), and where one step's memory goes and which strategy fits (``perf.memory``)."""

from __future__ import annotations

from .memory import check_memory
from .precision import check_precision
from .throughput import check_throughput

__all__ = ["check_memory", "check_precision", "check_throughput"]
