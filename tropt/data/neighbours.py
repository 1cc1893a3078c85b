"""Exact cosine nearest neighbours across splits, in chunks with torch matrix products; image average hashes;
hashed-trigram vectors of text columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

CHUNK_BYTES = 1 << 27  # similarity block size (query rows x reference rows x 4 bytes)


def pick_device(device: str | None) -> str:
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def finite_mean_std(x: np.ndarray, with_std: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-column float64 mean (and std) of ``x`` over its finite values only, in row chunks (no full copy).

    One inf (or a value whose square overflows float32) must not make the statistics, and with them every
    standardised vector, NaN. A column without finite values gets mean 0 (and std NaN).
    """
    x2 = x.reshape(len(x), -1)
    d = x2.shape[1]
    step = max(1, (1 << 22) // max(d, 1))
    total, count = np.zeros(d), np.zeros(d)
    for a in range(0, len(x2), step):
        v = x2[a:a + step].astype(np.float64)
        ok = np.isfinite(v)
        total += np.where(ok, v, 0.0).sum(axis=0)
        count += ok.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, 0.0)
    if not with_std:
        return mean, None
    sq = np.zeros(d)
    for a in range(0, len(x2), step):
        v = x2[a:a + step].astype(np.float64)
        sq += np.where(np.isfinite(v), (v - mean) ** 2, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.where(count > 0, np.sqrt(sq / count), np.nan)
    return mean, std


def prepare(x: np.ndarray, mean: np.ndarray, scale: np.ndarray | None, offset: float | None = None) -> np.ndarray:
    """Centre (and scale) with the reference statistics, fill missing and ±inf with the mean, L2-normalise rows
    (new array). ``offset`` appends that constant component before normalising, so that the cosine also sees
    magnitude: without it, rows on one ray from the mean (z and 1.5 z) have similarity 1 in any dimension."""
    z = np.empty((len(x), x.shape[1] + (offset is not None)), dtype=np.float32)
    z[:, :x.shape[1]] = x
    z[:, :x.shape[1]] -= mean
    if scale is not None:
        z[:, :x.shape[1]] /= scale
    np.nan_to_num(z, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    if offset is not None:
        z[:, -1] = offset
    return _unit_rows(z)


def _unit_rows(z: np.ndarray) -> np.ndarray:
    """``z`` with every non-zero row scaled to unit L2 norm, in place (zero rows stay zero)."""
    norm = np.linalg.norm(z, axis=1, keepdims=True)
    norm[norm == 0] = 1.0
    z /= norm
    return z


def nearest(query: np.ndarray, ref: np.ndarray, device: str = "cpu", progress: bool = False, desc: str = "",
            clip: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """For each query row, the largest dot product with a reference row and that row's position (exact search).

    ``clip`` limits the products to [-1, 1] (cosines of unit vectors); raw dot products (±1 hashes) need ``False``."""
    import torch
    from tqdm.auto import tqdm

    r = torch.from_numpy(np.ascontiguousarray(ref)).to(device)
    q_all = torch.from_numpy(np.ascontiguousarray(query))
    step = max(1, CHUNK_BYTES // (4 * max(1, len(ref))))
    best = np.empty(len(query), dtype=np.float32)
    arg = np.empty(len(query), dtype=np.int64)
    with torch.no_grad():
        for a in tqdm(range(0, len(query), step), desc=desc or "tropt: nearest neighbours", disable=not progress,
                      leave=False):
            q = q_all[a:a + step].to(device)
            sims = q @ r.T
            v, i = sims.max(dim=1)
            best[a:a + step] = v.cpu().numpy()
            arg[a:a + step] = i.cpu().numpy()
    return (np.clip(best, -1.0, 1.0) if clip else best), arg


def pair_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 cosine of row pairs of unit vectors, as ``1 - |a - b|^2 / 2``: a float32 dot product cannot resolve
    similarities within ~1e-7 of 1 (identical rows may score 0.99999994), the distance can. Zero rows: the dot."""
    out = np.empty(len(a))
    step = max(1, (1 << 20) // max(a.shape[1], 1))
    for s in range(0, len(a), step):
        x, y = a[s:s + step].astype(np.float64), b[s:s + step].astype(np.float64)
        dot = np.einsum("ij,ij->i", x, y)
        unit = (np.einsum("ij,ij->i", x, x) > 0) & (np.einsum("ij,ij->i", y, y) > 0)
        out[s:s + step] = np.where(unit, 1.0 - 0.5 * np.einsum("ij,ij->i", x - y, x - y), dot)
    return np.clip(out, -1.0, 1.0)


def self_nearest(ref: np.ndarray, max_queries: int = 2048, device: str = "cpu") -> np.ndarray:
    """Similarity of up to ``max_queries`` evenly spaced rows of ``ref`` to their nearest *other* row of ``ref``.

    How close unrelated rows of one split typically are, measured without the later split: a later split made
    mostly of near copies would otherwise set its own yardstick and hide itself.
    """
    idx, best = _self_nearest_rows(ref, max_queries, device)
    return pair_similarity(ref[idx], ref[best]) if len(idx) else np.empty(0, dtype=np.float64)


def _self_nearest_rows(ref: np.ndarray, max_queries: int, device: str) -> tuple[np.ndarray, np.ndarray]:
    """Positions of up to ``max_queries`` evenly spaced rows of ``ref`` and of each one's largest-dot-product other
    row."""
    import torch

    n = len(ref)
    if n < 2:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    idx = np.unique(np.linspace(0, n - 1, min(n, max_queries)).round().astype(np.int64))
    r = torch.from_numpy(np.ascontiguousarray(ref)).to(device)
    step = max(1, CHUNK_BYTES // (4 * n))
    best = np.empty(len(idx), dtype=np.int64)
    with torch.no_grad():
        for a in range(0, len(idx), step):
            rows = torch.from_numpy(idx[a:a + step]).to(device)
            sims = r[rows] @ r.T
            sims[torch.arange(len(rows), device=device), rows] = -float("inf")  # not itself
            best[a:a + step] = sims.argmax(dim=1).cpu().numpy()
    return idx, best


def pooled_gray(x: np.ndarray, shape: tuple, side: int = 16) -> np.ndarray:
    """Grayscale ``side x side`` average-pooled thumbnails (float32 ``(n, side*side)``) of flattened images with
    per-sample ``shape`` ((H,W), (C,H,W) or (H,W,C)): what the average hash thresholds."""
    import torch
    from torch.nn import functional as F

    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(len(x), *shape)
    if t.dim() == 3:
        t = t.unsqueeze(1)
    elif shape[0] not in (1, 3, 4) and shape[-1] in (1, 3, 4):
        t = t.permute(0, 3, 1, 2)
    out = []
    for a in range(0, len(t), 4096):
        g = t[a:a + 4096].mean(dim=1, keepdim=True)
        out.append(F.adaptive_avg_pool2d(g, side).flatten(1))
    return torch.cat(out).numpy() if out else np.zeros((0, side * side), dtype=np.float32)


def average_hash(x: np.ndarray, shape: tuple, side: int = 16) -> np.ndarray:
    """±1 average-hash bits (side*side) of flattened images with per-sample ``shape`` ((H,W), (C,H,W) or (H,W,C))."""
    small = pooled_gray(x, shape, side)
    return np.where(small > small.mean(axis=1, keepdims=True), 1.0, -1.0).astype(np.float32)


def hamming_nearest(query_bits: np.ndarray, ref_bits: np.ndarray, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Smallest Hamming distance of each ±1 query hash to a reference hash (via a matrix product), and its position."""
    # Raw dot products (not clipped to [-1, 1] like cosines): distance = (bits - dot) / 2, exact in float32 for
    # the 256 bits used here.
    dot, arg = nearest(query_bits, ref_bits, device, clip=False)
    nbits = query_bits.shape[1]
    return np.rint((nbits - dot.astype(np.float64)) / 2).astype(np.int64), arg


def hamming_self_nearest(bits: np.ndarray, max_queries: int = 2048, device: str = "cpu") -> np.ndarray:
    """Hamming distance of up to ``max_queries`` evenly spaced ±1 hashes of ``bits`` to their nearest *other* hash
    of ``bits``: how close unrelated samples of one split typically hash, measured without the later split."""
    idx, best = _self_nearest_rows(bits, max_queries, device)
    return np.count_nonzero(bits[idx] != bits[best], axis=1).astype(np.int64)


def standardise_rows(x: np.ndarray) -> np.ndarray:
    """Each row minus its own mean, L2-normalised (float32, new array): cosines of these are per-sample Pearson
    correlations, blind to brightness (an added constant) and contrast (a positive factor), like an average hash."""
    z = np.nan_to_num(np.asarray(x, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    z = z - z.mean(axis=1, keepdims=True)
    return _unit_rows(z)


def thumbnail(x: np.ndarray, shape: tuple, side: int = 48) -> np.ndarray:
    """A small (side, side[, 3]) float image in [0, 1] for plots."""
    import torch
    from torch.nn import functional as F

    t = torch.from_numpy(np.asarray(x, dtype=np.float32)).reshape(*shape)
    if t.dim() == 2:
        t = t.unsqueeze(0)
    elif shape[0] not in (1, 3, 4) and shape[-1] in (1, 3, 4):
        t = t.permute(2, 0, 1)
    t = t[:3] if t.shape[0] >= 3 else t[:1]
    h, w = t.shape[1:]
    if max(h, w) > side:
        t = F.interpolate(t.unsqueeze(0), size=(side * h // max(h, w) or 1, side * w // max(h, w) or 1), mode="area")[0]
    lo, hi = float(t.min()), float(t.max())
    t = (t - lo) / (hi - lo) if hi > lo else torch.zeros_like(t)
    return (t[0] if t.shape[0] == 1 else t.permute(1, 2, 0)).numpy()


TEXT_DIM = 256  # hashed character-trigram buckets per row


def normalise_text(frame: pd.DataFrame, columns: list) -> pd.Series:
    """Each row's text columns joined, lower-cased, with every run of punctuation/whitespace made one space: copies
    that differ only in case, spacing or punctuation become the same string."""
    import pandas as pd

    parts = [frame[c].astype("string").fillna("").str.lower().str.replace(r"[\W_]+", " ", regex=True).str.strip()
             for c in columns]
    joined = parts[0] if len(parts) == 1 else pd.concat(parts, axis=1).agg(" | ".join, axis=1)
    return joined.astype(object)


def text_vectors(texts: pd.Series | np.ndarray, dim: int = TEXT_DIM) -> np.ndarray:
    """Counts of hashed character trigrams per text (float32 ``(n, dim)``), computed vectorised over all texts.

    The hash is a fixed function of the code points (not Python's salted ``hash``), so vectors and similarities are
    the same in every process.
    """
    texts = [" " + str(t) + " " for t in np.asarray(texts, dtype=object)]  # pad: short words still make trigrams
    n = len(texts)
    if not n:
        return np.zeros((0, dim), dtype=np.float32)
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=n)
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    valid = np.ones(codes.size, dtype=bool)  # a trigram may not run past the end of its own text
    for back in (1, 2):
        ends = starts + lengths - back
        valid[ends[ends >= starts]] = False
    idx = np.flatnonzero(valid[:-2]) if codes.size >= 3 else np.empty(0, dtype=np.int64)
    h = (codes[idx] * np.uint64(0x9E3779B1) + codes[idx + 1] * np.uint64(0x85EBCA77)
         + codes[idx + 2] * np.uint64(0xC2B2AE3D))
    bucket = ((h ^ (h >> np.uint64(29))) % np.uint64(dim)).astype(np.int64)
    row = np.repeat(np.arange(n), lengths)[idx]
    import torch  # its scatter-add is ~8x faster than numpy's bincount/add.at here

    flat = torch.zeros(n * dim, dtype=torch.float32)
    flat.index_add_(0, torch.from_numpy(row * dim + bucket), torch.ones(row.size, dtype=torch.float32))
    return flat.view(n, dim).numpy()


def prepare_text(counts: np.ndarray) -> np.ndarray:
    """Sub-linear term weights (square root of counts), L2-normalised rows (new array)."""
    return _unit_rows(np.sqrt(counts.astype(np.float32)))
