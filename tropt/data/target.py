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


def _label_of(col: Any) -> Any:
    """A column label as the user named it (table rows upcast int labels to float: 43 became '43.0'), as a metric."""
    if isinstance(col, (np.integer, np.floating, np.str_)):
        col = col.item()
    return col if isinstance(col, (str, int, float)) and not isinstance(col, bool) else str(col)


def _smooth(x_fit: np.ndarray, t_fit: np.ndarray, x_new: np.ndarray, prior: np.ndarray, linear: bool, k: int = 10) -> np.ndarray:
    """Mean target (``t_fit``: (n, m) one-hot classes or (n, 1) values) of the ~k fitted rows nearest in feature value,
    for each new value: a one-feature nearest-neighbour smoother. ``linear`` fits a line in the window instead (a
    window mean is biased wherever a numeric label has a slope, most at the ends: a noisy copy of the label got R²
    0.95 on 150 rows, the local line 1.0). A value tied with more than k rows takes its whole tie group; missing
    values take the smoothed mean of the fitted rows with the value missing (missingness itself can leak).

    Quantile bins were used before: a bin straddling two classes held a copy of a 3-class label at AUC 0.98."""
    ok = np.isfinite(x_fit)
    order = np.argsort(x_fit[ok], kind="stable")
    xs, ts = x_fit[ok][order], t_fit[ok][order]
    miss = t_fit[~ok]
    out = np.empty((len(x_new), t_fit.shape[1]))
    out[:] = (miss.sum(axis=0) + prior) / (len(miss) + 1)
    fin = np.isfinite(x_new)
    if len(xs) == 0 or not fin.any():
        return out
    m, s = float(xs.mean()), float(xs.std()) or 1.0
    xc = (xs - m) / s  # standardised, so the window sums below keep their precision
    n, k = len(xs), min(k, len(xs))
    zero = np.zeros((1, ts.shape[1]))
    ct = np.concatenate([zero, np.cumsum(ts, axis=0)])
    left, right = np.searchsorted(xs, x_new[fin], "left"), np.searchsorted(xs, x_new[fin], "right")
    lo = np.clip((left + right) // 2 - k // 2, 0, n - k)
    hi = lo + k
    wide = right - left > k
    lo[wide], hi[wide] = left[wide], right[wide]
    cnt = (hi - lo)[:, None].astype(np.float64)
    mean_t = (ct[hi] - ct[lo]) / cnt
    if linear:
        cx, cxx = (np.concatenate([[0.0], np.cumsum(a)]) for a in (xc, xc * xc))
        cxt = np.concatenate([zero, np.cumsum(xc[:, None] * ts, axis=0)])
        mx = ((cx[hi] - cx[lo]) / cnt[:, 0])[:, None]
        var = (cxx[hi] - cxx[lo]) / cnt[:, 0] - mx[:, 0] ** 2
        cov = (cxt[hi] - cxt[lo]) / cnt - mx * mean_t
        slope = np.where(var[:, None] > 1e-9, cov / np.maximum(var, 1e-9)[:, None], 0.0)  # tied values: the mean
        mean_t = mean_t + slope * (((x_new[fin] - m) / s)[:, None] - mx)
    out[fin] = mean_t
    return out


def _smooth_preds(x: pd.Series, t: np.ndarray, fold: np.ndarray, folds: int, later: list, col, prior: np.ndarray,
                  linear: bool) -> tuple:
    """Out-of-fold :func:`_smooth` predictions on the first split, and each fold's model on every later split's rows
    (``(folds, n, m)``)."""
    v = _numeric_values(x)
    pred = np.empty((len(v), t.shape[1]))
    vl = [_numeric_values(smp[col]) for _, smp, _ in later]
    cuts = np.cumsum([0] + [len(a) for a in vl])
    outs = [[] for _ in later]
    for k in range(folds):
        fit, app = fold != k, fold == k
        got = _smooth(v[fit], t[fit], np.concatenate([v[app], *vl]), prior, linear)  # one sort of the fitted rows
        pred[app] = got[:app.sum()]
        for j in range(len(later)):
            outs[j].append(got[app.sum() + cuts[j]:app.sum() + cuts[j + 1]])
    return pred, [np.stack(o) for o in outs]


def _fold_powers(pred: np.ndarray, y: np.ndarray, fold: np.ndarray, later: np.ndarray | None, y_later: np.ndarray | None,
                 power, rows: np.ndarray | None = None, rows_later: np.ndarray | None = None) -> tuple[float, float]:
    """Mean power of each fold's model on its held-out rows, and on the later split's rows (optionally resampled).

    Each model is scored on its own (not pooled): pooling out-of-fold predictions of different models ranks rows
    by how their fold's absence shifted the encoding, which biases weak features' power below chance."""
    if rows is not None:
        pred, y, fold = pred[rows], y[rows], fold[rows]
    folds = int(fold.max()) + 1
    first = float(np.nanmean([power(pred[fold == k], y[fold == k]) for k in range(folds)]))
    if later is None:
        return first, float("nan")
    if rows_later is not None:
        later, y_later = later[:, rows_later], y_later[rows_later]
    return first, float(np.nanmean([power(later[k], y_later) for k in range(folds)]))


def _gap_z(pred: np.ndarray, y: np.ndarray, fold: np.ndarray, later: np.ndarray, y_later: np.ndarray, power,
           rng: np.random.Generator, reps: int) -> float:
    """The power gap (first - later) over its bootstrap standard error (rows of both splits resampled)."""
    a, b = _fold_powers(pred, y, fold, later, y_later, power)
    boots = []
    for _ in range(reps):
        pa, pb = _fold_powers(pred, y, fold, later, y_later, power,
                              rng.integers(0, len(y), len(y)), rng.integers(0, len(y_later), len(y_later)))
        boots.append(pa - pb)
    se = float(np.nanstd(boots))
    return (a - b) / se if se > 0 else float("inf") * np.sign(a - b)


def _rest_power(preds: list[np.ndarray], t: np.ndarray, y: np.ndarray, fold: np.ndarray, power,
                ridge: float = 1e-2) -> float:
    """Cross-validated power of the other features *combined*: a linear stack (ridge least squares onto the one-hot
    classes, or the value) of their out-of-fold one-feature predictions, fitted on the other folds and scored on each
    held-out fold alone, like the one-feature models (see :func:`_fold_powers`). ``preds`` come strongest first and
    are cut to about one stacked column per 10 rows, so the stack cannot overfit a small split."""
    if not preds:
        return float("nan")
    per = preds[0].reshape(len(t), -1).shape[1]
    preds = preds[:max(1, len(t) // (10 * per))]
    x = np.concatenate([np.ones((len(t), 1))] + [p.reshape(len(t), -1) for p in preds], axis=1)
    x[~np.isfinite(x)] = 0.0
    out = np.empty(t.shape)
    for k in range(int(fold.max()) + 1):
        fit, app = fold != k, fold == k
        a = x[fit]
        reg = ridge * len(a) * np.eye(a.shape[1])
        reg[0, 0] = 0.0  # the intercept is not shrunk
        w = np.linalg.solve(a.T @ a + reg, a.T @ t[fit])
        out[app] = x[app] @ w
    return float(np.nanmean([power(out[fold == k], y[fold == k]) for k in range(int(fold.max()) + 1)]))


@register("data.target_leakage", title="Target leakage (single-feature power)",
          description="a single feature that predicts the label almost perfectly, or far better in one split", needs="splits")
def check_target_leakage(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                         max_power: float = 0.995, warn_power: float = 0.98, max_gap: float = 0.15, min_power_for_gap: float = 0.6,
                         gap_alpha: float = 0.01, task: str | None = None, bins: int = 64, rows_per_bin: int = 10,
                         folds: int = 5, seed: int = 0, bootstrap: int = 200, max_features: int = 1000,
                         rest_gap: float = 0.1, rest_features: int = 50, progress: bool = True) -> CheckResult:
    """Cross-validated predictive power of each feature alone: a one-feature model (target encoding per value for
    categories and numbers with few values; a nearest-neighbour smoother over the value for other numbers).

    Power is ROC AUC for classification (macro one-vs-rest for several classes) and R² for regression, measured
    on up to 20,000 rows of the first split by ``folds``-fold cross-validation, and on each later split with the same
    fold models (each fit on the other folds and scored alone, then averaged: both powers come from the same models
    on unseen rows). A number with at most ``bins`` values (fewer for small splits: at least ``rows_per_bin`` fitted
    rows per value) is encoded per value like a category. FAIL for a feature
    with near-perfect power ``>= max_power`` in the first split and in every later one (0.995: a copy of the label,
    or a value recorded after the outcome); WARN for power ``>= warn_power`` in the first split otherwise (0.98: a
    leak, or a genuinely strong feature on an easy task, like iris petal width), and when a feature's power differs between the first split and a later one by
    more than ``max_gap`` (one of them at least ``min_power_for_gap``) and the difference is significant: its
    bootstrap z-score (``bootstrap`` resamples of both splits' rows) beyond the two-sided ``gap_alpha`` level,
    Bonferroni-corrected for the features checked.

    A feature with power ``>= warn_power`` is also a FAIL when it is *far beyond the rest combined*: the other features
    (its ``rest_features`` strongest) stacked into one small joint model (ridge least squares on their out-of-fold
    one-feature predictions, cross-validated on the same folds) reach a power at least ``rest_gap`` lower (0.1 AUC or
    R²). A value recorded after the outcome predicts it alone while the inputs a model should use cannot; a strong
    feature on an easy task (iris petal width, AUC 0.98) has company (petal length and the sepals together reach the
    same), so it stays a WARN. The rest's power is ``tables["features"]["rest_power"]`` for the features it was
    measured for.
    """
    from tqdm.auto import tqdm

    cid = "data.target_leakage"
    datas = _load(splits, label, group, time, features, progress, needs={"sample"})
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to measure each feature's predictive power")
    if datas[0].sample is None:  # 2-D arrays are tables (their columns are features); samples/images are not
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
    # Numbers with up to this many values are encoded per value, with enough rows per value that a fold's encoding is
    # not noise (64 values on 124 rows: 2 per value).
    nbins = int(min(bins, max(2, len(tr) * (folds - 1) // (folds * rows_per_bin))))

    def power(p, y):
        return _power(p[:, 0] if task == "regression" else p, y, task, n_classes)

    rows, preds = [], []
    for c in tqdm(feats, desc="tropt: target leakage", disable=not progress, leave=False):
        v = _numeric_values(tr[c]) if _is_num(tr[c]) else None
        if v is not None and (task == "regression" or np.unique(v[np.isfinite(v)]).size > nbins):
            # Many numeric values: the neighbour smoother (classes: window mean; regression: local line).
            pred, outs = _smooth_preds(tr[c], t_tr, fold, folds, later, c, prior, linear=task == "regression")
        else:  # categories, and numbers with few values: one bin per value
            codes, spec = _bins(tr[c], nbins)
            nb_ = int(codes.max()) + 2 if len(codes) else 2
            nb_ = max(nb_, (len(spec[1]) + 2))
            pred = np.empty((len(tr), t_tr.shape[1]))
            later_codes = [_apply_bins(smp[c], spec) for _, smp, _ in later]
            outs = [[] for _ in later]
            for k in range(folds):
                fit, app = fold != k, fold == k
                pred[app] = _encode(codes[fit], t_tr[fit], codes[app], nb_, prior)
                for j, lc in enumerate(later_codes):
                    outs[j].append(_encode(codes[fit], t_tr[fit], lc, nb_, prior))
            outs = [np.stack(o) for o in outs]
        row = {"feature": c, f"power_{datas[0].name}": _fold_powers(pred, y_tr, fold, None, None, power)[0]}
        for (d, smp, y), pl in zip(later, outs):
            row[f"power_{d.name}"] = float(np.nanmean([power(p, y) for p in pl])) if len(smp) >= 2 else float("nan")
        rows.append(row)
        preds.append((pred, outs))
    table = pd.DataFrame(rows)
    base = f"power_{datas[0].name}"
    gap_cols = []
    for d in datas[1:]:
        col = f"gap_{d.name}"
        table[col] = table[base] - table[f"power_{d.name}"]
        gap_cols.append(col)
    metric = "auc" if task == "classification" else "r2"
    gapped = pd.DataFrame()
    if gap_cols:
        # A gap counts when it is large, one side is strong, and it is not sampling noise: its bootstrap z-score
        # must clear the Bonferroni-corrected level (small test splits and weak features gave 0.15 gaps by chance).
        from scipy.stats import norm

        z_crit = float(norm.isf(gap_alpha / (2 * max(1, len(feats)))))
        rng = np.random.default_rng(seed)
        big = np.zeros(len(table), dtype=bool)
        for j, (d, smp, y) in enumerate(later):
            pc = table[f"power_{d.name}"]
            strong = (table[base] >= min_power_for_gap) | (pc >= min_power_for_gap)
            cand = ((table[f"gap_{d.name}"].abs() > max_gap) & strong).to_numpy()
            z = np.full(len(table), np.nan)
            for i in np.flatnonzero(cand):
                z[i] = _gap_z(preds[i][0], y_tr, fold, preds[i][1][j], y, power, rng, bootstrap)
            table[f"gap_z_{d.name}"] = z
            big |= cand & (np.abs(z) >= z_crit)
        gapped = table[big]
    table = table.sort_values(base, ascending=False, na_position="last", kind="stable").reset_index(drop=True)
    if len(gapped):
        gapped = table[table["feature"].isin(gapped["feature"])]
    top = table.iloc[0] if len(table) else None
    # Near-perfect in every split (a label copy is; NaN: a later split too small to score). One split alone is not
    # enough: iris petal width reaches 0.998 on some 105-row training splits and 0.96 on their test rows.
    perfect = table[base] >= max_power
    for d in datas[1:]:
        pc = table[f"power_{d.name}"]
        perfect &= (pc >= max_power) | pc.isna()
    # Near-perfect alone and far beyond all the other features together: recorded after the outcome, not a strong
    # input. The rest is scored by one joint model of the others' one-feature predictions.
    table["rest_power"] = np.nan
    by_name = {r["feature"]: i for i, r in enumerate(rows)}
    for j in np.flatnonzero(((table[base] >= warn_power) & ~perfect).to_numpy()):
        name = table["feature"].iloc[j]
        others = [f for f in table["feature"] if f != name][:rest_features]  # the table is sorted by power
        # A joint model of the others is at least as good as the best of them: that bound guards the stack.
        stacked = _rest_power([preds[by_name[f]][0] for f in others], t_tr, y_tr, fold, power)
        best_other = float(table.loc[table["feature"] != name, base].max()) if len(others) else float("nan")
        table.loc[table.index[j], "rest_power"] = np.nanmax([stacked, best_other]) if others else np.nan
    alone = ((table[base] >= warn_power) & (table["rest_power"] <= table[base] - rest_gap)).fillna(False)
    for d in datas[1:]:
        pc = table[f"power_{d.name}"]
        alone &= (pc >= warn_power) | pc.isna()
    after_outcome = alone & ~perfect
    perfect |= alone
    leaky = table[perfect]
    strong = table[(table[base] >= warn_power) & ~perfect]
    metrics: dict[str, Any] = {"task": task, "metric": metric, "features_checked": len(feats), "rows_used": len(tr),
                               "leaky_features": len(leaky), "strong_features": len(strong), "gap_features": len(gapped),
                               "beyond_rest_features": int(after_outcome.sum()),
                               "bins": nbins,
                               "max_power": float(top[base]) if top is not None and np.isfinite(top[base]) else float("nan"),
                               "top_feature": _label_of(table["feature"].iloc[0]) if top is not None else ""}
    tables = {"features": table}
    series = {"power": table[base].to_numpy(dtype=float)}
    advice = []
    if len(leaky):
        names = ", ".join(repr(f) for f in leaky["feature"][:5])
        summary = (f"{len(leaky)} feature(s) alone predict {label!r} almost perfectly ({metric} >= {max_power} in every "
                   f"split, or >= {warn_power} and at least {rest_gap} above all the other features combined): {names}")
        if after_outcome.any():
            r0 = table[after_outcome].iloc[0]
            summary += (f"; {r0['feature']!r} reaches {metric} {r0[base]:.3f} alone while every other feature together "
                        f"reaches {r0['rest_power']:.3f}: a value recorded after the outcome")
        advice.append(f"Remove {names} from the features unless it is legitimately known at prediction time "
                      "(a feature computed from the label or recorded after the outcome leaks the target).")
        status = Status.FAIL
    elif len(strong) or len(gapped):
        parts = []
        if len(strong):
            names = ", ".join(repr(f) for f in strong["feature"][:5])
            parts.append(f"{len(strong)} feature(s) alone predict {label!r} very well ({metric} >= {warn_power} in "
                         f"{datas[0].name}, not >= {max_power} in every split): {names}")
            advice.append(f"Check {names}: this may be a genuinely strong feature on an easy task; it is a leak only if it "
                          "is derived from the label or recorded after the outcome (then remove it).")
        if len(gapped):
            names = ", ".join(repr(f) for f in gapped["feature"][:5])
            parts.append(f"{len(gapped)} feature(s) predict {label!r} very differently across splits (gap > {max_gap} "
                         f"{metric}, significant at {gap_alpha} after correcting for {len(feats)} features): {names}")
            advice.append(f"Inspect {names}: a feature that is predictive in one split only often leaks split membership or drifts; "
                          "drop it or fix how it is computed.")
        summary = "; ".join(parts)
        status = Status.WARN
    else:
        summary = (f"no single feature predicts {label!r} suspiciously well (best: {metrics['top_feature']!r}, "
                   f"{metric} {metrics['max_power']:.3f}, cross-validated)")
        status = Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)
