"""Exact cosine nearest neighbours across splits, in chunks with torch matrix products; image average hashes."""

from __future__ import annotations

import numpy as np

CHUNK_BYTES = 1 << 27  # similarity block size (query rows x reference rows x 4 bytes)


def pick_device(device: str | None) -> str:
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def prepare(x: np.ndarray, mean: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Centre (and scale) with the reference statistics, fill missing with the mean, L2-normalise rows (new array)."""
    z = x.astype(np.float32, copy=True)
    z -= mean
    if scale is not None:
        z /= scale
    np.nan_to_num(z, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    norm = np.linalg.norm(z, axis=1, keepdims=True)
    norm[norm == 0] = 1.0
    z /= norm
    return z


def nearest(query: np.ndarray, ref: np.ndarray, device: str = "cpu", progress: bool = False, desc: str = "") -> tuple[np.ndarray, np.ndarray]:
    """For each query row, the largest dot product with a reference row and that row's position (exact search)."""
    import torch
    from tqdm.auto import tqdm

    r = torch.from_numpy(np.ascontiguousarray(ref)).to(device)
    q_all = torch.from_numpy(np.ascontiguousarray(query))
    step = max(1, CHUNK_BYTES // (4 * max(1, len(ref))))
    best = np.empty(len(query), dtype=np.float32)
    arg = np.empty(len(query), dtype=np.int64)
    with torch.no_grad():
        for a in tqdm(range(0, len(query), step), desc=desc or "tropt: nearest neighbours", disable=not progress, leave=False):
            q = q_all[a:a + step].to(device)
            sims = q @ r.T
            v, i = sims.max(dim=1)
            best[a:a + step] = v.cpu().numpy()
            arg[a:a + step] = i.cpu().numpy()
    return np.clip(best, -1.0, 1.0), arg


def average_hash(x: np.ndarray, shape: tuple, side: int = 16) -> np.ndarray:
    """±1 average-hash bits (side*side) of flattened images with per-sample ``shape`` ((H,W), (C,H,W) or (H,W,C))."""
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
        small = F.adaptive_avg_pool2d(g, side).flatten(1)
        out.append(torch.where(small > small.mean(dim=1, keepdim=True), 1.0, -1.0))
    return torch.cat(out).numpy()


def hamming_nearest(query_bits: np.ndarray, ref_bits: np.ndarray, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Smallest Hamming distance of each ±1 query hash to a reference hash (via a matrix product), and its position."""
    dot, arg = nearest(query_bits, ref_bits, device)
    nbits = query_bits.shape[1]
    return np.rint((nbits - dot * 1.0) / 2).astype(np.int64), arg


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
