"""The exact-copy join and the row fingerprints' fast paths against plain definitions (issue #22 made both faster:
a sort finds the repeated fingerprints before any hashing, and plain numeric columns are fingerprinted block by
block). Each test compares with a straightforward Python or column-by-column computation on data with known
repeats, across block and split boundaries."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pytest

from tropt.data.columns import column_kind
from tropt.data.exact_join import exact_join, repeated_rows
from tropt.data.hashing import _BLOCK, _GOLD, _mix_, _name_seed, hash_column, hash_rows


def naive_join(fps: list[np.ndarray], labels: list[list] | None, max_evidence: int) -> dict:
    """The join's numbers by dictionaries, row by row."""
    first_at = [dict() for _ in fps]
    for s, f in enumerate(fps):
        for i, v in enumerate(f.tolist()):
            first_at[s].setdefault(v, i)
    pairs = {}
    for li in range(1, len(fps)):
        for ei in range(li):
            hits = [(i, first_at[ei][v]) for i, v in enumerate(fps[li].tolist()) if v in first_at[ei]]
            pairs[(li, ei)] = (len(hits), [h[0] for h in hits[:max_evidence]], [h[1] for h in hits[:max_evidence]])
    counts = [Counter(f.tolist()) for f in fps]
    labs_of = defaultdict(set)
    everywhere = Counter(v for f in fps for v in f.tolist())
    conflict_rows = []
    if labels is not None:
        for f, lab in zip(fps, labels):
            for v, y in zip(f.tolist(), lab):
                labs_of[v].add(y)
        for s, f in enumerate(fps):
            conflict_rows += [(s, i) for i, v in enumerate(f.tolist()) if everywhere[v] > 1 and len(labs_of[v]) > 1]
    return {
        "pairs": pairs, "distinct": len(everywhere),
        "within": [len(f) - len(c) for f, c in zip(fps, counts)],
        "split_distinct": [len(c) for c in counts],
        "repeat_rows": [sum(1 for v in f.tolist() if c[v] > 1) for f, c in zip(fps, counts)],
        "conflicting": sum(1 for v, ys in labs_of.items() if len(ys) > 1 and everywhere[v] > 1),
        "conflict_rows": len(conflict_rows), "conflict_first": conflict_rows[:max_evidence],
    }


@pytest.mark.parametrize("seed", range(6))
def test_exact_join_matches_a_row_by_row_join(seed):
    rng = np.random.default_rng(seed)
    vocab = [40, 400, 4000, 10**9][seed % 4]  # from mostly repeats to none
    fps = [(rng.integers(0, vocab, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) for n in (700, 300, 1)]
    labels = [list(rng.integers(0, 3, len(f))) for f in fps] if seed % 2 else None
    want = naive_join(fps, labels, max_evidence=25)
    got = exact_join(fps, [pd.Series(y) for y in labels] if labels else None, "numeric" if labels else None, 25)
    for key in ("distinct", "within", "split_distinct", "repeat_rows", "conflicting", "conflict_rows"):
        assert got[key] == want[key], key
    for pair, (count, later, earlier) in want["pairs"].items():
        g = got["pairs"][pair]
        assert (g[0], list(g[1]), list(g[2])) == (count, later, earlier), pair
        assert list(g[3]) == [fps[pair[0]][i] for i in later]  # the evidence's fingerprints are the later rows'
    sid, pos, fp = got["conflict_evidence"]
    assert list(zip(sid.tolist(), pos.tolist())) == want["conflict_first"]
    assert all(fps[s][p] == v for s, p, v in zip(sid, pos, fp))


def repeated_mask(fp: np.ndarray) -> np.ndarray:
    out = np.zeros(len(fp), dtype=bool)
    out[repeated_rows([fp])[0]] = True
    return out


def test_repeated_mask_marks_exactly_the_repeated_values():
    rng = np.random.default_rng(3)
    fp = rng.integers(0, 2**63, 50_000).astype(np.uint64)
    fp[rng.choice(len(fp), 300, replace=False)] = fp[rng.choice(len(fp), 300, replace=False)]  # planted repeats
    counts = Counter(fp.tolist())
    want = np.array([counts[v] > 1 for v in fp.tolist()])
    assert want.sum() >= 300
    np.testing.assert_array_equal(repeated_mask(fp), want)
    assert not repeated_mask(np.arange(10, dtype=np.uint64)).any()


def column_by_column(frame: pd.DataFrame, kinds: dict) -> np.ndarray:
    """The fingerprint's definition: the sum of each column's mixed, name-seeded value hashes, mixed once more."""
    acc = np.zeros(len(frame), dtype=np.uint64)
    for c in frame.columns:
        h = hash_column(frame[c], kinds[c])
        h ^= _name_seed(c)
        acc += _mix_(h)
    acc += _GOLD
    return _mix_(acc)


@pytest.mark.parametrize("rows", [0, 1, _BLOCK - 1, _BLOCK, 2 * _BLOCK + 17])
def test_block_by_block_fingerprints_equal_the_column_by_column_definition(rows):
    rng = np.random.default_rng(rows)
    frame = pd.DataFrame({
        "f64": np.where(rng.random(rows) < 0.1, np.nan, rng.normal(size=rows)),
        "f32": rng.normal(size=rows).astype(np.float32),
        "zero": np.where(rng.random(rows) < 0.5, -0.0, 0.0),
        "i64": rng.integers(-(2**62), 2**62, rows),
        "u8": rng.integers(0, 255, rows).astype(np.uint8),
        "flag": rng.random(rows) < 0.5,
        "nullable": pd.array(np.where(rng.random(rows) < 0.2, None, rng.integers(0, 9, rows)), dtype="Int64"),
        "word": rng.choice(np.array(["a", "b", None], dtype=object), rows),
    })
    kinds = {c: column_kind(frame[c], "t") for c in frame}
    np.testing.assert_array_equal(hash_rows(frame, list(frame), kinds), column_by_column(frame, kinds))


def test_fingerprints_stay_canonical_on_the_fast_path():
    """-0.0 and 0.0, NaN and a missing value, an int and the equal float give one fingerprint."""
    a = pd.DataFrame({"x": [0.0, np.nan, 3.0], "y": np.array([1, 2, 3], dtype=np.int32)})
    b = pd.DataFrame({"x": [-0.0, None, 3], "y": np.array([1.0, 2.0, 3.0], dtype=np.float32)})
    kinds = {"x": "numeric", "y": "numeric"}
    np.testing.assert_array_equal(hash_rows(a, ["x", "y"], kinds), hash_rows(b, ["x", "y"], kinds))
    assert len(set(hash_rows(a, ["x", "y"], kinds).tolist())) == 3


def test_row_positions_index_like_the_array_they_replace():
    from tropt.data.split_data import RowPositions

    pos, ref = RowPositions(10), np.arange(10)
    assert len(pos) == 10
    for i in ([3, 0, 9], np.array([], dtype=np.int64), np.array([-1, -10]), ref % 3 == 0, slice(2, 8, 3)):
        np.testing.assert_array_equal(pos[i], ref[i])
    assert pos[4] == 4 and pos[-1] == 9 and isinstance(pos[np.int64(4)], int)
    np.testing.assert_array_equal(np.asarray(pos), ref)
    for bad in ([10], [-11], np.ones(3, dtype=bool)):
        with pytest.raises(IndexError):
            pos[bad]
