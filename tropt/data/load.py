"""Read the user's splits into one :class:`~tropt.data.split_data.SplitData` each: :func:`load_splits`, the entry
of every data check. Splits are checked to agree (the same columns, one comparison kind per column over all splits),
and each is scanned once per session and once per unchanged file (:mod:`tropt.data.cache`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from . import cache, dask_splits, limits
from .columns import column_kind, looks_like_text, unify_kinds
from .readers import Reader, is_tensor, resolve
from .scan import scan
from .split_data import ALL_NEEDS, LABEL_COLUMN, Options, SplitData

__all__ = ["ALL_NEEDS", "Options", "SplitData", "load_splits", "validate_splits"]


def validate_splits(splits: Any, min_splits: int = 1) -> list[tuple[str, Any]]:
    """The splits mapping as an ordered list of (name, object), with the basic shape checked."""
    if isinstance(splits, (pd.DataFrame, np.ndarray)) or is_tensor(splits) or not isinstance(splits, Mapping):
        raise DataError(f"splits is a {type(splits).__name__}, expected an ordered mapping of split name to data",
                        "pass e.g. {'train': df_train, 'test': df_test}")
    items = [(str(k), v) for k, v in splits.items()]
    if len(items) < min_splits:
        raise DataError(f"got {len(items)} split(s) ({', '.join(k for k, _ in items) or 'none'}); "
                        f"this check compares at least {min_splits}",
                        "pass e.g. {'train': df_train, 'test': df_test}, earlier splits first")
    for k, v in items:
        if v is None:
            raise DataError(f"split {k!r} is None", "pass the data or leave the split out")
    return items


def load_splits(splits: Any, opts: Options, progress: bool = False, min_splits: int = 1,
                needs: frozenset = frozenset()) -> list[SplitData]:
    """Scan every split (sharing work inside a session and for unchanged files) and check they agree."""
    items = validate_splits(splits, min_splits)
    readers = [Reader(obj, name, opts) for name, obj in items]
    tables = [r for r in readers if r.kind not in ("array", "dataset")]
    if tables and len(tables) != len(readers):
        kinds_seen = ", ".join(f"{r.name}: {'table' if r.kind not in ('array', 'dataset') else r.kind}"
                               for r in readers)
        raise DataError(f"the splits mix tables and tensors/Datasets ({kinds_seen}), which cannot be compared",
                        "pass every split in the same form")
    kinds = _table_kinds(tables, opts) if tables else {}
    cached = [cache.lookup(obj, opts, kinds, needs) for _, obj in items]
    started = _start_dask_maps([r for r, (_, _, d) in zip(readers, cached) if d is None], opts, kinds)
    out = []
    for (name, obj), reader, (key, fkey, data) in zip(items, readers, cached):
        if data is None:
            data = scan(reader, name, opts, kinds if tables else None, progress, cache.wanted_parts(needs, fkey),
                        numeric_rows=None if "numeric" in needs else limits.EAGER_NUMERIC_ROWS)
            cache.store_file(fkey, data)
        cache.store_session(key, obj, data)
        if data.name != name:
            data = replace(data, name=name)
        out.append(data)
    del started  # the scans have taken over the maps' futures
    return out


def _table_kinds(tables: list[Reader], opts: Options) -> dict:
    """One comparison kind per feature column over all splits (from each split's first chunk); string columns are
    free text or categories by all splits' first chunks together, so every split vectorises the same ones."""
    if opts.features is None:
        _check_columns(tables)
    per_col: dict = {}
    heads: dict = {}
    for r in tables:
        feats, *_ = resolve(r, opts)
        head = r.frame.iloc[:10_000][feats] if r.kind == "frame" else cache.session_head(r, feats)
        if head is None or len(head) == 0:
            if r.kind == "frame":
                raise DataError(f"split {r.name!r} is empty (0 rows)",
                                "pass a split with at least one row, or leave it out")
            continue
        for c in feats:
            per_col.setdefault(c, []).append(column_kind(head[c], r.name))
            heads.setdefault(c, []).append(head[c])
    kinds = {c: unify_kinds(v) for c, v in per_col.items()}
    for c, k in kinds.items():
        if k == "string" and looks_like_text(pd.concat(heads[c], ignore_index=True)
                                             if len(heads[c]) > 1 else heads[c][0]):
            kinds[c] = "text"
    return kinds


def _start_dask_maps(readers: list, opts: Options, kinds: dict) -> list:
    """Start the map of every Dask split about to be scanned on the current Client at once (their futures, held by
    the caller until the scans pick them up): scanned one after the other, the workers would idle at each split's
    last partitions."""
    started = []
    dask_readers = [r for r in readers if getattr(r, "ddf", None) is not None]
    if len(dask_readers) > 1 and kinds:
        for r in dask_readers:
            feats, label, group, time = resolve(r, opts)
            started.append(dask_splits.prefetch(r, dict(kinds), feats, label, group, time))
    return started


def _check_columns(tables: list[Reader]) -> None:
    first = tables[0]
    assert first.columns is not None  # table splits have their column lists
    base = [c for c in first.columns if c != LABEL_COLUMN]
    for r in tables[1:]:
        assert r.columns is not None
        cols = [c for c in r.columns if c != LABEL_COLUMN]
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
