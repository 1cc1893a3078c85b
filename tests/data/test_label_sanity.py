"""data.label_sanity on data with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tropt.data import check_label_sanity
from tropt.result import Status
from tropt.testing import untouched


@pytest.mark.parametrize("values,num_classes,status,problem", [
    ([0, 1, 2, 1, 0, 2], None, Status.PASS, None),
    ([0, 1, np.nan, 1, 0, 2], None, Status.FAIL, "missing label"),
    ([0, 1, np.inf, 1, 0, 2], None, Status.FAIL, "infinite"),
    ([0, 1, -1, 1, 0, 2], None, Status.FAIL, "negative class id"),
    ([0, 1, 5, 1, 0, 2], 3, Status.FAIL, ">= num_classes"),
    ([0, 1, 2, 1, 0, 2], 3, Status.PASS, None),
    ([0.0, 1.0, 1.5, 1.0, 0.0, 2.0], 3, Status.FAIL, "non-integer"),
    ([1, 1, 1, 1, 1, 1], None, Status.FAIL, "constant label"),
    ([0, 1, 4, 1, 0, 4], None, Status.WARN, "gap"),
])
def test_label_sanity(values, num_classes, status, problem):
    a = pd.DataFrame({"x": range(6), "y": values})
    b = pd.DataFrame({"x": range(6), "y": [0, 1, 0, 1, 0, 1]})
    with untouched(a, b):
        r = check_label_sanity({"train": a, "test": b}, label="y", num_classes=num_classes, progress=False)
    assert r.status is status, r.summary
    if problem:
        assert problem in r.summary and r.advice
