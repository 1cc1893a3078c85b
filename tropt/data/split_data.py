"""The data model of the stage-1 checks: what the user named (:class:`Options`) and what a scan makes of one split
(:class:`SplitData`), the one summary every data check works on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError

LABEL_COLUMN = "__tropt_label__"  # the label's column in a row sample, and in a table made from (X, y)
ALL_NEEDS = frozenset({"numeric", "sample"})  # the optional parts of a scan (see tropt.data.scan.scan)


def wanted_columns(feats: list, label: Any, group: Any, time: Any) -> list:
    """The columns a scan reads: the features, then the label, group and time columns (each once)."""
    return list(dict.fromkeys(feats + [c for c in (label, group, time) if c is not None]))


@dataclass(frozen=True)
class Options:
    """What the user named: label / group / time columns (or keys/indices) and the feature subset."""

    label: Any = None
    group: Any = None
    time: Any = None
    features: tuple | None = None

    @classmethod
    def make(cls, label=None, group=None, time=None, features=None) -> Options:
        if features is not None:
            if isinstance(features, (str, int)):
                features = [features]
            features = tuple(features)
            if not features:
                raise DataError("features=[] selects no columns", "pass None for every column except label/group/time")
        return cls(label, group, time, features)


# ---------------------------------------------------------------------------------------------------- split data
class RowPositions:
    """The row ids of a split whose rows are identified by position (a file, a Parquet dataset): 0..n-1, indexed
    like an array, without holding n integers (800 MB for 100M rows)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        return np.arange(self.n, dtype=np.int64)[i] if isinstance(i, slice) else _checked_positions(i, self.n)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.arange(self.n, dtype=dtype or np.int64)

    def __repr__(self) -> str:
        return f"RowPositions({self.n})"


def _checked_positions(i: Any, n: int) -> Any:
    idx = np.asarray(i)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise IndexError(f"boolean index of shape {idx.shape} for {n} rows")
        return np.flatnonzero(idx)
    idx = np.where(idx < 0, idx + n, idx).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"row position out of range for {n} rows")
    return int(idx) if idx.ndim == 0 else idx


@dataclass
class SplitData:
    """What the checks need from one split. Arrays are aligned by row position."""

    name: str
    kind: str  # "frame", "array", "dataset", "csv", "parquet"
    n: int
    row_id: np.ndarray | RowPositions  # the DataFrame index labels, else row positions (evidence tables show these)
    fp: np.ndarray | None = None  # uint64 fingerprints of the features
    label: pd.Series | None = None
    group: pd.Series | None = None
    time: pd.Series | None = None
    numeric: np.ndarray | None = None  # float32 (n, d): numeric features for nearest-neighbour search
    numeric_columns: list = field(default_factory=list)
    numeric_note: str = ""  # why ``numeric`` is None
    text: np.ndarray | None = None  # uint8 (n, TEXT_DIM): hashed trigram counts of the normalised free-text columns
    text_columns: list = field(default_factory=list)
    text_preview: np.ndarray | None = None  # object (n,): each row's normalised text, cut to TEXT_PREVIEW characters
    # object (n,): each row's whole normalised text (MinHash LSH above TEXT_MAX_ROWS)
    text_norm: np.ndarray | None = None
    tabular: bool = True  # a table (columns) rather than tensors/images
    image_shape: tuple | None = None  # (C, H, W)-like shape of one sample when samples are images
    sample: pd.DataFrame | None = None  # up to SAMPLE_ROWS rows: feature columns (+ LABEL_COLUMN)
    feature_columns: list = field(default_factory=list)
    kinds: dict = field(default_factory=dict)
    has: frozenset = frozenset()  # the optional parts computed: "numeric", "sample"
    # A Dask split scanned on a distributed Client: {"time": one future per partition} kept on the workers, with the
    # partitions' first row positions, for the time reduce.
    dask_parts: dict | None = None
    dask_offsets: np.ndarray | None = None
