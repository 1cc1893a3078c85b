"""How many classes :mod:`tropt.data.target_leakage` scores: at most :data:`MAX_SCORED_CLASSES`, so its memory is
bounded by rows x that many classes whatever the label holds."""

from __future__ import annotations

import numpy as np

# More classes than this are scored as the most frequent MAX_SCORED_CLASSES - 1 (in the first split's sample) and
# one "other" class: every feature's predictions are rows x scored classes, and 10,000 classes on 20,000 rows made
# a dense one-hot of 1.6 GB and as much again per feature. A copy of the label still predicts every scored class
# (and "other") perfectly.
MAX_SCORED_CLASSES = 50


def cap_classes(y_tr: np.ndarray, n_classes: int) -> np.ndarray | None:
    """The map of class index to scored class (the most frequent first, the rest the last, "other"), or None when
    every class is scored."""
    if n_classes <= MAX_SCORED_CLASSES:
        return None
    counts = np.bincount(y_tr, minlength=n_classes)
    keep = np.argsort(-counts, kind="stable")[:MAX_SCORED_CLASSES - 1]
    remap = np.full(n_classes, MAX_SCORED_CLASSES - 1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    return remap


def one_hot(y: np.ndarray, m: int) -> np.ndarray:
    """(len(y), m) one-hot rows of class indices ``y``."""
    t = np.zeros((len(y), m))
    t[np.arange(len(y)), y] = 1.0
    return t
