"""data.label_shift on data with known answers (effect-size boundaries, regression, drift over time)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tropt.data import check_label_shift
from tropt.result import Status


def shifted(p_train: float, p_test: float, n: int = 2000):
    a = pd.DataFrame({"x": np.arange(n), "y": (np.arange(n) < p_train * n).astype(int)})
    b = pd.DataFrame({"x": np.arange(n), "y": (np.arange(n) < p_test * n).astype(int)})
    return {"train": a, "test": b}


@pytest.mark.parametrize("p_test,status", [(0.5, Status.PASS), (0.62, Status.WARN), (0.85, Status.FAIL)])
def test_label_shift_effect_size_boundaries(p_test, status):
    r = check_label_shift(shifted(0.5, p_test), label="y", progress=False)
    assert r.status is status, r.summary  # Cramér's V: 0, 0.12, 0.37
    assert r.plot() is not None


def test_label_shift_not_by_p_value_alone_and_regression():
    r = check_label_shift(shifted(0.5, 0.53, n=200_000), label="y", progress=False)
    assert r.metrics["p_value.test_vs_train"] < 1e-6 and r.status is Status.PASS  # significant but tiny effect
    rng = np.random.default_rng(0)
    a = pd.DataFrame({"x": range(3000), "t": rng.normal(0, 1, 3000)})
    b = pd.DataFrame({"x": range(3000), "t": rng.normal(1.0, 1, 3000)})
    r = check_label_shift({"train": a, "test": b}, label="t", progress=False)
    assert (r.metrics["task"] == "regression" and r.status is Status.FAIL
            and r.tables["pairs"]["wasserstein_in_sd"][0] > 0.8)
    assert r.plot() is not None


def test_a_trending_target_split_by_time_is_drift_not_a_broken_split():
    """statsmodels' macrodata (shipped): real GDP by quarter, the last 20% of quarters as test. Its label shifts
    completely (KS 1.0). With time= the splits are seen to be time-ordered: a WARN that names the drift, never the
    advice to re-split by stratification (which would leak the future); without time= the shift is a FAIL; a
    random split of the same rows passes."""
    sm = pytest.importorskip("statsmodels.api")
    macro = sm.datasets.macrodata.load_pandas().data
    macro["date"] = pd.PeriodIndex.from_fields(year=macro["year"].astype(int), quarter=macro["quarter"].astype(int),
                                               freq="Q").to_timestamp()
    cut = int(len(macro) * 0.8)
    chrono = {"train": macro.iloc[:cut], "test": macro.iloc[cut:]}
    r = check_label_shift(chrono, label="realgdp", time="date", progress=False)
    assert r.status is Status.WARN and r.metrics["time_drift"] is True, r.summary
    assert "later period" in r.summary and "100% of 'test' labels lie outside 'train''s range" in r.summary
    assert not any("stratif" in a and "Re-split" in a for a in r.advice) and "leak the future" in r.advice[0]
    assert bool(r.tables["pairs"]["time_ordered"][0])
    assert check_label_shift(chrono, label="realgdp", progress=False).status is Status.FAIL  # not told it is temporal
    mixed = macro.sample(frac=1, random_state=0)
    r = check_label_shift({"train": mixed.iloc[:cut], "test": mixed.iloc[cut:]}, label="realgdp", time="date",
                          progress=False)
    assert r.status is Status.PASS and not r.tables["pairs"]["time_ordered"][0], r.summary
