"""What the stage-1 table checks share: loading splits, split pairs, result helpers, label handling.

Every check takes the ordered ``splits`` mapping first (earlier splits first: train, val, test, ...) and checks
each later split against every earlier one. Feature columns are every column except ``label``, ``group`` and
``time`` unless ``features=`` names them; thresholds are keyword defaults.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import DataError
from ..result import CheckResult, Status
from .columns import column_kind, is_numeric, numeric_values, unify_kinds
from .hashing import hash_column
from .load import load_splits
from .split_data import Options, SplitData

MAX_EVIDENCE = 1000  # evidence rows kept per table; metrics always count everything


def _load(splits, label, group, time, features, progress, min_splits=2, needs=frozenset()) -> list[SplitData]:
    return load_splits(splits, Options.make(label, group, time, features), progress=progress, min_splits=min_splits,
                       needs=frozenset(needs))


def _pairs(datas: list[SplitData]) -> list[tuple[SplitData, SplitData]]:
    """(later, earlier) for every later split and every split before it."""
    return [(datas[i], datas[j]) for i in range(1, len(datas)) for j in range(i)]


def _pkey(later: SplitData, earlier: SplitData) -> str:
    return f"{later.name}_in_{earlier.name}"


def _skip(check: str, why: str) -> CheckResult:
    return CheckResult(check, Status.SKIP, why)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def _label_kind(series: list[pd.Series], names: list[str]) -> str:
    """The one comparison kind of the same column across splits."""
    return unify_kinds([column_kind(s, n) for s, n in zip(series, names)])


def _canon_hashes(series: list[pd.Series], names: list[str]) -> list[np.ndarray]:
    """Canonical value hashes of the same column across splits (ints and floats of one value agree)."""
    kind = _label_kind(series, names)
    return [hash_column(s, kind) for s in series]


def _labels(datas: list[SplitData], label=None) -> list[pd.Series] | None:
    """Every split's labels (from label=, or y of (X, y) splits), or None when a split has none."""
    out = [d.label for d in datas]
    return None if any(s is None for s in out) else out


def infer_task(labels: list[pd.Series], task: str | None = None, num_classes: int | None = None,
               max_classes: int = 50) -> str:
    """"classification" or "regression" from the label values (or what the user said)."""
    if task is not None:
        if task not in ("classification", "regression"):
            raise DataError(f"task={task!r} is not 'classification' or 'regression'",
                            "pass one of those, or None to infer it")
        return task
    if num_classes is not None:
        return "classification"
    if not all(is_numeric(s) for s in labels):
        return "classification"
    v = np.concatenate([numeric_values(s) for s in labels])
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "classification"
    integral = np.mean(v == np.round(v))
    nunique = len(np.unique(v[: 1_000_000]))
    return "classification" if integral >= 0.99 and nunique <= max_classes else "regression"


def regression_reason(labels: list[pd.Series], task: str | None = None, max_classes: int = 50) -> str:
    """Why :func:`infer_task` took these labels for a regression target, in words that are true of them."""
    if task == "regression":
        return "task='regression' was given"
    v = np.concatenate([numeric_values(s) for s in labels])
    v = v[np.isfinite(v)]
    nunique = len(np.unique(v[: 1_000_000]))
    nonint = float(np.mean(v != np.round(v))) if v.size else 0.0
    if nonint <= 0.01:
        return f"{nunique} distinct integer values, more than {max_classes} for classes"
    return f"{nunique} distinct values, {100 * nonint:.0f}% of the labels non-integer"


def _class_keys(s: pd.Series) -> pd.Series:
    """Class values comparable across splits: numbers as floats → ints where integral, else as they are."""
    if is_numeric(s):
        v = numeric_values(s)
        finite = np.isfinite(v)
        # ±inf is no class: it counts as missing here (data.label_sanity reports it as an infinite label)
        out = pd.Series(np.where(finite, v, np.nan))
        if np.all(v[finite] == np.round(v[finite])):
            return out.astype("Int64") if not finite.all() else out.astype(np.int64)
        return out
    return s.astype(object).where(s.notna(), None)


def _counts_table(labels: list[pd.Series], names: list[str]) -> pd.DataFrame:
    counts = {}
    for s, n in zip(labels, names):
        counts[n] = _class_keys(s).dropna().value_counts()
    df = pd.DataFrame(counts).fillna(0).astype(np.int64)
    try:
        df = df.sort_index()
    except TypeError:  # mixed class types
        df = df.loc[sorted(df.index, key=str)]
    df.index.name = "class"
    return df
