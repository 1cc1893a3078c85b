"""Stage 6 — throughput: where step time goes (``perf.throughput``) and which precision is fast and stable
(``perf.precision``)."""

from __future__ import annotations

from .precision import check_precision, support
from .throughput import check_throughput

__all__ = ["check_precision", "check_throughput", "support"]
