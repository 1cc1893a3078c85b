"""data.class_coverage on data with known answers."""

from __future__ import annotations

import pandas as pd

from tropt.data import check_class_coverage
from tropt.result import Status


def test_class_coverage():
    a = pd.DataFrame({"x": range(40), "y": [0] * 20 + [1] * 17 + [2] * 3})
    b = pd.DataFrame({"x": range(20), "y": [0] * 10 + [1] * 10})
    r = check_class_coverage({"train": a, "test": b}, label="y", progress=False)
    assert r.status is Status.WARN and r.metrics["missing_in_later"] == 1 and r.metrics["rare_classes"] == 1
    c = pd.DataFrame({"x": range(20), "y": [0] * 10 + [1] * 5 + [3] * 5})
    r = check_class_coverage({"train": a, "test": c}, label="y", progress=False)
    assert r.status is Status.FAIL and r.metrics["unseen_in_first"] == 1
    assert "3" in r.summary and r.plot() is not None
    ok = pd.DataFrame({"x": range(40), "y": [0, 1] * 20})
    assert check_class_coverage({"train": ok, "test": ok}, label="y", progress=False).status is Status.PASS
