"""Summarise one split into a :class:`~tropt.data.split_data.SplitData`: :func:`scan`.

Every check works on the same summary: stable content fingerprints (:mod:`tropt.data.hashing`) of the feature part
of each row, the label / group / time columns, a numeric matrix for nearest-neighbour search (when small enough) and
a bounded row sample for the single-feature models. Tables are read chunk by chunk; arrays of rank >= 3 and
map-style Datasets sample by sample; Dask splits as a map-reduce (:mod:`tropt.data.dask_splits`). Nothing the user
passed is modified: every transformation makes new arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..output import terminal_line
from . import dask_splits, limits
from . import neighbours as nb
from .columns import column_kind, head_kinds, looks_like_text
from .hashing import hash_array_rows, hash_rows, mix
from .readers import Reader, is_tensor, resolve, to_numpy
from .split_data import ALL_NEEDS, LABEL_COLUMN, Options, RowPositions, SplitData, wanted_columns


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

def scan(obj: Any, name: str, opts: Options, kinds: Mapping | None = None, progress: bool = False,
         needs: frozenset = ALL_NEEDS, numeric_rows: int | None = None) -> SplitData:
    """Summarise one split (see :class:`SplitData`). ``kinds`` fixes each feature column's comparison kind.

    Fingerprints, label, group and time are always read; ``needs`` adds the numeric matrix and/or the row sample.
    ``numeric_rows`` caps the numeric matrix of a split read for later use: above it the matrix is dropped and the
    result does not claim it (``has``), so a check that needs it reads the split again.
    """
    reader = obj if isinstance(obj, Reader) else Reader(obj, name, opts)
    if reader.kind in ("array", "dataset"):
        data = _scan_samples(reader, progress)
        data.has = ALL_NEEDS
        return data
    feats, label, group, time = resolve(reader, opts)
    if getattr(reader, "ddf", None) is not None:  # a Dask split: the same fingerprints, as a map-reduce
        if not kinds:
            kinds = head_kinds(reader.head(feats), feats, name)
        return _scan_dask(reader, name, opts, dict(kinds), (feats, label, group, time), needs, numeric_rows, progress)
    table = _TableScan(name, feats, label, group, time, kinds, needs, numeric_rows)
    for chunk in reader.chunks(wanted_columns(feats, label, group, time)):
        if len(chunk) == 0:
            continue
        table.add(chunk, keep_index=reader.kind == "frame")
    return table.result(reader)


def _scan_dask(reader: Reader, name: str, opts: Options, kinds: dict, roles: tuple, needs: frozenset,
               numeric_rows: int | None, progress: bool) -> SplitData:
    """A Dask split: fingerprints and role columns by a map on the workers; a split small enough to hold is then
    gathered and scanned in memory (its near-duplicate vectors and sample as its pandas copy gives them)."""
    feats, label, group, time = roles
    mapped = dask_splits.map_split(reader, name, kinds, feats, label, group, time, progress)
    small = numeric_rows if numeric_rows is not None else limits.EAGER_NUMERIC_ROWS
    if "numeric" in needs and mapped.n <= small:
        frame = dask_splits.gather_rows(reader, wanted_columns(feats, label, group, time))
        data = scan(frame, name, opts, kinds, False, needs, numeric_rows)
        return replace(data, kind=reader.kind, dask_parts=mapped.futures, dask_offsets=mapped.offsets)
    return dask_splits.split_data(reader, name, mapped, kinds, roles, needs, small)


class _TableScan:
    """One table split's summary, accumulated chunk by chunk (see :func:`scan`)."""

    def __init__(self, name: str, feats: list, label: Any, group: Any, time: Any, kinds: Mapping | None,
                 needs: frozenset, numeric_rows: int | None) -> None:
        self.name, self.feats, self.label, self.group, self.time = name, feats, label, group, time
        self.kinds = kinds
        self.local_kinds: dict = {}
        self.want_numeric, self.want_sample = "numeric" in needs, "sample" in needs
        self.numeric_rows = numeric_rows
        self.fps: list[np.ndarray] = []
        self.labels: list[pd.Series] = []
        self.groups: list[pd.Series] = []
        self.times: list[pd.Series] = []
        self.row_ids: list[np.ndarray] = []
        self.nums: list[np.ndarray] = []
        self.texts: list[np.ndarray] = []
        self.norms: list[np.ndarray] = []
        self.sampler = _Sampler(limits.SAMPLE_ROWS)
        self.n = 0
        self.numeric_cols: list | None = None
        self.text_cols: list = []
        self.numeric_ok, self.numeric_note, self.text_ok = True, "", True

    def add(self, chunk: pd.DataFrame, keep_index: bool) -> None:
        """Fingerprint one chunk and keep its role columns, vectors and sample rows."""
        feats, label = self.feats, self.label
        if not self.kinds:
            for c in feats:
                if c not in self.local_kinds:
                    k = column_kind(chunk[c], self.name)
                    self.local_kinds[c] = "text" if k == "string" and looks_like_text(chunk[c].iloc[:10_000]) else k
        use = self.kinds or self.local_kinds
        self.fps.append(hash_rows(chunk, feats, use))
        if self.numeric_cols is None:
            self.numeric_cols = [c for c in feats if use[c] == "numeric"]
            self.text_cols = [c for c in feats if use[c] == "text"]
        self._add_vectors(chunk)
        # Own copies: a column taken from a chunk is a view of the chunk's whole same-dtype block (every int64
        # column of a 250k-row chunk), which kept about 20 MB per chunk alive, 0.4 GB per 5M rows.
        if label is not None:
            self.labels.append(chunk[label].copy())
        if self.group is not None:
            self.groups.append(chunk[self.group].copy())
        if self.time is not None:
            self.times.append(chunk[self.time].copy())
        if self.want_sample:
            sample_cols = feats + ([label] if label is not None else [])
            self.sampler.add(chunk[sample_cols].rename(columns={label: LABEL_COLUMN}) if label is not None
                             else chunk[sample_cols], self.n)
        if keep_index:
            self.row_ids.append(chunk.index.to_numpy())
        self.n += len(chunk)

    def _add_vectors(self, chunk: pd.DataFrame) -> None:
        """The chunk's normalised text and trigram vectors, and its numeric matrix, while they are kept."""
        n, numeric_cols = self.n, self.numeric_cols
        if self.want_numeric and self.text_cols:
            # the whole normalised text always (data.near_duplicates' MinHash LSH at scale); trigram vectors only
            # up to TEXT_MAX_ROWS, for exact search
            normalised = nb.normalise_text(chunk, self.text_cols)
            self.norms.append(normalised.to_numpy(dtype=object))
            if self.text_ok and n + len(chunk) > limits.TEXT_MAX_ROWS:
                self.text_ok, self.texts = False, []
            elif self.text_ok:
                self.texts.append(np.minimum(nb.text_vectors(normalised), 255).astype(np.uint8))
        if self.want_numeric and self.numeric_ok and numeric_cols:
            if self.numeric_rows is not None and n + len(chunk) > self.numeric_rows:
                self.numeric_ok, self.numeric_note, self.nums = False, f"not kept above {self.numeric_rows:,} rows", []
                self.want_numeric = False
            elif (n + len(chunk)) * len(numeric_cols) > limits.NUMERIC_MAX_CELLS:
                self.numeric_ok, self.numeric_note, self.nums = (
                    False, f"more than {limits.NUMERIC_MAX_CELLS:,} numeric cells", [])
            else:
                self.nums.append(np.column_stack([pd.to_numeric(chunk[c], errors="coerce").to_numpy(
                    dtype=np.float32, na_value=np.nan) for c in numeric_cols]))

    def result(self, reader: Reader) -> SplitData:
        """The split's summary once every chunk is in."""
        n, name, want_numeric = self.n, self.name, self.want_numeric
        if n == 0:
            raise DataError(f"split {name!r} is empty (0 rows)", "pass a split with at least one row, or leave it out")
        numeric, numeric_note, numeric_cols, text_cols = None, self.numeric_note, self.numeric_cols, self.text_cols
        if not want_numeric:
            numeric_note = numeric_note or "not computed"
        elif self.numeric_ok and numeric_cols:
            numeric = self.nums[0] if len(self.nums) == 1 else np.concatenate(self.nums)
        elif not numeric_cols:
            numeric_note = "no numeric feature columns"
        text = np.concatenate(self.texts) if want_numeric and self.text_ok and self.texts else None
        text_norm = np.concatenate(self.norms) if want_numeric and self.norms else None
        if text_cols and want_numeric and not self.text_ok:
            numeric_note = ((numeric_note + "; " if numeric_note else "")
                            + f"text columns of more than {limits.TEXT_MAX_ROWS:,} rows are not vectorised")
        return SplitData(
            name=name, kind=reader.kind, n=n, row_id=np.concatenate(self.row_ids) if self.row_ids else RowPositions(n),
            fp=np.concatenate(self.fps), label=_cat(self.labels), group=_cat(self.groups), time=_cat(self.times),
            numeric=numeric, numeric_columns=numeric_cols or [], numeric_note=numeric_note, text=text,
            text_columns=text_cols if text_norm is not None else [], text_preview=_previews(text_norm),
            text_norm=text_norm, tabular=not getattr(reader, "from_array", False), sample=self.sampler.frames,
            feature_columns=self.feats, kinds=dict(self.kinds or self.local_kinds),
            has=frozenset(k for k, w in (("numeric", want_numeric), ("sample", self.want_sample)) if w),
        )


def _cat(parts: list) -> pd.Series | None:
    """One split's column from its chunks' pieces, indexed 0..n-1 (None when the column was not read)."""
    if not parts:
        return None
    s = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    return s.reset_index(drop=True)


def _previews(texts: np.ndarray | None) -> np.ndarray | None:
    """Each text cut to TEXT_PREVIEW characters (near-duplicate evidence)."""
    if texts is None:
        return None
    return pd.Series(texts, dtype=object).str.slice(0, limits.TEXT_PREVIEW).to_numpy(dtype=object)


def _scan_samples(reader: Reader, progress: bool) -> SplitData:
    """Arrays of rank >= 3 and map-style Datasets: fingerprint whole samples; keep them for neighbour search."""
    name = reader.name
    if reader.kind == "array":
        x, y = reader.x, reader.y
        if len(x) == 0:
            raise DataError(f"split {name!r} is empty (0 samples)", "pass a split with at least one sample")
        fp = hash_array_rows(x)
        flat = x.reshape(len(x), -1)
        numeric = flat.astype(np.float32) if flat.size <= limits.NUMERIC_MAX_CELLS else None
        label = pd.Series(y) if y is not None else None
        return SplitData(name, "array", len(x), np.arange(len(x)), fp=fp, label=label, numeric=numeric,
                         numeric_note="" if numeric is not None else f"more than {limits.NUMERIC_MAX_CELLS:,} values",
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
        if isinstance(v, (np.ndarray, np.generic)) or is_tensor(v):
            a = to_numpy(v, f"split {name!r}: sample {i}{where}")
        elif isinstance(v, (bool, int, float)):
            a = np.asarray(v, dtype=np.float64)
        elif isinstance(v, (str, bytes)):
            a = np.asarray([pd.util.hash_array(np.array([v], dtype=object))[0]], dtype=np.uint64).view(np.float64)
        elif hasattr(v, "__array_interface__") or hasattr(v, "__array__"):  # PIL images and friends
            a = np.asarray(v)
        else:
            raise DataError(f"split {name!r}: sample {i}{where} is a {type(v).__name__}, which cannot be fingerprinted",
                            "make the Dataset return tensors, numpy arrays, numbers or strings "
                            "(e.g. add a ToTensor() transform)")
        if a.dtype.kind not in "biuf":
            raise DataError(f"split {name!r}: sample {i}{where} has dtype {a.dtype}, which cannot be fingerprinted",
                            "return numeric tensors from the Dataset")
        return a

    if isinstance(sample, Mapping):
        if label is not None and label not in sample:
            raise DataError(f"split {name!r}: label={label!r} is not a key of the samples; "
                            f"they have: {', '.join(map(repr, sample))}",
                            "pass label= one of those keys")
        keys = [k for k in sorted(sample, key=str) if k != label]
        return [arr(sample[k], f"[{k!r}]") for k in keys], (sample[label] if label is not None else None)
    if isinstance(sample, (tuple, list)):
        if label is not None:
            if not isinstance(label, int) or isinstance(label, bool):
                raise DataError(f"split {name!r}: samples are {type(sample).__name__}s of length {len(sample)}; "
                                f"label={label!r} cannot index them",
                                f"pass the label's position, e.g. label={len(sample) - 1}")
            if not -len(sample) <= label < len(sample):
                raise DataError(f"split {name!r}: label={label} is out of range for samples of length {len(sample)}",
                                f"pass an index in 0..{len(sample) - 1}")
            idx = label % len(sample)
            return [arr(v, f"[{j}]") for j, v in enumerate(sample) if j != idx], sample[idx]
        return [arr(v, f"[{j}]") for j, v in enumerate(sample)], None
    if label is not None:
        raise DataError(f"split {name!r}: samples are single {type(sample).__name__}s; "
                        f"label={label!r} cannot be taken from them",
                        "return (input, label) tuples or dicts from the Dataset, or drop label=")
    return [arr(sample, "")], None


def _scan_dataset(reader: Reader, progress: bool) -> SplitData:
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
    for i in tqdm(range(n), desc=f"tropt: reading {terminal_line(name)}", disable=not progress, leave=False):
        try:
            sample = ds[i]
        except Exception as exc:
            raise DataError(f"split {name!r}: reading sample {i} raised {type(exc).__name__}: {exc}",
                            "fix the Dataset's __getitem__") from exc
        parts, y = _sample_parts(sample, label, name, i)
        flat = np.concatenate([p.reshape(-1).astype(np.float64) for p in parts]) if parts else np.zeros(0)
        fps[i] = hash_array_rows(flat[None, :])[0] ^ mix(np.asarray([len(flat)], dtype=np.uint64))[0]
        if label is not None:
            yv = (to_numpy(y, f"split {name!r}: the label of sample {i}")
                  if (is_tensor(y) or isinstance(y, np.ndarray)) else None)
            labels.append(yv.item() if yv is not None and yv.size == 1 else y)
        if rows is not None:
            shape = tuple(parts[0].shape) if len(parts) == 1 else (flat.size,)
            if shape0 is None:
                shape0 = shape
            if shape != shape0:
                rows, note = None, "samples have different shapes"
            elif cells + flat.size > limits.NUMERIC_MAX_CELLS:
                rows, note = None, f"more than {limits.NUMERIC_MAX_CELLS:,} values"
            else:
                rows.append(flat.astype(np.float32))
                cells += flat.size
    numeric = np.stack(rows) if rows else None
    return SplitData(name, "dataset", n, np.arange(n), fp=fps, label=pd.Series(labels) if label is not None else None,
                     numeric=numeric, numeric_note=note, tabular=False,
                     image_shape=_image_shape(shape0) if shape0 and numeric is not None else None)
