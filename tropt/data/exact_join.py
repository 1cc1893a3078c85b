"""Exact copies among the rows of every split, from their fingerprints: one sort finds the repeated rows
(:func:`repeated_rows`), and only those are joined (:func:`exact_join`). Used by ``data.exact_duplicates`` for
every kind of split, Dask splits included (their fingerprints are gathered by the scan)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .hashing import hash_column

_MARK_BLOCK = 1 << 20  # rows per block when marking the repeated rows: a block's temporaries are reused


def repeated_rows(fps: list[np.ndarray]) -> list[np.ndarray]:
    """Per array of ``fps``, the (ascending) positions of the entries whose value occurs more than once over all of
    them. One sort (SIMD in numpy >= 2) finds the repeated values; a bit table on their top bits and a binary search
    of the few rows it lets through mark the rows, a block at a time. Several times faster than hashing every row
    (most rows of a real table are unique), and it allocates one array of the fingerprints' size: on a virtual
    machine, first touches of fresh memory cost more than this arithmetic."""
    s = np.concatenate(fps) if len(fps) != 1 else fps[0].copy()
    s.sort()
    rep = s[1:][s[1:] == s[:-1]]
    del s
    if len(rep) == 0:
        return [np.empty(0, dtype=np.int64) for _ in fps]
    rep = rep[np.concatenate([[True], rep[1:] != rep[:-1]])]
    bits = int(min(26, max(12, np.ceil(np.log2(64 * len(rep))))))
    shift = np.uint64(64 - bits)
    table = np.zeros(1 << bits, dtype=bool)
    table[(rep >> shift).astype(np.intp)] = True
    buf = np.empty(min(_MARK_BLOCK, max(len(f) for f in fps)), dtype=np.uint64)
    out = []
    for fp in fps:
        found = []
        for a in range(0, len(fp), _MARK_BLOCK):
            blk = fp[a:a + _MARK_BLOCK]
            top = np.right_shift(blk, shift, out=buf[:len(blk)]).view(np.int64)  # < 2**26: a valid index
            cand = np.flatnonzero(table[top])
            at = np.searchsorted(rep, blk[cand])
            at[at == len(rep)] = 0
            found.append(cand[rep[at] == blk[cand]] + a)
        out.append(np.concatenate(found) if found else np.empty(0, dtype=np.int64))
    return out


def exact_join(fps: list[np.ndarray], labels: list[pd.Series] | None, label_kind: str | None,
               max_evidence: int) -> dict:
    """Exact copies among the rows of every split, from their fingerprints ``fps[s]`` (and labels, compared by
    ``label_kind``). Only rows whose fingerprint occurs more than once (:func:`repeated_rows`) can pair, repeat or
    conflict, so only those are factorised and have their labels hashed.

    Returns, by row position: ``pairs[(later, earlier)] = (count, first later positions, their first earlier
    positions, fingerprints)``, ``within`` / ``split_distinct`` / ``repeat_rows`` per split, ``distinct``,
    ``conflicting``, ``conflict_rows`` and ``conflict_evidence`` (split index, position, fingerprint of the first
    conflicting rows)."""
    local = repeated_rows(fps)  # each split's repeated rows, by row
    bounds = np.cumsum([0] + [len(f) for f in fps])
    rows = np.concatenate([loc + b for loc, b in zip(local, bounds)])  # their global row numbers, ascending
    codes, uniq = pd.factorize(np.concatenate([f[loc] for f, loc in zip(fps, local)]))
    cut = np.cumsum([0] + [len(loc) for loc in local])
    split_codes = [codes[cut[i]:cut[i + 1]] for i in range(len(fps))]
    firsts = []  # per split: the first row (in the split) holding each repeated value, -1 where none
    for c, loc in zip(split_codes, local):
        f = np.full(len(uniq), -1, dtype=np.int64)
        f[c[::-1]] = loc[::-1]
        firsts.append(f)
    out: dict[str, Any] = {"pairs": {}, "distinct": int(bounds[-1]) - len(rows) + len(uniq), "within": [],
                           "split_distinct": [], "repeat_rows": []}
    for li in range(1, len(fps)):
        for ei in range(li):
            match = firsts[ei][split_codes[li]]
            hit = np.flatnonzero(match >= 0)
            take = local[li][hit[:max_evidence]]
            out["pairs"][(li, ei)] = (len(hit), take, match[hit[:max_evidence]], fps[li][take])
    for i, (c, f) in enumerate(zip(split_codes, firsts)):
        within = len(c) - int((f >= 0).sum())  # unique rows are distinct in their split too
        out["split_distinct"].append(len(fps[i]) - within)
        out["within"].append(within)
        out["repeat_rows"].append(int(np.count_nonzero(np.bincount(c, minlength=len(uniq))[c] > 1)) if within else 0)
    out["conflicting"], out["conflict_rows"] = 0, 0
    out["conflict_evidence"] = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.uint64))
    if labels is not None and len(rows):
        lh = np.concatenate([hash_column(lab.iloc[loc], label_kind) for lab, loc in zip(labels, local)])
        sub = pd.DataFrame({"code": codes, "lab": lh})
        nlab = sub.drop_duplicates().groupby("code").size()
        bad_codes = nlab.index[nlab.to_numpy() > 1].to_numpy()
        bad = rows[np.isin(codes, bad_codes)]
        out["conflicting"], out["conflict_rows"] = len(bad_codes), len(bad)
        first = bad[:max_evidence]
        sid = np.searchsorted(bounds, first, side="right") - 1
        local_first = first - bounds[sid]
        out["conflict_evidence"] = (sid, local_first,
                                    np.array([fps[i][p] for i, p in zip(sid, local_first)], dtype=np.uint64))
    return out
