"""data.group_leakage on data with known answers (shared entity ids)."""

from __future__ import annotations

from support.split_tables import OPTS

from tropt.data import check_group_leakage
from tropt.result import Status
from tropt.testing import untouched


def test_group_leakage_counts_and_boundary(clean):
    train, test = clean
    t = test.copy()
    t.loc[t.index[:5], "uid"] = train["uid"].iloc[[1, 2, 3, 4, 4]].to_numpy()  # 4 shared ids, 5 affected rows
    with untouched(train, t):
        r = check_group_leakage({"train": train, "test": t}, **OPTS)
    assert r.metrics["shared_groups"] == 4 and r.metrics["affected_rows"] == 5
    assert r.status is Status.FAIL  # 5/300 > 1 %
    shared = r.tables["shared_groups"]
    assert set(shared["group"]) == {1, 2, 3, 4}
    assert shared.set_index("group").loc[4, "rows_in_test"] == 2
    t3 = test.copy()
    t3.loc[t3.index[:3], "uid"] = train["uid"].iloc[:3].to_numpy()
    assert check_group_leakage({"train": train, "test": t3}, **OPTS).status is Status.WARN
    assert check_group_leakage({"train": train, "test": test}, **OPTS).status is Status.PASS
    assert check_group_leakage({"train": train, "test": test}, label="y").status is Status.SKIP
