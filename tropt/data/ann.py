"""Approximate nearest neighbours with FAISS for data.near_duplicates beyond exact-search sizes.

An inverted-file index (IVF-Flat, inner product on the same unit vectors the exact search uses) on the earlier
split, its recall measured against exact brute-force search on a sample of query rows, and average hashes in
a multi-index binary hash table (exact for every Hamming distance below its number of tables). FAISS's GPU build is
used where it sees a GPU. faiss is an optional extra (``tropt[ann]``), imported only here and only when needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MissingDependencyError

RECALL_TOLERANCE = 1e-5  # an approximate neighbour as similar as the exact one, within float32 rounding, is a hit
PROBES = 2000  # probes at the threshold measuring the recall (besides the sampled real rows)
SEARCH_ROWS = 65_536  # query rows per search call (bounds the result buffers and drives the progress bar)


def require_faiss(why: str) -> Any:
    """``faiss``, or a :class:`MissingDependencyError` saying why it is needed and naming the extra."""
    try:
        import faiss
    except ImportError as exc:
        raise MissingDependencyError(
            f"{why} needs an approximate nearest-neighbour index, but faiss is not installed ({exc})",
            "pip install 'tropt[ann]' (faiss-cpu and datasketch), or pass near_duplicates=False to skip the search")\
            from exc
    return faiss


@dataclass
class Index:
    """An IVF-Flat index on one split's unit vectors and how it searches."""

    index: Any
    n: int
    nlist: int
    nprobe: int
    gpu: bool

    @property
    def method(self) -> str:
        return f"faiss IVF-Flat{' (GPU)' if self.gpu else ''}, nlist={self.nlist}, nprobe={self.nprobe}"


def ivf_lists(n: int) -> int:
    """Inverted lists for ``n`` vectors: ~sqrt(n), at least 1, and at least 39 training points per list (fewer makes
    k-means warn). Adding the rows costs n x lists and searching each query nprobe/lists x n: with about as many
    query rows as reference rows and a small nprobe, sqrt(n) keeps both small (FAISS's guideline of 4-16 sqrt(n)
    favours the search over building: on 800k x 65 reference rows and 200k queries here, 3,577 lists searched 27 at a
    time took 47 s to build and search, 894 lists searched 4 at a time 6 s)."""
    return int(max(1, min(np.sqrt(n), n // 39)))


def build(ref: np.ndarray, nprobe: int | None = None, seed: int = 0, train_rows: int = 40) -> Index:
    """An inner-product IVF-Flat index on ``ref`` (float32 unit rows). ``nprobe`` lists are searched per query
    (default 1; :func:`tune` raises it until probes at the threshold are found): a near copy sits in its
    original's list or a neighbouring one, so a few lists find it while most of the data is never touched. k-means
    trains on ``train_rows`` points per list."""
    faiss = require_faiss(f"near-duplicate search among {len(ref):,} rows")
    ref = np.ascontiguousarray(ref, dtype=np.float32)
    n, d = ref.shape
    nlist = ivf_lists(n)
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(seed)
    train = ref[np.sort(rng.choice(n, size=min(n, nlist * train_rows), replace=False))]
    index.cp.seed = seed  # k-means initialisation: the same index for the same data
    index.cp.niter = 10  # rough centroids suffice: a near copy shares its original's list whatever the partition
    index.train(train)
    index.add(ref)
    probe = int(min(nlist, nprobe if nprobe is not None else 1))
    index.nprobe = probe
    gpu = faiss.get_num_gpus() > 0
    if gpu:  # the GPU build: the same index, searched on every visible GPU
        index = faiss.index_cpu_to_all_gpus(index)
    return Index(index, n, nlist, probe, gpu)


def search(index: Index, query: np.ndarray, k: int = 1, progress: bool = False,
           desc: str = "") -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest inner products of each query row in ``index`` and their positions (``-1``: none found)."""
    from tqdm.auto import tqdm

    query = np.ascontiguousarray(query, dtype=np.float32)
    sims = np.full((len(query), k), -np.inf, dtype=np.float32)
    pos = np.full((len(query), k), -1, dtype=np.int64)
    for a in tqdm(range(0, len(query), SEARCH_ROWS), desc=desc or "tropt: approximate neighbours",
                  disable=not progress, leave=False):
        s, i = index.index.search(query[a:a + SEARCH_ROWS], k)
        sims[a:a + SEARCH_ROWS], pos[a:a + SEARCH_ROWS] = s, i
    return sims, pos


def nearest(index: Index, query: np.ndarray, progress: bool = False, desc: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Each query row's approximate nearest reference row: similarity (clipped to [-1, 1]) and position.

    A query whose probed lists are all empty gets similarity -1 and position 0 (no near duplicate)."""
    sims, pos = search(index, query, 1, progress, desc)
    best, arg = sims[:, 0], pos[:, 0]
    none = arg < 0
    return np.clip(np.where(none, -1.0, best), -1.0, 1.0).astype(np.float32), np.where(none, 0, arg)


def exact(ref: np.ndarray, query: np.ndarray, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Exact largest inner product of each query row among ``ref`` and its position: brute force, by tropt's exact
    search (blocked torch matrix products, :func:`tropt.data.neighbours.nearest`), the search the index replaces."""
    from . import neighbours as nb

    return nb.nearest(query, ref, device)


def sample_rows(n: int, size: int, seed: int = 0) -> np.ndarray:
    """``size`` distinct query positions out of ``n`` (all when ``size >= n``), sorted; seeded, so reproducible."""
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


@dataclass
class Recall:
    """How well the index's nearest neighbours match exact search on a sample of query rows."""

    sample: int  # query rows compared
    recall: float  # share whose approximate neighbour is as similar as the exact one (recall@1)
    near_queries: int  # sampled rows whose exact nearest neighbour reaches the threshold
    near_recall: float | None  # share of those the index also found at or above the threshold (None: none sampled)


def recall(ref: np.ndarray, query: np.ndarray, approx_best: np.ndarray, threshold: float, size: int = 1000,
           seed: int = 0, device: str = "cpu") -> Recall:
    """Recall of the approximate search (``approx_best``: its similarity per query row) against exact brute-force
    search on ``size`` sampled query rows: recall@1 (ties within float32 rounding count as hits) and, what the
    verdict depends on, the share of the sampled near duplicates (exact similarity >= ``threshold``) it found."""
    rows = sample_rows(len(query), size, seed)
    if not len(rows):
        return Recall(0, 1.0, 0, None)
    truth, _ = exact(ref, query[rows], device)
    got = approx_best[rows]
    hit = got >= truth - RECALL_TOLERANCE
    near = truth >= threshold
    near_recall = float(np.mean(got[near] >= threshold)) if near.any() else None
    return Recall(len(rows), float(np.mean(hit)), int(near.sum()), near_recall)


# ------------------------------------------------------------------------------------------ average hashes (binary)
def pack_bits(bits: np.ndarray) -> np.ndarray:
    """±1 hashes (n, nbits) as packed uint8 codes (n, nbits / 8), what FAISS's binary indexes take."""
    return np.packbits(bits > 0, axis=1)


def hamming_nearest(query_bits: np.ndarray, ref_bits: np.ndarray, max_distance: int,
                    progress: bool = False) -> tuple[np.ndarray, np.ndarray, str]:
    """Each query hash's nearest reference hash by Hamming distance, exact for every distance up to
    ``max_distance``: a multi-index hash table (``IndexBinaryMultiHash``) with ``max_distance + 1`` disjoint
    substrings, so a pair differing in at most ``max_distance`` bits agrees exactly on at least one substring
    (pigeonhole) and is a candidate. Beyond that distance a query may get no neighbour: distance ``nbits + 1``."""
    from tqdm.auto import tqdm

    faiss = require_faiss(f"average-hash search among {len(ref_bits):,} images")
    nbits = ref_bits.shape[1]
    tables = int(min(nbits, max(1, max_distance + 1)))
    width = int(min(24, nbits // tables))  # bits per substring: disjoint substrings, buckets of a useful size
    index = faiss.IndexBinaryMultiHash(nbits, tables, width)
    index.add(pack_bits(ref_bits))
    q = pack_bits(query_bits)
    dist = np.empty(len(q), dtype=np.int64)
    pos = np.empty(len(q), dtype=np.int64)
    for a in tqdm(range(0, len(q), SEARCH_ROWS), desc="tropt: hash index", disable=not progress, leave=False):
        d, i = index.search(q[a:a + SEARCH_ROWS], 1)
        dist[a:a + SEARCH_ROWS], pos[a:a + SEARCH_ROWS] = d[:, 0], i[:, 0]
    none = pos < 0
    dist[none], pos[none] = nbits + 1, 0
    return dist, pos, f"faiss IndexBinaryMultiHash, {tables} tables of {width} bits"


def hamming_self_nearest(bits: np.ndarray, max_queries: int = 2048) -> np.ndarray:
    """Hamming distance of up to ``max_queries`` evenly spaced hashes of ``bits`` to their nearest *other* hash,
    by brute force (``IndexBinaryFlat``): the yardstick of the hash threshold, whatever its size."""
    faiss = require_faiss(f"average-hash search among {len(bits):,} images")
    n = len(bits)
    if n < 2:
        return np.empty(0, dtype=np.int64)
    idx = np.unique(np.linspace(0, n - 1, min(n, max_queries)).round().astype(np.int64))
    flat = faiss.IndexBinaryFlat(bits.shape[1])
    codes = pack_bits(bits)
    flat.add(codes)
    d, i = flat.search(codes[idx], 2)
    return np.where(i[:, 0] == idx, d[:, 1], d[:, 0]).astype(np.int64)


def probes(ref: np.ndarray, threshold: float, size: int, seed: int = 0) -> np.ndarray:
    """``size`` sampled non-zero rows of ``ref`` each turned by exactly ``arccos(threshold)`` in a random
    direction: queries whose exact nearest neighbour is known to be at least ``threshold`` similar (the row they
    came from), so the index's recall at the threshold can be measured even when the data hold no near copy."""
    nonzero = np.flatnonzero(np.einsum("ij,ij->i", ref, ref) > 0.5)
    if not nonzero.size or size <= 0:
        return np.empty((0, ref.shape[1]), dtype=np.float32)
    rows = nonzero[sample_rows(len(nonzero), size, seed)]
    r = ref[rows].astype(np.float64)
    u = np.random.default_rng(seed).standard_normal(r.shape)
    u -= np.einsum("ij,ij->i", u, r)[:, None] * r  # orthogonal to the row
    u /= np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)
    t = float(np.clip(threshold, -1.0, 1.0))
    return (t * r + np.sqrt(1.0 - t * t) * u).astype(np.float32)


def probe_recall(index: Index, ref: np.ndarray, threshold: float, size: int, seed: int = 0) -> tuple[int, int]:
    """(probes the index found at or above ``threshold``, probes): see :func:`probes`."""
    p = probes(ref, threshold, size, seed)
    if not len(p):
        return 0, 0
    best, _ = nearest(index, p)
    return int(np.sum(best >= threshold - RECALL_TOLERANCE)), len(p)


def tune(index: Index, ref: np.ndarray, threshold: float, size: int = 2000, target: float = 0.995) -> Index:
    """Double ``nprobe`` until probes at ``threshold`` are found at rate ``target`` (or every list is searched)."""
    while True:
        found, total = probe_recall(index, ref, threshold, size, seed=1)  # other probes than the reported ones
        if not total or found / total >= target or index.nprobe >= index.nlist:
            return index
        index.nprobe = min(index.nlist, 2 * index.nprobe)
        _set_nprobe(index.index, index.nprobe)


def _set_nprobe(index: Any, nprobe: int) -> None:
    try:
        index.nprobe = nprobe
    except AttributeError:  # a GPU index: set through the parameter space
        import faiss

        faiss.GpuParameterSpace().set_index_parameter(index, "nprobe", nprobe)
