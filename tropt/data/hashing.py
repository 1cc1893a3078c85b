"""Canonical content fingerprints of rows and values: the one hash every data check compares.

Fingerprints are canonical: ``-0.0 == 0.0``, ``NaN == NaN`` (and ``None``/``NaT`` are one missing value), ints
and floats of the same value agree (values up to 2**53 compare as float64; integers beyond that, where float64
cannot tell neighbours apart, compare exactly by their decimal text, never through float), column order and the
index are ignored (each column's hash is seeded by its name). Every function returns a new array; nothing passed in
is modified.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np
import pandas as pd

from ..errors import DataError
from .text_safe import escape_all, unhashable_column

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
    return np.uint64(pd.util.hash_array(escape_all(np.array([text], dtype=object)))[0])


def canonical_float_bits(v: np.ndarray) -> np.ndarray:
    """float64 bit patterns with -0.0 folded into 0.0 and every NaN into one pattern (a new array)."""
    v = np.asarray(v, dtype=np.float64) + 0.0  # x + 0.0 turns -0.0 into +0.0 and always copies
    bits = v.view(np.uint64)
    bits[np.isnan(v)] = _NAN_BITS
    return bits


_EXACT = 2.0**53  # float64 holds every integer up to this; beyond it, integers are hashed by their exact text


def _int_text(x: Any, f: float) -> str | None:
    """The exact decimal text of a wide integer value ``x`` (``f``: its float64 value), or None to keep float."""
    if isinstance(x, (bool, np.bool_)):
        return None
    i: int | None = None
    if isinstance(x, (int, np.integer)):
        i = int(x)
    elif isinstance(x, str):
        with contextlib.suppress(ValueError):  # "1e30": a float written as text, below
            i = int(x.strip())
    if i is None and np.isfinite(f) and float(f).is_integer():
        i = int(f)  # a float (or Decimal) beyond 2**53 is an integer
    return str(i) if i is not None and abs(i) > 2**53 else None


def _fix_wide(out: np.ndarray, v: np.ndarray, raw: Any) -> None:
    """Overwrite ``out``'s hashes of integers beyond 2**53 with their exact text's hash (in place).

    ``v``: the values as float64; ``raw(idx)``: the original values at those positions (ints, strings, ...)."""
    with np.errstate(invalid="ignore"):
        idx = np.flatnonzero(np.abs(v) >= _EXACT)
    if not len(idx):
        return
    texts = [_int_text(x, f) for x, f in zip(raw(idx), v[idx])]
    keep = np.array([t is not None for t in texts], dtype=bool)
    if keep.any():
        out[idx[keep]] = _string_hash(np.array([t for t in texts if t is not None], dtype=object))


_NA_HASH = np.uint64(np.iinfo(np.uint64).max)  # what pandas' categorised hashing gives every missing value


def _string_hash(values: np.ndarray, column: Any = None) -> np.ndarray:
    vals = np.asarray(values, dtype=object)
    try:
        out = pd.util.hash_array(vals, categorize=True)  # a new array; None/NaN alike
    except UnicodeEncodeError:  # lone surrogates: hashed as their escapes, as every split's copy holds them
        out = pd.util.hash_array(escape_all(vals), categorize=True)
    except DataError:
        raise
    except Exception as e:
        raise unhashable_column(vals, column, e) from e
    out[out == _NA_HASH] = _MISSING
    return out


def _string_hash_series(s: pd.Series) -> np.ndarray:
    """:func:`_string_hash` of a column's values, computed on the column's own storage.

    ``hash_pandas_object`` hashes Arrow strings and categorical codes without building a Python object per row
    (each distinct value is hashed once); the hashes equal :func:`_string_hash`'s, so splits stored either way
    still match."""
    try:
        out = pd.util.hash_pandas_object(s, index=False, categorize=True).to_numpy(dtype=np.uint64, copy=True)
    except Exception:  # noqa: BLE001 - lone surrogates or a raising __str__: the object path says which
        return _string_hash(s.to_numpy(dtype=object), s.name)
    out[out == _NA_HASH] = _MISSING
    return out


def hash_column(s: pd.Series, kind: str | None) -> np.ndarray:
    """Canonical uint64 value hashes of one column (a new array; ``s`` is not touched)."""
    if kind == "numeric" and (pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype)):
        if pd.api.types.is_timedelta64_dtype(s.dtype):
            ints = s.to_numpy(dtype="timedelta64[ns]").view(np.int64)
            v = ints.astype(np.float64)
            v[np.isnat(ints.view("timedelta64[ns]"))] = np.nan
            raw = ints.__getitem__
        else:
            v = s.to_numpy(dtype=np.float64, na_value=np.nan)
            raw = _raw_values(s)
        bits = canonical_float_bits(v)
        bits[np.isnan(v)] = _MISSING
        _fix_wide(bits, v, raw)
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
            out[rest] = _string_hash(s.to_numpy(dtype=object)[rest], s.name)
        _fix_wide(out, v, _raw_values(s))
        return out
    if isinstance(s.dtype, pd.CategoricalDtype) and pd.api.types.is_datetime64_any_dtype(s.dtype.categories.dtype):
        s = s.astype(object)
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        s = s.astype(str).where(s.notna(), None)
    return _string_hash_series(s)


def _raw_values(s: pd.Series):
    """``idx -> s``'s values at those positions, as numpy ints for integer columns and objects otherwise."""
    if isinstance(s.dtype, np.dtype) and s.dtype.kind in "iu":
        return lambda idx: s.to_numpy()[idx].tolist()
    return lambda idx: s.iloc[idx].to_numpy(dtype=object)


def _fits_float(v: np.ndarray) -> bool:
    """Whether every value of a numpy numeric column is exact in float64's integer range (no wide integers)."""
    if not len(v) or v.dtype.kind == "b":
        return True
    hi, lo = np.fmax.reduce(v), np.fmin.reduce(v)  # NaN-skipping, no temporary
    return not bool(hi >= _EXACT or lo <= -_EXACT)  # all-NaN: both NaN, both comparisons False


_BLOCK = 1 << 14  # rows per block of the plain numeric columns: a block's temporaries stay in the core's cache


def hash_rows(frame: pd.DataFrame, columns: list, kinds: Mapping[Any, str]) -> np.ndarray:
    """Row fingerprints over ``columns`` (order-independent: each column's hash is seeded by its name)."""
    acc = np.zeros(len(frame), dtype=np.uint64)
    plain = []
    for col in columns:
        s = frame[col]
        if kinds[col] == "numeric" and isinstance(s.dtype, np.dtype) and s.dtype.kind in "biuf":
            v = s.to_numpy()
            if _fits_float(v):
                plain.append((v, _name_seed(col)))
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
    # cast: numpy's stubs give all three one joined (float) dtype, and uint64 arrays support ^=
    f, z, t = cast("Iterator[np.ndarray]",
                   (np.empty(min(n, _BLOCK), dtype=d) for d in (np.float64, np.uint64, np.uint64)))
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
    wide = flat.dtype.kind in "iuf" and not _fits_float(flat.ravel())
    for a in range(0, n, step):
        block = flat[a:a + step]
        bits = canonical_float_bits(block)
        if wide:  # integers beyond 2**53: exact text hashes, never through float
            v = np.asarray(block, dtype=np.float64).ravel()
            flat_bits = bits.reshape(-1)
            _fix_wide(flat_bits, v, lambda idx, b=block: b.ravel()[idx].tolist())
        out[a:a + step] = mix(mix(bits ^ seeds[None, :]).sum(axis=1, dtype=np.uint64) + _GOLD)
    return out
