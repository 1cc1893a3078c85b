"""``data.label_shift``: the label distribution distance between splits (an effect size, not a p-value alone)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Status
from ._common import _counts_table, _labels, _load, _pairs, _skip, infer_task
from .columns import numeric_values


def _class_pairs(datas: list, labels: list[pd.Series], names: list[str], tables: dict) -> list[dict]:
    """Classification: per pair, chi-squared test of homogeneity and Cramér's V; the per-class table into ``tables``."""
    from scipy import stats

    counts = _counts_table(labels, names)
    props = counts / counts.sum(axis=0).replace(0, 1)
    dist = counts.copy()
    for name in names:
        dist[f"share_{name}"] = props[name]
    tables["class_distribution"] = dist.reset_index()
    pair_rows = []
    for later, earlier in _pairs(datas):
        sub = counts[[earlier.name, later.name]]
        sub = sub[(sub.sum(axis=1) > 0)]
        n = int(sub.to_numpy().sum())
        if len(sub) < 2 or (sub.sum(axis=0) == 0).any():
            chi2, p, v = 0.0, 1.0, 0.0
        else:
            chi2, p, _, _ = stats.chi2_contingency(sub.to_numpy().T, correction=False)
            v = float(np.sqrt(chi2 / n)) if n else 0.0
        tvd = float(0.5 * np.abs(props[later.name] - props[earlier.name]).sum())
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "effect": v, "effect_name": "cramers_v",
                          "chi2": float(chi2), "p_value": float(p), "total_variation": tvd})
    return pair_rows


def _value_pairs(datas: list, vals: list[np.ndarray], names: list[str], tables: dict, series: dict) -> list[dict]:
    """Regression: per pair, the Kolmogorov-Smirnov statistic and the Wasserstein distance in units of the earlier
    split's std; the quantiles into ``tables`` and histograms on one grid into ``series``."""
    from scipy import stats

    index = {n: i for i, n in enumerate(names)}
    q = [0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0]
    tables["quantiles"] = pd.DataFrame({n: (np.quantile(v, q) if v.size else np.full(len(q), np.nan))
                                        for n, v in zip(names, vals)},
                                       index=pd.Index(q, name="quantile")).reset_index()
    allv = np.concatenate(vals)
    if allv.size:
        edges = np.linspace(np.quantile(allv, 0.005), np.quantile(allv, 0.995) + 1e-12, 41)
        series["label_edges"] = edges
        for n, v in zip(names, vals):
            series[f"label_counts:{n}"] = np.histogram(np.clip(v, edges[0], edges[-1]), bins=edges)[0]
    pair_rows = []
    for later, earlier in _pairs(datas):
        a, b = vals[index[earlier.name]], vals[index[later.name]]
        if a.size == 0 or b.size == 0:
            continue
        ks = stats.ks_2samp(a, b)
        sd = float(np.std(a)) or 1.0
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "effect": float(ks.statistic),
                          "effect_name": "ks_statistic", "p_value": float(ks.pvalue),
                          "wasserstein_in_sd": float(stats.wasserstein_distance(a, b) / sd)})
    return pair_rows


def _time_ordered_pairs(datas: list, time: Any) -> set[tuple[str, str]]:
    """(later, earlier) split-name pairs whose later split starts at or after the earlier one ends by ``time`` (as
    data.temporal_leakage reads it); empty without a usable time column (that check reports why)."""
    if time is None or any(d.time is None and not (d.dask_parts or {}).get("time") for d in datas):
        return set()
    from .temporal_leakage import temporal_stats

    try:
        stats = temporal_stats(datas, time, 0)
    except DataError:
        return set()
    return {(datas[li].name, datas[ei].name) for li in range(len(datas)) for ei in range(li)
            if stats[li]["finite"] and stats[ei]["finite"] and stats[li]["min"] >= stats[ei]["max"]}


def _verdict(pairs: pd.DataFrame, metrics: dict, time: Any, warn_effect: float, fail_effect: float,
             alpha: float) -> tuple[Status, str, list[str]]:
    """(status, summary, advice): a significant shift of at least ``warn_effect``; drift when every shifted pair is
    a later period of time-ordered splits."""
    sig = pairs[pairs["p_value"] < alpha] if len(pairs) else pairs
    fail = sig[sig["effect"] >= fail_effect] if len(sig) else sig
    warn = sig[sig["effect"] >= warn_effect] if len(sig) else sig
    eff = metrics["effect_name"]
    drift = warn[warn["time_ordered"]] if len(warn) else warn
    if len(warn) and len(drift) == len(warn):
        # Every shifted pair is a later period after an earlier one (time= given): the target drifting over time,
        # which a time-ordered split shows by design. Judgement, not a defect; and a random re-split would leak.
        w = drift.sort_values("effect", ascending=False).iloc[0]
        metrics["time_drift"] = True
        outside = (f"; {w['outside_earlier_range']:.0%} of {w['split']!r} labels lie outside "
                   f"{w['earlier_split']!r}'s range"
                   if "outside_earlier_range" in w and w["outside_earlier_range"] > 0 else "")
        summary = (f"label distribution of {w['split']!r} differs from {w['earlier_split']!r}: {eff} {w['effect']:.3f} "
                   f"(p={w['p_value']:.2g}); {w['split']!r} is a later period (the splits are time-ordered by "
                   f"{time!r}), so the target drifted over time{outside}")
        advice = ["Keep the time-ordered split: a random or stratified re-split would leak the future into training.",
                  "Check that the model handles the later period: compare its errors per period; for a trending "
                  "target, predict changes (differences, returns) or detrend, "
                  "and re-fit or recalibrate on recent data."]
        return Status.WARN, summary, advice
    if len(warn):
        w = warn.sort_values("effect", ascending=False).iloc[0]
        summary = (f"label distribution of {w['split']!r} differs from {w['earlier_split']!r}: "
                   f"{eff} {w['effect']:.3f} (p={w['p_value']:.2g})")
        advice = ["Re-split with stratification on the label (e.g. sklearn train_test_split(..., stratify=y)) if the "
                  "splits should share one distribution.",
                  "If the shift is real (a later period), "
                  "evaluate with per-class metrics and re-weight or recalibrate."]
        return Status.FAIL if len(fail[~fail["time_ordered"]]) else Status.WARN, summary, advice
    return Status.PASS, f"label distributions agree across splits (largest {eff} {metrics['max_effect']:.3f})", []


@register("data.label_shift", title="Label distribution shift",
          description="label distribution distance between splits (effect size, not p-value alone)", needs="splits",
          plot="tropt.plots.data")
def check_label_shift(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                      warn_effect: float = 0.1, fail_effect: float = 0.3, alpha: float = 0.01, task: str | None = None,
                      progress: bool = True) -> CheckResult:
    """Compare the label distribution of every later split with every earlier one.

    Classification: per-class table, χ² test of homogeneity and Cramér's V (effect size). Regression:
    Kolmogorov-Smirnov statistic D (effect size) and the Wasserstein distance in units of the earlier split's
    standard deviation. WARN when the effect size is ``>= warn_effect`` and ``p < alpha``, FAIL from ``fail_effect``.
    """
    cid = "data.label_shift"
    datas = _load(splits, label, group, time, features, progress)
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to compare its distribution across splits")
    labels = _labels(datas, label)
    assert labels is not None  # checked just above
    task = infer_task(labels, task)
    names = [d.name for d in datas]
    tables: dict[str, pd.DataFrame] = {}
    series: dict[str, Any] = {}
    index = {n: i for i, n in enumerate(names)}
    if task == "classification":
        pair_rows = _class_pairs(datas, labels, names, tables)
    else:
        vals = [numeric_values(s) for s in labels]
        vals = [v[np.isfinite(v)] for v in vals]
        pair_rows = _value_pairs(datas, vals, names, tables, series)
    ordered = _time_ordered_pairs(datas, time)
    for r in pair_rows:
        r["time_ordered"] = (r["split"], r["earlier_split"]) in ordered
        if task != "classification":
            a, b = vals[index[r["earlier_split"]]], vals[index[r["split"]]]
            r["outside_earlier_range"] = float(np.mean((b < a.min()) | (b > a.max())))
    pairs = pd.DataFrame(pair_rows)
    tables = {"pairs": pairs, **tables}
    metrics: dict[str, Any] = {"task": task, "max_effect": float(pairs["effect"].max()) if len(pairs) else 0.0,
                               "effect_name": "cramers_v" if task == "classification" else "ks_statistic"}
    for r in pair_rows:
        metrics[f"effect.{r['split']}_vs_{r['earlier_split']}"] = r["effect"]
        metrics[f"p_value.{r['split']}_vs_{r['earlier_split']}"] = r["p_value"]
    status, summary, advice = _verdict(pairs, metrics, time, warn_effect, fail_effect, alpha)
    return CheckResult(cid, status, summary, metrics, tables, advice, series)
