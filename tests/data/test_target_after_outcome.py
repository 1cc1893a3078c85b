"""data.target_leakage: a single feature near-perfect alone and far beyond all the other features combined is a value
recorded after the outcome (FAIL); a strong feature on an easy task whose other features are strong too stays a
WARN (iris petal width)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tropt.data import check_target_leakage
from tropt.result import Status
from tropt.testing import untouched


def noisy_task(after_outcome: bool, seed: int = 0, n: int = 2000) -> dict:
    """A hard binary task (three weak inputs, three noise columns), optionally with a column recorded after the
    outcome: the label plus noise, AUC about 0.99 alone (below the 0.995 'label copy' bar)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6))
    y = (rng.random(n) < 1 / (1 + np.exp(-0.7 * x[:, :3].sum(1)))).astype(int)
    df = pd.DataFrame(x, columns=list("abcdef")).assign(y=y)
    if after_outcome:
        df["refund_issued"] = y + rng.normal(0, 0.27, n)
    return {"train": df.iloc[:1400], "test": df.iloc[1400:]}


def test_a_feature_far_beyond_the_rest_combined_fails():
    splits = noisy_task(True)
    with untouched(*splits.values()):
        r = check_target_leakage(splits, label="y", progress=False)
    assert r.status is Status.FAIL, r.summary
    assert r.metrics["top_feature"] == "refund_issued" and r.metrics["beyond_rest_features"] == 1
    row = r.tables["features"].set_index("feature").loc["refund_issued"]
    assert 0.98 <= row["power_train"] < 0.995  # not a plain label copy: the old rule only WARNed
    assert row["rest_power"] < 0.8  # every other feature together is far weaker
    assert "recorded after the outcome" in r.summary and "'refund_issued'" in r.advice[0]


def test_the_same_task_without_it_passes():
    r = check_target_leakage(noisy_task(False), label="y", progress=False)
    assert r.status is Status.PASS, r.summary


@pytest.mark.parametrize("seed", [0, 3, 6])
def test_iris_petal_width_stays_a_warn(seed):
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    df = load_iris(as_frame=True).frame
    tr, te = train_test_split(df, test_size=0.3, random_state=seed, stratify=df["target"])
    r = check_target_leakage({"train": tr, "test": te}, label="target", progress=False)
    assert r.status is Status.WARN and r.metrics["beyond_rest_features"] == 0, r.summary
    measured = r.tables["features"]["rest_power"].dropna()
    assert len(measured) and (measured > 0.95).all()  # the others together are as strong
