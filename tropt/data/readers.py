"""Open one split, whatever it is, as a stream of DataFrame chunks (tables) or arrays (tensors, Datasets): the
:class:`Reader`, and which of its columns are the features, label, group and time (:func:`resolve`).

A split may be a pandas DataFrame, a numpy array or torch tensor ``(N, ...)``, a tuple ``(X, y)`` of those, a
map-style torch ``Dataset``, a path to a CSV/Parquet file (streamed in chunks, never loaded whole), or a Dask
collection: a ``dask.dataframe.DataFrame`` or a Parquet dataset path (a directory, a glob, an fsspec URL), read by
:mod:`tropt.data.dask_splits` (without dask installed, a local directory is streamed by pyarrow instead). Nothing
the user passed is modified.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from . import dask_splits, limits
from .split_data import LABEL_COLUMN, Options
from .text_safe import safe_array, safe_frame


def is_path(x: Any) -> bool:
    """Whether a split is given as a path (a string or ``os.PathLike``)."""
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


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (told by its type, without importing torch)."""
    t = type(x)
    return t.__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(x: Any, where: str = "a tensor") -> np.ndarray:
    """A tensor's values as numpy (``where`` names it in the error for a tensor that holds no values)."""
    if is_tensor(x):
        if getattr(x, "is_meta", False):
            raise DataError(f"{where} is on the meta device (shape {tuple(x.shape)}): "
                            "it has a shape but no values to check",
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
                        "tropt cannot address by one name",
                        "flatten them first: df.columns = ['_'.join(map(str, c)) for c in df.columns]")
    dup = columns[columns.duplicated()].unique()
    if len(dup):
        shown = ", ".join(repr(c) for c in dup[:10]) + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
        raise DataError(f"split {name!r} has duplicate column names: {shown}",
                        "give every column its own name (df.columns = [...]), "
                        "or drop the copies: df.loc[:, ~df.columns.duplicated()]")


def _is_dataset(x: Any) -> bool:
    try:
        from torch.utils.data import Dataset
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, Dataset) or (hasattr(x, "__getitem__") and hasattr(x, "__len__")
                                      and not isinstance(x, (str, bytes, list, tuple, dict)))


def _table_from_array(x: np.ndarray, y: np.ndarray | None, name: str) -> pd.DataFrame:
    if x.ndim == 1:
        x = x[:, None]
    df = pd.DataFrame(x, columns=list(range(x.shape[1])), copy=False)
    if y is not None:
        # df is our own frame (it shares x's memory read-only; adding a column copies nothing of x)
        df[LABEL_COLUMN] = y
    return df


# ---------------------------------------------------------------------------------------------------- readers
class Reader:
    """A split as a stream of DataFrame chunks (tables) or of arrays (tensors, datasets)."""

    def __init__(self, obj: Any, name: str, opts: Options) -> None:
        self.obj, self.name, self.opts = obj, name, opts
        self.y: np.ndarray | None = None
        self.label_col: Any = opts.label
        self.columns: list | None
        if isinstance(obj, pd.Series):
            obj = obj.to_frame()
        if dask_splits.is_dask_frame(obj):
            self._init_dask(obj, None)
        elif is_path(obj) and dask_splits.is_dataset_path(os.fspath(obj)):
            self._init_dask(None, os.fspath(obj))
        elif isinstance(obj, pd.DataFrame):
            _check_column_names(obj.columns, name)
            self.kind, self.frame = "frame", safe_frame(obj)
            self.columns = list(obj.columns)
        elif is_path(obj):
            path = os.fspath(obj)
            if not os.path.exists(path):
                raise DataError(f"split {name!r}: the file {path!r} does not exist",
                                "check the path (relative paths start at the current directory)")
            self.kind, self.path = _file_kind(path, name), path
            self.columns = self._file_columns()
            _check_column_names(pd.Index(self.columns, tupleize_cols=False), name)
        elif isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, np.ndarray) or is_tensor(v) for v in obj):
            x = to_numpy(obj[0], f"split {name!r}: X of the (X, y) tuple")
            y = to_numpy(obj[1], f"split {name!r}: y of the (X, y) tuple")
            if len(x) != len(y):
                raise DataError(f"split {name!r}: (X, y) have different lengths {len(x)} and {len(y)}",
                                "pass arrays with one label per sample")
            self._init_array(x, safe_array(y))
        elif isinstance(obj, np.ndarray) or is_tensor(obj):
            self._init_array(to_numpy(obj, f"split {name!r}"), None)
        elif isinstance(obj, Mapping) and obj and all(isinstance(v, (np.ndarray, list)) or is_tensor(v)
                                                      for v in obj.values()):
            self.kind, self.frame = "frame", safe_frame(pd.DataFrame(
                {k: to_numpy(v, f"split {name!r}: column {k!r}") if is_tensor(v) else v for k, v in obj.items()}))
            self.columns = list(self.frame.columns)
        elif _is_dataset(obj):
            self.kind = "dataset"
            try:
                self.n = len(obj)
            except TypeError:
                raise DataError(f"split {name!r}: the {type(obj).__name__} has no length (an iterable-style dataset?)",
                                "pass a map-style Dataset (with __len__ and __getitem__), "
                                "or materialise it as a tensor") from None
            self.columns = None
        else:
            raise DataError(
                f"split {name!r} is a {type(obj).__name__}, which tropt cannot read as data",
                "pass a pandas DataFrame, a numpy array or torch tensor (N, ...), a tuple (X, y), a map-style torch "
                "Dataset, a Dask DataFrame, or a path to a .csv/.parquet file "
                "or a Parquet dataset (directory, glob, URL)",
            )

    def _init_dask(self, ddf: Any, path: str | None) -> None:
        """A Dask DataFrame (row ids: its index labels, as ``ddf.compute()`` has them) or a Parquet dataset path read
        by Dask (row ids: positions, as for a Parquet file); scanned by :mod:`tropt.data.dask_splits`."""
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
            raise DataError(f"split {self.name!r}: arrays of dtype {x.dtype} with {x.ndim} dimensions "
                            "cannot be fingerprinted",
                            "pass numeric arrays, or a DataFrame for text columns")
        if x.ndim <= 2:
            self.kind, self.frame = "frame", _table_from_array(x, y, self.name)
            self.columns = list(self.frame.columns)
            if y is not None:
                if self.opts.label is not None:
                    raise DataError(f"split {self.name!r} is (X, y) and label={self.opts.label!r} was given too",
                                    "drop label= (y is the label) or pass X alone with label=<column index>")
                self.label_col = LABEL_COLUMN
            self.from_array = True
        else:
            self.kind, self.x, self.y = "array", x, y
            self.columns = None
            self.n = len(x)
            if self.opts.group is not None or self.opts.time is not None:
                raise DataError(f"split {self.name!r} is an array of shape {x.shape}: group=/time= need named columns",
                                "pass a DataFrame with those columns, or use the data checks without group/time")
            if self.opts.label is not None and y is None:
                raise DataError(f"split {self.name!r} is an array of shape {x.shape}; "
                                f"label={self.opts.label!r} cannot index it",
                                "pass the split as a tuple (X, y) with the labels in y")
            if y is not None:
                self.label_col = LABEL_COLUMN

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
        except Exception as exc:
            raise DataError(f"split {self.name!r}: cannot read {self.path!r} as {self.kind}: "
                            f"{type(exc).__name__}: {exc}",
                            "check that the file is a valid CSV/Parquet file") from exc

    def unreadable(self, exc: BaseException) -> DataError:
        """The error for a file its parser rejects, naming the split, the file and the parser's reason."""
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        return DataError(f"split {self.name!r}: cannot read {self.path!r} as {self.kind}: {reason}",
                         "fix or re-export the file "
                         "(an unterminated quote makes the rest of a CSV one field; check the "
                         "quoting, the delimiter and the encoding)")

    def read_csv(self, read: Any, **kwargs: Any) -> Any:
        """``read(self.path, **kwargs)`` with parser errors as :meth:`unreadable`."""
        try:
            return read(self.path, **kwargs)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self.unreadable(exc) from exc

    def head(self, cols: list) -> pd.DataFrame | None:
        """The first rows of ``cols``: 10,000 of a CSV file or a Dask split, else the first chunk (the comparison
        kinds are taken from them)."""
        if getattr(self, "ddf", None) is not None:
            return dask_splits.head(self.ddf, cols, name=self.name)
        if self.kind == "csv":
            sep = "\t" if self.path.lower().endswith(".tsv") else ","
            return self.read_csv(pd.read_csv, usecols=cols, nrows=10_000, sep=sep)
        return next(iter(self.chunks(cols)), None)

    def chunks(self, columns: list) -> Iterator[pd.DataFrame]:
        """DataFrame chunks holding ``columns`` (tables only)."""
        if self.kind == "frame":
            yield self.frame  # callers select columns by name; taking a column subset would copy the frame
        elif self.kind == "csv":
            sep = "\t" if self.path.lower().endswith(".tsv") else ","
            chunks = self.read_csv(pd.read_csv, usecols=columns, chunksize=limits.CHUNK_ROWS, sep=sep)
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
                for batch in pf.iter_batches(batch_size=limits.CHUNK_ROWS, columns=[str(c) for c in columns]):
                    yield batch.to_pandas()
            else:  # a Parquet directory without dask installed: streamed by pyarrow's dataset API in batches
                import pyarrow.dataset as ds

                scan_options = ds.ParquetFragmentScanOptions(pre_buffer=False)
                for batch in _pyarrow_dataset(self.path).to_batches(
                        columns=[str(c) for c in columns], batch_size=limits.CHUNK_ROWS,
                        fragment_scan_options=scan_options,
                        batch_readahead=1, fragment_readahead=1):  # bounded memory: one batch ahead, not 16
                    yield batch.to_pandas()


# ---------------------------------------------------------------------------------------------------- column roles
def resolve(reader: Reader, opts: Options) -> tuple[list, Any, Any, Any]:
    """(feature columns, label column, group column, time column) of a table split; names checked."""
    cols = reader.columns
    assert cols is not None  # a table split (the only kind resolved) has its column list
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
