"""Synthetic loss curves of every class, with known answers (multiplicative noise, like mini-batch losses)."""

from __future__ import annotations

import numpy as np


def _noise(n, rel, rng):
    return np.exp(rng.normal(0.0, rel, n))


def healthy(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return (0.3 + 2.0 * np.exp(-t / (n / 12))) * _noise(n, 0.05, rng)


def flat(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    return 2.3 * _noise(n, 0.05, rng)


def diverging(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    base = 0.5 + 2.0 * np.exp(-t / (n / 10))
    blow = np.where(t > n * 0.6, np.exp((t - n * 0.6) / (n / 20)), 1.0)
    return base * blow * _noise(n, 0.05, rng)


def non_finite(n=2000, seed=0):
    y = healthy(n, seed)
    y[int(n * 0.7):] = np.nan
    return y


def unstable(n=2000, seed=0):
    y = healthy(n, seed)
    for at in (int(n * 0.3), int(n * 0.55), int(n * 0.8)):
        y[at:at + 3] *= 4.0  # spike, then recovery
    return y


def noisy_late(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    rel = np.where(t > n * 0.6, 0.5, 0.04)
    return (0.3 + 2.0 * np.exp(-t / (n / 12))) * np.exp(rng.normal(0.0, 1.0, n) * rel)


def still_improving(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 2.5 * np.exp(-t / (n / 1.5)) * _noise(n, 0.05, rng)


def overfitting(n=2000, seed=0, evals=40):
    """Training falls throughout; validation bottoms out at ~40% of the run, then rises."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    train = (0.05 + 2.0 * np.exp(-t / (n / 8))) * _noise(n, 0.05, rng)
    vt = np.linspace(0, n - 1, evals)
    val = 0.6 + 1.7 * np.exp(-vt / (n / 10)) + 0.5 * np.clip(vt / n - 0.4, 0, None) ** 1.2
    val = val * _noise(evals, 0.01, rng)
    return train, vt, val


CASES = {
    "healthy": healthy,
    "flat": flat,
    "diverging": diverging,
    "non_finite": non_finite,
    "unstable": unstable,
    "noisy_late": noisy_late,
    "still_improving": still_improving,
}


def fast_fall_then_floor(n=300, seed=0, tau=20, rel=0.25):
    """Halves within ~2 tau steps, then sits at its noise floor (heavy per-batch noise): healthy, not flat."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return (0.5 + 0.5 * np.exp(-t / tau)) * _noise(n, rel, rng)


def flat_noisy(n=300, seed=0, rel=0.25):
    rng = np.random.default_rng(seed)
    return 0.9 * _noise(n, rel, rng)
