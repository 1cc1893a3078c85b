"""data.target_leakage with thousands of classes: memory bounded (a capped number of scored classes, the rest one
"other" class), the result says so, and a copy of the label is still found."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd

from tropt.data import check_target_leakage
from tropt.data.target_leakage import MAX_SCORED_CLASSES

CLASSES, ROWS = 1500, 3000


def _splits(copy: bool) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for name, n in (("train", ROWS), ("val", ROWS // 2)):
        y = np.array([f"c{i}" for i in rng.integers(0, CLASSES, n)], dtype=object)
        df = pd.DataFrame({"noise": rng.normal(size=n), "level": rng.integers(0, 5, n), "y": y})
        if copy:
            df["y_copy"] = pd.Series(y, dtype=object)
        out[name] = df
    return out


def _peak_mb(splits: dict) -> tuple[float, object]:
    small = {k: v.iloc[:200].assign(y=np.arange(200) % 2) for k, v in splits.items()}
    check_target_leakage(small, label="y", progress=False, bootstrap=20)  # imports and caches, outside the peak
    tracemalloc.start()
    try:
        r = check_target_leakage(splits, label="y", task="classification", progress=False, bootstrap=20)
        return tracemalloc.get_traced_memory()[1] / 2**20, r
    finally:
        tracemalloc.stop()


def test_many_classes_are_scored_in_bounded_memory_and_the_result_says_so():
    """1500 classes on 3000 rows: a dense one-hot is 36 MB and every feature's predictions as much again (the issue:
    10,000 classes on 20,000 rows went out of memory; this case peaked at 316 MB). Capped, the check's peak stays
    under 40 MB (about 11 MB measured)."""
    splits = _splits(copy=False)
    seen = splits["train"]["y"].nunique()
    peak, r = _peak_mb(splits)
    assert peak < 40, f"peak {peak:.0f} MB"
    assert r.status.value == "pass", r.summary
    assert r.metrics["classes"] == seen and r.metrics["classes_scored"] == MAX_SCORED_CLASSES
    assert f"{MAX_SCORED_CLASSES - 1} most frequent of {seen} classes" in r.summary


def test_a_copy_of_a_many_class_label_still_fails():
    _, r = _peak_mb(_splits(copy=True))
    assert r.status.value == "fail", r.summary
    assert "'y_copy'" in r.summary and r.metrics["classes_scored"] == MAX_SCORED_CLASSES
