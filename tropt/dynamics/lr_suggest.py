"""The suggestions of ``dynamics.lr_range`` on one sweep: steepest descent, fastai's valley and the minimum / 10.

Pure numpy on a sweep's learning rates and smoothed losses, so the sweep itself (``lr_range``) and its sequential
stop stay apart from how a range is read from it.
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("steepest", "valley", "min_div_10")

__all__ = ["METHODS", "centred_median", "ema_smooth", "suggest"]


def ema_smooth(losses: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected exponential moving average (as in Adam / fastai): unbiased from the first value on."""
    out = np.empty(len(losses))
    avg = 0.0
    for i, v in enumerate(losses):
        avg = beta * avg + (1 - beta) * v
        out[i] = avg / (1 - beta ** (i + 1))
    return out


def centred_median(values: np.ndarray, window: int) -> np.ndarray:
    """Running median over ``window`` points centred on each point (shrinking at the ends)."""
    n, half = len(values), window // 2
    return np.array([np.median(values[max(0, i - half): i + half + 1]) for i in range(n)]) if n else np.empty(0)


def _window_slopes(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """Least-squares slope of y against x over every window of m consecutive points (O(n) with cumulative sums)."""
    def window_sum(v: np.ndarray) -> np.ndarray:
        c = np.concatenate(([0.0], np.cumsum(v)))
        return c[m:] - c[:-m]

    sx, sy, sxx, sxy = window_sum(x), window_sum(y), window_sum(x * x), window_sum(x * y)
    var = sxx - sx * sx / m
    return np.where(var > 0, (sxy - sx * sy / m) / np.where(var > 0, var, 1.0), 0.0)


def suggest(lrs: np.ndarray, smooth: np.ndarray, skip_start: int = 0) -> dict[str, float]:
    """The three suggestions on one smoothed sweep (NaN when the curve gives none).

    ``steepest``: the most negative slope of the smoothed loss against log10(lr), before the minimum.
    ``valley``: fastai's valley — the longest run of decreasing loss, two thirds down it.
    ``min_div_10``: the LR of the smoothed minimum, divided by 10.

    The first ``skip_start`` points are left out of the minimum: the bias-corrected EMA rests on only a few losses
    there, so one lucky first batch would otherwise be "the minimum" at the smallest LR.
    """
    out = {m: math.nan for m in METHODS}
    n = len(smooth)
    if n < 5:
        return out
    skip = min(skip_start, n - 3)
    i_min = skip + int(np.nanargmin(smooth[skip:]))
    out["min_div_10"] = float(lrs[i_min] / 10)
    lo = min(skip_start, max(0, i_min - 2))
    if i_min - lo >= 2:
        # Least-squares slope over windows of a fifth of the sweep: a point-wise gradient of a noisy loss finds its
        # steepest "descent" in the noise at LRs far too small to learn anything.
        m = min(max(3, n // 5), i_min - lo + 1)
        slopes = _window_slopes(np.log10(lrs[lo:i_min + 1]), smooth[lo:i_min + 1], m)
        out["steepest"] = float(lrs[lo + int(np.argmin(slopes)) + m // 2])
    # fastai valley: longest decreasing subsequence (O(n^2) with n <= a few hundred)
    lds = np.ones(n, dtype=np.int64)
    max_start = max_end = 0
    for i in range(1, n):
        prev = lds[:i][smooth[i] < smooth[:i]]
        if prev.size:
            lds[i] = prev.max() + 1
        if lds[max_end] < lds[i]:
            max_end = i
            max_start = max_end - lds[max_end]
    sections = (max_end - max_start) / 3
    idx = max_start + int(sections) + int(sections / 2)
    if max_end > max_start:
        out["valley"] = float(lrs[min(idx, n - 1)])
    return out
