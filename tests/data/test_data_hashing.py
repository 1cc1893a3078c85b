"""Row fingerprints do not depend on how a string column is stored (object, Arrow string, categorical)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tropt.data import check_exact_duplicates
from tropt.data.hashing import _string_hash, hash_column

VALUES = ["a", "b", None, "a", np.nan, "ç", "1", ""]


@pytest.mark.parametrize("dtype", [object, "str", "string", "category"])
def test_string_column_hashes_equal_the_object_hashes(dtype):
    s = pd.Series(VALUES, dtype=object).astype(dtype)
    np.testing.assert_array_equal(hash_column(s, "string"), _string_hash(np.array(VALUES, dtype=object)))


def test_copies_are_found_across_splits_stored_differently():
    """A categorical train split and an object-string test split holding 3 of its rows: 3 leaked rows."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(500)], dtype=object)
    train = pd.DataFrame({"s": words[rng.integers(0, 500, 200)], "x": rng.normal(size=200)})
    test = pd.DataFrame({"s": words[rng.integers(0, 500, 50)], "x": rng.normal(size=50)})
    test.iloc[:3] = train.iloc[[5, 6, 7]].to_numpy()
    r = check_exact_duplicates({"train": train.astype({"s": "category"}), "test": test.astype({"s": object})},
                               progress=False)
    assert r.metrics["leaked_rows"] == 3
    assert sorted(r.tables["leaked_rows"]["earlier_row"]) == [5, 6, 7]
