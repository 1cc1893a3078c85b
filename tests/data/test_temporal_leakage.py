"""data.temporal_leakage on data with known answers (dates, strings and numbers as times)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.split_tables import OPTS

from tropt.data import check_temporal_leakage
from tropt.errors import DataError
from tropt.result import Status


def test_temporal_leakage_overlap_and_patterns(clean):
    train, test = clean
    assert check_temporal_leakage({"train": train, "test": test}, **OPTS).status is Status.PASS
    t = test.copy()
    t.loc[t.index[:6], "ts"] = pd.Timestamp("2023-06-01")
    r = check_temporal_leakage({"train": train, "test": t}, **OPTS)
    assert r.metrics["overlap_rows"] == 6 and r.status is Status.FAIL and r.metrics["pattern"] == "partial overlap"
    assert len(r.tables["rows_before_end"]) == 6
    t.loc[t.index[3:6], "ts"] = pd.Timestamp("2024-03-01")
    assert check_temporal_leakage({"train": train, "test": t}, **OPTS).status is Status.WARN  # 3/300 = 1 %
    both = pd.concat([train, test]).sample(frac=1.0, random_state=0)
    r = check_temporal_leakage({"train": both.iloc[:600], "test": both.iloc[600:]}, **OPTS)
    assert r.metrics["pattern"] == "random split of time-ordered data" and r.status is Status.FAIL
    assert r.plot() is not None


def test_temporal_leakage_string_and_numeric_times(clean):
    train, test = clean
    a, b = train.assign(ts=train.ts.dt.strftime("%Y-%m-%d")), test.assign(ts=test.ts.dt.strftime("%Y-%m-%d"))
    assert check_temporal_leakage({"train": a, "test": b}, **OPTS).status is Status.PASS
    a, b = train.assign(ts=np.arange(600)), test.assign(ts=np.arange(590, 890))
    r = check_temporal_leakage({"train": a, "test": b}, **OPTS)
    assert r.metrics["overlap_rows"] == 9  # 590..598 lie before train's last step 599
    # dates in train, epoch seconds in test: nanoseconds against seconds would call every row a leak
    seconds = test.assign(ts=test.ts.astype("int64") // 10**9)
    with pytest.raises(DataError, match="dates in some splits and plain numbers in others"):
        check_temporal_leakage({"train": train, "test": seconds}, **OPTS)
