"""Splits as Dask collections: a ``dask.dataframe.DataFrame``, or a Parquet dataset path (a directory, a glob, or an
``fsspec`` URL such as ``s3://bucket/train/``), scanned as a map-reduce on the user's Dask scheduler.

Map (on the workers, one task per partition): the same canonical row fingerprints as the in-memory path
(:func:`tropt.data.hashing.hash_rows`, with the comparison kinds fixed once for all splits from the first 10,000
rows), plus the label, group and time columns. The client receives 8 bytes of fingerprint a row and the label and
group columns, concatenated in partition order into the same :class:`~tropt.data.split_data.SplitData` the pandas path
builds; the wide feature columns never leave the workers. Every split's map is started before the first is
waited on (:func:`prefetch`), so the workers do not idle at a split's last partitions.

Reduce: ``data.exact_duplicates`` joins the gathered fingerprints on the client with the in-memory path's
:func:`tropt.data.exact_join.exact_join` (one sort: ~0.2 s for 30M rows, less than moving the fingerprints between
workers again for a bucketed join would take). On a ``distributed`` Client a date or number time column stays on
the workers as one future per partition, and ``data.temporal_leakage`` reduces it there (min/max, rows before each
end, histograms; that column is not gathered). The other checks run their one implementation on the gathered
columns, so results, counts and evidence rows are those of the same rows in memory. The row sample for the
single-feature models is the in-memory path's own uniform sample (bottom-k of a seeded hash of the row position,
chosen from the row count alone), taken in a second pass. The numeric matrix for the near-duplicate search is
built only for splits small enough to gather.

The scheduler is the user's: the current ``dask.distributed`` Client when there is one, else Dask's default (local)
scheduler. ``dask`` is imported only when a split needs it (the ``tropt[dask]`` extra).
"""

from __future__ import annotations

import operator
import os
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..output import terminal_line
from . import limits
from .columns import is_numeric
from .dask_progress import gather_as_done, local_progress, partition_error
from .hashing import hash_rows, mix
from .split_data import LABEL_COLUMN, RowPositions, SplitData, wanted_columns
from .times import merge_rows_before, merge_time_summaries, rows_before, time_summary, time_values

HEAD_ROWS = 10_000  # rows the comparison kinds are taken from: what the pandas path reads of a DataFrame
_GLOB_CHARS = ("*", "?", "[")
_EXTRA = "pip install 'tropt[dask]'"


# ---------------------------------------------------------------------------------------------------- detection
def is_dask_frame(obj: Any) -> bool:
    """Whether ``obj`` is a Dask DataFrame or Series (told by its type, without importing dask)."""
    mod = type(obj).__module__ or ""
    return (mod == "dask" or mod.startswith("dask.")) and hasattr(obj, "npartitions") and hasattr(obj, "to_delayed")


def is_dataset_path(path: str) -> bool:
    """Whether a path names a Parquet dataset for Dask: a glob, an fsspec URL, or a local directory (the last only
    when dask is installed; without it a directory is still streamed by pyarrow on this machine)."""
    if "://" in path:
        return True
    if os.path.exists(path):  # taken literally, even when its name holds glob characters ("runs[1].csv")
        return os.path.isdir(path) and _has_dask()
    return any(c in path for c in _GLOB_CHARS)


def _has_dask() -> bool:
    try:
        import dask.dataframe  # noqa: F401
    except ImportError:
        return False
    return True


def _dask():
    """The ``dask`` module (with dask.dataframe), or a DataError naming the extra to install."""
    try:
        import dask
        import dask.dataframe
    except ImportError as exc:
        raise DataError(f"a Dask split (a Dask DataFrame, a Parquet glob or URL) needs dask, "
                        f"which is not installed ({exc})",
                        f"install the extra: {_EXTRA}") from None
    return dask


def current_client() -> Any:
    """The current ``dask.distributed`` Client, or None (then Dask's default local scheduler runs the graph).
    ``distributed`` is only asked when it is already imported: a user with a Client has imported it."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed.client import _get_global_client
    except ImportError:  # pragma: no cover - a distributed without the helper
        return None
    return _get_global_client()


def compute(*tasks: Any, name: str = "", parts: int | None = None) -> tuple:
    """Compute Dask objects on the user's scheduler: the current Client when there is one, else Dask's default. A
    partition that killed every worker reading it is a DataError naming split ``name`` and the partition."""
    client = current_client()
    if client is not None:
        try:
            return tuple(client.gather(client.compute(list(tasks))))
        except Exception as exc:
            raise partition_error(exc, name, parts=parts) from exc
    return _dask().compute(*tasks)


_CHECKED_CLIENTS: weakref.WeakSet = weakref.WeakSet()  # the Clients whose workers were found to import this tropt


def check_workers(client: Any, name: str) -> None:
    """Raise a DataError when the Client's workers cannot import tropt, or run another version of it: the map's
    tasks are tropt functions, and a worker without tropt dies unpickling them (Dask restarts it, and the check
    ends in a KilledWorker that names neither cause nor fix). Asked once per Client, with a builtin as the probe."""
    if client in _CHECKED_CLIENTS:
        return
    from .. import __version__

    try:
        versions = client.run(eval, "__import__('tropt.data.dask_splits').__version__")
    except ImportError as exc:
        raise DataError(f"split {name!r}: the Dask workers cannot import tropt ({type(exc).__name__}: {exc})",
                        "install tropt, with the 'dask' extra, in every worker's environment (the same version as "
                        "here: pip install 'tropt[dask]==" + __version__ + "'), then restart the workers") from None
    other = {w: v for w, v in versions.items() if v != __version__}
    if other:
        raise DataError(f"split {name!r}: the Dask workers run other versions of tropt than this process "
                        f"({__version__}): {other}",
                        "install the same tropt version on the workers as here, so that rows are fingerprinted alike")
    _CHECKED_CLIENTS.add(client)


# ---------------------------------------------------------------------------------------------------- datasets
def _files(path: str, name: str) -> tuple[Any, list[str]]:
    """(filesystem, data files) of a Parquet dataset path; a glob or directory that holds none is a DataError."""
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(path)
    globbed = any(c in path for c in _GLOB_CHARS) and not fs.exists(root)
    if globbed:  # a pattern may match files, or directories (of hive partitions) whose files all count
        found: list = []
        for p, info in fs.glob(root, detail=True).items():
            found.extend(fs.find(p) if info.get("type") == "directory" else [p])
    elif fs.isdir(root):
        found = fs.find(root)
    elif fs.exists(root):
        found = [root]
    else:
        raise DataError(f"split {name!r}: {path!r} does not exist",
                        "check the path or URL (relative paths start at the current directory)")
    # Dask and pyarrow skip metadata and hidden files (_metadata, _SUCCESS, .crc): so does the schema check.
    files = sorted(f for f in found if not any(part.startswith(("_", ".")) for part in f.rstrip("/").split("/")[-1:]))
    if not files:
        what = (f"the glob {path!r} matches no files" if globbed
                else f"the directory {path!r} holds no Parquet files (it has no columns)")
        raise DataError(f"split {name!r}: {what}",
                        "check the pattern and the directory (a glob is matched against file names, "
                        "e.g. 'data/train/*.parquet' "
                        "or 'data/train/**/*.parquet' for hive partitions)")
    return fs, files


def check_schemas(path: str, name: str) -> None:
    """Raise a DataError naming the columns whose presence or type differs between the dataset's files (read from the
    footers only). Dask reads every partition with the first file's schema, and a file that disagrees fails later
    with a message that names neither the file nor the column."""
    import pyarrow.parquet as pq

    fs, files = _files(path, name)
    schemas = []
    for f in files:
        try:
            with fs.open(f, "rb") as fh:
                schemas.append(pq.read_schema(fh))
        except Exception as exc:
            raise DataError(f"split {name!r}: cannot read {f!r} as Parquet: {type(exc).__name__}: {exc}",
                            "remove or re-export that file "
                            "(only Parquet files belong in the dataset's directory)") from exc
    base = {fld.name: fld.type for fld in schemas[0]}
    for f, sch in zip(files[1:], schemas[1:]):
        cols = {fld.name: fld.type for fld in sch}
        differ = [c for c in dict.fromkeys([*base, *cols])
                  if c not in base or c not in cols or not base[c].equals(cols[c])]
        if differ:
            detail = "; ".join(f"{c!r}: {base.get(c, 'absent')} vs {cols.get(c, 'absent')}" for c in differ)
            raise DataError(f"split {name!r}: the dataset's files have different schemas; columns that differ between "
                            f"{files[0]!r} and {f!r}: {detail}",
                            "rewrite the partitions with one schema (the same columns and types, e.g. cast in pyarrow "
                            "before writing), or pass a Dask DataFrame that casts them: "
                            "dd.read_parquet(...).astype({...})")


def read_dataset(path: str, name: str) -> Any:
    """A Parquet dataset path (directory, glob or fsspec URL; hive partitions become columns) as a Dask DataFrame,
    after the files' schemas are checked to agree."""
    dask = _dask()  # noqa: F841 - the error names the extra before fsspec/pyarrow are asked
    check_schemas(path, name)
    import dask.dataframe as dd

    try:
        return dd.read_parquet(path)
    except Exception as exc:
        raise DataError(f"split {name!r}: cannot read {path!r} as a Parquet dataset: {type(exc).__name__}: {exc}",
                        "check that the path holds Parquet files with one schema") from exc


# ---------------------------------------------------------------------------------------------------- map
def _summarise(part: pd.DataFrame, feats: list, kinds: dict, label: Any, group: Any, time: Any,
               with_index: bool) -> dict:
    """One partition's fingerprints, role columns and index (the map step; runs on a worker)."""
    out: dict = {"n": len(part), "fp": hash_rows(part, feats, kinds) if len(part) else np.empty(0, dtype=np.uint64)}
    for role, col in (("label", label), ("group", group), ("time", time)):
        if col is not None:
            out[role] = part[col].copy()  # its own memory: a column of a partition is a view of the partition's block
    if with_index:
        out["index"] = part.index.to_numpy()
    return out


def _without(summary: dict, keys: tuple) -> dict:
    return {k: v for k, v in summary.items() if k not in keys}


def _reducible_time(dtype: Any) -> bool:
    """Whether a time column can be summarised per partition: dates or numbers (a text column is parsed as a whole,
    with a rule on the share of values that fail to parse)."""
    return pd.api.types.is_datetime64_any_dtype(dtype) or is_numeric(pd.Series([], dtype=dtype))


def _take(part: pd.DataFrame, positions: np.ndarray, cols: list, label: Any) -> pd.DataFrame:
    """The rows at ``positions`` of one partition, in the sample's layout (the label renamed as the pandas path
    does)."""
    rows = part[cols].iloc[positions]
    return rows.rename(columns={label: LABEL_COLUMN}) if label is not None else rows


def _first_rows(part: pd.DataFrame, rows: int) -> pd.DataFrame:
    return part.iloc[:rows]


def head(ddf: Any, cols: list, rows: int = HEAD_ROWS, name: str = "") -> pd.DataFrame:
    """The first ``rows`` rows of ``cols``, reading partitions in order only until there are enough."""
    client = current_client()
    if client is not None:
        check_workers(client, name)
    got, n = [], 0
    first = _dask().delayed(_first_rows, pure=True)
    for part in ddf[cols].to_delayed():  # lazily: only the partitions computed below are read
        # cut on the worker: 10,000 rows travel, not the partition
        (part,) = compute(first(part, rows - n), name=name, parts=ddf.npartitions)
        got.append(part)
        n += len(part)
        if n >= rows:
            break
    frame = got[0] if len(got) == 1 else pd.concat(got)
    return frame.iloc[:rows]


def _sample_positions(n: int, k: int) -> np.ndarray:
    """The row positions of the pandas path's sample (:class:`tropt.data.scan._Sampler`): the ``k`` smallest
    seeded hashes of the positions 0..n-1, in position order. Depends on ``n`` only, so no data is read to choose."""
    if n <= k:
        return np.arange(n)
    best_keys, best_pos = np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    step = 8_000_000
    for a in range(0, n, step):  # in slices: 100M keys at once would be 800 MB on the client
        pos = np.arange(a, min(n, a + step), dtype=np.int64)
        keys = mix(pos.astype(np.uint64) + np.uint64(12345))
        keys, pos = np.concatenate([best_keys, keys]), np.concatenate([best_pos, pos])
        if len(keys) > k:
            pick = np.argpartition(keys, k)[:k]
            keys, pos = keys[pick], pos[pick]
        best_keys, best_pos = keys, pos
    return np.sort(best_pos)


def _map_tasks(reader: Any, kinds: dict, feats: list, label: Any, group: Any, time: Any) -> list:
    """The map step's tasks, one per partition. Their keys depend only on the arguments (``pure=True``), so the same
    call made twice names the same tasks, and a Client computes them once."""
    wanted = wanted_columns(feats, label, group, time)
    summarise = _dask().delayed(_summarise, pure=True)
    return [summarise(p, feats, kinds, label, group, time, not reader.positions)
            for p in _partitions(reader.ddf, wanted)]


def prefetch(reader: Any, kinds: dict, feats: list, label: Any, group: Any, time: Any) -> list | None:
    """Start a Dask split's map on the current Client and return its futures (None without a Client): the caller
    starts every split's map before it waits on the first, so the workers do not idle at the end of each split.
    :func:`scan_dask` later asks for the same tasks and finds them running (the caller holds the futures till then)."""
    client = current_client()
    if client is None:
        return None
    check_workers(client, reader.name)
    return client.compute(_map_tasks(reader, kinds, feats, label, group, time))


@dataclass
class DaskMap:
    """What the map step of one Dask split gathered: the row count per partition, the fingerprints, row ids and role
    columns in partition order, and (on a distributed Client) the futures of the time column left on the workers."""

    n: int
    lengths: np.ndarray
    offsets: np.ndarray  # each partition's first row position
    fp: np.ndarray
    row_id: np.ndarray | RowPositions
    label: pd.Series | None
    group: pd.Series | None
    time: pd.Series | None
    futures: dict | None


def map_split(reader: Any, name: str, kinds: dict, feats: list, label: Any, group: Any, time: Any,
              progress: bool = False) -> DaskMap:
    """Run the map step of a Dask split (see the module docstring) and gather its fingerprints and role columns."""
    ddf = reader.ddf
    with_index = not reader.positions
    tasks = _map_tasks(reader, kinds, feats, label, group, time)
    client = current_client()
    futures = None
    if client is not None:
        check_workers(client, name)
        futures = client.compute(tasks)
        # A date or number time column stays on the workers: data.temporal_leakage reduces it per partition.
        keep = ("time",) if time is not None and _reducible_time(ddf.dtypes[time]) else ()
        parts: Sequence[Any] = gather_as_done(client,
                                [client.submit(_without, f, keep, pure=False) for f in futures] if keep else futures,
                                f"tropt: fingerprinting {terminal_line(name)} on the Dask cluster", progress, name)
        futures = {"time": [client.submit(operator.getitem, f, "time", pure=False) for f in futures]} if keep else None
    else:
        with local_progress(len(tasks), f"tropt: fingerprinting {terminal_line(name)} with Dask", progress):
            parts = compute(*tasks)
    lengths = np.array([p["n"] for p in parts], dtype=np.int64)
    n = int(lengths.sum())
    if n == 0:
        raise DataError(f"split {name!r} is empty (0 rows in {len(parts)} partition(s))",
                        "pass a split with at least one row, or leave it out")
    live = [p for p in parts if p["n"]]  # the pandas path skips empty chunks alike

    def cat(role: str) -> pd.Series | None:
        if role not in live[0]:
            return None
        pieces = [p[role] for p in live]
        s = pieces[0] if len(pieces) == 1 else pd.concat(pieces, ignore_index=True)
        return s.reset_index(drop=True)

    fp = np.concatenate([p["fp"] for p in live])
    row_id = np.concatenate([p["index"] for p in live]) if with_index else RowPositions(n)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return DaskMap(n, lengths, offsets, fp, row_id, cat("label"), cat("group"), cat("time"), futures)


def gather_rows(reader: Any, wanted: list) -> pd.DataFrame:
    """The whole split's ``wanted`` columns as one pandas DataFrame (for a split small enough to hold: its
    near-duplicate vectors and sample then come from the in-memory scan, so a small Dask split gives the very
    report its pandas copy gives)."""
    (frame,) = compute(reader.ddf[wanted], name=reader.name)
    return frame.reset_index(drop=True) if reader.positions else frame


def split_data(reader: Any, name: str, mapped: DaskMap, kinds: dict, roles: tuple, needs: frozenset,
               small: int) -> SplitData:
    """The :class:`~tropt.data.split_data.SplitData` of a Dask split not gathered whole (more than ``small`` rows, or
    no numeric matrix asked for): the map's columns, and the row sample (a second pass) when asked for."""
    feats, label, group, time = roles
    sample = None
    if "sample" in needs:
        sample = _sample(reader.ddf, wanted_columns(feats, label, group, time), feats, label, mapped.lengths, _dask())
    numeric_cols = [c for c in feats if kinds[c] == "numeric"]
    return SplitData(
        name=name, kind=reader.kind, n=mapped.n, row_id=mapped.row_id, fp=mapped.fp, label=mapped.label,
        group=mapped.group, time=mapped.time, numeric=None, numeric_columns=numeric_cols,
        numeric_note=f"a Dask split of more than {small:,} rows: its near-duplicate vectors are not gathered",
        tabular=True, sample=sample, feature_columns=feats, kinds=dict(kinds),
        # "numeric" is claimed (as not available) so a check asking for it does not scan the cluster again
        has=frozenset({"numeric", *(["sample"] if "sample" in needs else [])}),
        dask_parts=mapped.futures, dask_offsets=mapped.offsets,
    )


def _partitions(ddf: Any, columns: list) -> list:
    """The partitions of ``ddf[columns]`` as Delayed objects. Every pass over a split uses the same projection:
    Dask's optimiser fuses small Parquet partitions depending on the columns read (3 files read as 2 partitions when
    fewer columns are asked for), so row positions are only comparable between passes that read the same columns."""
    return ddf[columns].to_delayed()


def _sample(ddf: Any, wanted: list, feats: list, label: Any, lengths: np.ndarray, dask: Any) -> pd.DataFrame:
    """The pandas path's uniform row sample, taken from the partitions that hold its rows (a second pass over the
    feature columns: 20,000 rows spread over the partitions usually touch every one)."""
    positions = _sample_positions(int(lengths.sum()), limits.SAMPLE_ROWS)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    cols = feats + ([label] if label is not None else [])
    take = dask.delayed(_take, pure=True)
    tasks = []
    parts = _partitions(ddf, wanted)  # the first pass's partitions: the positions below are theirs
    if len(parts) != len(lengths):  # pragma: no cover - a Dask change in how it plans the same read
        raise DataError("a Dask split's partitions changed between two reads of the same columns",
                        "report this to tropt; meanwhile pass the split as a pandas DataFrame")
    for i, part in enumerate(parts):
        lo, hi = np.searchsorted(positions, [bounds[i], bounds[i + 1]])
        if hi > lo:
            tasks.append(take(part, positions[lo:hi] - bounds[i], cols, label))
    pieces = compute(*tasks)
    frame = pieces[0] if len(pieces) == 1 else pd.concat(pieces)
    return frame.reset_index(drop=True)


# ---------------------------------------------------------------------------------------------------- time reduce
def _part_times(time: pd.Series) -> tuple[np.ndarray, bool]:
    return time_values(time, "", None)


def _part_time_summary(time: pd.Series) -> dict:
    return time_summary(*_part_times(time))


def _part_rows_before(time: pd.Series, offset: int, ends: list, max_evidence: int) -> list:
    t, _ = _part_times(time)
    return rows_before(t, np.arange(offset, offset + len(t), dtype=np.int64), ends, max_evidence)


def _part_histogram(time: pd.Series, edges: np.ndarray) -> np.ndarray:
    t, _ = _part_times(time)
    return np.histogram(t[np.isfinite(t)], bins=edges)[0]


def _client_for(d: Any) -> Any:
    client = current_client()
    if client is None:
        raise DataError(f"split {d.name!r}: its time column is held by a Dask Client "
                        "that has closed since the split was read",
                        "keep the Client open while the checks run (or read the split again)")
    return client


def distributed_time_summary(d: Any, time: Any) -> dict:
    """Min, max and finite count of a split's times, per partition on the workers, reduced here."""
    client = _client_for(d)
    return merge_time_summaries(client.gather([client.submit(_part_time_summary, f, pure=False)
                                               for f in d.dask_parts["time"]]))


def distributed_rows_before(d: Any, stat: dict, ends: list, max_evidence: int) -> list:
    """Rows dated before each end (count and first evidence), per partition on the workers, merged by time then row."""
    client = _client_for(d)
    parts = client.gather([client.submit(_part_rows_before, f, int(o), ends, max_evidence, pure=False)
                           for f, o in zip(d.dask_parts["time"], d.dask_offsets)])
    return merge_rows_before(parts, max_evidence)


def distributed_time_histogram(d: Any, edges: np.ndarray) -> np.ndarray:
    """Counts of the split's finite times on ``edges``: the partitions' histograms, summed."""
    client = _client_for(d)
    return np.sum(client.gather([client.submit(_part_histogram, f, edges, pure=False)
                                 for f in d.dask_parts["time"]]), axis=0)
