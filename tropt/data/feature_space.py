"""How many value combinations a table's feature columns can take, and whether exact copies across splits are what
chance gives there. In a feature space too small to judge (a few discrete answers), rows coincide by chance across
and within splits, so exact copies do not show leakage. Shared by ``data.exact_duplicates`` and
``data.near_duplicates``.

The size of the space is estimated from the rows (:func:`feature_space`), and rows copied before a random split
repeat too: the more copies, the smaller the space they imply, and the more of the leak would be excused. So the
chance verdict also needs evidence that copies cannot make (:func:`neighbourhood`): in a space small enough for rows
to coincide by chance, rows that differ in a few columns (the space's step) are at least as common as rows that
coincide, while exact copies of rows from a large space (images, measurements) add exact matches and no near ones.
Within-split repeat rates cannot tell the two apart: a random split spreads copies across and within splits in the
same proportions as chance coincidences."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ._common import _load

NEAR_COLUMNS = 2  # the least step counted as near: one answer of a one-hot-encoded question changes two columns
NEIGHBOURHOOD_COST = 3e8  # column comparisons of the near-row search (about a second on two cores)
NEIGHBOURHOOD_ROWS = (64, 1000)  # later-split rows examined: at least (cost permitting at most) this many
P_COPIES = 1e-3  # one-sided sign test: exact-only rows this unlikely to outnumber near-only ones under chance
DEGENERATE_REPEATS = 10.0  # an earlier split whose rows repeat this often on average holds only a handful of vectors


def _space(datas: list) -> tuple[float, int, str]:
    """:func:`feature_space` of splits loaded with their row samples."""
    cols = datas[0].feature_columns
    frames = [d.sample for d in datas if d.sample is not None]
    both = pd.concat([f[cols] for f in frames], ignore_index=True) if len(frames) > 1 else frames[0][cols]
    distinct = [both[c].nunique(dropna=False) for c in cols]
    if any(k >= 0.5 * len(both) for k in distinct):  # a mostly-distinct column: the sample cannot bound it
        return float("inf"), len(cols), "product"
    product = float(sum(np.log10(max(1, k)) for k in distinct))
    first = datas[0].sample
    if first is None or len(first) < 2 or max(distinct, default=1) > np.sqrt(len(both)):
        return product, len(cols), "product"
    n = len(first)
    d = int(first[cols].drop_duplicates().shape[0])
    if d >= n:
        return product, len(cols), "product"
    lo, hi = float(d), float(d)
    while hi * (1 - np.exp(-n / hi)) < d:  # occupancy D(S) grows with S towards n
        hi *= 2
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mid * (1 - np.exp(-n / mid)) < d else (lo, mid)
    observed = float(np.log10(hi))
    if observed < product - np.log10(2):  # clearly fewer than the product (otherwise its "at most" is plainer)
        return observed, len(cols), f"rows: {d} distinct of {n} {datas[0].name} rows"
    return product, len(cols), "product"


def feature_space(splits: Mapping[str, Any], label: Any, group: Any, time: Any, features: Any,
                  progress: bool) -> tuple[float, int, str]:
    """log10 of how many value combinations the feature columns can take, the number of feature columns, and how
    that bound was found.

    The product of each column's distinct values (missing counting as one, in the splits' row samples) is one bound;
    it ignores dependence between columns (20 one-hot columns of 6 answers: 2^20, yet only 1,296 combinations
    exist). When every column is discrete (at most sqrt(rows) distinct values, so values repeat by chance within
    the column), the rows themselves give a second bound: the earliest split's sample of N rows shows D distinct
    vectors, and a space of S equally likely vectors gives D = S (1 - exp(-N / S)) on average, solved for S
    (infinite when no row repeats). A continuous table whose rows were copied (each value three times) is not
    discrete and keeps the product bound; a discrete one is not, so the chance verdict also needs
    :func:`neighbourhood`."""
    return _space(_load(splits, label, group, time, features, progress, needs={"sample"}))


def _codes(later: pd.DataFrame, earlier: pd.DataFrame, cols: list) -> tuple[np.ndarray, np.ndarray]:
    """Both samples' feature values as integer codes per column (one code per value, missing included; an int 1
    and a float 1.0 share one): (later codes, earlier codes), rows x columns."""
    both = pd.concat([earlier[cols], later[cols]], ignore_index=True)
    m = np.empty((len(both), len(cols)), dtype=np.int32)
    for j, c in enumerate(cols):
        m[:, j] = pd.factorize(both[c].to_numpy(), use_na_sentinel=False)[0]
    return m[len(earlier):], m[:len(earlier)]


def _sign_test(a: int, b: int) -> float:
    """P(X >= a) for X ~ Binomial(a + b, 1/2): how often ``a`` exact-only rows would outnumber ``b`` near-only ones
    if each were as likely as the other."""
    n = a + b
    return sum(math.comb(n, k) for k in range(a, n + 1)) / 2 ** n if n else 1.0


def neighbourhood(later: pd.DataFrame, earlier: pd.DataFrame, cols: list) -> dict:
    """Exact and near matches of the later split's sampled rows among the earlier split's sampled rows: whether each
    row has an earlier row with the same features (exact), and whether it has a different earlier row no farther
    than the space's step (near). The step is the smallest distance, in columns, from any examined row to a
    different earlier row, and at least NEAR_COLUMNS.

    Chance in a small space gives both (a row's near neighbourhood holds more vectors than the row itself); copies
    of rows from a large space give exact matches and no near ones. ``refuted`` (chance cannot explain the exact
    matches) when rows matched only exactly outnumber rows matched only nearly beyond a one-sided sign test at
    P_COPIES, unless the earlier split holds only a handful of vectors, each repeated about DEGENERATE_REPEATS
    times or more (two far-apart answers, 0000 and 1111, are a tiny space with no near rows)."""
    lat, ref = _codes(later, earlier, cols)
    ref = np.unique(ref, axis=0)
    lo, hi = NEIGHBOURHOOD_ROWS
    q = int(min(len(lat), np.clip(NEIGHBOURHOOD_COST / max(1, ref.size), lo, hi)))
    pick = np.unique(np.linspace(0, len(lat) - 1, q).astype(np.int64)) if q else np.empty(0, np.int64)
    acc = np.uint16 if ref.shape[1] < np.iinfo(np.uint16).max else np.uint32  # counts of differing columns
    far = np.iinfo(acc).max  # no different earlier row
    exact, nearest = np.zeros(len(pick), bool), np.full(len(pick), far, dtype=np.int64)
    ref_t = np.ascontiguousarray(ref.T)  # column by column: each pass compares contiguous rows
    chunk = max(1, (1 << 22) // max(1, len(ref)))
    for a in range(0, len(pick), chunk):  # columns that differ, one column at a time (rows x earlier vectors)
        block = np.ascontiguousarray(lat[pick[a:a + chunk]].T)
        d = np.zeros((block.shape[1], len(ref)), dtype=acc)
        for c in range(len(ref_t)):
            d += block[c][:, None] != ref_t[c][None, :]
        exact[a:a + chunk] = (d == 0).any(axis=1)
        d[d == 0] = far
        nearest[a:a + chunk] = d.min(axis=1)  # columns to the nearest different earlier vector
    # The space's step: one answer may change several columns (x, x^2, x^3), never fewer than the closest two
    # different vectors are apart (copies make no different vectors).
    step = max(NEAR_COLUMNS, int(nearest.min())) if len(pick) and len(ref) > 1 else NEAR_COLUMNS
    near = nearest <= step
    exact_only, near_only = int(np.sum(exact & ~near)), int(np.sum(near & ~exact))
    p = _sign_test(exact_only, near_only)
    degenerate = len(earlier) >= DEGENERATE_REPEATS * max(1, len(ref))
    return {"rows": len(pick), "exact_rate": float(exact.mean()) if len(pick) else 0.0,
            "near_rate": float(near.mean()) if len(pick) else 0.0, "exact_only": exact_only, "near_only": near_only,
            "p": p, "step": step, "earlier_distinct": len(ref), "degenerate": degenerate,
            "refuted": bool(p < P_COPIES and not degenerate)}


@dataclass(frozen=True)
class Chance:
    """Whether exact copies across splits are what chance gives: the feature space bound (:func:`feature_space`),
    whether it alone is small (at most ``small_space`` x rows), and each judged (later, earlier) pair's
    :func:`neighbourhood`."""

    space: tuple
    small: bool
    pairs: dict[tuple[int, int], dict] = field(default_factory=dict)

    def of(self, pair: tuple[int, int]) -> bool:
        """Whether the pair's exact copies are chance: a small space whose near rows do not refute it."""
        return self.small and not self.pairs.get(pair, {}).get("refuted", False)

    def record(self, metrics: dict, datas: list) -> None:
        """The bound and every judged pair's neighbourhood into ``metrics``."""
        if np.isfinite(self.space[0]):
            metrics["feature_combinations_log10"] = round(self.space[0], 3)
        metrics["space_bound_small"] = self.small
        for (li, ei), nb in self.pairs.items():
            key = f"{datas[li].name}_in_{datas[ei].name}"
            metrics[f"neighbourhood_rows.{key}"] = nb["rows"]
            metrics[f"exact_match_rate_sampled.{key}"] = nb["exact_rate"]
            metrics[f"near_match_rate.{key}"] = nb["near_rate"]
            metrics[f"copies_not_chance.{key}"] = nb["refuted"]


def judge_chance(splits: Mapping[str, Any], label: Any, group: Any, time: Any, features: Any, progress: bool,
                 datas: list, small_space: float, pairs: Sequence[tuple[int, int]]) -> Chance | None:
    """Whether a table's exact copies are chance (None for samples that are not a table): the feature space bound
    and, when it is small, the :func:`neighbourhood` of each (later, earlier) pair in ``pairs`` (split positions)."""
    if not datas[0].tabular:
        return None
    sampled = _load(splits, label, group, time, features, progress, needs={"sample"})
    space = _space(sampled)
    small = bool(space[0] <= np.log10(small_space * sum(d.n for d in datas)))
    judged = {}
    if small:
        cols = sampled[0].feature_columns
        for li, ei in pairs:
            later, earlier = sampled[li].sample, sampled[ei].sample
            if later is not None and earlier is not None and len(later) and len(earlier):
                judged[(li, ei)] = neighbourhood(later, earlier, cols)
    return Chance(space, small, judged)


def space_words(space: tuple) -> str:
    """The feature space bound in words, for the summary."""
    if space[2] == "product":
        return f"{space[1]} feature column(s) take at most {10 ** space[0]:,.0f} value combinations"
    return f"{space[1]} discrete feature column(s) show about {10 ** space[0]:,.0f} possible combinations ({space[2]})"


def refutation_words(nb: dict, later: str, earlier: str) -> str:
    """Why the pair's exact copies are not chance, for the summary."""
    return (f"of {nb['rows']} {later} rows examined, {nb['exact_rate']:.0%} have an exact copy in {earlier} but "
            f"{nb['near_rate']:.0%} a {earlier} row differing in 1-{nb['step']} columns; in a space small enough "
            "for chance copies such near rows are at least as common, so these are copies, not chance")
