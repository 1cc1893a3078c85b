"""Stage-1 target leakage: the cross-validated predictive power of each feature alone."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..registry import register
from ..result import CheckResult, Status
from ._common import _class_keys, _is_num, _labels, _load, _numeric_values, _skip, infer_task
from .sources import _LABEL


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    """ROC AUC of a binary target (ties averaged); NaN when one class is missing."""
    pos = y.astype(bool)
    npos, nneg = int(pos.sum()), int((~pos).sum())
    if npos == 0 or nneg == 0:
        return float("nan")
    from scipy.stats import rankdata

    r = rankdata(score)
    return float((r[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def _power(pred: np.ndarray, y: np.ndarray, task: str, n_classes: int) -> float:
    if task == "regression":
        ss = float(np.sum((y - y.mean()) ** 2))
        return float(1 - np.sum((y - pred) ** 2) / ss) if ss > 0 else float("nan")
    if n_classes == 2:
        return _auc(pred[:, 1], y == 1)
    aucs = [_auc(pred[:, k], y == k) for k in range(n_classes)]
    aucs = [a for a in aucs if np.isfinite(a)]
    return float(np.mean(aucs)) if aucs else float("nan")


def _bins(x: pd.Series, nbins: int) -> tuple[np.ndarray, Any]:
    """Bin codes (0..B-1; B = missing/unseen) of one feature, and how to bin new data the same way."""
    if _is_num(x):
        v = x.to_numpy(dtype=np.float64, na_value=np.nan)
        ok = v[np.isfinite(v)]
        uniq = np.unique(ok)
        if uniq.size <= nbins:
            edges = (uniq[:-1] + uniq[1:]) / 2 if uniq.size > 1 else np.empty(0)
        else:
            edges = np.unique(np.quantile(ok, np.linspace(0, 1, nbins + 1)[1:-1]))
        spec = ("num", edges)
    else:
        cats = pd.Index(pd.unique(x.astype(object).where(x.notna(), None).dropna()))
        spec = ("cat", cats)
    return _apply_bins(x, spec), spec


def _apply_bins(x: pd.Series, spec) -> np.ndarray:
    kind, what = spec
    if kind == "num":
        v = _numeric_values(x)
        codes = np.searchsorted(what, v, side="right")
        codes[~np.isfinite(v)] = len(what) + 1
        return codes
    codes = what.get_indexer(x.astype(object).where(x.notna(), None))
    codes[codes < 0] = len(what)
    return codes


def _encode(codes_fit: np.ndarray, target: np.ndarray, codes_apply: np.ndarray, nb: int, prior: np.ndarray, m: float = 1.0) -> np.ndarray:
    """Smoothed per-bin target means (target: (n, k) one-hot or (n, 1)) applied to other rows."""
    counts = np.bincount(codes_fit, minlength=nb).astype(np.float64)
    sums = np.stack([np.bincount(codes_fit, weights=target[:, k], minlength=nb) for k in range(target.shape[1])], axis=1)
    enc = (sums + m * prior[None, :]) / (counts[:, None] + m)
    return enc[np.minimum(codes_apply, nb - 1)]


def _knn_predict(x_fit: np.ndarray, y_fit: np.ndarray, x_new: np.ndarray, k: int = 10) -> np.ndarray:
    """Mean label of the ~k fitted rows nearest in feature value (a one-feature smoother; NaN -> the mean)."""
    ok = np.isfinite(x_fit)
    xs, order = np.sort(x_fit[ok]), np.argsort(x_fit[ok], kind="stable")
    ys = y_fit[ok][order]
    out = np.full(len(x_new), float(y_fit.mean()))
    if len(xs) == 0:
        return out
    k = min(k, len(xs))
    cs = np.concatenate([[0.0], np.cumsum(ys)])
    fin = np.isfinite(x_new)
    pos = np.searchsorted(xs, x_new[fin])
    lo = np.clip(pos - k // 2, 0, len(xs) - k)
    out[fin] = (cs[lo + k] - cs[lo]) / k
    return out


def _regression_power(x: pd.Series, y: np.ndarray, fold: np.ndarray, folds: int, later: list, col, first: str) -> dict:
    """Out-of-fold R² of a numeric feature alone (nearest-neighbour smoother), then on each later split."""
    v = _numeric_values(x)
    pred = np.empty(len(v))
    for k in range(folds):
        fit, app = fold != k, fold == k
        pred[app] = _knn_predict(v[fit], y[fit], v[app])
    row = {"feature": col, f"power_{first}": _power(pred, y, "regression", 1)}
    for d, smp, yl in later:
        row[f"power_{d.name}"] = _power(_knn_predict(v, y, _numeric_values(smp[col])), yl, "regression", 1) if len(smp) >= 2 else float("nan")
    return row


@register("data.target_leakage", title="Target leakage (single-feature power)",
          description="a single feature that predicts the label almost perfectly, or far better in one split", needs="splits")
def check_target_leakage(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                         max_power: float = 0.98, max_gap: float = 0.15, min_power_for_gap: float = 0.6,
                         task: str | None = None, bins: int = 64, folds: int = 5, seed: int = 0,
                         max_features: int = 1000, progress: bool = True) -> CheckResult:
    """Cross-validated predictive power of each feature alone (a binned one-feature model, i.e. target encoding).

    Power is ROC AUC for classification (macro one-vs-rest for several classes) and R² for regression, measured
    out-of-fold on up to 20,000 rows of the first split, then on each later split with the first split's
    encoding. FAIL for a feature with power ``>= max_power``; WARN when a feature's power differs between the
    first split and a later one by more than ``max_gap`` (and one of them is at least ``min_power_for_gap``).
    """
    from tqdm.auto import tqdm

    cid = "data.target_leakage"
    datas = _load(splits, label, group, time, features, progress, needs={"sample"})
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to measure each feature's predictive power")
    if not datas[0].tabular or datas[0].sample is None:
        return _skip(cid, "target leakage is measured per column of tables; these splits are tensors/samples")
    labels = [d.sample[_LABEL] for d in datas]
    task = infer_task([d.label for d in datas], task)
    train = datas[0].sample
    feats = [c for c in datas[0].feature_columns][:max_features]

    def target_of(s: pd.Series, classes=None):
        if task == "regression":
            y = _numeric_values(s)
            ok = np.isfinite(y)
            return y, ok, None
        keys = _class_keys(s).astype(object)
        ok = keys.notna().to_numpy()
        if classes is None:
            classes = pd.Index(pd.unique(keys[ok]))
        y = classes.get_indexer(keys)
        return y, ok & (y >= 0), classes

    y0, ok0, classes = target_of(labels[0])
    if ok0.sum() < 2 * folds:
        return _skip(cid, f"too few labelled rows in {datas[0].name!r} ({int(ok0.sum())}) for {folds}-fold cross-validation")
    if task == "classification" and len(classes) < 2:
        return _skip(cid, f"the label has a single class in {datas[0].name!r}: nothing to predict (see data.label_sanity)")
    n_classes = len(classes) if classes is not None else 1

    def onehot(y):
        return np.eye(n_classes)[y] if task == "classification" else y[:, None]

    tr = train[ok0].reset_index(drop=True)
    y_tr = y0[ok0]
    t_tr = onehot(y_tr)
    prior = t_tr.mean(axis=0)
    fold = np.random.default_rng(seed).permutation(len(tr)) % folds
    later = []
    for d, s in zip(datas[1:], labels[1:]):
        y, ok, _ = target_of(s, classes)
        later.append((d, d.sample[ok].reset_index(drop=True), y[ok]))
    rows = []
    for c in tqdm(feats, desc="tropt: target leakage", disable=not progress, leave=False):
        if task == "regression" and _is_num(tr[c]):
            row = _regression_power(tr[c], y_tr, fold, folds, later, c, datas[0].name)
            rows.append(row)
            continue
        codes, spec = _bins(tr[c], bins)
        nb_ = int(codes.max()) + 2 if len(codes) else 2
        nb_ = max(nb_, (len(spec[1]) + 2))
        pred = np.empty((len(tr), t_tr.shape[1]))
        for k in range(folds):
            fit, app = fold != k, fold == k
            pred[app] = _encode(codes[fit], t_tr[fit], codes[app], nb_, prior)
        p = pred[:, 0] if task == "regression" else pred
        row = {"feature": c, f"power_{datas[0].name}": _power(p, y_tr, task, n_classes)}
        for d, smp, y in later:
            if len(smp) < 2:
                row[f"power_{d.name}"] = float("nan")
                continue
            pl = _encode(codes, t_tr, _apply_bins(smp[c], spec), nb_, prior)
            row[f"power_{d.name}"] = _power(pl[:, 0] if task == "regression" else pl, y, task, n_classes)
        rows.append(row)
    table = pd.DataFrame(rows)
    base = f"power_{datas[0].name}"
    gap_cols = []
    for d in datas[1:]:
        col = f"gap_{d.name}"
        table[col] = table[base] - table[f"power_{d.name}"]
        gap_cols.append(col)
    table = table.sort_values(base, ascending=False, na_position="last", kind="stable").reset_index(drop=True)
    metric = "auc" if task == "classification" else "r2"
    top = table.iloc[0] if len(table) else None
    leaky = table[table[base] >= max_power]
    gapped = pd.DataFrame()
    if gap_cols:
        big = np.zeros(len(table), dtype=bool)
        for d in datas[1:]:
            pc = table[f"power_{d.name}"]
            strong = (table[base] >= min_power_for_gap) | (pc >= min_power_for_gap)
            big |= ((table[f"gap_{d.name}"].abs() > max_gap) & strong).to_numpy()
        gapped = table[big]
    metrics: dict[str, Any] = {"task": task, "metric": metric, "features_checked": len(feats), "rows_used": len(tr),
                               "leaky_features": len(leaky), "gap_features": len(gapped),
                               "max_power": float(top[base]) if top is not None and np.isfinite(top[base]) else float("nan"),
                               "top_feature": str(top["feature"]) if top is not None else ""}
    tables = {"features": table}
    series = {"power": table[base].to_numpy(dtype=float)}
    advice = []
    if len(leaky):
        names = ", ".join(repr(f) for f in leaky["feature"][:5])
        summary = (f"{len(leaky)} feature(s) alone predict {label!r} almost perfectly ({metric} >= {max_power}): {names}")
        advice.append(f"Remove {names} from the features unless it is legitimately known at prediction time "
                      "(a feature computed from the label or recorded after the outcome leaks the target).")
        status = Status.FAIL
    elif len(gapped):
        names = ", ".join(repr(f) for f in gapped["feature"][:5])
        summary = f"{len(gapped)} feature(s) predict {label!r} very differently across splits (gap > {max_gap} {metric}): {names}"
        advice.append(f"Inspect {names}: a feature that is predictive in one split only often leaks split membership or drifts; "
                      "drop it or fix how it is computed.")
        status = Status.WARN
    else:
        summary = (f"no single feature predicts {label!r} suspiciously well (best: {metrics['top_feature']!r}, "
                   f"{metric} {metrics['max_power']:.3f}, cross-validated)")
        status = Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)
