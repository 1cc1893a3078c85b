"""Regenerate the bundled sample (deterministic): ``python data/samples/make_samples.py``.

Writes ``train.csv`` and ``test.csv``: a customer-churn table with a documented, deliberate defect set
(see README.md in this folder).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

N_TRAIN, N_TEST = 3000, 1000
N_COPIED = 30  # test rows that are exact copies of train rows (features, label, id and date)
N_SHARED_IDS = 25  # further test rows whose customer_id also appears in train (new features, same customer)


def _customers(rng: np.random.Generator, ids: np.ndarray, start: str, end: str) -> pd.DataFrame:
    n = len(ids)
    lo, hi = pd.Timestamp(start).value // 10**9, pd.Timestamp(end).value // 10**9
    df = pd.DataFrame(
        {
            "customer_id": ids,
            "signup_date": pd.to_datetime(rng.integers(lo, hi, n), unit="s").normalize(),
            "age": rng.integers(18, 80, n),
            "tenure_months": rng.integers(1, 72, n),
            "monthly_spend": np.round(rng.gamma(4.0, 15.0, n), 2),
            "support_calls": rng.poisson(1.5, n),
            "plan": rng.choice(["basic", "plus", "pro"], n, p=[0.5, 0.3, 0.2]),
        }
    )
    logit = (-0.5 - 0.04 * df.tenure_months + 0.45 * df.support_calls + 0.01 * (df.monthly_spend - 60)
             - 0.6 * (df.plan == "pro"))
    df["churned"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    return df


def make(seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    train = _customers(rng, np.arange(100000, 100000 + N_TRAIN), "2023-01-01", "2024-06-30")
    test = _customers(rng, np.arange(200000, 200000 + N_TEST), "2024-07-01", "2024-12-31")
    copied = rng.choice(N_TRAIN, N_COPIED, replace=False)
    test.iloc[:N_COPIED] = train.iloc[copied].to_numpy()
    rest = np.setdiff1d(np.arange(N_TRAIN), copied)
    test.loc[N_COPIED:N_COPIED + N_SHARED_IDS - 1, "customer_id"] = rng.choice(train.customer_id.to_numpy()[rest],
                                                                               N_SHARED_IDS, replace=False)
    test = test.astype(train.dtypes.to_dict())
    return train, test


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    train, test = make()
    train.to_csv(os.path.join(here, "train.csv"), index=False, date_format="%Y-%m-%d")
    test.to_csv(os.path.join(here, "test.csv"), index=False, date_format="%Y-%m-%d")
    print(f"train {train.shape}, test {test.shape}")
