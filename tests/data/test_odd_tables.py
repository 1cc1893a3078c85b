"""Odd tables give a DataError naming the culprit and the fix, or work (#16): never a raw internal exception."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tropt
from tropt.cli import main


def _frame(n=120, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "c": rng.normal(size=n),
                         "y": rng.integers(0, 2, n)})


def _errors(report) -> dict[str, str]:
    return {r.check: r.summary for r in report if r.status.value == "error"}


def _assert_clear_errors(report, *fragments):
    errors = _errors(report)
    assert errors, report.to_frame()
    for check, summary in errors.items():
        r = report[check]
        assert r.metrics.get("error_type") == "DataError", (check, summary)
        assert all(f in summary for f in fragments), (check, summary)
        assert r.advice and "report it to tropt" not in r.advice[0]


def test_duplicate_column_names():
    df = _frame()
    df.columns = ["a", "a", "c", "y"]
    report = tropt.diagnose(splits={"train": df, "test": df.iloc[:20]}, label="y", checks="data", progress=False)
    _assert_clear_errors(report, "split 'train' has duplicate column names: 'a'")
    assert "df.columns.duplicated()" in report["data.exact_duplicates"].advice[0]


def test_multiindex_columns():
    df = _frame()
    df.columns = pd.MultiIndex.from_tuples([("f", "a"), ("f", "b"), ("f", "c"), ("t", "y")])
    report = tropt.diagnose(splits={"train": df, "test": df.iloc[:20]}, label=("t", "y"), checks="data", progress=False)
    _assert_clear_errors(report, "split 'train' has MultiIndex columns (2 levels")
    assert "flatten" in report["data.target_leakage"].advice[0]


def test_infinite_values_in_a_float_label_are_found_and_the_rest_runs():
    df = _frame()
    df["y"] = df["y"].astype(float)
    df.loc[[3, 5], "y"] = [np.inf, -np.inf]
    report = tropt.diagnose(splits={"train": df.iloc[:80], "test": df.iloc[80:]}, label="y", checks="data",
                            progress=False)
    assert _errors(report) == {}
    sanity = report["data.label_sanity"]
    assert sanity.status.value == "fail" and "infinite label (2 rows)" in sanity.summary
    assert report["data.class_coverage"].status.value == "pass" and report["data.label_shift"].status.value == "pass"


def test_malformed_csv(tmp_path):
    bad, ok = tmp_path / "bad.csv", tmp_path / "ok.csv"
    bad.write_text('a,b,y\n1,2,0\n3,"4,1\n5,6,1\n')  # the quote is never closed
    ok.write_text("a,b,y\n1,2,0\n3,4,1\n")
    report = tropt.diagnose(splits={"train": str(bad), "test": str(ok)}, label="y", checks="data", progress=False)
    _assert_clear_errors(report, "split 'train': cannot read", "bad.csv", "EOF inside string")
    assert "unterminated quote" in report["data.exact_duplicates"].advice[0]


class _MetaDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.empty(3, 8, 8, device="meta"), i % 2


@pytest.mark.parametrize("make, culprit", [
    (lambda: (torch.empty(50, 3, device="meta"), torch.zeros(50)),
     "split 'train': X of the (X, y) tuple is on the meta device"),
    (lambda: _MetaDataset(), "split 'train': sample 0 item 0 is on the meta device"),
])
def test_meta_tensor_inside_a_tuple(make, culprit):
    test = (torch.randn(10, 3), torch.zeros(10)) if isinstance(make(), tuple) else _MetaDataset()
    report = tropt.diagnose(splits={"train": make(), "test": test}, checks=["data.exact_duplicates"], progress=False)
    _assert_clear_errors(report, culprit.split(" item ")[0], "meta device")


def _many_classes(n_classes=1000, per_class=6, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    train = pd.DataFrame({"a": rng.normal(size=len(y)), "b": rng.normal(size=len(y)), "c": rng.normal(size=len(y)),
                          "y": y})
    # 10 classes never tested
    test = train[train["y"] < n_classes - 10].sample(800, random_state=0).assign(a=lambda t: t.a + 5)
    return {"train": train, "test": test}


def test_1000_integer_classes_with_task_classification():
    splits = _many_classes()
    inferred = tropt.diagnose(splits=splits, label="y", checks=["data.class_coverage"], progress=False)
    r = inferred["data.class_coverage"]
    assert r.status.value == "skip" and "task='classification'" in r.summary  # the advice names a keyword...
    told = tropt.diagnose(splits=splits, label="y", task="classification", checks=["data.class_coverage"],
                          progress=False)
    r = told["data.class_coverage"]  # ...that diagnose accepts, and then the 10 untested classes are found
    assert r.status.value in ("warn", "fail") and r.status.value != "error", r.summary


def test_task_is_validated():
    with pytest.raises(tropt.TroptError, match="task='classes' is not 'classification' or 'regression'"):
        tropt.diagnose(splits={"train": _frame()}, label="y", task="classes", progress=False)


def test_cli_task_option(tmp_path, capsys):
    splits = _many_classes()
    for name, df in splits.items():
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    args = ["diagnose", "--split", f"train={tmp_path / 'train.csv'}", "--split", f"test={tmp_path / 'test.csv'}",
            "--label", "y", "--checks", "data.class_coverage", "--no-progress", "--fail-on", "never"]
    assert main(args) == 0
    assert "SKIP   data.class_coverage" in capsys.readouterr().out
    assert main([*args, "--task", "classification"]) == 0
    out = capsys.readouterr().out
    assert "SKIP   data.class_coverage" not in out and "data.class_coverage" in out


def test_report_notebooks_declare_task():
    from tropt.report.runner import declared_parameters, notebook_path

    for kind in ("diagnose", "data"):
        assert "task" in declared_parameters(notebook_path(kind))
