"""data.near_duplicates beyond exact-search sizes: a FAISS IVF index on the same vectors (recall measured against
exact search), MinHash LSH for free text (every pair verified by its exact Jaccard), a binary hash index for image
average hashes, "auto" switching to the index above 200k rows instead of skipping, and a clear error naming the
extra when faiss or datasketch is missing."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch

import tropt
from tropt.data import check_near_duplicates
from tropt.errors import MissingDependencyError
from tropt.result import Status

faiss = pytest.importorskip("faiss")
datasketch = pytest.importorskip("datasketch")


def planted_table(n_train: int, n_test: int, d: int = 16, k: int = 300, noise: float = 1e-3, seed: int = 0):
    """Gaussian rows; the first ``k`` test rows are noisy copies of train rows ``src`` (their index labels)."""
    rng = np.random.default_rng(seed)
    train = pd.DataFrame(rng.standard_normal((n_train, d), dtype=np.float32), columns=[f"x{i}" for i in range(d)])
    test = pd.DataFrame(rng.standard_normal((n_test, d), dtype=np.float32), columns=train.columns,
                        index=pd.RangeIndex(10_000_000, 10_000_000 + n_test))
    src = np.sort(rng.choice(n_train, size=k, replace=False))
    test.iloc[:k] = train.iloc[src].to_numpy() + noise * rng.standard_normal((k, d)).astype(np.float32)
    return train, test, src


def test_auto_on_a_300k_row_table_uses_the_index_and_finds_every_planted_pair():
    train, test, src = planted_table(250_000, 50_000)
    r = check_near_duplicates({"train": train, "test": test}, progress=False)  # enabled="auto", search="auto"
    assert r.status is Status.WARN and r.metrics["leaked_rows"] == 300, r.summary  # 0.6 % of test
    ev = r.tables["near_duplicates"]
    assert dict(zip(ev["row"], ev["earlier_row"])) == {10_000_000 + i: int(s) for i, s in enumerate(src)}
    assert r.metrics["method"].startswith("faiss IVF-Flat") and "approximate index" in r.summary
    assert "300,000 rows, above the exact-search limit of 200,000" in r.summary
    assert r.metrics["recall"] >= 0.95 and "LOW RECALL" not in r.summary
    assert r.metrics["recall_sample.test_in_train"] == 1000 and r.metrics["recall_probes.test_in_train"] == 2000


def test_index_and_exact_search_agree_on_a_moderate_table():
    """Same vectors, same calibration: the index flags exactly the rows exact search flags, at the same threshold."""
    train, test, _src = planted_table(20_000, 5_000, k=40, noise=3e-3, seed=1)
    exact = check_near_duplicates({"train": train, "test": test}, search="exact", progress=False)
    index = check_near_duplicates({"train": train, "test": test}, search="index", progress=False)
    assert "method" not in exact.metrics and index.metrics["method"].startswith("faiss")
    assert index.metrics["threshold"] == pytest.approx(exact.metrics["threshold"], abs=0)
    assert sorted(index.tables["near_duplicates"]["row"]) == sorted(exact.tables["near_duplicates"]["row"])
    assert exact.metrics["leaked_rows"] == 40


def test_low_recall_is_said_in_the_summary_and_advice(monkeypatch):
    """An index searching one list of many (tuning disabled) misses near copies: the measured recall says so."""
    from tropt.data import ann

    monkeypatch.setattr(ann, "tune", lambda index, *a, **k: index)
    real_build = ann.build
    monkeypatch.setattr(ann, "build", lambda ref, nprobe=None, **k: real_build(ref, nprobe=1, **k))
    rng = np.random.default_rng(3)
    # loose copies (cosine ~0.85 in 33 dimensions) often fall in another of ~200 lists than their original
    train = pd.DataFrame(rng.standard_normal((8000, 32)).astype(np.float32))
    test = pd.DataFrame(train.to_numpy()[:2000] + 0.6 * rng.standard_normal((2000, 32)).astype(np.float32))
    r = check_near_duplicates({"train": train, "test": test}, search="index", threshold=0.75, progress=False)
    assert r.metrics["recall"] < 0.95, r.metrics
    assert "LOW RECALL" in r.summary and any("search='exact'" in a for a in r.advice)


def _sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(3, 9))) for _ in range(3000)])
    return [" ".join(rng.choice(vocab, 10)).capitalize() + "." for _ in range(n)]


def _one_word_changed(text: str, rng) -> str:
    words = text.rstrip(".").split(" ")
    i = int(rng.integers(1, len(words)))
    words[i] = "zq" + words[i][::-1]
    return " ".join(words) + "."


def test_minhash_finds_recased_repunctuated_and_one_word_changed_copies_and_no_false_pair():
    train_text, test_text = _sentences(4000, 0), _sentences(1000, 1)
    rng = np.random.default_rng(2)
    src = rng.choice(4000, size=60, replace=False)
    for i, j in enumerate(src):
        t = train_text[j]
        test_text[i] = (t.upper() if i < 20 else t.replace(" ", ", ").replace(".", "!") if i < 40
                        else _one_word_changed(t, rng))
    train = pd.DataFrame({"review": train_text, "y": rng.integers(0, 2, 4000)})
    test = pd.DataFrame({"review": test_text, "y": rng.integers(0, 2, 1000)})
    r = check_near_duplicates({"train": train, "test": test}, label="y", search="index", progress=False)
    ev = r.tables["near_duplicates"]
    assert r.metrics["leaked_rows"] == 60, r.summary
    assert dict(zip(ev["row"], ev["earlier_row"])) == {i: int(j) for i, j in enumerate(src)}  # no false pair
    assert r.metrics["method"].startswith("MinHash LSH") and r.metrics["lsh_recall_at_threshold"] > 0.99
    assert (ev.loc[ev["row"] < 40, "similarity"] == 1.0).all()  # equal once normalised
    assert ((ev.loc[ev["row"] >= 40, "similarity"] >= 0.5) & (ev.loc[ev["row"] >= 40, "similarity"] < 1)).all()
    assert ev.loc[ev["row"] == 0, "earlier_text"].item() == train_text[src[0]].lower().rstrip(".")  # both texts kept
    assert ev.loc[ev["row"] == 0, "text"].item() == ev.loc[ev["row"] == 0, "earlier_text"].item()
    clean = check_near_duplicates({"train": train, "test": test.iloc[60:]}, label="y", search="index", progress=False)
    assert clean.status is Status.PASS and clean.metrics["leaked_rows"] == 0, clean.summary


def test_text_too_long_to_vectorise_goes_to_minhash(monkeypatch):
    """Above limits.TEXT_MAX_ROWS the trigram vectors are not built: the text is compared by MinHash LSH."""
    from tropt.data import limits

    monkeypatch.setattr(limits, "TEXT_MAX_ROWS", 500)
    train_text, test_text = _sentences(2000, 3), _sentences(300, 4)
    test_text[:10] = [t.lower() for t in train_text[100:110]]
    r = check_near_duplicates({"train": pd.DataFrame({"t": train_text}), "test": pd.DataFrame({"t": test_text})},
                              progress=False)
    assert r.metrics["method"].startswith("MinHash LSH") and r.metrics["leaked_rows"] == 10, r.summary
    assert sorted(r.tables["near_duplicates"]["earlier_row"]) == list(range(100, 110))


def test_signatures_are_datasketchs_minhash():
    """Vectorised signatures equal datasketch.MinHash's hashvalues for the same hashed shingles."""
    from tropt.data import minhash as mh

    texts = ["hello world, this is a test", "", "ab", "near duplicate text"]
    sig = mh.signatures(texts)
    hashes, starts = mh.shingle_hashes(texts)
    ends = np.append(starts[1:], hashes.size)
    for i in range(len(texts)):
        m = datasketch.MinHash(num_perm=mh.NUM_PERM, seed=mh.SEED, hashfunc=lambda x: x)
        m.update_batch([int(v) for v in hashes[starts[i]:ends[i]]])
        assert np.array_equal(m.hashvalues, sig[i])
        assert ends[i] - starts[i] == len(mh.shingle_set(texts[i]))


def test_image_hashes_in_the_binary_index_find_near_identical_images():
    g = torch.Generator().manual_seed(0)
    train = torch.rand(3000, 3, 16, 16, generator=g)
    test = torch.rand(500, 3, 16, 16, generator=g)
    test[:20] = (train[100:120] * 0.9 + 0.05 + 0.01 * torch.randn(20, 3, 16, 16, generator=g)).clamp(0, 1)
    r = check_near_duplicates({"train": (train, torch.zeros(3000)), "test": (test, torch.zeros(500))}, search="index",
                              progress=False)
    ev = r.tables["near_duplicates"]
    assert r.metrics["leaked_rows"] == 20 and dict(zip(ev["row"], ev["earlier_row"])) == {i: 100 + i for i in range(20)}
    assert ("IndexBinaryMultiHash" in r.metrics["method"]
            and (ev["hash_distance"] <= r.metrics["hash_threshold.test_in_train"]).all())


def test_binary_index_is_exact_within_its_radius():
    """Every pair within max_distance bits is found with its exact distance (pigeonhole over disjoint substrings)."""
    from tropt.data import ann

    rng = np.random.default_rng(0)
    ref = np.where(rng.random((5000, 256)) < 0.5, 1.0, -1.0).astype(np.float32)
    query = ref[:300].copy()
    flips = rng.integers(0, 11, 300)
    for i, f in enumerate(flips):
        query[i, rng.choice(256, f, replace=False)] *= -1
    dist, pos, _ = ann.hamming_nearest(query, ref, max_distance=10)
    assert np.array_equal(pos, np.arange(300)) and np.array_equal(dist, flips)


@pytest.mark.parametrize("missing", ["faiss", "datasketch"])
def test_a_missing_extra_is_named_and_becomes_an_error_result_in_diagnose(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    if missing == "faiss":
        train, test, _ = planted_table(300, 100, k=5)
        kw = {}
    else:
        train = pd.DataFrame({"t": _sentences(300, 0), "y": 0})
        test = pd.DataFrame({"t": _sentences(100, 1), "y": 0})
        kw = {"label": "y"}
    with pytest.raises(MissingDependencyError, match=r"pip install 'tropt\[ann\]'") as err:
        check_near_duplicates({"train": train, "test": test}, search="index", progress=False, **kw)
    assert f"{missing} is not installed" in str(err.value)
    report = tropt.diagnose(splits={"train": train, "test": test}, checks=["data.near_duplicates"], progress=False,
                            options={"data.near_duplicates": {"search": "index"}}, **kw)
    r = report["data.near_duplicates"]
    assert r.status is Status.ERROR and "tropt[ann]" in r.summary + " ".join(r.advice), r


def test_minhash_beside_numbers_needs_the_numbers_to_be_near_copies_too():
    """Text by MinHash, numbers by their block's cosine at the calibrated threshold: the same text with other numbers
    is not a near duplicate; text and numbers copied are."""
    rng = np.random.default_rng(5)
    train = pd.DataFrame({"t": _sentences(3000, 5), "fare": rng.uniform(50, 900, 3000),
                          "miles": rng.integers(100, 5000, 3000), "age": rng.integers(18, 90, 3000)})
    test = pd.DataFrame({"t": _sentences(600, 6), "fare": rng.uniform(50, 900, 600),
                         "miles": rng.integers(100, 5000, 600), "age": rng.integers(18, 90, 600)})
    test.loc[:19, "t"] = [s.lower() for s in train["t"][:20]]  # same text, other numbers
    test.loc[20:29, ["t", "fare", "miles", "age"]] = train.loc[100:109, ["t", "fare", "miles", "age"]].to_numpy()
    test = test.astype(train.dtypes.to_dict())
    r = check_near_duplicates({"train": train, "test": test}, search="index", progress=False)
    ev = r.tables["near_duplicates"]
    assert r.metrics["leaked_rows"] == 10 and sorted(ev["earlier_row"]) == list(range(100, 110)), r.summary
    assert (ev["numeric_similarity"] >= r.metrics["numeric_threshold.test_in_train"]).all()


def test_auto_skips_only_above_the_index_memory_limit_and_true_runs_it():
    """"auto" above the exact limit runs the index unless it would hold more than max_auto_index_bytes of vectors
    (the 5M x 50 data stage of #16 stays within its memory); near_duplicates=True runs it at any size."""
    train, test, _src = planted_table(3000, 1000, k=20)
    small = {"max_auto_rows": 1000, "max_auto_index_bytes": 4000 * 12 * 17 - 1, "progress": False}
    r = check_near_duplicates({"train": train, "test": test}, **small)
    assert r.status is Status.SKIP and "would hold ~0.0 GB" in r.summary and "near_duplicates=True" in r.summary
    r = check_near_duplicates({"train": train, "test": test}, enabled=True, **small)
    assert r.metrics["leaked_rows"] == 20 and r.metrics["method"].startswith("faiss IVF")
    small["max_auto_index_bytes"] += 1
    assert check_near_duplicates({"train": train, "test": test}, **small).metrics["leaked_rows"] == 20
