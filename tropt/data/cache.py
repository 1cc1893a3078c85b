"""The two caches of split scans: a session (within one ``check_splits`` / ``diagnose`` call each split is scanned
once and shared between the checks) and the last few files scanned, unchanged since (path, size and mtime)."""

from __future__ import annotations

import contextvars
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pandas as pd

from . import dask_splits
from .readers import Reader, is_path
from .split_data import ALL_NEEDS, Options, SplitData

_SESSION: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tropt_data_session", default=None)
_FILE_CACHE: OrderedDict = OrderedDict()  # (path, size, mtime, options, kinds) -> SplitData; files only
_FILE_CACHE_SIZE = 8
_NEEDS = "__needs__"  # the session's key for the optional parts its scans compute

# The optional parts of a split scan (see tropt.data.scan.scan) each data check uses; FINGERPRINT_ONLY checks need
# only the fingerprints, labels, group and time. A session (diagnose) scans once for the union of its checks' needs.
# (data.exact_duplicates reads the row sample only to judge a FAIL-sized leak; then it scans again.)
SCAN_NEEDS = {"data.near_duplicates": {"numeric"}, "data.target_leakage": {"sample"}}
FINGERPRINT_ONLY = {"data.exact_duplicates", "data.group_leakage", "data.temporal_leakage", "data.label_shift",
                    "data.class_coverage", "data.label_sanity"}


def scan_needs(check_ids: Iterable[str]) -> frozenset:
    """The scan parts the given checks need together (a data check not listed above: everything, to be safe)."""
    needs: set = set()
    for c in check_ids:
        if c in SCAN_NEEDS:
            needs |= SCAN_NEEDS[c]
        elif c.startswith("data.") and c not in FINGERPRINT_ONLY:
            return ALL_NEEDS
    return frozenset(needs)


@contextmanager
def session(needs: frozenset = ALL_NEEDS) -> Iterator[None]:
    """Within one ``check_splits`` / ``diagnose`` call, scan each split once and share it between the checks.

    Every scan in the session computes ``needs`` (the optional parts the session's checks use, see
    :func:`tropt.data.scan.scan`) besides what its own check asks for, so one pass serves them all; pass fewer needs
    when only cheap checks run (vectorising free text for a neighbour search that will not run costs far more than
    the fingerprints)."""
    token = _SESSION.set({_NEEDS: frozenset(needs)})
    try:
        yield
    finally:
        _SESSION.reset(token)


def _file_key(obj: Any, opts: Options, kinds: Mapping) -> tuple | None:
    if not is_path(obj) or dask_splits.is_dataset_path(os.fspath(obj)):
        return None  # a dataset's directory does not change when a partition file is rewritten: never cached
    path = os.path.abspath(os.fspath(obj))
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_size, st.st_mtime_ns, opts, tuple(sorted(kinds.items(), key=lambda kv: str(kv[0]))))


def lookup(obj: Any, opts: Options, kinds: Mapping, needs: frozenset) -> tuple[Any, Any, SplitData | None]:
    """(session key, file key, the cached scan holding ``needs`` or None) of one split."""
    sess = _SESSION.get()
    key = ("mem", id(obj), opts, tuple(sorted(kinds.items(), key=lambda kv: str(kv[0])))) if sess is not None else None
    fkey = _file_key(obj, opts, kinds)
    data = None
    if key is not None and sess is not None and key in sess and needs <= sess[key][1].has:
        data = sess[key][1]
    elif fkey is not None and fkey in _FILE_CACHE and needs <= _FILE_CACHE[fkey].has:
        _FILE_CACHE.move_to_end(fkey)
        data = _FILE_CACHE[fkey]
    return key, fkey, data


def wanted_parts(needs: frozenset, fkey: Any) -> frozenset:
    """What a new scan computes: inside a session, what the session's checks need; alone, files are read once for
    everything and other splits for what this check needs."""
    sess = _SESSION.get()
    if sess is not None:
        return frozenset(needs) | sess.get(_NEEDS, ALL_NEEDS)
    return ALL_NEEDS if fkey is not None else frozenset(needs)


def store_file(fkey: Any, data: SplitData) -> None:
    """Keep a file's scan (the last few files only)."""
    if fkey is not None:
        _FILE_CACHE[fkey] = data
        while len(_FILE_CACHE) > _FILE_CACHE_SIZE:
            _FILE_CACHE.popitem(last=False)


def store_session(key: Any, obj: Any, data: SplitData) -> None:
    """Keep a split's scan for the rest of the session."""
    sess = _SESSION.get()
    if key is not None and sess is not None:
        sess[key] = (obj, data)  # holding obj keeps its id from being reused during the session


def session_head(r: Reader, cols: list) -> pd.DataFrame | None:
    """:meth:`Reader.head`, read once per session for a Dask split (a round trip to the cluster per check otherwise)."""
    sess = _SESSION.get()
    if sess is None or getattr(r, "ddf", None) is None:
        return r.head(cols)
    key = ("head", id(r.obj), tuple(map(str, cols)))
    if key not in sess:
        sess[key] = (r.obj, r.head(cols))  # holding obj keeps its id from being reused during the session
    return sess[key][1]
