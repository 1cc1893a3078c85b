"""Every stage-1 check together: check_splits and diagnose on clean, sample and real data; no check mutates its
input."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from support.split_tables import OPTS, SAMPLES

import tropt
from tropt.data import check_exact_duplicates, check_near_duplicates, check_splits
from tropt.result import Status
from tropt.testing import untouched


def test_sample_csv_known_answers_through_diagnose():
    splits = {"train": os.path.join(SAMPLES, "train.csv"), "test": os.path.join(SAMPLES, "test.csv")}
    rep = tropt.diagnose(splits=splits, label="churned", group="customer_id", time="signup_date", checks="data",
                         progress=False)
    assert rep["data.exact_duplicates"].metrics["leaked_rows"] == 30
    assert rep["data.group_leakage"].metrics["shared_groups"] == 55
    assert rep["data.group_leakage"].metrics["affected_rows"] == 55
    assert rep["data.temporal_leakage"].metrics["overlap_rows"] == 30
    for cid in ("data.target_leakage", "data.label_shift", "data.class_coverage", "data.label_sanity"):
        assert rep[cid].status is Status.PASS, (cid, rep[cid].summary)
    assert rep["data.near_duplicates"].metrics["exact_copies.test_in_train"] == 30
    json.loads(rep.to_json())  # strict JSON (timestamps, NaN) round-trips
    assert tropt.result.Report.from_json(rep.to_json())["data.exact_duplicates"].metrics["leaked_rows"] == 30


def test_check_splits_clean_passes_and_plots(clean):
    train, test = clean
    with untouched(train, test):
        rep = check_splits({"train": train, "test": test}, **OPTS)
    assert rep.checks == list(tropt.data.CHECKS)
    assert all(r.status is Status.PASS for r in rep), [(r.check, r.status, r.summary) for r in rep]
    single_bar = ("data.exact_duplicates", "data.group_leakage")  # two splits: one bar, not drawn (#15)
    for r in rep:
        if r.check != "data.label_sanity" and r.check not in single_bar:
            assert r.plot() is not None


def test_real_dataset_breast_cancer():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    df = sklearn_datasets.load_breast_cancer(as_frame=True).frame
    shuffled = df.sample(frac=1.0, random_state=0)
    train, test = shuffled.iloc[:400], shuffled.iloc[400:]
    rep = check_splits({"train": train, "test": test}, label="target", progress=False)
    assert rep["data.exact_duplicates"].metrics["leaked_rows"] == 0
    assert rep["data.near_duplicates"].metrics["leaked_rows"] == 0
    assert rep["data.label_shift"].status is Status.PASS
    assert rep["data.target_leakage"].metrics["max_power"] < 0.98  # strong features, none perfect
    leaky = pd.concat([test, train.iloc[:9]])  # 9 train rows copied into test
    r = check_exact_duplicates({"train": train, "test": leaky}, label="target", progress=False)
    assert r.metrics["leaked_rows"] == 9 and sorted(r.tables["leaked_rows"]["row"]) == sorted(train.index[:9])
    r = check_near_duplicates({"train": train, "test": leaky}, label="target", progress=False)
    assert r.metrics["leaked_rows"] == 9


def test_no_check_mutates_frames():
    a = pd.DataFrame({"x": [0.0, -0.0, np.nan, 1.0] * 10, "s": pd.Categorical(["a", "b", None, "a"] * 10),
                      "o": ["p", None, "q", "r"] * 10, "t": pd.date_range("2024-01-01", periods=40), "y": [0, 1] * 20,
                      "g": list(range(40))})
    b = a.iloc[::-1].copy()
    b.attrs["note"] = "keep"
    for fn in tropt.data.CHECKS.values():
        with untouched(a, b):
            fn({"train": a, "test": b}, label="y", group="g", time="t", progress=False)
