"""Stage-1 label checks: label distribution shift, class coverage and label sanity."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Status
from ._common import (MAX_EVIDENCE, _counts_table, _is_num, _labels, _load, _numeric_values, _pairs, _skip, infer_task,
                      regression_reason)
from .sources import SplitData


# ---------------------------------------------------------------------------------------------------- label shift
@register("data.label_shift", title="Label distribution shift",
          description="label distribution distance between splits (effect size, not p-value alone)", needs="splits")
def check_label_shift(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                      warn_effect: float = 0.1, fail_effect: float = 0.3, alpha: float = 0.01, task: str | None = None,
                      progress: bool = True) -> CheckResult:
    """Compare the label distribution of every later split with every earlier one.

    Classification: per-class table, χ² test of homogeneity and Cramér's V (effect size). Regression:
    Kolmogorov-Smirnov statistic D (effect size) and the Wasserstein distance in units of the earlier split's
    standard deviation. WARN when the effect size is ``>= warn_effect`` and ``p < alpha``, FAIL from ``fail_effect``.
    """
    from scipy import stats

    cid = "data.label_shift"
    datas = _load(splits, label, group, time, features, progress)
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to compare its distribution across splits")
    labels = _labels(datas, label)
    task = infer_task(labels, task)
    names = [d.name for d in datas]
    pair_rows = []
    tables: dict[str, pd.DataFrame] = {}
    series: dict[str, Any] = {}
    index = {n: i for i, n in enumerate(names)}
    if task == "classification":
        counts = _counts_table(labels, names)
        props = counts / counts.sum(axis=0).replace(0, 1)
        dist = counts.copy()
        for n in names:
            dist[f"share_{n}"] = props[n]
        tables["class_distribution"] = dist.reset_index()
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
    else:
        vals = [_numeric_values(s) for s in labels]
        vals = [v[np.isfinite(v)] for v in vals]
        q = [0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0]
        tables["quantiles"] = pd.DataFrame({n: (np.quantile(v, q) if v.size else np.full(len(q), np.nan)) for n, v in zip(names, vals)},
                                           index=pd.Index(q, name="quantile")).reset_index()
        allv = np.concatenate(vals)
        if allv.size:
            edges = np.linspace(np.quantile(allv, 0.005), np.quantile(allv, 0.995) + 1e-12, 41)
            series["label_edges"] = edges
            for n, v in zip(names, vals):
                series[f"label_counts:{n}"] = np.histogram(np.clip(v, edges[0], edges[-1]), bins=edges)[0]
        for later, earlier in _pairs(datas):
            a, b = vals[index[earlier.name]], vals[index[later.name]]
            if a.size == 0 or b.size == 0:
                continue
            ks = stats.ks_2samp(a, b)
            sd = float(np.std(a)) or 1.0
            pair_rows.append({"split": later.name, "earlier_split": earlier.name, "effect": float(ks.statistic),
                              "effect_name": "ks_statistic", "p_value": float(ks.pvalue),
                              "wasserstein_in_sd": float(stats.wasserstein_distance(a, b) / sd)})
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
        outside = (f"; {w['outside_earlier_range']:.0%} of {w['split']!r} labels lie outside {w['earlier_split']!r}'s range"
                   if "outside_earlier_range" in w and w["outside_earlier_range"] > 0 else "")
        summary = (f"label distribution of {w['split']!r} differs from {w['earlier_split']!r}: {eff} {w['effect']:.3f} "
                   f"(p={w['p_value']:.2g}); {w['split']!r} is a later period (the splits are time-ordered by "
                   f"{time!r}), so the target drifted over time{outside}")
        advice = ["Keep the time-ordered split: a random or stratified re-split would leak the future into training.",
                  "Check that the model handles the later period: compare its errors per period; for a trending "
                  "target, predict changes (differences, returns) or detrend, and re-fit or recalibrate on recent data."]
        status = Status.WARN
    elif len(warn):
        w = warn.sort_values("effect", ascending=False).iloc[0]
        summary = f"label distribution of {w['split']!r} differs from {w['earlier_split']!r}: {eff} {w['effect']:.3f} (p={w['p_value']:.2g})"
        advice = ["Re-split with stratification on the label (e.g. sklearn train_test_split(..., stratify=y)) if the "
                  "splits should share one distribution.",
                  "If the shift is real (a later period), evaluate with per-class metrics and re-weight or recalibrate."]
        status = Status.FAIL if len(fail[~fail["time_ordered"]]) else Status.WARN
    else:
        summary = f"label distributions agree across splits (largest {eff} {metrics['max_effect']:.3f})"
        advice = []
        status = Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)


def _time_ordered_pairs(datas: list, time: Any) -> set[tuple[str, str]]:
    """(later, earlier) split-name pairs whose later split starts at or after the earlier one ends by ``time`` (as
    data.temporal_leakage reads it); empty without a usable time column (that check reports why)."""
    if time is None or any(d.time is None and not (d.dask_parts or {}).get("time") for d in datas):
        return set()
    from .leakage import _temporal_stats

    try:
        stats = _temporal_stats(datas, time, 0)
    except DataError:
        return set()
    return {(datas[li].name, datas[ei].name) for li in range(len(datas)) for ei in range(li)
            if stats[li]["finite"] and stats[ei]["finite"] and stats[li]["min"] >= stats[ei]["max"]}


# ---------------------------------------------------------------------------------------------------- class coverage
@register("data.class_coverage", title="Class coverage",
          description="classes missing from a split, and classes below a minimum count", needs="splits")
def check_class_coverage(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                         min_count: int = 5, task: str | None = None, progress: bool = True) -> CheckResult:
    """Classes present in one split and absent in another, and classes with fewer than ``min_count`` rows.

    FAIL: a later split holds a class the first (training) split never shows. WARN: a training class missing from
    a later split (it cannot be evaluated there), or a class below ``min_count`` in some split.
    """
    cid = "data.class_coverage"
    datas = _load(splits, label, group, time, features, progress, min_splits=1)
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to check which classes each split covers")
    labels = _labels(datas, label)
    if infer_task(labels, task) != "classification":
        return _skip(cid, f"{label!r} looks like a regression target ({regression_reason(labels, task)}): class coverage "
                          "does not apply (pass task='classification' if these are classes)")
    names = [d.name for d in datas]
    counts = _counts_table(labels, names)
    first = names[0]
    unseen, missing, rare = [], [], []
    for cls, row in counts.iterrows():
        for n in names[1:]:
            if row[n] > 0 and row[first] == 0:
                unseen.append({"class": cls, "split": n, "problem": f"in {n} but not in {first}", "count": int(row[n])})
            if row[first] > 0 and row[n] == 0:
                missing.append({"class": cls, "split": n, "problem": f"in {first} but not in {n}", "count": 0})
        for n in names:
            if 0 < row[n] < min_count:
                rare.append({"class": cls, "split": n, "problem": f"fewer than {min_count} rows", "count": int(row[n])})
    metrics = {"classes": len(counts), "unseen_in_first": len({r["class"] for r in unseen}),
               "missing_in_later": len({r["class"] for r in missing}), "rare_classes": len({r["class"] for r in rare}),
               "min_count": min_count}
    for n in names:
        metrics[f"classes.{n}"] = int((counts[n] > 0).sum())
    tables = {"counts": counts.reset_index()}
    problems = unseen + missing + rare
    if problems:
        tables["problems"] = pd.DataFrame(problems)
    advice = []
    if unseen:
        cl = sorted({str(r["class"]) for r in unseen})
        summary = f"{len(cl)} class(es) appear in later splits but never in {first!r}: {', '.join(cl[:10])}"
        advice.append(f"Re-split with stratification on the label so {first!r} holds every class, or remove those classes from the later splits.")
        status = Status.FAIL
    elif missing or rare:
        bits = []
        if missing:
            bits.append(f"{metrics['missing_in_later']} class(es) of {first!r} missing from a later split")
        if rare:
            bits.append(f"{metrics['rare_classes']} class(es) with fewer than {min_count} rows in some split")
        summary = "; ".join(bits)
        advice.append("Stratify the split on the label so every class is represented; merge or drop classes too rare to learn or evaluate.")
        status = Status.WARN
    else:
        summary = f"all {len(counts)} classes appear in every split with at least {min_count} rows"
        status = Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)


# ---------------------------------------------------------------------------------------------------- label sanity
@register("data.label_sanity", title="Label sanity",
          description="missing/inf labels, non-integer or negative class ids, ids outside [0, num_classes), constant labels", needs="splits")
def check_label_sanity(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                       num_classes: int | None = None, task: str | None = None, max_evidence: int = MAX_EVIDENCE,
                       progress: bool = True) -> CheckResult:
    """Labels a loss function cannot use, or that cannot teach anything.

    FAIL: missing (NaN/None) or infinite labels; for classification, non-integer or negative class ids and ids
    ``>= num_classes`` (when given); a constant label in the first split. WARN: a constant label in a later split,
    class ids with gaps (``max + 1`` output units for fewer classes).
    """
    cid = "data.label_sanity"
    datas = _load(splits, label, group, time, features, progress, min_splits=1)
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to check its values")
    labels = _labels(datas, label)
    task = infer_task(labels, task, num_classes)
    problems, bad_rows = [], []
    fail, warn = False, False

    def note(split: SplitData, problem: str, mask: np.ndarray | None, severe: bool, values: pd.Series) -> None:
        nonlocal fail, warn
        rows = int(mask.sum()) if mask is not None else split.n
        ex = values[mask].head(3).tolist() if mask is not None else values.head(1).tolist()
        problems.append({"split": split.name, "problem": problem, "rows": rows, "examples": ", ".join(map(str, ex)),
                         "severity": "fail" if severe else "warn"})
        fail |= severe
        warn |= not severe
        if mask is not None and len(bad_rows) < max_evidence:
            idx = np.flatnonzero(mask)[: max_evidence - len(bad_rows)]
            for i in idx:
                bad_rows.append({"split": split.name, "row": split.row_id[i], "label": values.iloc[i], "problem": problem})

    all_ids = []
    for i, (d, s) in enumerate(zip(datas, labels)):
        s = s.reset_index(drop=True)
        na = s.isna().to_numpy()
        if na.any():
            note(d, "missing label (NaN/None)", na, True, s)
        num = _is_num(s)
        v = _numeric_values(s) if num else None
        if num:
            inf = np.isinf(v)
            if inf.any():
                note(d, "infinite label", inf, True, s)
        if task == "classification" and num:
            fin = np.isfinite(v)
            nonint = fin & (v != np.round(v))
            if nonint.any():
                note(d, "non-integer class id", nonint, True, s)
            neg = fin & (v < 0)
            if neg.any():
                note(d, "negative class id" + (" (-100 is CrossEntropyLoss's ignore_index: intended?)" if np.all(v[neg] == -100) else ""), neg, True, s)
            if num_classes is not None:
                big = fin & (v >= num_classes)
                if big.any():
                    note(d, f"class id >= num_classes ({num_classes})", big, True, s)
            all_ids.append(np.unique(v[fin & ~nonint & ~neg]))
        nunique = s.nunique(dropna=True)
        if nunique <= 1 and d.n > 1:
            note(d, "constant label" if nunique == 1 else "no label values", None, i == 0, s.dropna())
    gaps = 0
    if task == "classification" and all_ids and num_classes is None:
        ids = np.unique(np.concatenate(all_ids)) if all_ids else np.empty(0)
        if ids.size and ids.max() + 1 > ids.size:
            gaps = int(ids.max() + 1 - ids.size)
            problems.append({"split": "all", "problem": f"class ids have {gaps} gap(s) in 0..{int(ids.max())}", "rows": 0,
                             "examples": ", ".join(str(int(x)) for x in np.setdiff1d(np.arange(int(ids.max()) + 1), ids)[:5]),
                             "severity": "warn"})
            warn = True
    metrics = {"task": task, "problems": len(problems), "bad_rows": sum(p["rows"] for p in problems if p["problem"] != "constant label" and p["split"] != "all"),
               "class_id_gaps": gaps}
    if num_classes is not None:
        metrics["num_classes"] = num_classes
    tables: dict[str, pd.DataFrame] = {}
    if problems:
        tables["problems"] = pd.DataFrame(problems)
    if bad_rows:
        tables["bad_rows"] = pd.DataFrame(bad_rows)
    advice = []
    kinds = {p["problem"].split(" (")[0] for p in problems}
    if any(k.startswith(("missing label", "infinite label")) for k in kinds):
        advice.append("Drop or fix the rows with missing/infinite labels (listed in 'bad_rows') before training.")
    if any(k.startswith(("non-integer", "negative", "class id >=")) for k in kinds):
        advice.append("Map labels to integer class ids 0..num_classes-1 (e.g. pd.factorize or sklearn LabelEncoder) and set the "
                      "output layer to num_classes units.")
    if "constant label" in kinds:
        advice.append("A constant label teaches nothing: check the label column and how the split was made.")
    if gaps:
        advice.append("Re-index the class ids contiguously, or confirm the missing ids are real classes (the model needs max id + 1 outputs).")
    if problems:
        summary = "; ".join(f"{p['split']}: {p['problem']}" + (f" ({p['rows']} rows)" if p["rows"] else "") for p in problems[:4])
        if len(problems) > 4:
            summary += f"; and {len(problems) - 4} more"
    else:
        summary = f"labels are valid {task} targets in every split"
    status = Status.FAIL if fail else Status.WARN if warn else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)
