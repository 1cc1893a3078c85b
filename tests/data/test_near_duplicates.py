"""data.near_duplicates on data with known answers (planted near copies in tensors, images, text and tables)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from support.digit_tables import PIXELS, digit_table, digits_with_copies
from support.split_tables import OPTS

from tropt.data import check_exact_duplicates, check_near_duplicates
from tropt.result import Status
from tropt.testing import untouched


def test_near_duplicates_likert_copies_are_chance_like_exact_duplicates_says():
    """4 five-point answers: near_duplicates FAILed (92%) on the same exact copies exact_duplicates calls chance."""
    rng = np.random.default_rng(7)
    df = pd.DataFrame({f"q{i}": rng.integers(1, 6, 2000) for i in range(4)})
    df["y"] = (df.sum(axis=1) + rng.normal(0, 2, 2000) > 12).astype(int)
    splits = {"train": df.iloc[:1600], "test": df.iloc[1600:]}
    e = check_exact_duplicates(splits, label="y", progress=False)
    n = check_near_duplicates(splits, label="y", progress=False)
    assert e.status is Status.WARN and n.status is Status.WARN, n.summary
    assert n.metrics["leaked_rows"] == e.metrics["leaked_rows"] == n.metrics["exact_copies.test_in_train"]
    assert n.metrics["small_feature_space"] and n.metrics["max_pair_fraction_not_exact"] == 0.0


def planted_vectors(n_train=3000, n_test=800, d=32, k=12, noise=1e-3, seed=0):
    g = torch.Generator().manual_seed(seed)
    train = torch.randn(n_train, d, generator=g)
    test = torch.randn(n_test, d, generator=g)
    src = torch.randperm(n_train, generator=g)[:k]
    test[:k] = train[src] + noise * torch.randn(k, d, generator=g)
    return train, test, src


def test_near_duplicates_tensors_all_planted_no_false():
    train, test, src = planted_vectors()
    with untouched(train, test):
        r = check_near_duplicates({"train": train, "test": test}, progress=False)
    assert r.metrics["leaked_rows"] == 12
    ev = r.tables["near_duplicates"]
    assert sorted(ev["row"]) == list(range(12))
    assert dict(zip(ev["row"], ev["earlier_row"])) == {i: int(s) for i, s in enumerate(src)}
    assert (ev["similarity"] > 0.99).all() and not ev["exact"].any()
    assert r.status is Status.FAIL  # 12 / 800 = 1.5 %


def test_near_duplicates_boundary_and_threshold_override():
    train, test, _ = planted_vectors(k=8)  # 1 % of 800: WARN
    assert check_near_duplicates({"train": train, "test": test}, progress=False).status is Status.WARN
    train, test, _ = planted_vectors(k=0)
    r = check_near_duplicates({"train": train, "test": test}, progress=False)
    assert r.status is Status.PASS and r.metrics["leaked_rows"] == 0
    r = check_near_duplicates({"train": train, "test": test}, threshold=-1.0, progress=False)
    assert r.metrics["leaked_rows"] == 800  # every row is "near" when the cut-off is -1


def test_near_duplicates_images_with_brightness_change_and_plot():
    g = torch.Generator().manual_seed(1)
    train = torch.rand(400, 3, 16, 16, generator=g)
    test = torch.rand(100, 3, 16, 16, generator=g)
    test[:4] = train[:4] * 0.8 + 0.1  # re-encoded copies: darker, offset
    r = check_near_duplicates({"train": (train, torch.zeros(400)), "test": (test, torch.zeros(100))}, progress=False)
    assert r.metrics["leaked_rows"] == 4
    assert set(r.tables["near_duplicates"]["row"]) == {0, 1, 2, 3}
    assert "hash_distance" in r.tables["near_duplicates"]
    assert np.asarray(r.series["pair_images"]).shape[:2] == (4, 2)
    ax = r.plot()
    assert ax is not None


def _digit_images():
    from sklearn.datasets import load_digits
    from torch.nn import functional as F

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=(24, 24), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x, torch.tensor(d.target), perm[:1400], perm[1400:]


def test_near_duplicates_image_hash_finds_brightness_copies_and_spares_healthy_digits():
    """The average-hash path never fired: Hamming distances came from cosines clipped to [-1, 1], so every distance
    read 128 and 40 test digits that are train digits x1.1 brighter plus noise (hash distance 0-3) PASSed. With the
    raw distance but the fixed cut-off 10, a healthy digit split got ~124 false hits (unrelated digits hash at a
    median 13). The cut-off is now calibrated on train's own nearest hash distances: copies found by hash, none
    in the healthy split."""
    x, y, tr, te = _digit_images()
    healthy = check_near_duplicates({"train": (x[tr], y[tr]), "test": (x[te], y[te])}, progress=False)
    assert healthy.status is Status.PASS and healthy.metrics["leaked_rows"] == 0, healthy.summary
    assert healthy.metrics["hash_threshold.test_in_train"] == 1
    xt = x[te].clone()
    g = torch.Generator().manual_seed(0)
    xt[:40] = (x[tr[:40]] * 1.1 + 0.01 * torch.randn(40, 3, 24, 24, generator=g)).clamp(0, 1.2)
    with untouched(xt):
        r = check_near_duplicates({"train": (x[tr], y[tr]), "test": (xt, y[te])}, progress=False)
    ev = r.tables["near_duplicates"]
    assert r.status is Status.FAIL and set(ev["row"]) <= set(range(40)) and len(ev) >= 35, r.summary
    assert (ev["earlier_row"] == ev["row"]).all()  # test digit i is a copy of train digit i
    assert (ev["hash_distance"] <= 1).all() and (ev["similarity"] < r.metrics["threshold"]).sum() >= 35  # by hash


def test_near_duplicates_skips_when_not_applicable(clean):
    train, test = clean
    r = check_near_duplicates({"train": train[["f_float", "y"]], "test": test[["f_float", "y"]]}, label="y",
                              progress=False)
    assert r.status is Status.SKIP and "numeric feature" in r.summary
    r = check_near_duplicates({"train": train[["y"]], "test": test[["y"]]}, label="y", progress=False)
    assert r.status is Status.SKIP and "no free-text columns" in r.summary, r.summary
    r = check_near_duplicates({"train": train, "test": test}, **OPTS, enabled=False)
    assert r.status is Status.SKIP
    pytest.importorskip("faiss")
    # above it: an index, not a SKIP
    r = check_near_duplicates({"train": train, "test": test}, **OPTS, max_auto_rows=10)
    assert r.status is Status.PASS and r.metrics["method"].startswith("faiss IVF") and "approximate index" in r.summary


def _reviews(seed=0, n_train=2000, n_test=500):
    rng = np.random.default_rng(seed)
    words = np.array(["good", "bad", "great", "awful", "movie", "plot", "actor", "boring", "fun", "long", "score",
                      "scene", "ending", "cast", "slow", "funny", "dark", "script", "twist", "music"])

    def reviews(n):
        return [" ".join(rng.choice(words, 12)).capitalize() + "." for _ in range(n)]

    train = pd.DataFrame({"review": reviews(n_train), "stars": rng.integers(1, 6, n_train),
                          "y": rng.integers(0, 2, n_train)})
    test = pd.DataFrame({"review": reviews(n_test), "stars": rng.integers(1, 6, n_test),
                         "y": rng.integers(0, 2, n_test)},
                        index=pd.RangeIndex(10_000, 10_000 + n_test))
    return train, test


def test_near_duplicates_in_text_columns_by_normalised_text():
    """A review table: 12 test reviews re-cased, re-spaced or re-punctuated from train (same stars) and 8 copied
    verbatim are found, exactly those 20, with the texts as evidence; the same tables without them pass."""
    train, test = _reviews()
    clean = check_near_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert clean.status is Status.PASS and clean.metrics["text_columns"] == "review"
    leaked = test.copy()
    src = np.arange(100, 120)
    variants = [str.upper, lambda t: t.replace(" ", "  "), lambda t: t.replace(".", "!"), str.lower]
    for i, j in enumerate(src):
        text = train.loc[j, "review"]
        leaked.iloc[i, 0] = variants[i % 4](text) if i < 12 else text
        leaked.iloc[i, 1] = train.loc[j, "stars"]
    with untouched(train, leaked):
        r = check_near_duplicates({"train": train, "test": leaked}, label="y", progress=False)
    assert r.status is Status.FAIL and r.metrics["leaked_rows"] == 20
    ev = r.tables["near_duplicates"]
    assert sorted(ev["row"]) == list(range(10_000, 10_020)) and sorted(ev["earlier_row"]) == list(src)
    assert ev["exact"].sum() == 8 and (ev["text"] == ev["earlier_text"]).all()  # equal once normalised
    assert ev.loc[ev["row"] == 10_000, "earlier_text"].item() == train.loc[100, "review"].lower().rstrip(".")


def test_near_duplicates_text_beside_few_numeric_columns_compares_the_numbers():
    """Text beside 2 numeric columns: the numbers were dropped (the 3-column rule of numeric-only tables), so 20 test
    rows with a train row's text but other fares and miles scored 1.0 and FAILed. Now both blocks count: those rows
    are not near copies, while 20 rows copying text and numbers are."""
    train, test = _reviews()
    rng = np.random.default_rng(5)
    train = train.assign(fare=rng.uniform(50, 900, len(train)), miles=rng.integers(100, 5000, len(train)))
    test = test.assign(fare=rng.uniform(50, 900, len(test)), miles=rng.integers(100, 5000, len(test)))
    cols = ["review", "fare", "miles"]
    same_text = test.copy()
    same_text.iloc[:20, 0] = train["review"].iloc[:20].to_numpy()
    same_text.iloc[:20, 1] = train["stars"].iloc[:20].to_numpy()
    same_text.iloc[:20, 3] = train["fare"].iloc[20:40].to_numpy() * 3 + 500  # other numbers
    r = check_near_duplicates({"train": train[[*cols, "y"]], "test": same_text[[*cols, "y"]]}, label="y",
                              progress=False)
    assert r.status is Status.PASS and r.metrics["leaked_rows"] == 0, r.summary
    assert r.metrics["dimensions"] == 2 + 256
    copied = test.copy()
    copied.iloc[:20, [0, 3, 4]] = train.iloc[:20][cols].to_numpy()
    copied = copied.astype(test.dtypes.to_dict())
    r = check_near_duplicates({"train": train[[*cols, "y"]], "test": copied[[*cols, "y"]]}, label="y", progress=False)
    assert r.status is Status.FAIL and sorted(r.tables["near_duplicates"]["earlier_row"]) == list(range(20)), r.summary


@pytest.mark.parametrize("share", [0.6, 1.0])
def test_near_duplicates_found_even_when_most_of_the_later_split_is_copies(share):
    """The yardstick was the later split's own nearest distances: with most test rows near copies it became the copy
    distance and the check passed exactly when the leak was worst. Now it is the earlier split's own spacing."""
    rng = np.random.default_rng(0)
    train = pd.DataFrame(rng.normal(size=(500, 10)))
    n = int(500 * share)
    copies = train.iloc[:n] + rng.normal(0, 1e-3, (n, 10))
    test = pd.concat([copies, pd.DataFrame(rng.normal(size=(500 - n, 10)))], ignore_index=True)
    r = check_near_duplicates({"train": train, "test": test}, progress=False)
    assert r.status is Status.FAIL and r.metrics["leaked_rows"] == n
    assert sorted(r.tables["near_duplicates"]["row"]) == list(range(n))
    fresh = check_near_duplicates({"train": train, "test": pd.DataFrame(rng.normal(size=(500, 10)))}, progress=False)
    assert fresh.status is Status.PASS


def test_text_vectors_are_the_same_in_every_process():
    """The trigram hash is fixed arithmetic, not Python's salted str hash: another process gets the same vectors."""
    import subprocess
    import sys

    from tropt.data.neighbours import text_vectors

    code = ("from tropt.data.neighbours import text_vectors; "
            "print(text_vectors(['hello world', 'near duplicate']).tobytes().hex())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=env).stdout.strip()
    assert other == text_vectors(["hello world", "near duplicate"]).tobytes().hex()


def test_near_duplicates_categorical_strings_are_not_text():
    """A 3-value category is not free text: with 2 numeric features it made every test row a 'near duplicate'
    (FAIL 100%); now the table has too few numeric columns to compare (SKIP), and with 4 numeric columns only
    the 5 planted noisy copies are found."""
    rng = np.random.default_rng(0)
    n = 3000
    df = pd.DataFrame({"x0": rng.normal(size=n), "x1": rng.normal(size=n), "cat": rng.choice(["a", "b", "c"], n),
                       "y": rng.integers(0, 2, n)})
    r = check_near_duplicates({"train": df.iloc[:2400], "test": df.iloc[2400:]}, label="y", progress=False)
    assert r.status is Status.SKIP and "2 numeric feature" in r.summary, r.summary
    df = df.assign(x2=rng.normal(size=n), x3=rng.normal(size=n))
    test = df.iloc[2400:].copy()
    test.iloc[:5, [0, 1, 4, 5]] = df.iloc[[7, 8, 9, 10, 11], [0, 1, 4, 5]].to_numpy() + 1e-4
    test.iloc[:5, 2] = df.iloc[[7, 8, 9, 10, 11], 2].to_numpy()
    r = check_near_duplicates({"train": df.iloc[:2400], "test": test}, label="y", progress=False)
    assert "text_columns" not in r.metrics and r.metrics["dimensions"] == 4
    assert r.metrics["leaked_rows"] == 5 and sorted(r.tables["near_duplicates"]["earlier_row"]) == [7, 8, 9, 10, 11]
    from tropt.data.columns import looks_like_text

    assert not looks_like_text(df["cat"]) and looks_like_text(_reviews()[0]["review"])


@pytest.mark.parametrize("bad", [np.inf, -np.inf, 1e30])
def test_near_duplicates_survive_one_infinite_or_huge_value(bad):
    """One inf (or 1e30) in a train column made the column's mean/std, and so every vector, NaN: 5 planted copies
    passed unseen. Statistics now use the finite values only; the copies are found, the clean table passes."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(2000, 6)), columns=list("abcdef")).assign(y=rng.integers(0, 2, 2000))
    df.loc[3, "a"] = bad
    train = df.iloc[:1600]
    r = check_near_duplicates({"train": train, "test": df.iloc[1600:]}, label="y", progress=False)
    assert r.status is Status.PASS and r.metrics["median_nn_similarity.test_in_train"] > 0.5, r.summary
    with untouched(train):
        r = check_near_duplicates({"train": train, "test": pd.concat([df.iloc[1600:], df.iloc[100:105]])}, label="y",
                                  progress=False)
    assert (r.metrics["leaked_rows"] == 5
            and sorted(r.tables["near_duplicates"]["earlier_row"]) == [100, 101, 102, 103, 104])


def test_near_duplicates_in_few_dimensions_see_magnitude():
    """In few dimensions a row and 1.5x that row had cosine 1.0 and were 'near duplicates'; a constant component
    next to the standardised table features makes magnitude count. True near copies are still found, and the
    threshold is printed with the digits that tell it from 1."""
    import re

    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.normal(size=(3000, 4)), columns=["a", "b", "c", "d"]).assign(y=rng.integers(0, 2, 3000))
    train, test = df.iloc[:2400], df.iloc[2400:].copy()
    mean = train.iloc[:, :4].mean().to_numpy()
    test.iloc[:10, :4] = mean + 1.5 * (train.iloc[:10, :4].to_numpy() - mean)  # same direction from the mean
    r = check_near_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert r.status is Status.PASS and r.metrics["leaked_rows"] == 0, r.summary
    shown = float(re.search(r"threshold ([0-9.]+)", r.summary).group(1))
    assert shown < 1 and abs((1 - shown) / (1 - r.metrics["threshold"]) - 1) < 0.01, r.summary
    test.iloc[10:15, :4] = train.iloc[20:25, :4].to_numpy() + 1e-5  # near copies
    r = check_near_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert r.metrics["leaked_rows"] == 5 and sorted(r.tables["near_duplicates"]["earlier_row"]) == list(range(20, 25))


@pytest.mark.parametrize("near_constant", ["noisy", "kept_clean"])
def test_tiny_noise_on_near_constant_columns_cannot_hide_copies(near_constant):
    """Digits as a table, 30 test rows replaced by train rows plus N(0, 0.01) noise (pixels are 0-16): PASS 'no near
    duplicates', while the same copies with the noise kept off the near-constant border pixels FAILed. Dividing by a
    border pixel's std (0.03) made the noise a third of a standard deviation. A column's scale is now at least half
    the size of its own deviations from its median, so the noise stays tiny: both find exactly the 30 copies."""
    x = digit_table()
    perm = np.random.default_rng(0).permutation(len(x))
    train, test = x.iloc[perm[:1437]], x.iloc[perm[1437:]]
    rng = np.random.default_rng(1)
    src = rng.choice(len(train), 30, replace=False)
    noise = rng.normal(0, 0.01, (30, 64))
    if near_constant == "kept_clean":
        noise[:, train[PIXELS].std(ddof=0).to_numpy() < 0.5] = 0.0
    leaked = test.copy()
    leaked.iloc[:30, :64] = train.iloc[src, :64].to_numpy() + noise
    with untouched(train, leaked):
        r = check_near_duplicates({"train": train, "test": leaked}, label="y", progress=False)
    assert r.status is Status.FAIL and r.metrics["leaked_rows"] == 30, r.summary
    ev = r.tables["near_duplicates"]
    assert sorted(ev["row"]) == sorted(test.index[:30]) and not ev["exact"].any()
    assert dict(zip(ev["row"], ev["earlier_row"])) == dict(zip(test.index[:30], train.index[src]))
    clean = check_near_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert clean.status is Status.PASS and clean.metrics["leaked_rows"] == 0, clean.summary


@pytest.mark.parametrize("share", [0.1, 1.0])
def test_digit_copies_are_not_excused_as_chance_either(share):
    """Digits with 10% (or all) of its rows copied before the split: near_duplicates found the exact copies but
    excused them as chance, by data.exact_duplicates' feature-space rule, which the copies' own repeats fooled (WARN,
    none of them judged). The rule now also asks for the near rows chance would bring (see data.exact_duplicates):
    every copy counts toward the FAIL."""
    train, test = digits_with_copies(share)
    expected = int(test[PIXELS].apply(tuple, axis=1).isin(set(train[PIXELS].apply(tuple, axis=1))).sum())
    r = check_near_duplicates({"train": train, "test": test}, label="y", progress=False)
    assert r.status is Status.FAIL and not r.metrics["small_feature_space"], r.summary
    assert r.metrics["leaked_rows"] == r.metrics["exact_copies.test_in_train"] == expected
    assert "max_pair_fraction_not_exact" not in r.metrics
