"""Lone surrogates (what os.listdir gives for a non-UTF-8 file name) in labels, class names and text columns, and
object values whose __str__ raises: the data checks run and the report survives, or the error names the column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tropt
from tropt.data import check_class_coverage, check_exact_duplicates, check_splits
from tropt.errors import DataError

CLASSES = ["caf\udce9", "ok", "b\udcff"]  # two folder names as os.listdir returns undecodable bytes


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(size=n),
                       "name": pd.Series([f"file{seed}_{i}\udce9.jpg" for i in range(n)], dtype=object),
                       "y": pd.Series([CLASSES[i % 3] for i in range(n)], dtype=object)})
    return df


def test_surrogate_labels_and_text_run_every_data_check_without_error():
    train, val = _frame(300, 0), _frame(90, 1)
    before = train.copy()
    rep = check_splits({"train": train, "val": val}, label="y", progress=False)
    statuses = {r.check: r.status.value for r in rep.results}
    assert "error" not in statuses.values(), statuses
    assert statuses["data.exact_duplicates"] == "pass" and statuses["data.class_coverage"] == "pass"
    pd.testing.assert_frame_equal(train, before)  # the user's frame is not touched
    assert rep.to_json() and rep.to_html() and rep.to_markdown() and str(rep)


def test_a_surrogate_copy_is_still_a_duplicate_and_classes_stay_distinct():
    """Two surrogate class names differ only in the undecodable byte: they stay two classes; a val row copying a
    train row (surrogate text included) is one leaked row."""
    train, val = _frame(60, 0), _frame(30, 1)
    val.iloc[0] = train.iloc[5]
    r = check_exact_duplicates({"train": train, "val": val}, label="y", progress=False)
    assert r.metrics["leaked_rows"] == 1, r.summary
    names = ["a\udce9", "a\udcea"] * 30
    r = check_class_coverage({"train": pd.DataFrame({"x": range(60), "y": pd.Series(names, dtype=object)}),
                              "val": pd.DataFrame({"x": range(60), "y": pd.Series(names, dtype=object)})},
                             label="y", progress=False)
    assert r.status.value == "pass" and r.metrics.get("classes", 2) == 2, (r.summary, r.metrics)


def test_surrogate_y_of_an_x_y_tuple_is_read():
    x = np.arange(120, dtype=np.float64).reshape(60, 2)
    y = np.array([CLASSES[i % 3] for i in range(60)], dtype=object)
    rep = check_splits({"train": (x, y), "val": (x + 1000.0, y)}, progress=False)
    assert "error" not in {r.status.value for r in rep.results}, [r.summary for r in rep.results]


class _NoText:
    def __init__(self, i: int) -> None:
        self.i = i

    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__

    def __hash__(self) -> int:
        return self.i

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NoText) and other.i == self.i


def _raising(n: int) -> pd.DataFrame:
    return pd.DataFrame({"x": np.arange(n, dtype=float), "weird": pd.Series([_NoText(i % 7) for i in range(n)],
                                                                            dtype=object), "y": [0, 1] * (n // 2)})


def test_a_column_whose_str_raises_is_named():
    with pytest.raises(DataError, match=r"column 'weird' holds a _NoText value whose __str__ raises RuntimeError"):
        check_splits({"train": _raising(100), "val": _raising(40)}, label="y", progress=False)


def test_under_diagnose_the_column_is_each_checks_error_and_the_report_runs():
    rep = tropt.diagnose(splits={"train": _raising(100), "val": _raising(40)}, label="y", checks="data",
                         progress=False)
    errors = [r for r in rep.results if r.status.value == "error"]
    assert errors, [r.summary for r in rep.results]
    for r in errors:
        assert "'weird'" in r.summary and "__str__" in r.summary, r.summary
        assert "report it to tropt" not in " ".join(r.advice)
    assert rep.to_json()


def test_python_backed_string_labels_with_surrogates_run():
    """pandas' python-backed StringDtype holds lone surrogates too (Arrow strings refuse them at construction)."""
    def frame(n):
        return pd.DataFrame({"x": np.arange(n, dtype=float),
                             "y": pd.Series([CLASSES[i % 3] for i in range(n)], dtype=object).astype("string[python]")})

    val = frame(90)
    val["x"] += 1000.0
    rep = check_splits({"train": frame(300), "val": val}, label="y", progress=False)
    assert "error" not in {r.status.value for r in rep.results}, [r.summary for r in rep.results]
    assert rep["data.class_coverage"].status.value == "pass"
