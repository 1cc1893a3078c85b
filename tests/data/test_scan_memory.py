"""A large table's scan keeps only what the checks will use (#16 scale): the numeric matrix, most of a 5M-row table's
peak memory, is kept unasked only for splits small enough for the automatic near-duplicate search."""

from __future__ import annotations

import numpy as np
import pandas as pd

import tropt
from tropt.data import cache, limits
from tropt.data.cache import session
from tropt.data.load import Options, load_splits


def _splits(tmp_path, n=400, copies=20, seed=0):
    rng = np.random.default_rng(seed)
    train = pd.DataFrame(rng.normal(size=(n, 6)), columns=[f"f{i}" for i in range(6)]).assign(y=rng.integers(0, 2, n))
    test = pd.DataFrame(rng.normal(size=(n // 2, 6)), columns=train.columns[:6]).assign(y=rng.integers(0, 2, n // 2))
    test.iloc[:copies, :6] = train.iloc[:copies, :6].to_numpy() + 1e-6  # near copies, not exact ones
    paths = {}
    for name, df in {"train": train, "test": test}.items():
        paths[name] = str(tmp_path / f"{name}.parquet")
        df.to_parquet(paths[name])
    return paths


def test_session_scan_drops_the_numeric_matrix_above_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "EAGER_NUMERIC_ROWS", 300)
    paths = _splits(tmp_path)
    with session():
        train, test = load_splits(paths, Options.make(label="y"))
    assert train.numeric is None and "numeric" not in train.has and "not kept above 300 rows" in train.numeric_note
    assert test.numeric is not None and test.numeric.shape == (200, 6)  # 200 rows: small enough to keep
    assert train.fp.shape == (400,) and train.sample is not None  # everything else is still read once


def test_near_duplicates_still_found_when_asked_after_a_lean_scan(tmp_path, monkeypatch):
    paths = _splits(tmp_path)
    full = tropt.diagnose(splits=paths, label="y", checks=["data.exact_duplicates", "data.near_duplicates"],
                          progress=False)
    monkeypatch.setattr(limits, "EAGER_NUMERIC_ROWS", 300)
    cache._FILE_CACHE.clear()
    lean = tropt.diagnose(splits=paths, label="y", checks=["data.exact_duplicates", "data.near_duplicates"],
                          progress=False)
    r = lean["data.near_duplicates"]
    assert r.status.value == "fail" and r.metrics["leaked_rows"] == 20  # the planted near copies, read again on demand
    assert r.metrics["leaked_rows"] == full["data.near_duplicates"].metrics["leaked_rows"]


def test_above_the_automatic_limit_the_search_uses_the_index(tmp_path, monkeypatch):
    """It used to SKIP there (#22): now the matrix is read on demand and searched with an approximate index."""
    import pytest

    pytest.importorskip("faiss")
    monkeypatch.setattr(limits, "EAGER_NUMERIC_ROWS", 300)
    paths = _splits(tmp_path)
    cache._FILE_CACHE.clear()
    r = tropt.data.check_near_duplicates(paths, label="y", max_auto_rows=500, progress=False)
    assert r.status.value == "fail" and r.metrics["leaked_rows"] == 20, r.summary
    assert "above the exact-search limit of 500" in r.summary and r.metrics["method"].startswith("faiss IVF")
