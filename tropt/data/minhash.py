"""MinHash LSH over normalised character shingles: near-duplicate text beyond exact-search sizes.

Each text (already normalised: lower-cased, punctuation and spacing collapsed) becomes its set of character
``k``-shingles; a MinHash signature estimates the Jaccard similarity of two sets, and locality-sensitive hashing
(bands of ``r`` signature values) makes pairs above a Jaccard threshold collide in some band with high probability.
Every candidate is then verified by the exact Jaccard of the two shingle sets, so no false pair survives.

Signatures are datasketch's (``datasketch.MinHash``: its affine32 permutations of the seed, after the MurmurHash3
finalizer) of a fixed 32-bit hash of each shingle, computed for all texts at once with numpy instead of one Python
object per text; the banding joins bands with a sort, not a dictionary per band, so a million texts fit in memory.
datasketch is an optional extra (``tropt[ann]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MissingDependencyError

SHINGLE = 5  # characters per shingle: a changed word touches ~word length + 4 of them
NUM_PERM = 128
SEED = 1
CHUNK_SHINGLES = 1 << 18  # shingles per signature step (x NUM_PERM x 4 bytes: 128 MB)
TEXT_BLOCK = 50_000  # texts whose shingles are hashed at once
BUCKET_CAP = 200  # earlier rows taken from one band bucket per query: a bucket of boilerplate cannot explode
QUERY_BLOCK = 8192  # later rows joined at once: at most QUERY_BLOCK x bands x BUCKET_CAP candidate pairs in memory


def require_datasketch(why: str):
    """``datasketch``, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import datasketch
    except ImportError as exc:
        raise MissingDependencyError(
            f"{why} needs MinHash LSH, but datasketch is not installed ({exc})",
            "pip install 'tropt[ann]' (faiss-cpu and datasketch), or pass near_duplicates=False to skip the search")\
            from exc
    return datasketch


def _padded(text, k: int = SHINGLE) -> str:
    """A text as shingled: one space either side (first and last words make whole shingles), at least ``k`` long."""
    t = " " + str(text) + " "
    return t + " " * (k - len(t)) if len(t) < k else t


def shingle_hashes(texts, k: int = SHINGLE) -> tuple[np.ndarray, np.ndarray]:
    """The distinct 32-bit hashes of each text's character ``k``-shingles, for all texts at once.

    Returns ``(hashes, starts)``: uint32 hashes grouped by text (sorted within each text) and each text's first
    position (every text has at least one shingle). The hash is fixed arithmetic on the code points (not
    Python's salted ``hash``): the same in every process."""
    padded = [_padded(t, k) for t in np.asarray(texts, dtype=object)]
    n = len(padded)
    if not n:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64)
    lengths = np.fromiter((len(t) for t in padded), dtype=np.int64, count=n)
    codes = np.frombuffer("".join(padded).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    count = lengths - k + 1  # shingles per text (>= 1)
    row = np.repeat(np.arange(n), count)
    # a shingle starts at every position of its text that leaves k characters: skip the last k - 1 of each text
    first = np.arange(row.size) + np.repeat(np.arange(n) * (k - 1), count)
    h = np.zeros(row.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            h = (h ^ codes[first + j]) * np.uint64(0x100000001B3)  # FNV-1a style over 64 bits
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(29)
    key = (row.astype(np.uint64) << np.uint64(32)) | (h & np.uint64(0xFFFFFFFF))
    # one entry per distinct shingle of a text, grouped by text (a sort: numpy's hash-based unique is slower)
    key.sort()
    key = key[np.r_[True, key[1:] != key[:-1]]]
    rows = (key >> np.uint64(32)).astype(np.int64)
    starts = np.searchsorted(rows, np.arange(n))
    return (key & np.uint64(0xFFFFFFFF)).astype(np.uint32), starts


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (what datasketch applies before its affine permutations)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def permutations(num_perm: int = NUM_PERM, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutation parameters ``(a, b)`` for ``num_perm`` and ``seed``."""
    ds = require_datasketch("near-duplicate text search")
    try:
        a, b = ds.MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
    except TypeError as exc:  # datasketch < 2.0: no affine32 scheme
        raise MissingDependencyError(f"datasketch {getattr(ds, '__version__', '?')} "
                                     f"is too old for tropt's MinHash ({exc})",
                                     "pip install 'datasketch>=2.0' (or 'tropt[ann]')") from exc
    return np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)


def signatures(texts, num_perm: int = NUM_PERM, seed: int = SEED, k: int = SHINGLE) -> np.ndarray:
    """uint32 MinHash signatures ``(n, num_perm)`` of the texts' shingle sets; row i equals the ``hashvalues`` of
    ``datasketch.MinHash(num_perm, seed, hashfunc=<the shingle hash>)`` updated with text i's shingles."""
    a, b = permutations(num_perm, seed)
    texts = np.asarray(texts, dtype=object)
    out = np.empty((len(texts), num_perm), dtype=np.uint32)
    for s in range(0, len(texts), TEXT_BLOCK):  # texts per block: bounds the shingle arrays
        out[s:s + TEXT_BLOCK] = _block_signatures(texts[s:s + TEXT_BLOCK], a, b, k)
    return out


def _block_signatures(texts: np.ndarray, a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    hashes, starts = shingle_hashes(texts, k)
    n = len(starts)
    out = np.empty((n, len(a)), dtype=np.uint32)
    mixed = _fmix32(hashes)
    ends = np.append(starts[1:], hashes.size)
    t = 0
    with np.errstate(over="ignore"):  # the permutations are arithmetic modulo 2^32
        while t < n:  # whole texts per step, about CHUNK_SHINGLES shingles
            stop = max(int(np.searchsorted(starts, starts[t] + CHUNK_SHINGLES, side="right")), t + 1)
            s0, s1 = starts[t], ends[stop - 1]
            phv = a[:, None] * mixed[None, s0:s1] + b[:, None]  # (permutations, shingles): contiguous rows
            out[t:stop] = np.minimum.reduceat(phv, starts[t:stop] - s0, axis=1).T
            t = stop
    return out


def bands_for(threshold: float, num_perm: int = NUM_PERM, target: float = 0.995) -> tuple[int, int]:
    """``(bands, rows)``: the most rows per band (fewest chance candidates) for which a pair of Jaccard
    ``threshold`` still collides in at least one band with probability ``target``."""
    for r in range(min(num_perm, 16), 0, -1):
        b = num_perm // r
        if 1.0 - (1.0 - threshold ** r) ** b >= target:
            return b, r
    return num_perm, 1


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64 key of each band's ``rows`` signature values, ``(n, bands)``: equal bands give equal keys."""
    s = sig[:, :bands * rows].astype(np.uint64).reshape(len(sig), bands, rows)
    key = np.zeros((len(sig), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows):
            key = (key ^ s[:, :, j]) * np.uint64(0x9E3779B97F4A7C15)
            key ^= key >> np.uint64(31)
    return key


def band_index(earlier_keys: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per band, the earlier rows sorted by their key and the sorted keys: what :func:`candidates` joins against."""
    out = []
    for j in range(earlier_keys.shape[1]):
        order = np.argsort(earlier_keys[:, j], kind="stable")
        out.append((order, earlier_keys[order, j]))
    return out


def candidates(later_keys: np.ndarray, index: list, cap: int = BUCKET_CAP) -> tuple[np.ndarray, np.ndarray, int]:
    """Distinct (later row, earlier row) pairs that share a band key, by a sorted join per band.

    Returns the pairs and how many were left out because one bucket held more than ``cap`` earlier rows."""
    pairs, dropped = [], 0
    for j, (order, sk) in enumerate(index):
        lo = np.searchsorted(sk, later_keys[:, j], "left")
        hi = np.searchsorted(sk, later_keys[:, j], "right")
        cnt = np.minimum(hi - lo, cap)
        dropped += int((hi - lo - cnt).sum())
        q = np.repeat(np.arange(len(later_keys)), cnt)
        if not q.size:
            continue
        within = np.arange(q.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        e = order[lo[q] + within]
        pairs.append((q.astype(np.uint64) << np.uint64(32)) | e.astype(np.uint64))
    if not pairs:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), dropped
    u = np.sort(np.concatenate(pairs))
    u = u[np.r_[True, u[1:] != u[:-1]]]
    return (u >> np.uint64(32)).astype(np.int64), (u & np.uint64(0xFFFFFFFF)).astype(np.int64), dropped


def estimated_jaccard(sig_a: np.ndarray, rows_a: np.ndarray, sig_b: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
    """MinHash estimate of the Jaccard similarity of the row pairs ``(sig_a[rows_a[i]], sig_b[rows_b[i]])``: the
    share of equal signature values (gathered in blocks: millions of candidates stay bounded in memory)."""
    out = np.empty(len(rows_a))
    step = 1 << 16
    for s in range(0, len(rows_a), step):
        out[s:s + step] = np.mean(sig_a[rows_a[s:s + step]] == sig_b[rows_b[s:s + step]], axis=1)
    return out


def shingle_set(text: str, k: int = SHINGLE) -> set:
    """The text's character ``k``-shingles as strings (what :func:`shingle_hashes` hashes)."""
    t = _padded(text, k)
    return {t[i:i + k] for i in range(len(t) - k + 1)}


def exact_jaccard(a_texts, b_texts, k: int = SHINGLE) -> np.ndarray:
    """Exact Jaccard similarity of the shingle sets of each text pair (strings, no hashing: no collisions)."""
    out = np.empty(len(a_texts))
    for i, (x, y) in enumerate(zip(a_texts, b_texts)):
        sx, sy = shingle_set(x, k), shingle_set(y, k)
        out[i] = len(sx & sy) / len(sx | sy) if (sx or sy) else 1.0
    return out


@dataclass
class TextMatches:
    """Each later text's most similar earlier text among the verified LSH candidates."""

    jaccard: np.ndarray  # float64 per later row: exact Jaccard of its best verified candidate (0 when none)
    match: np.ndarray  # int64 per later row: that earlier row (0 when none)
    candidates: int  # distinct candidate pairs from the bands
    verified: int  # pairs whose exact Jaccard was computed
    capped: int  # candidates left out of oversized buckets
    bands: int
    rows: int

    def collision_probability(self, jaccard: float) -> float:
        """Probability that a pair of this Jaccard similarity becomes a candidate (shares a band)."""
        return float(1.0 - (1.0 - jaccard ** self.rows) ** self.bands)

    @property
    def method(self) -> str:
        return f"MinHash LSH ({NUM_PERM} permutations, {self.bands} bands of {self.rows}, {SHINGLE}-character shingles)"


def near_texts(later_texts, earlier_texts, threshold: float, earlier_sig: np.ndarray | None = None,
               margin: float = 0.15) -> TextMatches:
    """For every later text, the earlier text with the largest exact shingle Jaccard among the LSH candidates
    whose MinHash estimate is within ``margin`` of ``threshold`` (the estimate's standard error at 128
    permutations is <= 0.045, so a true pair at the threshold is kept with probability ~0.9996)."""
    b, r = bands_for(threshold)
    later_sig = signatures(later_texts)
    earlier_sig = signatures(earlier_texts) if earlier_sig is None else earlier_sig
    later_keys, index = band_keys(later_sig, b, r), band_index(band_keys(earlier_sig, b, r))
    qs, es, seen, capped = [], [], 0, 0
    for a in range(0, len(later_sig), QUERY_BLOCK):  # later rows per join: bounds the candidate arrays
        q, e, dropped = candidates(later_keys[a:a + QUERY_BLOCK], index)
        q += a
        keep = estimated_jaccard(later_sig, q, earlier_sig, e) >= threshold - margin
        qs.append(q[keep])
        es.append(e[keep])
        seen, capped = seen + q.size, capped + dropped
    q = np.concatenate(qs) if qs else np.empty(0, dtype=np.int64)
    e = np.concatenate(es) if es else np.empty(0, dtype=np.int64)
    later_arr = np.asarray(later_texts, dtype=object)
    earlier_arr = np.asarray(earlier_texts, dtype=object)
    jac = exact_jaccard(later_arr[q], earlier_arr[e])
    best = np.zeros(len(later_sig))
    match = np.zeros(len(later_sig), dtype=np.int64)
    if q.size:
        order = np.lexsort((e, -jac, q))  # per later row: largest Jaccard first, then the earliest row
        q, e, jac = q[order], e[order], jac[order]
        first = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
        best[q[first]], match[q[first]] = jac[first], e[first]
    return TextMatches(best, match, seen, int(q.size), capped, b, r)
