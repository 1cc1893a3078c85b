"""data.exact_duplicates on data with known answers (injected copies, canonical fingerprints, small feature spaces)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.digit_tables import PIXELS, digits_with_copies
from support.split_tables import OPTS, make_table, with_copies

from tropt.data import check_exact_duplicates, check_near_duplicates
from tropt.result import Status
from tropt.testing import untouched


def test_exact_duplicates_found_with_exact_counts_and_indices(clean):
    train, test = clean
    test, src = with_copies(train, test, 7)
    test = test.iloc[::-1]  # index order is irrelevant; evidence shows the index labels
    with untouched(train, test):
        r = check_exact_duplicates({"train": train, "test": test}, **OPTS)
    assert r.status is Status.FAIL  # 7 of 300 > 1 %
    assert r.metrics["leaked_rows"] == 7 and r.metrics["leaked_rows.test_in_train"] == 7
    assert r.metrics["leaked_fraction"] == pytest.approx(7 / 300)
    ev = r.tables["leaked_rows"]
    assert sorted(ev["row"]) == list(range(7))
    assert sorted(ev["earlier_row"]) == sorted(train.index[src])
    assert (ev["label"].to_numpy() == ev["earlier_label"].to_numpy()).all()
    assert r.advice


@pytest.mark.parametrize("k,status", [(0, Status.PASS), (3, Status.WARN), (4, Status.FAIL)])
def test_exact_duplicates_warn_fail_boundary(clean, k, status):
    train, test = clean  # 300 test rows: 3 copies = 1.0 % (WARN, not above 1 %), 4 = 1.33 % (FAIL)
    test, _ = with_copies(train, test, k) if k else (test, None)
    r = check_exact_duplicates({"train": train, "test": test}, **OPTS)
    assert r.status is status and r.metrics["leaked_rows"] == k


def test_fingerprints_are_canonical():
    a = pd.DataFrame({"x": [0.0, np.nan, 1.0, 2.5], "s": ["p", None, "q", "r"], "k": [1, 2, 3, 4]})
    b = pd.DataFrame({"k": [1.0, 2.0, 7.0], "s": ["p", np.nan, "z"], "x": [-0.0, np.nan, 9.0]}, index=[10, 20, 30])
    r = check_exact_duplicates({"a": a, "b": b}, progress=False)
    assert r.metrics["leaked_rows"] == 2  # -0.0 == 0.0, NaN == NaN == None, int 1 == float 1.0, column order ignored
    assert list(r.tables["leaked_rows"]["row"]) == [10, 20]


def test_within_split_duplicates_and_conflicting_labels():
    a = pd.DataFrame({"x": [1, 1, 2, 3, 4], "y": [0, 0, 1, 0, 1]})
    b = pd.DataFrame({"x": [3, 5, 6, 4], "y": [1, 0, 1, 1]})
    r = check_exact_duplicates({"train": a, "test": b}, label="y", progress=False)
    assert r.metrics["duplicates_within.train"] == 1 and r.metrics["duplicates_within"] == 1
    assert r.metrics["leaked_rows"] == 2
    assert r.metrics["conflicting_labels"] == 1  # x=3 has labels 0 and 1; x=4 agrees
    assert r.metrics["conflicting_label_rows"] == 2
    assert set(r.tables["conflicting_labels"]["label"]) == {0, 1}


def test_three_splits_check_every_later_pair(clean):
    train, test = clean
    val = make_table(200, 5, 50_000, "2023-12-01", "2023-12-31")
    test, _ = with_copies(val, test, 2)
    r = check_exact_duplicates({"train": train, "val": val, "test": test}, **OPTS)
    assert r.metrics["leaked_rows.test_in_val"] == 2
    assert r.metrics["leaked_rows.test_in_train"] == 0 and r.metrics["leaked_rows.val_in_train"] == 0
    assert len(r.tables["pairs"]) == 3


def test_exact_duplicates_in_a_tiny_feature_space_are_not_leakage():
    """4 five-point answers (625 combinations) for 5000 rows: every test row has a copy in train by chance, and
    rows repeat within test too. That was FAIL '1000 of 1000 test rows in train'; now WARN, feature space too
    small to judge. Real copies (every row of a continuous table triplicated, then split) still FAIL."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({f"q{i}": rng.integers(1, 6, 5000) for i in range(4)})
    df["y"] = ((df.sum(axis=1) + rng.normal(0, 2, 5000)) > 12).astype(int)
    r = check_exact_duplicates({"train": df.iloc[:4000], "test": df.iloc[4000:]}, label="y", progress=False)
    assert r.status is Status.WARN and "too small to judge" in r.summary, r.summary
    assert r.metrics["leaked_rows"] == 1000 and len(r.tables["leaked_rows"]) == 1000
    assert r.metrics["small_feature_space"] and r.metrics["distinct_vectors"] == 625
    assert r.metrics["distinct_vectors.test"] == 494 and r.metrics["within_repeat_rate.test"] == pytest.approx(0.81)
    assert not any("Drop the" in a for a in r.advice)
    x = pd.DataFrame(rng.normal(size=(1000, 3)), columns=["a", "b", "c"]).assign(y=rng.integers(0, 2, 1000))
    tripled = pd.concat([x] * 3, ignore_index=True).sample(frac=1.0, random_state=0)
    r = check_exact_duplicates({"train": tripled.iloc[:2400], "test": tripled.iloc[2400:]}, label="y", progress=False)
    assert r.status is Status.FAIL and not r.metrics["small_feature_space"] and r.metrics["leaked_rows"] > 500


def _survey(seed=6, n=2000):
    rng = np.random.default_rng(seed)
    raw = pd.DataFrame({f"q{i}": rng.choice(list("abcd"[:k]), n) for i, k in enumerate([3, 4, 3, 3, 4, 3])})
    y = ((raw.q0 == "a") ^ (raw.q3 == "b") | (rng.random(n) < 0.2)).astype(int)
    return raw, y


@pytest.mark.parametrize("dtype", [bool, "float32"])
def test_one_hot_answers_are_a_small_feature_space_too(dtype):
    """Six survey answers (1,296 combinations) were WARN 'too small to judge' as strings but FAIL (67%) as
    pd.get_dummies columns: the bound multiplied the 20 binary columns' cardinalities (2^20). Discrete columns are
    now also bounded by the vectors train's repeating rows imply. near_duplicates, which FAILed on the same chance
    copies, applies the same rule. A one-hot-like table whose rows do not repeat still FAILs on planted copies."""
    raw, y = _survey()
    onehot = pd.get_dummies(raw).astype(dtype).assign(y=y.to_numpy())
    tr, te = onehot.iloc[:1600], onehot.iloc[1600:]
    r = check_exact_duplicates({"train": tr, "test": te}, label="y", progress=False)
    assert r.status is Status.WARN and "too small to judge" in r.summary and r.metrics["small_feature_space"], r.summary
    assert 3.0 < r.metrics["feature_combinations_log10"] < 3.3  # ~1,296, not 2^20
    n = check_near_duplicates({"train": tr, "test": te}, label="y", progress=False)
    assert n.status is Status.WARN and "expected by chance" in n.summary and n.metrics["leaked_rows"] > 200, n.summary
    rng = np.random.default_rng(1)
    wide = pd.DataFrame(rng.integers(0, 2, (3000, 30)).astype(dtype),
                        columns=[f"b{i}" for i in range(30)]).assign(y=rng.integers(0, 2, 3000))
    test = wide.iloc[2400:].copy()
    test.iloc[:30] = wide.iloc[:30].to_numpy()
    r = check_exact_duplicates({"train": wide.iloc[:2400], "test": test}, label="y", progress=False)
    assert (r.status is Status.FAIL and not r.metrics["small_feature_space"]
            and r.metrics["leaked_rows"] == 30), r.summary


@pytest.mark.parametrize("share", [0.05, 0.10, 1.0])
def test_copies_planted_before_the_split_are_not_excused_as_chance(share):
    """Digits rows copied before a random split: 5% FAILed or WARNed depending on the split (this one: WARN), 10%
    only WARNed 'expected by chance', and the doubled set said 78% leaked test rows were 'expected by chance': the
    copies' own repeats made the feature space look small (the more copies, the smaller). Exact copies cannot make
    rows that differ in a few columns (the space's step: here the 12-15 pixels the closest two different digits are
    apart), and in a space small enough for chance copies those are at least as common as exact ones; here they are
    rare, so the copies FAIL, every leaked row counted."""
    train, test = digits_with_copies(share)
    expected = int(test[PIXELS].apply(tuple, axis=1).isin(set(train[PIXELS].apply(tuple, axis=1))).sum())
    r = check_exact_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert r.status is Status.FAIL and not r.metrics["small_feature_space"], r.summary
    assert r.metrics["leaked_rows"] == expected and expected > 0.05 * len(test)
    assert r.metrics["near_match_rate.test_in_train"] < 0.01 and r.metrics["copies_not_chance.test_in_train"]
    assert r.metrics["exact_match_rate_sampled.test_in_train"] == pytest.approx(expected / len(test))
    assert any("Drop the" in a for a in r.advice)
    # The copies' repeats alone make the space look small (the bound today's verdict rested on); the summary says why
    # that is not chance.
    assert r.metrics["space_bound_small"] or share < 0.1
    if r.metrics["space_bound_small"]:
        assert "not chance" in r.summary and "columns" in r.summary, r.summary


def test_clean_digits_have_no_exact_copies():
    train, test = digits_with_copies(0.0)
    r = check_exact_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert r.status is Status.PASS and r.metrics["leaked_rows"] == 0


def test_a_genuinely_tiny_space_keeps_its_chance_verdict():
    """Two binary columns (4 combinations), no copies: every test row matches train by chance, and as many have a
    train row one column away. Still WARN 'too small to judge', never FAIL. So do tables whose few possible vectors
    are far apart (the same binary answer in 4 columns: 0000 or 1111), and tables where one answer changes three
    columns (q, q^2, q^3 of 6 five-point answers: 15,625 combinations, 22% of test rows in train by chance, none
    within 2 columns): the near rows are counted within the space's step, the closest two different rows' distance."""
    rng = np.random.default_rng(2)
    df = pd.DataFrame({"a": rng.integers(0, 2, 1000), "b": rng.integers(0, 2, 1000)}).assign(y=rng.integers(0, 2, 1000))
    r = check_exact_duplicates({"train": df.iloc[:800], "test": df.iloc[800:]}, label="y", progress=False)
    assert r.status is Status.WARN and "too small to judge" in r.summary and r.metrics["small_feature_space"], r.summary
    assert r.metrics["leaked_rows"] == 200 and r.metrics["near_match_rate.test_in_train"] == 1.0
    bit = rng.integers(0, 2, 1000)
    far = pd.DataFrame({f"c{i}": bit for i in range(4)}).assign(y=rng.integers(0, 2, 1000))
    r = check_exact_duplicates({"train": far.iloc[:800], "test": far.iloc[800:]}, label="y", progress=False)
    assert r.status is Status.WARN and r.metrics["small_feature_space"], r.summary
    q = pd.DataFrame({f"q{i}": rng.integers(1, 6, 5000) for i in range(6)})
    derived = pd.concat([q, q ** 2, q ** 3], axis=1, keys=["x", "sq", "cu"])
    derived.columns = [f"{a}_{b}" for a, b in derived.columns]
    derived["y"] = rng.integers(0, 2, 5000)
    r = check_exact_duplicates({"train": derived.iloc[:4000], "test": derived.iloc[4000:]}, label="y", progress=False)
    assert r.status is Status.WARN and r.metrics["small_feature_space"], r.summary
    assert r.metrics["leaked_fraction"] > 0.1 and r.metrics["near_match_rate.test_in_train"] > 0.9
