"""Integers beyond int64 / beyond float64's exact range (2**53) are fingerprinted exactly, never through float:
neighbouring wide ids stay distinct, and a true copy of wide values is still found with its exact count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tropt.data import check_exact_duplicates, check_group_leakage
from tropt.data.hashing import hash_array_rows, hash_column

WIDE = 2**70  # beyond int64: pandas stores these as Python ints in an object column
U64 = 2**63  # fits uint64 only: a uint64 column, whose values float64 cannot tell apart


def _ids(start: int, n: int, dtype=object) -> pd.Series:
    vals = [start + i for i in range(n)]
    if dtype == "u8":
        return pd.Series(np.array(vals, dtype=np.uint64))
    return pd.Series(vals, dtype=object)


@pytest.mark.parametrize("base,dtype", [(WIDE, object), (U64, "u8"), (2**60, object), (-(2**62), object)])
def test_neighbouring_wide_group_ids_are_not_shared(base, dtype):
    """100 train ids and 50 disjoint val ids, consecutive integers beyond 2**53: no group is shared (was a FAIL
    with 100% or 50% of val rows 'affected': the ids collapsed into one float)."""
    train = pd.DataFrame({"g": _ids(base, 100, dtype), "y": [0, 1] * 50})
    val = pd.DataFrame({"g": _ids(base + 1000, 50, dtype), "y": [0, 1] * 25})
    r = check_group_leakage({"train": train, "val": val}, group="g", label="y", progress=False)
    assert r.status.value == "pass", r.summary
    assert r.metrics["shared_groups"] == 0 and r.metrics["affected_rows"] == 0


def test_a_true_shared_wide_group_is_found_with_its_count():
    train = pd.DataFrame({"g": _ids(WIDE, 100), "y": [0, 1] * 50})
    val = pd.DataFrame({"g": _ids(WIDE + 1000, 50), "y": [0, 1] * 25})
    val.loc[[3, 4, 5], "g"] = WIDE + 7  # three val rows of train's entity WIDE + 7
    r = check_group_leakage({"train": train, "val": val}, group="g", label="y", progress=False)
    assert r.metrics["shared_groups"] == 1 and r.metrics["affected_rows"] == 3
    assert list(r.tables["shared_groups"]["group"]) == [WIDE + 7]


@pytest.mark.parametrize("dtype", [object, "u8"])
def test_distinct_wide_feature_values_are_not_duplicates_and_true_copies_count(dtype):
    """Feature x: train even, val odd consecutive wide integers (all distinct); 4 val rows then copy train rows."""
    base = WIDE if dtype is object else U64
    store = object if dtype is object else np.uint64
    train = pd.DataFrame({"x": pd.Series([base + 2 * i for i in range(100)], dtype=store)})
    val = pd.DataFrame({"x": pd.Series([base + 2 * i + 1 for i in range(50)], dtype=store)})
    r = check_exact_duplicates({"train": train, "val": val}, progress=False)
    assert r.status.value == "pass", r.summary
    assert r.metrics["leaked_rows"] == 0 and r.metrics["duplicates_within"] == 0
    val.loc[[0, 1, 2, 3], "x"] = train["x"].iloc[[10, 11, 12, 13]].to_numpy()
    r = check_exact_duplicates({"train": train, "val": val}, progress=False)
    assert r.metrics["leaked_rows"] == 4 and r.metrics["duplicates_within"] == 0
    assert sorted(r.tables["leaked_rows"]["earlier_row"]) == [10, 11, 12, 13]


def test_wide_integers_and_floats_of_one_value_still_agree():
    """2**60 is exact in float64: the int, the uint64, the float and the numeric text all hash alike; 2**60 + 1
    (not a float64) differs from all of them."""
    a = hash_column(pd.Series([2**60, 2**60 + 1], dtype=object), "mixed")
    b = hash_column(pd.Series(np.array([2**60, 2**60 + 1], dtype=np.uint64)), "numeric")
    c = hash_column(pd.Series([float(2**60)]), "numeric")
    d = hash_column(pd.Series([str(2**60), str(2**60 + 1)], dtype=object), "mixed")
    assert a[0] == b[0] == c[0] == d[0] and a[1] == b[1] == d[1] and a[0] != a[1]
    small = hash_column(pd.Series([3, 2**53]), "numeric")
    assert list(small) == list(hash_column(pd.Series([3.0, float(2**53)]), "numeric"))


def test_array_rows_of_wide_integers_are_exact():
    x = np.array([[2**62, 1], [2**62 + 1, 1], [2**62, 1]], dtype=np.int64)
    fp = hash_array_rows(x)
    assert fp[0] == fp[2] and fp[0] != fp[1]
    assert hash_array_rows(np.array([[2.0**62, 1.0]]))[0] == fp[0]
