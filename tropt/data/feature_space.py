"""How many value combinations a table's feature columns can take: in a feature space too small to judge (a few
discrete answers), rows coincide by chance across and within splits, so exact copies do not show leakage. Shared by
``data.exact_duplicates`` and ``data.near_duplicates``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ._common import _load


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
    discrete and keeps the product bound."""
    datas = _load(splits, label, group, time, features, progress, needs={"sample"})
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


def too_small_to_judge(splits: Mapping[str, Any], label: Any, group: Any, time: Any, features: Any, progress: bool,
                       datas: list, small_space: float) -> tuple[bool, tuple | None]:
    """Whether a table's feature space is too small to judge exact copies (at most ``small_space`` x rows)."""
    if not datas[0].tabular:
        return False, None
    space = feature_space(splits, label, group, time, features, progress)
    return bool(space[0] <= np.log10(small_space * sum(d.n for d in datas))), space


def space_words(space: tuple) -> str:
    """The feature space bound in words, for the summary."""
    if space[2] == "product":
        return f"{space[1]} feature column(s) take at most {10 ** space[0]:,.0f} value combinations"
    return f"{space[1]} discrete feature column(s) show about {10 ** space[0]:,.0f} possible combinations ({space[2]})"
