"""Run identity: the data fingerprint comes from the data checks' own scan and can never lose a report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tropt
from tropt.data import load
from tropt.errors import DataError
from tropt.identity import fingerprint


def _frames(n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.integers(0, 50, n), "s": rng.choice(["x", "y", "z"], n),
                       "y": rng.integers(0, 2, n)})
    return df.iloc[:150].reset_index(drop=True), df.iloc[150:].reset_index(drop=True)


def test_diagnose_fingerprint_reuses_the_checks_scan(monkeypatch):
    """One fingerprint pass serves the check and the identity: each split is scanned once, and the identity hashes
    no frame of its own (it used to rehash every split with hash_pandas_object: up to 2.5x the check's cost)."""
    train, test = _frames()
    scans, real_scan = [], load.scan

    def counting_scan(obj, name, *args, **kwargs):
        scans.append(name)
        return real_scan(obj, name, *args, **kwargs)

    real_hash = pd.util.hash_pandas_object

    def no_frame_hash(obj, *args, **kwargs):
        assert not isinstance(obj, pd.DataFrame), "the identity rehashed a whole split"
        return real_hash(obj, *args, **kwargs)

    monkeypatch.setattr(load, "scan", counting_scan)
    monkeypatch.setattr(pd.util, "hash_pandas_object", no_frame_hash)
    report = tropt.diagnose(splits={"train": train, "test": test}, label="y", checks=["data.exact_duplicates"],
                            progress=False)
    assert sorted(scans) == ["test", "train"]
    assert report.identity["data_fingerprint"] and report.identity["data_fingerprint_error"] is None
    assert report["data.exact_duplicates"].status is tropt.Status.PASS


def test_diagnose_scans_only_what_the_selected_checks_need(monkeypatch):
    """Exact duplicates alone never vectorise text or build the numeric matrix (a session scans for its checks)."""
    train, test = _frames()
    wanted, real_scan = [], load.scan

    def spy(obj, name, opts, kinds=None, progress=False, needs=load.ALL_NEEDS, **kw):
        wanted.append(needs)
        return real_scan(obj, name, opts, kinds, progress, needs, **kw)

    monkeypatch.setattr(load, "scan", spy)
    tropt.diagnose(splits={"train": train, "test": test}, label="y", checks=["data.exact_duplicates"], progress=False)
    assert wanted and all("numeric" not in n for n in wanted)


def test_data_fingerprint_is_reproducible_and_covers_features_and_labels():
    train, test = _frames()
    a = fingerprint(None, {"train": train, "test": test}, label="y")
    assert a == fingerprint(None, {"train": train.copy(), "test": test.copy()}, label="y") and a[1] is None
    relabelled = test.assign(y=1 - test["y"])
    assert fingerprint(None, {"train": train, "test": relabelled}, label="y")[0] != a[0]
    changed = test.assign(a=test["a"] + 1.0)
    assert fingerprint(None, {"train": train, "test": changed}, label="y")[0] != a[0]


@pytest.mark.parametrize("cell", [(1, 2), {"k": 1}, [1, 2]], ids=["tuple", "dict", "list"])
def test_unhashable_cells_keep_the_report_and_the_identity_says_why(cell):
    """Tuple, dict or list cells: the data checks are ERROR with the column named, the report is whole, and the
    identity records why the data could not be fingerprinted (it used to raise after every check had run)."""
    train = pd.DataFrame({"a": [cell, cell, 3], "b": [1, 2, 3], "y": [0, 1, 0]})
    test = pd.DataFrame({"a": [cell, 5], "b": [1, 9], "y": [0, 1]})
    report = tropt.diagnose(splits={"train": train, "test": test}, label="y",
                            checks=["data.exact_duplicates", "data.class_coverage"], progress=False)
    assert [r.status for r in report.results] == [tropt.Status.ERROR, tropt.Status.ERROR]
    assert "column 'a'" in report["data.exact_duplicates"].summary
    err = report.identity["data_fingerprint_error"]
    assert err and "DataError" in err and "column 'a'" in err
    assert report.identity["data_fingerprint"] is None  # nothing else to fingerprint: no Setup
    assert report.to_json()  # the report serialises whole


def test_unhashable_cells_with_a_setup_keep_the_setup_part_of_the_fingerprint(tiny_setup):
    train = pd.DataFrame({"a": [(1,), (2,)], "y": [0, 1]})
    fp, err = fingerprint(tiny_setup, {"train": train, "test": train}, label="y")
    assert fp is not None and "column 'a'" in err


def test_partitioned_parquet_directory_is_fingerprinted(tmp_path):
    """A directory of Parquet files is a valid split: the report keeps its findings and its fingerprint (the
    identity used to open() the directory and lose the report with IsADirectoryError)."""
    train, test = _frames()
    (tmp_path / "train").mkdir()
    train.iloc[:70].to_parquet(tmp_path / "train" / "part-0.parquet", index=False)
    train.iloc[70:].to_parquet(tmp_path / "train" / "part-1.parquet", index=False)
    leaked = pd.concat([test, train.iloc[:5]], ignore_index=True)
    report = tropt.diagnose(splits={"train": str(tmp_path / "train"), "test": leaked}, label="y",
                            checks=["data.exact_duplicates"], progress=False)
    assert report["data.exact_duplicates"].metrics["leaked_rows"] == 5
    assert report.identity["data_fingerprint"] and report.identity["data_fingerprint_error"] is None


@pytest.mark.parametrize("make, words", [
    (lambda tmp: str(tmp), "has no columns"),                                          # an empty directory
    # a directory of non-Parquet files
    (lambda tmp: (tmp / "notes.txt").write_text("hi") and str(tmp), "cannot read"),
    (lambda tmp: torch.empty(10, 3, device="meta"), "meta device"),                   # shapes without data
    (lambda tmp: (torch.empty(10, 3, device="meta"), torch.zeros(10)), "meta device"),  # inside (X, y)
])
def test_bad_split_is_a_data_error_naming_it_found_before_any_check(tmp_path, make, words, monkeypatch):
    import tropt.data.load as load

    scans = []
    real_scan = load.scan
    monkeypatch.setattr(load, "scan", lambda *a, **k: scans.append(a[1]) or real_scan(*a, **k))
    train, _ = _frames()
    report = tropt.diagnose(splits={"train": train, "holdout": make(tmp_path)}, checks="data", progress=False)
    data = [r for r in report if r.check.startswith("data.") and r.status is not tropt.Status.SKIP]
    assert data and all(r.status is tropt.Status.ERROR and "split 'holdout'" in r.summary for r in data)
    assert all(words in r.summary for r in data) and all(r.metrics["error_type"] == "DataError" for r in data)
    assert scans == []  # found before any check read the data
    assert "split 'holdout'" in report.identity["data_fingerprint_error"]  # the report and its identity are kept
    # A Setup's checks still run beside it (the rest of the report is not lost).
    with pytest.raises(DataError, match=words):
        from tropt.diagnosis import check_splits_readable
        check_splits_readable({"train": train, "holdout": make(tmp_path)})


def test_fingerprint_never_raises():
    class Odd:
        def __len__(self):
            raise RuntimeError("no length today")

    fp, err = fingerprint(None, {"train": Odd()})
    assert fp is None and err and "splits:" in err


def _surrogate_frames(odd: str):
    rng = np.random.default_rng(0)
    train = pd.DataFrame({"x": rng.normal(size=60), "y": pd.Series(["a", "b"] * 30, dtype=object)})
    test = pd.DataFrame({"x": rng.normal(size=20), "y": pd.Series(["a", "b"] * 8 + [odd] * 4, dtype=object)})
    return train, test


@pytest.mark.parametrize("where", ["class", "split"])
def test_a_lone_surrogate_in_a_class_or_split_name_keeps_the_report(where, tmp_path):
    odd = "bad\udcffname"  # what os.listdir returns for a folder name that is not UTF-8
    train, test = _surrogate_frames(odd if where == "class" else "c")
    splits = {"train": train, (odd if where == "split" else "test"): test}
    report = tropt.diagnose(None, splits, label="y", checks="data.label_sanity", progress=False)
    assert report["data.label_sanity"].status is tropt.Status.PASS  # the report is not lost to its identity
    fp = report.identity["data_fingerprint"]
    assert fp and report.identity["data_fingerprint_error"] is None
    # exact: another surrogate (another name on disk) is another fingerprint
    train2, test2 = _surrogate_frames("bad\udcfename" if where == "class" else "c")
    other = {"train": train2, ("bad\udcfename" if where == "split" else "test"): test2}
    assert fingerprint(None, other, label="y")[0] != fp
    assert fingerprint(None, splits, label="y")[0] == fp
    back = tropt.Report.from_json(report.to_json(tmp_path / "findings.json"))
    assert back.to_dict() == report.to_dict()
    report.to_html(tmp_path / "report.html")
