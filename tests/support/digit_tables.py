"""scikit-learn's digits (1,797 images of 8x8 pixels on 0-16, shipped with the package) as a table, split at random,
with rows copied before the split: the stage-1 copy checks' known answers on discrete data from a large space."""

from __future__ import annotations

import numpy as np
import pandas as pd

PIXELS = [f"p{i}" for i in range(64)]


def digit_table() -> pd.DataFrame:
    """The 64 pixel columns and the digit as ``y``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return pd.DataFrame(d.data, columns=PIXELS).assign(y=d.target)


def digits_with_copies(share: float, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test): digits with ``share`` of its rows copied (1.0: the whole set doubled) before a random 80/20
    split; 0.0 is the clean split."""
    x = digit_table()
    rng = np.random.default_rng(seed)
    extra = x if share >= 1 else x.iloc[rng.choice(len(x), round(share * len(x)), replace=False)]
    full = pd.concat([x, extra], ignore_index=True).iloc[rng.permutation(len(x) + len(extra))]
    cut = int(0.8 * len(full))
    return full.iloc[:cut], full.iloc[cut:]
