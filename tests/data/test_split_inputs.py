"""Every kind of split input finds the same copies; bad input raises a DataError that names it, in every check."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tropt
from tropt.data import (
    check_exact_duplicates,
    check_group_leakage,
    check_label_sanity,
    check_label_shift,
    check_near_duplicates,
    check_splits,
    check_temporal_leakage,
)
from tropt.errors import DataError
from tropt.result import Status


class TupleDataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class DictDataset(TupleDataset):
    def __getitem__(self, i):
        return {"image": self.x[i], "y": self.y[i]}


def test_every_input_type_finds_the_same_copies(tmp_path, monkeypatch):
    from tropt.data import limits

    monkeypatch.setattr(limits, "CHUNK_ROWS", 97)  # stream the files in many small chunks
    g = torch.Generator().manual_seed(0)
    xa, xb = torch.randn(500, 6, generator=g), torch.randn(200, 6, generator=g)
    xb[:5] = xa[10:15]
    ya, yb = torch.randint(0, 3, (500,), generator=g), torch.randint(0, 3, (200,), generator=g)
    fa = pd.DataFrame(xa.numpy(), columns=[f"c{i}" for i in range(6)]).assign(y=ya.numpy())
    fb = pd.DataFrame(xb.numpy(), columns=[f"c{i}" for i in range(6)]).assign(y=yb.numpy())
    fa.to_csv(tmp_path / "a.csv", index=False, float_format="%.9g")
    fb.to_csv(tmp_path / "b.csv", index=False, float_format="%.9g")
    fa.to_parquet(tmp_path / "a.parquet")
    fb.to_parquet(tmp_path / "b.parquet")
    cases = {
        "frame": ({"train": fa, "test": fb}, "y"),
        "numpy": ({"train": fa.to_numpy(), "test": fb.to_numpy()}, 6),
        "tensor": ({"train": torch.from_numpy(fa.to_numpy()), "test": torch.from_numpy(fb.to_numpy())}, "6"),
        "xy": ({"train": (xa, ya), "test": (xb, yb)}, None),
        "images": ({"train": (xa.reshape(500, 1, 2, 3), ya), "test": (xb.reshape(200, 1, 2, 3), yb)}, None),
        "dataset": ({"train": TupleDataset(xa, ya), "test": TupleDataset(xb, yb)}, 1),
        "dict_dataset": ({"train": DictDataset(xa, ya), "test": DictDataset(xb, yb)}, "y"),
        "csv": ({"train": str(tmp_path / "a.csv"), "test": tmp_path / "b.csv"}, "y"),
        "parquet": ({"train": str(tmp_path / "a.parquet"), "test": str(tmp_path / "b.parquet")}, "y"),
    }
    for name, (splits, label) in cases.items():
        r = check_exact_duplicates(splits, label=label, progress=False)
        assert r.metrics["leaked_rows"] == 5, name
        assert sorted(r.tables["leaked_rows"]["earlier_row"]) == [10, 11, 12, 13, 14], name
        if name != "dataset" or label is not None:
            ls = check_label_sanity(splits, label=label, progress=False)
            assert ls.status is Status.PASS, (name, ls.summary)
        nd = check_near_duplicates(splits, label=label, progress=False)
        assert nd.metrics["leaked_rows"] == 5, (name, nd.summary)


def test_bad_inputs_raise_helpful_data_errors(clean, tmp_path):
    train, test = clean
    with pytest.raises(DataError, match=r"different columns.*missing in 'test': \['f_more'\]"):
        check_exact_duplicates({"train": train, "test": test.drop(columns="f_more")}, progress=False)
    with pytest.raises(DataError, match=r"label='nope' is not a column; it has: 'uid', 'ts'"):
        check_label_shift({"train": train, "test": test}, label="nope", progress=False)
    with pytest.raises(DataError, match=r"group='gid' is not a column"):
        check_group_leakage({"train": train, "test": test}, group="gid", progress=False)
    with pytest.raises(DataError, match=r"time='when' is not a column"):
        check_temporal_leakage({"train": train, "test": test}, time="when", progress=False)
    with pytest.raises(DataError, match=r"split 'test' is empty"):
        check_exact_duplicates({"train": train, "test": test.iloc[:0]}, progress=False)
    bad = train.assign(tags=[[1, 2]] * len(train))
    with pytest.raises(DataError, match=r"column 'tags' holds unhashable list values"):
        check_exact_duplicates({"train": bad, "test": test.assign(tags=[[3]] * len(test))}, progress=False)

    class Weird(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return object(), 1

    with pytest.raises(DataError, match=r"sample 0\[0\] is a object, which cannot be fingerprinted"):
        check_exact_duplicates({"train": Weird(), "test": Weird()}, label=1, progress=False)
    with pytest.raises(DataError, match=r"label='y' cannot index them.*label=1"):
        check_label_sanity({"train": TupleDataset(torch.zeros(3, 2), torch.zeros(3))}, label="y", progress=False)
    with pytest.raises(DataError, match="expected an ordered mapping"):
        check_exact_duplicates(train, progress=False)
    with pytest.raises(DataError, match="at least 2"):
        check_exact_duplicates({"train": train}, progress=False)
    with pytest.raises(DataError, match="does not exist"):
        check_exact_duplicates({"train": str(tmp_path / "no.csv"), "test": test}, progress=False)
    with pytest.raises(DataError, match="mix tables and tensors"):
        check_exact_duplicates({"train": train, "test": torch.zeros(4, 3, 8, 8)}, progress=False)
    with pytest.raises(DataError, match="cannot be read as dates"):
        check_temporal_leakage({"train": train.assign(ts="soon"), "test": test.assign(ts="later")}, time="ts",
                               progress=False)
    with pytest.raises(DataError, match="different columns"):
        check_splits({"train": train, "test": test.drop(columns="f_more")}, progress=False)


def test_diagnose_turns_bad_input_into_error_results(clean):
    train, test = clean
    rep = tropt.diagnose(splits={"train": train, "test": test}, label="missing", checks="data", progress=False)
    statuses = {r.check: r.status for r in rep}
    assert statuses["data.exact_duplicates"] is Status.ERROR
    assert "label='missing' is not a column" in rep["data.exact_duplicates"].summary
    assert rep["data.exact_duplicates"].advice
