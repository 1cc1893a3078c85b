"""What a column holds, for comparing it: its comparison kind ("numeric", "datetime", "string", "text", "mixed"),
and whether its values are numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import DataError

_UNHASHABLE = (list, dict, set, tuple, np.ndarray)


def column_kind(s: pd.Series, split: str) -> str:
    """"numeric", "datetime", "string" or "mixed" (numbers and strings); raises for unhashable values.

    A "string" column that :func:`looks_like_text` is then made "text" (same fingerprints; also vectorised for the
    near-duplicate search) by :func:`tropt.data.load.load_splits` / :func:`tropt.data.scan.scan`.
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
            f"convert it to strings (df[{s.name!r}].map(str)), expand it into columns, "
            "or leave it out with features=[...]",
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



def head_kinds(head: pd.DataFrame, feats: list, name: str) -> dict:
    """Each feature column's comparison kind from a split's first rows (one split alone; see load_splits)."""
    kinds = {}
    for c in feats:
        k = column_kind(head[c], name)
        kinds[c] = "text" if k == "string" and looks_like_text(head[c].iloc[:10_000]) else k
    return kinds


def is_numeric(s: pd.Series) -> bool:
    """Whether a column holds real numbers or booleans (complex numbers are not)."""
    return ((pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype))
            and not pd.api.types.is_complex_dtype(s.dtype))


def numeric_values(s: pd.Series) -> np.ndarray:
    """A column's values as float64 (missing and unparseable values NaN; a new array)."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    if is_numeric(s):
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
