"""Text values every data check can hash, compare and show: lone surrogates (what ``os.listdir`` gives for a
non-UTF-8 file name, under Python's ``surrogateescape``) cannot be encoded as UTF-8, so pandas' hashing, Arrow
strings and every writer refuse them. A split's copy (never the user's object) holds such a value with its
surrogates written as ``\\udcXX`` escapes instead, and a value whose ``__str__`` raises is named by its column."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError


def escape_text(v: str) -> str:
    """``v`` with each lone surrogate as its ``\\udcXX`` escape (``v`` itself when it has none)."""
    try:
        v.encode("utf-8")
        return v
    except UnicodeEncodeError:
        return v.encode("utf-8", "backslashreplace").decode("utf-8")


def _encodable(vals: np.ndarray) -> bool:
    """Whether every string among ``vals`` encodes as UTF-8 (one C pass for all-string columns)."""
    try:
        "\0".join(vals).encode("utf-8")
        return True
    except TypeError:  # not all strings: look at the strings alone
        pass
    except UnicodeEncodeError:
        return False
    try:
        "\0".join([v for v in vals if isinstance(v, str)]).encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def safe_values(s: pd.Series) -> pd.Series:
    """``s``, or a new object Series with its lone surrogates escaped (``s`` is never modified)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        cats = s.cat.categories
        if cats.dtype == object and not _encodable(cats.to_numpy(dtype=object)):
            return s.cat.rename_categories([escape_text(c) if isinstance(c, str) else c for c in cats])
        return s
    python_strings = isinstance(s.dtype, pd.StringDtype) and s.dtype.storage == "python"
    if s.dtype != object and not python_strings:
        return s  # numbers, datetimes and Arrow strings (which cannot hold lone surrogates)
    vals = s.to_numpy(dtype=object, na_value=None) if python_strings else s.to_numpy(dtype=object)
    if _encodable(vals):
        return s
    return pd.Series([escape_text(v) if isinstance(v, str) else v for v in vals], index=s.index, name=s.name,
                     dtype=object)


def safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df``, or a shallow copy whose object columns holding lone surrogates are replaced by escaped copies."""
    fixed = {}
    for i in range(df.shape[1]):
        s = df.iloc[:, i]
        t = safe_values(s)
        if t is not s:
            fixed[i] = t
    if not fixed:
        return df
    out = df.copy(deep=False)
    for i, t in fixed.items():
        out.isetitem(i, t)
    return out


def safe_array(y: np.ndarray) -> np.ndarray:
    """An object label array with lone surrogates escaped (a new array; other arrays are returned as they are)."""
    if y.dtype != object or _encodable(y.ravel()):
        return y
    return np.array([escape_text(v) if isinstance(v, str) else v for v in y.ravel()], dtype=object).reshape(y.shape)


def escape_all(vals: np.ndarray) -> np.ndarray:
    """An object array with every string's lone surrogates escaped (a new array)."""
    return np.array([escape_text(v) if isinstance(v, str) else v for v in vals], dtype=object)


def unhashable_column(vals: np.ndarray, column: Any, error: BaseException) -> DataError:
    """The DataError for a column whose values pandas could not hash: the first value whose ``__str__`` raises
    (what pandas hashes objects by), or ``error`` itself."""
    for v in vals:
        if not isinstance(v, str):
            try:
                str(v)
            except Exception as e:  # noqa: BLE001 - any failure of the user's __str__ is the column's problem
                return _str_error(v, column, e)
    return DataError(f"column {column!r}: its values cannot be fingerprinted ({type(error).__name__}: {error})",
                     "convert the column to plain numbers or strings first, or leave it out with features=[...]")


def _str_error(v: Any, column: Any, e: BaseException) -> DataError:
    return DataError(f"column {column!r} holds a {type(v).__name__} value whose __str__ raises "
                     f"{type(e).__name__}: {e}",
                     f"convert the column to plain values first (e.g. df[{column!r}].map(<your to-text>)), "
                     "or leave it out with features=[...]")
