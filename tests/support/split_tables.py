"""Tables with known answers shared by the stage-1 check tests: a train/test pair of users with ids, dates, numeric
and string features and a label, and copies of train rows planted into test."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "data", "samples")
OPTS = dict(label="y", group="uid", time="ts", progress=False)


def make_table(n: int, seed: int, id_start: int, start: str, end: str) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lo, hi = pd.Timestamp(start).value, pd.Timestamp(end).value
    df = pd.DataFrame({
        "uid": np.arange(id_start, id_start + n),
        "ts": pd.to_datetime(np.sort(rng.integers(lo, hi, n))),
        "f_float": rng.normal(size=n),
        "f_int": rng.integers(0, 1000, n),
        "f_str": rng.choice(["a", "b", "c", "d"], n),
        "f_more": rng.normal(size=n) * 10,
    })
    df["y"] = (df.f_float + 0.5 * rng.normal(size=n) > 0).astype(int)
    return df


def clean_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """600 train rows of 2023, 300 test rows of 2024: no shared rows, ids or dates; the label depends on f_float."""
    return make_table(600, 0, 0, "2023-01-01", "2023-12-31"), make_table(300, 1, 10_000, "2024-01-01", "2024-06-30")


def with_copies(train: pd.DataFrame, test: pd.DataFrame, k: int, seed: int = 3) -> tuple[pd.DataFrame, np.ndarray]:
    """Test with its first k rows replaced by copies of k train rows (features, label; new id and date), and the
    positions of the train rows copied."""
    rng = np.random.default_rng(seed)
    src = rng.choice(len(train), k, replace=False)
    test = test.copy()
    cols = ["f_float", "f_int", "f_str", "f_more", "y"]
    test.loc[test.index[:k], cols] = train.iloc[src][cols].to_numpy()
    return test.astype(train.dtypes.to_dict()), src
