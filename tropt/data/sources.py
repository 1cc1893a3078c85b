"""Read the user's splits, whatever they are, into one summary per split: :class:`SplitData`.

A split may be a pandas DataFrame, a numpy array or torch tensor ``(N, ...)``, a tuple ``(X, y)`` of those, a
map-style torch ``Dataset``, a path to a CSV/Parquet file (streamed in chunks, never loaded whole), or a Dask
collection: a ``dask.dataframe.DataFrame`` or a Parquet dataset path (a directory, a glob, an fsspec URL), scanned as
a map-reduce on the user's Dask scheduler by :mod:`tropt.data.dask_splits` (without dask installed, a local
directory is streamed by pyarrow instead). Every
check works on the same summary: stable content fingerprints of the feature part of each row, the label / group /
time columns, a numeric matrix for nearest-neighbour search (when small enough) and a bounded row sample for the
single-feature models. Nothing the user passed is modified: every transformation makes new arrays.

Fingerprints are canonical: ``-0.0 == 0.0``, ``NaN == NaN`` (and ``None``/``NaT`` are one missing value), ints
and floats of the same value agree (values are compared as float64, so integers above 2**53 may collide),
column order and the index are ignored, and only the feature columns count (label, group and time excluded).
"""

from __future__ import annotations

import contextvars
import functools
import os
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pandas as pd

from ..errors import DataError
from . import neighbours as nb

CHUNK_ROWS = 250_000  # rows per chunk when streaming files
SAMPLE_ROWS = 20_000  # rows kept per split for the single-feature models
NUMERIC_MAX_CELLS = 200_000_000  # numeric matrix kept for near-duplicate search up to this many cells per split
# A scan that reads everything once (a diagnose session, a file) keeps the numeric matrix, unasked, only up to this
# many rows per split: data.near_duplicates' exact-search limit. Above it that check reads the split again for its
# matrix (searched with an approximate index), and other checks need not hold the matrix (float32, rows x numeric
# columns: 750 MB at 4M x 47), which was most of a large table's peak memory.
EAGER_NUMERIC_ROWS = 200_000
TEXT_PREVIEW = 80  # characters of each row's normalised text kept for near-duplicate evidence
TEXT_MAX_ROWS = 200_000  # text columns are vectorised (uint8 trigram counts) for splits up to this many rows
_LABEL = "__tropt_label__"

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_NAN_BITS = np.float64("nan").view(np.uint64)
_MISSING = np.uint64(0x6E61_6E5F_6D69_7373)  # "nan_miss": the one hash of a missing value in any column kind


def mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (new array; numpy wraps uint64 arithmetic silently)."""
    return _mix_(z ^ (z >> np.uint64(30)), pre_shifted=True)


def _mix_(z: np.ndarray, pre_shifted: bool = False) -> np.ndarray:
    """:func:`mix` in place on ``z`` (a uint64 array the caller owns): fewer temporaries on million-row columns."""
    if not pre_shifted:
        z ^= z >> np.uint64(30)
    z *= _C1
    z ^= z >> np.uint64(27)
    z *= _C2
    z ^= z >> np.uint64(31)
    return z


def _name_seed(name: Any) -> np.uint64:
    return _text_seed(str(name))


@functools.lru_cache(maxsize=4096)
def _text_seed(text: str) -> np.uint64:  # cached: a partition of a 100-column table asks 100 times
    return np.uint64(pd.util.hash_array(np.array([text], dtype=object))[0])


def canonical_float_bits(v: np.ndarray) -> np.ndarray:
    """float64 bit patterns with -0.0 folded into 0.0 and every NaN into one pattern (a new array)."""
    v = np.asarray(v, dtype=np.float64) + 0.0  # x + 0.0 turns -0.0 into +0.0 and always copies
    bits = v.view(np.uint64)
    bits[np.isnan(v)] = _NAN_BITS
    return bits


# ---------------------------------------------------------------------------------------------------- column kinds
_UNHASHABLE = (list, dict, set, tuple, np.ndarray)


def column_kind(s: pd.Series, split: str) -> str:
    """"numeric", "datetime", "string" or "mixed" (numbers and strings); raises for unhashable values.

    A "string" column that :func:`looks_like_text` is then made "text" (same fingerprints; also vectorised for the
    near-duplicate search) by :func:`load_splits` / :func:`scan`.
    """
    dt = s.dtype
    if pd.api.types.is_bool_dtype(dt) or pd.api.types.is_numeric_dtype(dt):
        if pd.api.types.is_complex_dtype(dt):
            raise DataError(f"split {split!r}: column {s.name!r} holds complex numbers, which tropt cannot compare",
                            "split it into real and imaginary columns or leave it out with features=[...]")
        return "numeric"
    if pd.api.types.is_datetime64_any_dtype(dt):
        return "datetime"
    if pd.api.types.is_timedelta64_dtype(dt):
        return "numeric"
    if isinstance(dt, pd.CategoricalDtype):
        return "string"
    if pd.api.types.is_string_dtype(dt) and not pd.api.types.is_object_dtype(dt):
        return "string"
    inferred = pd.api.types.infer_dtype(s, skipna=True)
    if inferred in ("string", "empty", "bytes"):
        return "string"
    if inferred in ("integer", "floating", "mixed-integer-float", "decimal", "boolean"):
        return "mixed"  # numbers stored as objects: compare them as numbers
    if inferred in ("datetime", "datetime64", "date", "time", "period", "interval", "timedelta"):
        return "string"
    bad = next((v for v in s.to_numpy(dtype=object) if isinstance(v, _UNHASHABLE)), None)
    if bad is not None:
        raise DataError(
            f"split {split!r}: column {s.name!r} holds unhashable {type(bad).__name__} values, which cannot be "
            "fingerprinted",
            f"convert it to strings (df[{s.name!r}].map(str)), expand it into columns, or leave it out with features=[...]",
        )
    return "mixed"


TEXT_MIN_DISTINCT = 0.5  # a string column whose values are at least this share distinct is free text
TEXT_MIN_WORDS, TEXT_MIN_VALUES = 4, 50  # ... as is one of long multi-word values with many different ones


def looks_like_text(s: pd.Series) -> bool:
    """Whether a string column holds free text rather than a category: mostly distinct values, or long multi-word
    values with many different ones. Low-cardinality strings ("red", "green", "blue") are categories; comparing
    them as text would make every row with the same category a near duplicate."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return False
    v = s.dropna()
    if len(v) == 0:
        return False
    v = v.astype(str)
    distinct = v.nunique()
    if distinct >= TEXT_MIN_DISTINCT * len(v):
        return True
    return distinct >= TEXT_MIN_VALUES and float(v.str.split().str.len().median()) >= TEXT_MIN_WORDS


def unify_kinds(kinds: list[str]) -> str:
    """One comparison kind for a column seen with these kinds in different splits/chunks."""
    ks = set(kinds)
    if len(ks) == 1:
        return ks.pop()
    if ks <= {"numeric", "mixed"}:
        return "mixed"
    return "mixed" if "numeric" in ks or "mixed" in ks else "string"


_NA_HASH = np.uint64(np.iinfo(np.uint64).max)  # what pandas' categorised hashing gives every missing value


def _string_hash(values: np.ndarray) -> np.ndarray:
    out = pd.util.hash_array(np.asarray(values, dtype=object), categorize=True)  # a new array; None/NaN alike
    out[out == _NA_HASH] = _MISSING
    return out


def _string_hash_series(s: pd.Series) -> np.ndarray:
    """:func:`_string_hash` of a column's values, computed on the column's own storage.

    ``hash_pandas_object`` hashes Arrow strings and categorical codes without building a Python object per row
    (each distinct value is hashed once); the hashes equal :func:`_string_hash`'s, so splits stored either way
    still match."""
    out = pd.util.hash_pandas_object(s, index=False, categorize=True).to_numpy(dtype=np.uint64, copy=True)
    out[out == _NA_HASH] = _MISSING
    return out


def hash_column(s: pd.Series, kind: str) -> np.ndarray:
    """Canonical uint64 value hashes of one column (a new array; ``s`` is not touched)."""
    if kind == "numeric" and (pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype)):
        if pd.api.types.is_timedelta64_dtype(s.dtype):
            v = s.to_numpy(dtype="timedelta64[ns]").view(np.int64).astype(np.float64)
        else:
            v = s.to_numpy(dtype=np.float64, na_value=np.nan)
        bits = canonical_float_bits(v)
        bits[np.isnan(v)] = _MISSING
        return bits
    if kind == "datetime" and pd.api.types.is_datetime64_any_dtype(s.dtype):
        if getattr(s.dt, "tz", None) is not None:
            s = s.dt.tz_convert("UTC").dt.tz_localize(None)
        v = s.to_numpy(dtype="datetime64[ns]")
        out = v.view(np.int64).astype(np.uint64)  # astype copies
        out[np.isnat(v)] = _MISSING
        return out
    if kind in ("numeric", "mixed"):
        # Numbers (and strings that are numbers) compare by value; everything else by its text.
        num = pd.to_numeric(s, errors="coerce")
        v = num.to_numpy(dtype=np.float64, na_value=np.nan)
        out = canonical_float_bits(v)
        isnum = ~np.isnan(v)
        rest = ~isnum
        if rest.any():
            out[rest] = _string_hash(s.to_numpy(dtype=object)[rest])
        return out
    if isinstance(s.dtype, pd.CategoricalDtype) and pd.api.types.is_datetime64_any_dtype(s.dtype.categories.dtype):
        s = s.astype(object)
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        s = s.astype(str).where(s.notna(), None)
    return _string_hash_series(s)


_BLOCK = 1 << 14  # rows per block of the plain numeric columns: a block's temporaries stay in the core's cache


def hash_rows(frame: pd.DataFrame, columns: list, kinds: Mapping[Any, str]) -> np.ndarray:
    """Row fingerprints over ``columns`` (order-independent: each column's hash is seeded by its name)."""
    acc = np.zeros(len(frame), dtype=np.uint64)
    plain = []
    for col in columns:
        s = frame[col]
        if kinds[col] == "numeric" and isinstance(s.dtype, np.dtype) and s.dtype.kind in "biuf":
            plain.append((s.to_numpy(), _name_seed(col)))
            continue
        h = hash_column(s, kinds[col])  # a new array: mixed in place
        h ^= _name_seed(col)
        acc += _mix_(h)
    if plain:
        _hash_plain_numeric(plain, acc)
    acc += _GOLD
    return _mix_(acc)


def _hash_plain_numeric(columns: list, acc: np.ndarray) -> None:
    """Add ``mix(hash_column(v) ^ seed)`` of numpy bool/int/float columns to ``acc``, block by block.

    The same values as :func:`hash_column` (float64 bits, -0.0 folded, NaN the missing hash), computed a block of
    rows at a time into preallocated buffers: a whole column's ten passes would each stream it through memory,
    and the fingerprints of a wide table were most of a partition's time (issue #22)."""
    n = len(acc)
    f, z, t = (np.empty(min(n, _BLOCK), dtype=d) for d in (np.float64, np.uint64, np.uint64))
    s27, s30, s31 = np.uint64(27), np.uint64(30), np.uint64(31)
    for a in range(0, n, _BLOCK):
        m = min(_BLOCK, n - a)
        ff, zz, tt, out = f[:m], z[:m], t[:m], acc[a:a + m]
        bits = ff.view(np.uint64)
        for v, seed in columns:
            np.add(v[a:a + m], 0.0, out=ff, casting="unsafe")  # as float64, and x + 0.0 turns -0.0 into +0.0
            if v.dtype.kind == "f":
                nan = np.isnan(ff)
                if nan.any():
                    bits[nan] = _MISSING
            np.bitwise_xor(bits, seed, out=zz)
            # _mix_ in place, its shifts into a preallocated buffer
            np.right_shift(zz, s30, out=tt)
            zz ^= tt
            zz *= _C1
            np.right_shift(zz, s27, out=tt)
            zz ^= tt
            zz *= _C2
            np.right_shift(zz, s31, out=tt)
            zz ^= tt
            out += zz


def hash_array_rows(x: np.ndarray) -> np.ndarray:
    """Row fingerprints of an ``(n, ...)`` numeric array (every element of a row counts, by position)."""
    n = x.shape[0]
    flat = x.reshape(n, -1)
    d = flat.shape[1]
    seeds = mix(np.arange(d, dtype=np.uint64) + _GOLD)
    out = np.empty(n, dtype=np.uint64)
    step = max(1, (1 << 22) // max(d, 1))
    for a in range(0, n, step):
        bits = canonical_float_bits(flat[a:a + step])
        out[a:a + step] = mix(mix(bits ^ seeds[None, :]).sum(axis=1, dtype=np.uint64) + _GOLD)
    return out


# ---------------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """What the user named: label / group / time columns (or keys/indices) and the feature subset."""

    label: Any = None
    group: Any = None
    time: Any = None
    features: tuple | None = None

    @classmethod
    def make(cls, label=None, group=None, time=None, features=None) -> "Options":
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
    text_norm: np.ndarray | None = None  # object (n,): each row's whole normalised text (MinHash LSH above TEXT_MAX_ROWS)
    tabular: bool = True  # a table (columns) rather than tensors/images
    image_shape: tuple | None = None  # (C, H, W)-like shape of one sample when samples are images
    sample: pd.DataFrame | None = None  # up to SAMPLE_ROWS rows: feature columns (+ _LABEL)
    feature_columns: list = field(default_factory=list)
    kinds: dict = field(default_factory=dict)
    has: frozenset = frozenset()  # the optional parts computed: "numeric", "sample"
    # A Dask split scanned on a distributed Client: {"time": one future per partition} kept on the workers, with the
    # partitions' first row positions, for the time reduce.
    dask_parts: dict | None = None
    dask_offsets: np.ndarray | None = None


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _file_kind(path: str, name: str) -> str:
    p = path.lower()
    if p.endswith((".parquet", ".pq", ".parq")):
        return "parquet"
    if p.endswith((".csv", ".csv.gz", ".csv.bz2", ".csv.zip", ".csv.xz", ".tsv", ".txt")):
        return "csv"
    if os.path.isdir(path):
        return "parquet"  # a partitioned Parquet dataset
    raise DataError(f"split {name!r}: cannot tell the format of {path!r} from its name",
                    "use a .csv or .parquet file (or load it yourself and pass a DataFrame)")


def _pyarrow_dataset(path: str) -> Any:
    """A Parquet directory as pyarrow reads it without Dask: hive partitions (``region=eu/``) become dictionary
    columns, as ``pd.read_parquet`` and ``dd.read_parquet`` make them, so the fingerprints agree with theirs."""
    import pyarrow.dataset as pads

    return pads.dataset(path, format="parquet", partitioning=pads.HivePartitioning.discover(infer_dictionary=True))


def _torch():
    import torch

    return torch


def _is_tensor(x: Any) -> bool:
    t = type(x)
    return t.__module__.startswith("torch") and hasattr(x, "detach")


def _to_numpy(x: Any, where: str = "a tensor") -> np.ndarray:
    """A tensor's values as numpy (``where`` names it in the error for a tensor that holds no values)."""
    if _is_tensor(x):
        if getattr(x, "is_meta", False):
            raise DataError(f"{where} is on the meta device (shape {tuple(x.shape)}): it has a shape but no values to check",
                            "pass the materialised data (a CPU tensor or array), not a meta-device placeholder")
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16" or str(x.dtype) == "torch.float16":
            x = x.float()
        return x.cpu().numpy()
    return np.asarray(x)


def _check_column_names(columns: pd.Index, name: str) -> None:
    """Columns must be addressable by one unique name each (label=, group=, features= and the evidence use them)."""
    if isinstance(columns, pd.MultiIndex):
        raise DataError(f"split {name!r} has MultiIndex columns ({columns.nlevels} levels, e.g. {columns[0]!r}), which "
                        "tropt cannot address by one name", "flatten them first: df.columns = ['_'.join(map(str, c)) for c in df.columns]")
    dup = columns[columns.duplicated()].unique()
    if len(dup):
        shown = ", ".join(repr(c) for c in dup[:10]) + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
        raise DataError(f"split {name!r} has duplicate column names: {shown}",
                        "give every column its own name (df.columns = [...]), or drop the copies: df.loc[:, ~df.columns.duplicated()]")


def _dask_split(x: Any) -> bool:
    from .dask_splits import is_dask_frame

    return is_dask_frame(x)


def _dask_path(path: str) -> bool:
    from .dask_splits import is_dataset_path

    return is_dataset_path(path)


def _is_dataset(x: Any) -> bool:
    try:
        from torch.utils.data import Dataset
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, Dataset) or (hasattr(x, "__getitem__") and hasattr(x, "__len__") and not isinstance(x, (str, bytes, list, tuple, dict)))


def _table_from_array(x: np.ndarray, y: np.ndarray | None, name: str) -> pd.DataFrame:
    if x.ndim == 1:
        x = x[:, None]
    df = pd.DataFrame(x, columns=list(range(x.shape[1])), copy=False)
    if y is not None:
        df[_LABEL] = y  # df is our own frame (it shares x's memory read-only; adding a column copies nothing of x)
    return df


# ---------------------------------------------------------------------------------------------------- readers
class _Reader:
    """A split as a stream of DataFrame chunks (tables) or of arrays (tensors, datasets)."""

    def __init__(self, obj: Any, name: str, opts: Options) -> None:
        self.obj, self.name, self.opts = obj, name, opts
        self.y: np.ndarray | None = None
        self.label_col: Any = opts.label
        if isinstance(obj, pd.Series):
            obj = obj.to_frame()
        if _dask_split(obj):
            self._init_dask(obj, None)
        elif _is_path(obj) and _dask_path(os.fspath(obj)):
            self._init_dask(None, os.fspath(obj))
        elif isinstance(obj, pd.DataFrame):
            _check_column_names(obj.columns, name)
            self.kind, self.frame = "frame", obj
            self.columns = list(obj.columns)
        elif _is_path(obj):
            path = os.fspath(obj)
            if not os.path.exists(path):
                raise DataError(f"split {name!r}: the file {path!r} does not exist", "check the path (relative paths start at the current directory)")
            self.kind, self.path = _file_kind(path, name), path
            self.columns = self._file_columns()
            _check_column_names(pd.Index(self.columns, tupleize_cols=False), name)
        elif isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, np.ndarray) or _is_tensor(v) for v in obj):
            x, y = _to_numpy(obj[0], f"split {name!r}: X of the (X, y) tuple"), _to_numpy(obj[1], f"split {name!r}: y of the (X, y) tuple")
            if len(x) != len(y):
                raise DataError(f"split {name!r}: (X, y) have different lengths {len(x)} and {len(y)}", "pass arrays with one label per sample")
            self._init_array(x, y)
        elif isinstance(obj, np.ndarray) or _is_tensor(obj):
            self._init_array(_to_numpy(obj, f"split {name!r}"), None)
        elif isinstance(obj, Mapping) and obj and all(isinstance(v, (np.ndarray, list)) or _is_tensor(v) for v in obj.values()):
            self.kind, self.frame = "frame", pd.DataFrame({k: _to_numpy(v, f"split {name!r}: column {k!r}") if _is_tensor(v) else v
                                                 for k, v in obj.items()})
            self.columns = list(self.frame.columns)
        elif _is_dataset(obj):
            self.kind = "dataset"
            try:
                self.n = len(obj)
            except TypeError:
                raise DataError(f"split {name!r}: the {type(obj).__name__} has no length (an iterable-style dataset?)",
                                "pass a map-style Dataset (with __len__ and __getitem__), or materialise it as a tensor") from None
            self.columns = None
        else:
            raise DataError(
                f"split {name!r} is a {type(obj).__name__}, which tropt cannot read as data",
                "pass a pandas DataFrame, a numpy array or torch tensor (N, ...), a tuple (X, y), a map-style torch "
                "Dataset, a Dask DataFrame, or a path to a .csv/.parquet file or a Parquet dataset (directory, glob, URL)",
            )

    def _init_dask(self, ddf: Any, path: str | None) -> None:
        """A Dask DataFrame (row ids: its index labels, as ``ddf.compute()`` has them) or a Parquet dataset path read
        by Dask (row ids: positions, as for a Parquet file); scanned by :mod:`tropt.data.dask_splits`."""
        from . import dask_splits

        if path is not None:
            self.kind, self.path, self.positions = "parquet", path, True
            ddf = dask_splits.read_dataset(path, self.name)
        else:
            self.kind, self.positions = "dask", False
            if not hasattr(ddf, "columns"):  # a Dask Series: one column, as a pandas Series is
                ddf = ddf.to_frame()
        self.ddf, self.columns = ddf, list(ddf.columns)
        _check_column_names(pd.Index(self.columns, tupleize_cols=False), self.name)

    def _init_array(self, x: np.ndarray, y: np.ndarray | None) -> None:
        if x.ndim == 0:
            raise DataError(f"split {self.name!r} is a scalar array", "pass an array of samples, shape (N, ...)")
        if x.dtype.kind not in "biuf" and x.ndim > 2:
            raise DataError(f"split {self.name!r}: arrays of dtype {x.dtype} with {x.ndim} dimensions cannot be fingerprinted",
                            "pass numeric arrays, or a DataFrame for text columns")
        if x.ndim <= 2:
            self.kind, self.frame = "frame", _table_from_array(x, y, self.name)
            self.columns = list(self.frame.columns)
            if y is not None:
                if self.opts.label is not None:
                    raise DataError(f"split {self.name!r} is (X, y) and label={self.opts.label!r} was given too",
                                    "drop label= (y is the label) or pass X alone with label=<column index>")
                self.label_col = _LABEL
            self.from_array = True
        else:
            self.kind, self.x, self.y = "array", x, y
            self.columns = None
            self.n = len(x)
            if self.opts.group is not None or self.opts.time is not None:
                raise DataError(f"split {self.name!r} is an array of shape {x.shape}: group=/time= need named columns",
                                "pass a DataFrame with those columns, or use the data checks without group/time")
            if self.opts.label is not None and y is None:
                raise DataError(f"split {self.name!r} is an array of shape {x.shape}; label={self.opts.label!r} cannot index it",
                                "pass the split as a tuple (X, y) with the labels in y")
            if y is not None:
                self.label_col = _LABEL

    def _file_columns(self) -> list:
        try:
            if self.kind == "parquet":
                import pyarrow.parquet as pq

                if os.path.isfile(self.path):
                    return list(pq.ParquetFile(self.path).schema_arrow.names)

                return list(_pyarrow_dataset(self.path).schema.names)  # as chunks() reads it
            return list(pd.read_csv(self.path, nrows=0, sep=None if self.path.lower().endswith(".tsv") else ",",
                                    engine="python" if self.path.lower().endswith(".tsv") else "c").columns)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - the file's own parser message is the useful part
            raise DataError(f"split {self.name!r}: cannot read {self.path!r} as {self.kind}: {type(exc).__name__}: {exc}",
                            "check that the file is a valid CSV/Parquet file") from exc

    def unreadable(self, exc: BaseException) -> DataError:
        """The error for a file its parser rejects, naming the split, the file and the parser's reason."""
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        return DataError(f"split {self.name!r}: cannot read {self.path!r} as {self.kind}: {reason}",
                         "fix or re-export the file (an unterminated quote makes the rest of a CSV one field; check the "
                         "quoting, the delimiter and the encoding)")

    def read_csv(self, read: Any, **kwargs: Any) -> Any:
        """``read(self.path, **kwargs)`` with parser errors as :meth:`unreadable`."""
        try:
            return read(self.path, **kwargs)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self.unreadable(exc) from exc

    def chunks(self, columns: list) -> Iterator[pd.DataFrame]:
        """DataFrame chunks holding ``columns`` (tables only)."""
        if self.kind == "frame":
            yield self.frame  # callers select columns by name; taking a column subset would copy the frame
        elif self.kind == "csv":
            sep = "\t" if self.path.lower().endswith(".tsv") else ","
            chunks = self.read_csv(pd.read_csv, usecols=columns, chunksize=CHUNK_ROWS, sep=sep)
            while True:  # next() by hand: a malformed row raises while iterating, and must say which file
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
                except (ValueError, UnicodeDecodeError) as exc:  # pandas' ParserError is a ValueError
                    raise self.unreadable(exc) from exc
                yield chunk
        else:
            import pyarrow.parquet as pq

            if os.path.isfile(self.path):
                # pre_buffer=False: pre-buffering kept column chunks of the row groups ahead in memory, a peak that
                # grew with the file (1.9 GB for a 4M x 50 file, against 0.6 GB without, and no slower).
                pf = pq.ParquetFile(self.path, pre_buffer=False)
                for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=[str(c) for c in columns]):
                    yield batch.to_pandas()
            else:  # a Parquet directory without dask installed: streamed by pyarrow's dataset API in batches
                import pyarrow.dataset as ds

                scan_options = ds.ParquetFragmentScanOptions(pre_buffer=False)
                for batch in _pyarrow_dataset(self.path).to_batches(
                        columns=[str(c) for c in columns], batch_size=CHUNK_ROWS, fragment_scan_options=scan_options,
                        batch_readahead=1, fragment_readahead=1):  # bounded memory: one batch ahead, not 16
                    yield batch.to_pandas()


# ---------------------------------------------------------------------------------------------------- column roles
def _resolve(reader: _Reader, opts: Options) -> tuple[list, Any, Any, Any]:
    """(feature columns, label column, group column, time column) of a table split; names checked."""
    cols = reader.columns
    label = reader.label_col
    present = set(cols)

    def find(role: str, col: Any) -> Any:
        if col is None:
            return None
        if col in present:
            return col
        if isinstance(col, str) and col.isdigit() and int(col) in present:
            return int(col)
        shown = ", ".join(repr(c) for c in cols[:40]) + (f", ... ({len(cols)} in all)" if len(cols) > 40 else "")
        raise DataError(f"split {reader.name!r}: {role}={col!r} is not a column; it has: {shown}",
                        f"pass {role}= one of those columns")

    label, group, time = find("label", label), find("group", opts.group), find("time", opts.time)
    roles = {c for c in (label, group, time) if c is not None}
    if opts.features is not None:
        feats = [find("features", f) for f in opts.features]
        overlap = [f for f in feats if f in roles]
        if overlap:
            raise DataError(f"features={list(opts.features)!r} include the label/group/time column {overlap!r}",
                            "leave label, group and time columns out of features=")
    else:
        feats = [c for c in cols if c not in roles]
    return feats, label, group, time


# ---------------------------------------------------------------------------------------------------- scanning
def wanted_columns(feats: list, label: Any, group: Any, time: Any) -> list:
    """The columns a scan reads: the features, then the label, group and time columns (each once)."""
    return list(dict.fromkeys(feats + [c for c in (label, group, time) if c is not None]))


class _Sampler:
    """Deterministic uniform row sample of bounded size over a stream (bottom-k of a seeded hash of the position)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.keys = np.empty(0, dtype=np.uint64)
        self.frames: pd.DataFrame | None = None

    def add(self, frame: pd.DataFrame, offset: int) -> None:
        keys = mix(np.arange(offset, offset + len(frame), dtype=np.uint64) + np.uint64(12345))
        if len(keys) > self.k:  # only this chunk's k smallest keys can make the sample
            pick = np.sort(np.argpartition(keys, self.k)[: self.k])
            keys, frame = keys[pick], frame.iloc[pick]
        frame = frame.reset_index(drop=True)
        allk = np.concatenate([self.keys, keys])
        allf = frame if self.frames is None else pd.concat([self.frames, frame], ignore_index=True)
        if len(allk) > self.k:
            keep = np.sort(np.argpartition(allk, self.k)[: self.k])
            allk, allf = allk[keep], allf.iloc[keep].reset_index(drop=True)
        self.keys, self.frames = allk, allf


ALL_NEEDS = frozenset({"numeric", "sample"})


def scan(obj: Any, name: str, opts: Options, kinds: Mapping | None = None, progress: bool = False,
         needs: frozenset = ALL_NEEDS, numeric_rows: int | None = None) -> SplitData:
    """Summarise one split (see :class:`SplitData`). ``kinds`` fixes each feature column's comparison kind.

    Fingerprints, label, group and time are always read; ``needs`` adds the numeric matrix and/or the row sample.
    ``numeric_rows`` caps the numeric matrix of a split read for later use: above it the matrix is dropped and the
    result does not claim it (``has``), so a check that needs it reads the split again.
    """
    reader = obj if isinstance(obj, _Reader) else _Reader(obj, name, opts)
    if reader.kind in ("array", "dataset"):
        data = _scan_samples(reader, progress)
        data.has = ALL_NEEDS
        return data
    want_numeric, want_sample = "numeric" in needs, "sample" in needs
    feats, label, group, time = _resolve(reader, opts)
    if getattr(reader, "ddf", None) is not None:  # a Dask split: the same fingerprints, as a map-reduce
        from .dask_splits import scan_dask

        if not kinds:
            kinds = _head_kinds(_head(reader, feats), feats, name)
        return scan_dask(reader, name, opts, dict(kinds), feats, label, group, time, needs, numeric_rows, progress)
    wanted = wanted_columns(feats, label, group, time)
    fps, labels, groups, times, nums, texts, norms = [], [], [], [], [], [], []
    sampler = _Sampler(SAMPLE_ROWS)
    local_kinds: dict = {}
    n = 0
    numeric_cols: list | None = None
    text_cols: list = []
    numeric_ok, numeric_note, text_ok = True, "", True
    row_ids = []
    for chunk in reader.chunks(wanted):
        if len(chunk) == 0:
            continue
        if not kinds:
            for c in feats:
                if c not in local_kinds:
                    k = column_kind(chunk[c], name)
                    local_kinds[c] = "text" if k == "string" and looks_like_text(chunk[c].iloc[:10_000]) else k
        use = kinds or local_kinds
        fps.append(hash_rows(chunk, feats, use))
        if numeric_cols is None:
            numeric_cols = [c for c in feats if use[c] == "numeric"]
            text_cols = [c for c in feats if use[c] == "text"]
        if want_numeric and text_cols:
            # the whole normalised text always (data.near_duplicates' MinHash LSH at scale); trigram vectors only
            # up to TEXT_MAX_ROWS, for exact search
            normalised = nb.normalise_text(chunk, text_cols)
            norms.append(normalised.to_numpy(dtype=object))
            if text_ok and n + len(chunk) > TEXT_MAX_ROWS:
                text_ok, texts = False, []
            elif text_ok:
                texts.append(np.minimum(nb.text_vectors(normalised), 255).astype(np.uint8))
        if want_numeric and numeric_ok and numeric_cols:
            if numeric_rows is not None and n + len(chunk) > numeric_rows:
                numeric_ok, numeric_note, nums, want_numeric = False, f"not kept above {numeric_rows:,} rows", [], False
            elif (n + len(chunk)) * len(numeric_cols) > NUMERIC_MAX_CELLS:
                numeric_ok, numeric_note, nums = False, f"more than {NUMERIC_MAX_CELLS:,} numeric cells", []
            else:
                nums.append(np.column_stack([pd.to_numeric(chunk[c], errors="coerce").to_numpy(dtype=np.float32, na_value=np.nan) for c in numeric_cols]))
        # Own copies: a column taken from a chunk is a view of the chunk's whole same-dtype block (every int64
        # column of a 250k-row chunk), which kept about 20 MB per chunk alive, 0.4 GB per 5M rows.
        if label is not None:
            labels.append(chunk[label].copy())
        if group is not None:
            groups.append(chunk[group].copy())
        if time is not None:
            times.append(chunk[time].copy())
        if want_sample:
            sample_cols = feats + ([label] if label is not None else [])
            sampler.add(chunk[sample_cols].rename(columns={label: _LABEL}) if label is not None else chunk[sample_cols], n)
        if reader.kind == "frame":
            row_ids.append(chunk.index.to_numpy())
        n += len(chunk)
    if n == 0:
        raise DataError(f"split {name!r} is empty (0 rows)", "pass a split with at least one row, or leave it out")

    def cat(parts):
        if not parts:
            return None
        s = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
        return s.reset_index(drop=True)

    numeric = None
    if not want_numeric:
        numeric_note = numeric_note or "not computed"
    elif numeric_ok and numeric_cols:
        numeric = nums[0] if len(nums) == 1 else np.concatenate(nums)
    elif not numeric_cols:
        numeric_note = "no numeric feature columns"
    text = np.concatenate(texts) if want_numeric and text_ok and texts else None
    text_norm = np.concatenate(norms) if want_numeric and norms else None
    if text_cols and want_numeric and not text_ok:
        numeric_note = (numeric_note + "; " if numeric_note else "") + f"text columns of more than {TEXT_MAX_ROWS:,} rows are not vectorised"
    return SplitData(
        name=name, kind=reader.kind, n=n, row_id=np.concatenate(row_ids) if row_ids else RowPositions(n), fp=np.concatenate(fps),
        label=cat(labels), group=cat(groups), time=cat(times), numeric=numeric, numeric_columns=numeric_cols or [],
        numeric_note=numeric_note, text=text, text_columns=text_cols if text_norm is not None else [],
        text_preview=_previews(text_norm), text_norm=text_norm,
        tabular=not getattr(reader, "from_array", False), sample=sampler.frames,
        feature_columns=feats, kinds=dict(kinds or local_kinds),
        has=frozenset(k for k, w in (("numeric", want_numeric), ("sample", want_sample)) if w),
    )


def _previews(texts: np.ndarray | None) -> np.ndarray | None:
    """Each text cut to TEXT_PREVIEW characters (near-duplicate evidence)."""
    return None if texts is None else pd.Series(texts, dtype=object).str.slice(0, TEXT_PREVIEW).to_numpy(dtype=object)


def _scan_samples(reader: _Reader, progress: bool) -> SplitData:
    """Arrays of rank >= 3 and map-style Datasets: fingerprint whole samples; keep them for neighbour search."""
    name = reader.name
    if reader.kind == "array":
        x, y = reader.x, reader.y
        if len(x) == 0:
            raise DataError(f"split {name!r} is empty (0 samples)", "pass a split with at least one sample")
        fp = hash_array_rows(x)
        flat = x.reshape(len(x), -1)
        numeric = flat.astype(np.float32) if flat.size <= NUMERIC_MAX_CELLS else None
        label = pd.Series(y) if y is not None else None
        return SplitData(name, "array", len(x), np.arange(len(x)), fp=fp, label=label, numeric=numeric,
                         numeric_note="" if numeric is not None else f"more than {NUMERIC_MAX_CELLS:,} values",
                         tabular=False, image_shape=_image_shape(x.shape[1:]))
    return _scan_dataset(reader, progress)


def _image_shape(shape: tuple) -> tuple | None:
    """The shape of one sample when it looks like an image: (H, W), (C, H, W) or (H, W, C) with H, W >= 8."""
    if len(shape) == 2 and min(shape) >= 8:
        return tuple(shape)
    if len(shape) == 3 and min(shape[1:]) >= 8 and shape[0] in (1, 3, 4):
        return tuple(shape)
    if len(shape) == 3 and min(shape[:2]) >= 8 and shape[2] in (1, 3, 4):
        return tuple(shape)
    return None


def _sample_parts(sample: Any, label: Any, name: str, i: int) -> tuple[list[np.ndarray], Any]:
    """Split one Dataset sample into its input arrays and its label."""
    def arr(v: Any, where: str) -> np.ndarray:
        if isinstance(v, (np.ndarray, np.generic)) or _is_tensor(v):
            a = _to_numpy(v, f"split {name!r}: sample {i}{where}")
        elif isinstance(v, (bool, int, float)):
            a = np.asarray(v, dtype=np.float64)
        elif isinstance(v, (str, bytes)):
            a = np.asarray([pd.util.hash_array(np.array([v], dtype=object))[0]], dtype=np.uint64).view(np.float64)
        elif hasattr(v, "__array_interface__") or hasattr(v, "__array__"):  # PIL images and friends
            a = np.asarray(v)
        else:
            raise DataError(f"split {name!r}: sample {i}{where} is a {type(v).__name__}, which cannot be fingerprinted",
                            "make the Dataset return tensors, numpy arrays, numbers or strings (e.g. add a ToTensor() transform)")
        if a.dtype.kind not in "biuf":
            raise DataError(f"split {name!r}: sample {i}{where} has dtype {a.dtype}, which cannot be fingerprinted",
                            "return numeric tensors from the Dataset")
        return a

    if isinstance(sample, Mapping):
        if label is not None and label not in sample:
            raise DataError(f"split {name!r}: label={label!r} is not a key of the samples; they have: {', '.join(map(repr, sample))}",
                            "pass label= one of those keys")
        keys = [k for k in sorted(sample, key=str) if k != label]
        return [arr(sample[k], f"[{k!r}]") for k in keys], (sample[label] if label is not None else None)
    if isinstance(sample, (tuple, list)):
        if label is not None:
            if not isinstance(label, int) or isinstance(label, bool):
                raise DataError(f"split {name!r}: samples are {type(sample).__name__}s of length {len(sample)}; label={label!r} cannot index them",
                                f"pass the label's position, e.g. label={len(sample) - 1}")
            if not -len(sample) <= label < len(sample):
                raise DataError(f"split {name!r}: label={label} is out of range for samples of length {len(sample)}",
                                f"pass an index in 0..{len(sample) - 1}")
            idx = label % len(sample)
            return [arr(v, f"[{j}]") for j, v in enumerate(sample) if j != idx], sample[idx]
        return [arr(v, f"[{j}]") for j, v in enumerate(sample)], None
    if label is not None:
        raise DataError(f"split {name!r}: samples are single {type(sample).__name__}s; label={label!r} cannot be taken from them",
                        "return (input, label) tuples or dicts from the Dataset, or drop label=")
    return [arr(sample, "")], None


def _scan_dataset(reader: _Reader, progress: bool) -> SplitData:
    from tqdm.auto import tqdm

    ds, name, label = reader.obj, reader.name, reader.opts.label
    n = reader.n
    if n == 0:
        raise DataError(f"split {name!r} is an empty Dataset (len 0)", "pass a Dataset with at least one sample")
    fps = np.empty(n, dtype=np.uint64)
    labels: list = []
    rows: list[np.ndarray] | None = []
    shape0: tuple | None = None
    cells = 0
    note = ""
    for i in tqdm(range(n), desc=f"tropt: reading {name}", disable=not progress, leave=False):
        try:
            sample = ds[i]
        except Exception as exc:  # noqa: BLE001 - the user's Dataset raised
            raise DataError(f"split {name!r}: reading sample {i} raised {type(exc).__name__}: {exc}", "fix the Dataset's __getitem__") from exc
        parts, y = _sample_parts(sample, label, name, i)
        flat = np.concatenate([p.reshape(-1).astype(np.float64) for p in parts]) if parts else np.zeros(0)
        fps[i] = hash_array_rows(flat[None, :])[0] ^ mix(np.asarray([len(flat)], dtype=np.uint64))[0]
        if label is not None:
            yv = _to_numpy(y, f"split {name!r}: the label of sample {i}") if (_is_tensor(y) or isinstance(y, np.ndarray)) else None
            labels.append(yv.item() if yv is not None and yv.size == 1 else y)
        if rows is not None:
            shape = tuple(parts[0].shape) if len(parts) == 1 else (flat.size,)
            if shape0 is None:
                shape0 = shape
            if shape != shape0:
                rows, note = None, "samples have different shapes"
            elif cells + flat.size > NUMERIC_MAX_CELLS:
                rows, note = None, f"more than {NUMERIC_MAX_CELLS:,} values"
            else:
                rows.append(flat.astype(np.float32))
                cells += flat.size
    numeric = np.stack(rows) if rows else None
    return SplitData(name, "dataset", n, np.arange(n), fp=fps, label=pd.Series(labels) if label is not None else None,
                     numeric=numeric, numeric_note=note, tabular=False,
                     image_shape=_image_shape(shape0) if shape0 and numeric is not None else None)


# ---------------------------------------------------------------------------------------------------- all splits
_SESSION: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tropt_data_session", default=None)
_FILE_CACHE: OrderedDict = OrderedDict()  # (path, size, mtime, options, kinds) -> SplitData; files only
_FILE_CACHE_SIZE = 8


_NEEDS = "__needs__"  # the session's key for the optional parts its scans compute


@contextmanager
def session(needs: frozenset = ALL_NEEDS) -> Iterator[None]:
    """Within one ``check_splits`` / ``diagnose`` call, scan each split once and share it between the checks.

    Every scan in the session computes ``needs`` (the optional parts the session's checks use, see :func:`scan`)
    besides what its own check asks for, so one pass serves them all; pass fewer needs when only cheap checks run
    (vectorising free text for a neighbour search that will not run costs far more than the fingerprints)."""
    token = _SESSION.set({_NEEDS: frozenset(needs)})
    try:
        yield
    finally:
        _SESSION.reset(token)


def _file_key(obj: Any, opts: Options, kinds: Mapping) -> tuple | None:
    if not _is_path(obj) or _dask_path(os.fspath(obj)):
        return None  # a dataset's directory does not change when a partition file is rewritten: never cached
    path = os.path.abspath(os.fspath(obj))
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_size, st.st_mtime_ns, opts, tuple(sorted(kinds.items(), key=lambda kv: str(kv[0]))))


def validate_splits(splits: Any, min_splits: int = 1) -> list[tuple[str, Any]]:
    """The splits mapping as an ordered list of (name, object), with the basic shape checked."""
    if isinstance(splits, (pd.DataFrame, np.ndarray)) or _is_tensor(splits) or not isinstance(splits, Mapping):
        raise DataError(f"splits is a {type(splits).__name__}, expected an ordered mapping of split name to data",
                        "pass e.g. {'train': df_train, 'test': df_test}")
    items = [(str(k), v) for k, v in splits.items()]
    if len(items) < min_splits:
        raise DataError(f"got {len(items)} split(s) ({', '.join(k for k, _ in items) or 'none'}); this check compares at least {min_splits}",
                        "pass e.g. {'train': df_train, 'test': df_test}, earlier splits first")
    for k, v in items:
        if v is None:
            raise DataError(f"split {k!r} is None", "pass the data or leave the split out")
    return items


def load_splits(splits: Any, opts: Options, progress: bool = False, min_splits: int = 1,
                needs: frozenset = frozenset()) -> list[SplitData]:
    """Scan every split (sharing work inside a session and for unchanged files) and check they agree."""
    items = validate_splits(splits, min_splits)
    readers = [_Reader(obj, name, opts) for name, obj in items]
    tables = [r for r in readers if r.kind not in ("array", "dataset")]
    if tables and len(tables) != len(readers):
        kinds_seen = ", ".join(f"{r.name}: {'table' if r.kind not in ('array', 'dataset') else r.kind}" for r in readers)
        raise DataError(f"the splits mix tables and tensors/Datasets ({kinds_seen}), which cannot be compared",
                        "pass every split in the same form")
    kinds: dict = {}
    if tables:
        if opts.features is None:
            _check_columns(tables)
        # One comparison kind per feature column over all splits (from each split's first chunk); string columns
        # are free text or categories by all splits' first chunks together, so every split vectorises the same ones.
        per_col: dict = {}
        heads: dict = {}
        for r in tables:
            feats, *_ = _resolve(r, opts)
            head = r.frame.iloc[:10_000][feats] if r.kind == "frame" else _session_head(r, feats)
            if head is None or len(head) == 0:
                if r.kind == "frame":
                    raise DataError(f"split {r.name!r} is empty (0 rows)", "pass a split with at least one row, or leave it out")
                continue
            for c in feats:
                per_col.setdefault(c, []).append(column_kind(head[c], r.name))
                heads.setdefault(c, []).append(head[c])
        kinds = {c: unify_kinds(v) for c, v in per_col.items()}
        for c, k in kinds.items():
            if k == "string" and looks_like_text(pd.concat(heads[c], ignore_index=True) if len(heads[c]) > 1 else heads[c][0]):
                kinds[c] = "text"
    sess = _SESSION.get()
    out = []
    cached = []
    for name, obj in items:
        key = ("mem", id(obj), opts, tuple(sorted(kinds.items(), key=lambda kv: str(kv[0])))) if sess is not None else None
        fkey = _file_key(obj, opts, kinds)
        data = None
        if key is not None and key in sess and needs <= sess[key][1].has:
            data = sess[key][1]
        elif fkey is not None and fkey in _FILE_CACHE and needs <= _FILE_CACHE[fkey].has:
            _FILE_CACHE.move_to_end(fkey)
            data = _FILE_CACHE[fkey]
        cached.append((key, fkey, data))
    started = _start_dask_maps([r for r, (_, _, d) in zip(readers, cached) if d is None], opts, kinds)
    for (name, obj), reader, (key, fkey, data) in zip(items, readers, cached):
        if data is None:
            # Inside a session, a scan computes what the session's checks need; alone, files are read once for
            # everything and other splits for what this check needs.
            if sess is not None:
                want = frozenset(needs) | sess.get(_NEEDS, ALL_NEEDS)
            else:
                want = ALL_NEEDS if fkey is not None else frozenset(needs)
            data = scan(reader, name, opts, kinds if tables else None, progress, want,
                        numeric_rows=None if "numeric" in needs else EAGER_NUMERIC_ROWS)
            if fkey is not None:
                _FILE_CACHE[fkey] = data
                while len(_FILE_CACHE) > _FILE_CACHE_SIZE:
                    _FILE_CACHE.popitem(last=False)
        if key is not None:
            sess[key] = (obj, data)  # holding obj keeps its id from being reused during the session
        if data.name != name:
            data = _renamed(data, name)
        out.append(data)
    del started  # the scans have taken over the maps' futures
    return out


def _start_dask_maps(readers: list, opts: Options, kinds: dict) -> list:
    """Start the map of every Dask split about to be scanned on the current Client at once (their futures, held by
    the caller until the scans pick them up): scanned one after the other, the workers would idle at each split's
    last partitions."""
    started = []
    dask_readers = [r for r in readers if getattr(r, "ddf", None) is not None]
    if len(dask_readers) > 1 and kinds:
        from .dask_splits import prefetch

        for r in dask_readers:
            feats, label, group, time = _resolve(r, opts)
            started.append(prefetch(r, dict(kinds), feats, label, group, time))
    return started


def _renamed(data: SplitData, name: str) -> SplitData:
    from dataclasses import replace

    return replace(data, name=name)


def _session_head(r: _Reader, cols: list) -> pd.DataFrame | None:
    """:func:`_head`, read once per session for a Dask split (a round trip to the cluster per check otherwise)."""
    sess = _SESSION.get()
    if sess is None or getattr(r, "ddf", None) is None:
        return _head(r, cols)
    key = ("head", id(r.obj), tuple(map(str, cols)))
    if key not in sess:
        sess[key] = (r.obj, _head(r, cols))  # holding obj keeps its id from being reused during the session
    return sess[key][1]


def _head_kinds(head: pd.DataFrame, feats: list, name: str) -> dict:
    """Each feature column's comparison kind from a split's first rows (one split alone; see load_splits)."""
    kinds = {}
    for c in feats:
        k = column_kind(head[c], name)
        kinds[c] = "text" if k == "string" and looks_like_text(head[c].iloc[:10_000]) else k
    return kinds


def _head(r: _Reader, cols: list) -> pd.DataFrame | None:
    if getattr(r, "ddf", None) is not None:
        from .dask_splits import head  # the first 10,000 rows, as a DataFrame split's kinds are taken from

        return head(r.ddf, cols, name=r.name)
    if r.kind == "csv":
        sep = "\t" if r.path.lower().endswith(".tsv") else ","
        return r.read_csv(pd.read_csv, usecols=cols, nrows=10_000, sep=sep)
    return next(iter(r.chunks(cols)), None)


def _check_columns(tables: list[_Reader]) -> None:
    first = tables[0]
    base = [c for c in first.columns if c != _LABEL]
    for r in tables[1:]:
        cols = [c for c in r.columns if c != _LABEL]
        if set(cols) != set(base):
            missing = [c for c in base if c not in set(cols)]
            extra = [c for c in cols if c not in set(base)]
            parts = []
            if missing:
                parts.append(f"missing in {r.name!r}: {missing}")
            if extra:
                parts.append(f"only in {r.name!r}: {extra}")
            raise DataError(f"splits {first.name!r} and {r.name!r} have different columns ({'; '.join(parts)})",
                            "give every split the same columns, or pass features=[...] with the shared ones "
                            "(the label/group/time columns must exist in every split)")
