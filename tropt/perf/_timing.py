"""Timing verdicts that survive noise: intervals for medians and speed-ups, and oversubscription signs.

Pure functions of timing arrays (tests feed them synthetic timings), plus :func:`machine_load` and
:func:`thread_probe`, which read the machine. The rules:

* a speed-up is the median of paired per-round ratios (the candidates' steps are interleaved, so one burst of
  noise hits both sides of a pair); its 95% interval comes from order statistics of those ratios (distribution
  free, no resampling, deterministic);
* a speed-up is "clear" only when its interval excludes 1, otherwise the timings are too noisy to decide;
* oversubscription (more busy threads than cores) shows as torch's threads running slower than one thread,
  as large variance between repeats, or as the load average plus torch's threads exceeding the cores.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile (the order-statistic interval's sign-test approximation)
NOISY_SPREAD = 3.0  # p90 / p10 of step times above this: repeats disagree too much to trust a single number
NOISY_MIN_REPEATS = 8  # ... judged on at least this many repeats (a few sub-millisecond steps jitter by chance)
LOAD_SHARE = 1.5  # load average + torch threads above this many times the cores: the threads compete for cores


def median_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """``(median, low, high)``: the median of ``values`` and its ~95% interval from order statistics.

    The ranks ``(n - z sqrt(n)) / 2`` and ``n + 1`` minus that bound the median with the given confidence whatever
    the distribution (the sign test's interval). With fewer than 6 values the interval is the full range."""
    v = np.sort(np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64))
    n = v.size
    if n == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(v))
    k = math.floor((n - z * math.sqrt(n)) / 2.0)  # 1-based rank of the lower bound
    if n < 6 or k < 1:
        return med, float(v[0]), float(v[-1])
    return med, float(v[k - 1]), float(v[n - k])


def speedup(base: Sequence[float] | np.ndarray, candidate: Sequence[float] | np.ndarray) -> tuple[float, float, float]:
    """``(speed-up, low, high)`` of ``candidate`` over ``base`` (>1: the candidate is faster).

    ``base[i]`` and ``candidate[i]`` are times of the same round of interleaved repeats, so their ratio cancels the
    noise the round shared; arrays of different lengths are paired up to the shorter one."""
    n = min(len(base), len(candidate))
    ratios = [b / c for b, c in zip(base[:n], candidate[:n], strict=True)
              if c > 0 and math.isfinite(b) and math.isfinite(c)]
    return median_interval(ratios)


def clear(interval: tuple[float, float, float], threshold: float = 1.0) -> bool:
    """Whether a speed-up's whole interval lies above ``threshold`` (1: faster beyond noise)."""
    return bool(math.isfinite(interval[1]) and interval[1] > threshold)


def time_spread(times: Sequence[float]) -> float:
    """p90 / p10 of repeated times (1 = no spread; NaN with fewer than 3)."""
    v = np.asarray([t for t in times if math.isfinite(t) and t > 0], dtype=np.float64)
    if v.size < 3:
        return math.nan
    lo, hi = np.percentile(v, [10, 90])
    return float(hi / lo) if lo > 0 else math.inf


def machine_load() -> dict[str, Any]:
    """torch's intra-op threads, the cores, and the 1-minute load average (NaN where unknown)."""
    import torch

    try:
        load = float(os.getloadavg()[0])
    except (AttributeError, OSError):
        load = math.nan
    return {"torch_threads": int(torch.get_num_threads()), "cpu_count": int(os.cpu_count() or 1), "load_avg": load}


def oversubscription(times: Sequence[float], machine: dict[str, Any], probe: tuple[float, float, float] | None = None,
                     device_type: str = "cpu") -> list[str]:
    """Reasons to think the timings suffer from oversubscription (empty when none).

    ``probe`` is :func:`thread_probe`'s speed-up of one thread over torch's threads (>1: one thread is faster).
    Only CPU timings are judged on threads and load; the variance between repeats counts on any device."""
    reasons = []
    spread = time_spread(times)
    if len(times) >= NOISY_MIN_REPEATS and math.isfinite(spread) and spread > NOISY_SPREAD:
        reasons.append(f"step times vary {spread:.1f}x between repeats (p90/p10)")
    if device_type == "cpu":
        threads, cores, load = machine["torch_threads"], machine["cpu_count"], machine["load_avg"]
        if probe is not None and clear(probe):
            reasons.append(f"one thread runs a step {probe[0]:.2f}x faster than torch's {threads} threads "
                           f"(interval {probe[1]:.2f}-{probe[2]:.2f})")
        if threads > 1 and math.isfinite(load) and load + threads > LOAD_SHARE * cores:
            reasons.append(f"load average {load:.1f} plus {threads} torch threads on {cores} cores")
    return reasons


def oversubscription_advice(machine: dict[str, Any]) -> str:
    cores, load = machine["cpu_count"], machine["load_avg"]
    free = max(1, int(cores - (load if math.isfinite(load) else 0)))
    return (f"Timings look oversubscribed: set torch.set_num_threads({min(free, machine['torch_threads'])}) (or "
            "OMP_NUM_THREADS) to the cores this job really has, or measure on a quiet machine, before acting on them.")


def thread_probe(step: Callable[[], None], rounds: int = 4, sync: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[float, float, float] | None:
    """Speed-up of one intra-op thread over torch's current threads on ``step`` (interleaved rounds).

    None when torch already uses one thread. torch's thread count is restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    if threads <= 1:
        return None
    many: list[float] = []
    one: list[float] = []
    try:
        for r in range(rounds):
            for n, out in ((threads, many), (1, one))[:: 1 if r % 2 == 0 else -1]:
                torch.set_num_threads(n)
                sync()
                t0 = clock()
                step()
                sync()
                out.append(clock() - t0)
    finally:
        torch.set_num_threads(threads)
    return speedup(many, one)
