"""A split's time column as numbers (ns since the epoch for dates), and the per-split (or per-partition) summaries
data.temporal_leakage reduces: min/max/count, and the rows dated before each earlier split's end. Shared by the
in-memory path and the Dask partitions (:mod:`tropt.data.dask_splits`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from .columns import is_numeric


def time_values(s: pd.Series, split: str, col: Any) -> tuple[np.ndarray, bool]:
    """Times as float64 (ns since epoch for dates) and whether they are datetimes."""
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        if getattr(s.dt, "tz", None) is not None:
            s = s.dt.tz_convert("UTC").dt.tz_localize(None)
        v = s.to_numpy(dtype="datetime64[ns]")
        out = v.view(np.int64).astype(np.float64)
        out[np.isnat(v)] = np.nan
        return out, True
    if is_numeric(s):
        return s.to_numpy(dtype=np.float64, na_value=np.nan), False
    parsed = pd.to_datetime(s, errors="coerce", utc=True, format="mixed")
    bad = parsed.isna() & s.notna()
    if bad.mean() > 0.5 or (bad.any() and parsed.notna().sum() == 0):
        example = s[bad].iloc[0]
        raise DataError(f"split {split!r}: time column {col!r} cannot be read as dates (e.g. {example!r})",
                        "pass a datetime or numeric column as time=, or convert it with pd.to_datetime first")
    v = parsed.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    out = v.view(np.int64).astype(np.float64)
    out[np.isnat(v)] = np.nan
    return out, True


def time_summary(t: np.ndarray, is_dt: bool) -> dict:
    """Min, max and count of the finite times of a split or partition (reduced over partitions by min/max/sum)."""
    ok = t[np.isfinite(t)]
    return {"min": float(ok.min()) if ok.size else np.nan, "max": float(ok.max()) if ok.size else np.nan,
            "finite": int(ok.size), "is_dt": is_dt}


def merge_time_summaries(parts: list[dict]) -> dict:
    """:func:`time_summary` of several partitions as one (min of the minima, max of the maxima, counts summed)."""
    live = [p for p in parts if p["finite"]]
    return {"min": min((p["min"] for p in live), default=np.nan), "max": max((p["max"] for p in live), default=np.nan),
            "finite": sum(p["finite"] for p in parts), "is_dt": parts[0]["is_dt"]}


def rows_before(t: np.ndarray, pos: np.ndarray, ends: list, max_evidence: int) -> list:
    """For each end (None: skipped): (rows with a finite time before it, the first ``max_evidence`` of their times
    and positions by time then position). Partitions' results merge with :func:`merge_rows_before`."""
    out: list = []
    for end in ends:
        if end is None or not np.isfinite(end):
            out.append(None)
            continue
        idx = np.flatnonzero(np.isfinite(t) & (t < end))
        first = idx[np.argsort(t[idx], kind="stable")][:max_evidence]
        out.append((len(idx), t[first], pos[first]))
    return out


def merge_rows_before(parts: list[list], max_evidence: int) -> list:
    """:func:`rows_before` of several partitions as one: counts summed, the first evidence rows by time then row."""
    out: list = []
    for got in zip(*parts):
        if got[0] is None:
            out.append(None)
            continue
        ts, ps = np.concatenate([g[1] for g in got]), np.concatenate([g[2] for g in got])
        order = np.lexsort((ps, ts))[:max_evidence]
        out.append((sum(g[0] for g in got), ts[order], ps[order]))
    return out
