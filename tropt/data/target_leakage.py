"""``data.target_leakage``: the cross-validated predictive power of each feature alone (a one-feature model per
column of the first split's row sample), in the first split and on every later one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from ..registry import register
from ..result import CheckResult, Status
from ._common import _class_keys, _labels, _load, _skip, infer_task
from .columns import is_numeric, numeric_values
from .split_data import LABEL_COLUMN
from .target_classes import MAX_SCORED_CLASSES, cap_classes, one_hot


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
    if is_numeric(x):
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
        v = numeric_values(x)
        codes = np.searchsorted(what, v, side="right")
        codes[~np.isfinite(v)] = len(what) + 1
        return codes
    codes = what.get_indexer(x.astype(object).where(x.notna(), None))
    codes[codes < 0] = len(what)
    return codes


def _encode(codes_fit: np.ndarray, target: np.ndarray, codes_apply: np.ndarray, nb: int, prior: np.ndarray,
            m: float = 1.0) -> np.ndarray:
    """Smoothed per-bin target means (target: (n, k) one-hot or (n, 1)) applied to other rows."""
    counts = np.bincount(codes_fit, minlength=nb).astype(np.float64)
    sums = np.stack([np.bincount(codes_fit, weights=target[:, k], minlength=nb) for k in range(target.shape[1])],
                    axis=1)
    enc = (sums + m * prior[None, :]) / (counts[:, None] + m)
    return enc[np.minimum(codes_apply, nb - 1)]


def _label_of(col: Any) -> Any:
    """A column label as the user named it (table rows upcast int labels to float: 43 became '43.0'), as a metric."""
    if isinstance(col, (np.integer, np.floating, np.str_)):
        col = col.item()
    return col if isinstance(col, (str, int, float)) and not isinstance(col, bool) else str(col)


def _smooth(x_fit: np.ndarray, t_fit: np.ndarray, x_new: np.ndarray, prior: np.ndarray, linear: bool,
            k: int = 10) -> np.ndarray:
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
    v = numeric_values(x)
    pred = np.empty((len(v), t.shape[1]))
    vl = [numeric_values(smp[col]) for _, smp, _ in later]
    cuts = np.cumsum([0] + [len(a) for a in vl])
    outs: list[list[np.ndarray]] = [[] for _ in later]
    for k in range(folds):
        fit, app = fold != k, fold == k
        got = _smooth(v[fit], t[fit], np.concatenate([v[app], *vl]), prior, linear)  # one sort of the fitted rows
        pred[app] = got[:app.sum()]
        for j in range(len(later)):
            outs[j].append(got[app.sum() + cuts[j]:app.sum() + cuts[j + 1]])
    return pred, [np.stack(o) for o in outs]


def _fold_powers(pred: np.ndarray, y: np.ndarray, fold: np.ndarray, later: np.ndarray | None,
                 y_later: np.ndarray | None,
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
        assert y_later is not None  # passed with later
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


def _target_of(s: pd.Series, task: str, classes: pd.Index | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """(targets, which rows have one, the classes): values for regression, class indices (of ``classes``, found
    from ``s`` when None) for classification."""
    if task == "regression":
        y = numeric_values(s)
        ok = np.isfinite(y)
        return y, ok, None
    keys = _class_keys(s).astype(object)
    ok = keys.notna().to_numpy()
    if classes is None:
        classes = pd.Index(pd.unique(keys[ok]))
    y = classes.get_indexer(keys)
    return y, ok & (y >= 0), classes


@dataclass
class _Fit:
    """The first split's rows the one-feature models are fitted on, their folds, and each later split's rows."""

    task: str
    n_classes: int
    tr: pd.DataFrame  # the first split's labelled sample rows
    y_tr: np.ndarray
    t_tr: np.ndarray  # (n, classes) one-hot, or (n, 1) values
    prior: np.ndarray
    fold: np.ndarray
    folds: int
    later: list  # (split, its labelled sample rows, their targets) per later split
    nbins: int
    classes_total: int = 0  # the first split's classes (classification), of which n_classes are scored

    def power(self, p: np.ndarray, y: np.ndarray) -> float:
        return _power(p[:, 0] if self.task == "regression" else p, y, self.task, self.n_classes)


def _fit(datas: list, labels: list[pd.Series], task: str, y0: np.ndarray, ok0: np.ndarray, classes: Any,
         folds: int, seed: int, bins: int, rows_per_bin: int) -> _Fit:
    n_classes = len(classes) if classes is not None else 1
    tr = datas[0].sample[ok0].reset_index(drop=True)
    y_tr = y0[ok0]
    remap = cap_classes(y_tr, n_classes) if task == "classification" else None
    total = n_classes
    if remap is not None:
        y_tr, n_classes = remap[y_tr], MAX_SCORED_CLASSES
    t_tr = one_hot(y_tr, n_classes) if task == "classification" else y_tr[:, None]
    fold = np.random.default_rng(seed).permutation(len(tr)) % folds
    later = []
    for d, s in zip(datas[1:], labels[1:]):
        y, ok, _ = _target_of(s, task, classes)
        later.append((d, d.sample[ok].reset_index(drop=True), y[ok] if remap is None else remap[y[ok]]))
    # Numbers with up to this many values are encoded per value, with enough rows per value that a fold's encoding is
    # not noise (64 values on 124 rows: 2 per value).
    nbins = int(min(bins, max(2, len(tr) * (folds - 1) // (folds * rows_per_bin))))
    return _Fit(task, n_classes, tr, y_tr, t_tr, t_tr.mean(axis=0), fold, folds, later, nbins, total)


def _one_feature(f: _Fit, c: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """Out-of-fold predictions of the one-feature model of column ``c`` on the first split, and each fold's model's
    predictions on every later split (``(folds, n, m)`` each)."""
    tr, t_tr, fold, folds, prior = f.tr, f.t_tr, f.fold, f.folds, f.prior
    v = numeric_values(tr[c]) if is_numeric(tr[c]) else None
    if v is not None and (f.task == "regression" or np.unique(v[np.isfinite(v)]).size > f.nbins):
        # Many numeric values: the neighbour smoother (classes: window mean; regression: local line).
        return _smooth_preds(tr[c], t_tr, fold, folds, f.later, c, prior, linear=f.task == "regression")
    # categories, and numbers with few values: one bin per value
    codes, spec = _bins(tr[c], f.nbins)
    nb_ = int(codes.max()) + 2 if len(codes) else 2
    nb_ = max(nb_, (len(spec[1]) + 2))
    pred = np.empty((len(tr), t_tr.shape[1]))
    later_codes = [_apply_bins(smp[c], spec) for _, smp, _ in f.later]
    outs: list[list[np.ndarray]] = [[] for _ in f.later]
    for k in range(folds):
        fit, app = fold != k, fold == k
        pred[app] = _encode(codes[fit], t_tr[fit], codes[app], nb_, prior)
        for j, lc in enumerate(later_codes):
            outs[j].append(_encode(codes[fit], t_tr[fit], lc, nb_, prior))
    return pred, [np.stack(o) for o in outs]


def _feature_powers(f: _Fit, feats: list, first: str, progress: bool) -> tuple[list[dict], list[tuple]]:
    """Per feature: its power on the first split (``power_<first>``) and on each later split, and its predictions."""
    from tqdm.auto import tqdm

    rows, preds = [], []
    for c in tqdm(feats, desc="tropt: target leakage", disable=not progress, leave=False):
        pred, outs = _one_feature(f, c)
        row = {"feature": c, f"power_{first}": _fold_powers(pred, f.y_tr, f.fold, None, None, f.power)[0]}
        for (d, smp, y), pl in zip(f.later, outs):
            row[f"power_{d.name}"] = float(np.nanmean([f.power(p, y) for p in pl])) if len(smp) >= 2 else float("nan")
        rows.append(row)
        preds.append((pred, outs))
    return rows, preds


def _significant_gaps(table: pd.DataFrame, f: _Fit, preds: list[tuple], base: str, n_feats: int, max_gap: float,
                      min_power_for_gap: float, gap_alpha: float, seed: int, bootstrap: int) -> pd.DataFrame:
    """The features whose power differs between the first split and a later one by more than ``max_gap`` (one side
    strong) with a bootstrap z-score beyond the Bonferroni-corrected level; adds the ``gap_z_<split>`` columns."""
    # A gap counts when it is large, one side is strong, and it is not sampling noise: its bootstrap z-score
    # must clear the Bonferroni-corrected level (small test splits and weak features gave 0.15 gaps by chance).
    from scipy.stats import norm

    z_crit = float(norm.isf(gap_alpha / (2 * max(1, n_feats))))
    rng = np.random.default_rng(seed)
    big = np.zeros(len(table), dtype=bool)
    for j, (d, _smp, y) in enumerate(f.later):
        pc = table[f"power_{d.name}"]
        strong = (table[base] >= min_power_for_gap) | (pc >= min_power_for_gap)
        cand = ((table[f"gap_{d.name}"].abs() > max_gap) & strong).to_numpy()
        z = np.full(len(table), np.nan)
        for i in np.flatnonzero(cand):
            z[i] = _gap_z(preds[i][0], f.y_tr, f.fold, preds[i][1][j], y, f.power, rng, bootstrap)
        table[f"gap_z_{d.name}"] = z
        big |= cand & (np.abs(z) >= z_crit)
    return table[big]


def _beyond_rest(table: pd.DataFrame, f: _Fit, rows: list[dict], preds: list[tuple], base: str, later_names: list,
                 max_power: float, warn_power: float, rest_gap: float,
                 rest_features: int) -> tuple[pd.Series, pd.Series]:
    """(near-perfect features, of which those near-perfect only beside the rest combined): fills ``rest_power``."""
    # Near-perfect in every split (a label copy is; NaN: a later split too small to score). One split alone is not
    # enough: iris petal width reaches 0.998 on some 105-row training splits and 0.96 on their test rows.
    perfect = table[base] >= max_power
    for name in later_names:
        pc = table[f"power_{name}"]
        perfect &= (pc >= max_power) | pc.isna()
    # Near-perfect alone and far beyond all the other features together: recorded after the outcome, not a strong
    # input. The rest is scored by one joint model of the others' one-feature predictions.
    table["rest_power"] = np.nan
    by_name = {r["feature"]: i for i, r in enumerate(rows)}
    for j in np.flatnonzero(((table[base] >= warn_power) & ~perfect).to_numpy()):
        name = table["feature"].iloc[j]
        others = [c for c in table["feature"] if c != name][:rest_features]  # the table is sorted by power
        # A joint model of the others is at least as good as the best of them: that bound guards the stack.
        stacked = _rest_power([preds[by_name[c]][0] for c in others], f.t_tr, f.y_tr, f.fold, f.power)
        best_other = float(table.loc[table["feature"] != name, base].max()) if len(others) else float("nan")
        table.loc[table.index[j], "rest_power"] = np.nanmax([stacked, best_other]) if others else np.nan
    alone = ((table[base] >= warn_power) & (table["rest_power"] <= table[base] - rest_gap)).fillna(False)
    for name in later_names:
        pc = table[f"power_{name}"]
        alone &= (pc >= warn_power) | pc.isna()
    after_outcome = alone & ~perfect
    return perfect | alone, after_outcome


def _verdict(table: pd.DataFrame, leaky: pd.DataFrame, strong: pd.DataFrame, gapped: pd.DataFrame,
             after_outcome: pd.Series, metrics: dict, first: str, label: Any, n_feats: int, max_power: float,
             warn_power: float, max_gap: float, gap_alpha: float, rest_gap: float) -> tuple[Status, str, list[str]]:
    base, metric = f"power_{first}", metrics["metric"]
    advice = []
    if len(leaky):
        names = ", ".join(repr(c) for c in leaky["feature"][:5])
        summary = (f"{len(leaky)} feature(s) alone predict {label!r} almost perfectly "
                   f"({metric} >= {max_power} in every "
                   f"split, or >= {warn_power} and at least {rest_gap} above all the other features combined): {names}")
        if after_outcome.any():
            r0 = table[after_outcome].iloc[0]
            summary += (f"; {r0['feature']!r} reaches {metric} {r0[base]:.3f} alone while every other feature together "
                        f"reaches {r0['rest_power']:.3f}: a value recorded after the outcome")
        advice.append(f"Remove {names} from the features unless it is legitimately known at prediction time "
                      "(a feature computed from the label or recorded after the outcome leaks the target).")
        return Status.FAIL, summary, advice
    if len(strong) or len(gapped):
        parts = []
        if len(strong):
            names = ", ".join(repr(c) for c in strong["feature"][:5])
            parts.append(f"{len(strong)} feature(s) alone predict {label!r} very well ({metric} >= {warn_power} in "
                         f"{first}, not >= {max_power} in every split): {names}")
            advice.append(f"Check {names}: this may be a genuinely strong feature on an easy task; "
                          "it is a leak only if it "
                          "is derived from the label or recorded after the outcome (then remove it).")
        if len(gapped):
            names = ", ".join(repr(c) for c in gapped["feature"][:5])
            parts.append(f"{len(gapped)} feature(s) predict {label!r} very differently across splits (gap > {max_gap} "
                         f"{metric}, significant at {gap_alpha} after correcting for {n_feats} features): {names}")
            advice.append(f"Inspect {names}: a feature that is predictive in one split only "
                          "often leaks split membership or drifts; "
                          "drop it or fix how it is computed.")
        return Status.WARN, "; ".join(parts), advice
    summary = (f"no single feature predicts {label!r} suspiciously well (best: {metrics['top_feature']!r}, "
               f"{metric} {metrics['max_power']:.3f}, cross-validated)")
    return Status.PASS, summary, advice


@register("data.target_leakage", title="Target leakage (single-feature power)",
          description="a single feature that predicts the label almost perfectly, or far better in one split",
          needs="splits",
          budgets={'quick': {'bootstrap': 50}, 'thorough': {'bootstrap': 500}},
          plot="tropt.plots.data")
def check_target_leakage(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                         max_power: float = 0.995, warn_power: float = 0.98, max_gap: float = 0.15,
                         min_power_for_gap: float = 0.6,
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
    leak, or a genuinely strong feature on an easy task, like iris petal width), and when a feature's power differs
    between the first split and a later one by
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
    cid = "data.target_leakage"
    datas = _load(splits, label, group, time, features, progress, needs={"sample"})
    if _labels(datas) is None:
        return _skip(cid, "no label= given: pass the label column to measure each feature's predictive power")
    if datas[0].sample is None:  # 2-D arrays are tables (their columns are features); samples/images are not
        return _skip(cid, "target leakage is measured per column of tables; these splits are tensors/samples")
    # cast: every split is a table (splits do not mix kinds), so each has the sample it was loaded with
    labels = [cast(pd.DataFrame, d.sample)[LABEL_COLUMN] for d in datas]
    task = infer_task([d.label for d in datas], task)
    feats = [c for c in datas[0].feature_columns][:max_features]
    y0, ok0, classes = _target_of(labels[0], task)
    if ok0.sum() < 2 * folds:
        return _skip(cid, f"too few labelled rows in {datas[0].name!r} ({int(ok0.sum())}) "
                          f"for {folds}-fold cross-validation")
    if task == "classification" and len(classes) < 2:
        return _skip(cid, f"the label has a single class in {datas[0].name!r}: "
                          "nothing to predict (see data.label_sanity)")
    f = _fit(datas, labels, task, y0, ok0, classes, folds, seed, bins, rows_per_bin)
    rows, preds = _feature_powers(f, feats, datas[0].name, progress)
    table = pd.DataFrame(rows)
    base = f"power_{datas[0].name}"
    for d in datas[1:]:
        table[f"gap_{d.name}"] = table[base] - table[f"power_{d.name}"]
    metric = "auc" if task == "classification" else "r2"
    gapped = pd.DataFrame()
    if len(datas) > 1:
        gapped = _significant_gaps(table, f, preds, base, len(feats), max_gap, min_power_for_gap, gap_alpha, seed,
                                   bootstrap)
    table = table.sort_values(base, ascending=False, na_position="last", kind="stable").reset_index(drop=True)
    if len(gapped):
        gapped = table[table["feature"].isin(gapped["feature"])]
    top = table.iloc[0] if len(table) else None
    perfect, after_outcome = _beyond_rest(table, f, rows, preds, base, [d.name for d in datas[1:]], max_power,
                                          warn_power, rest_gap, rest_features)
    leaky = table[perfect]
    strong = table[(table[base] >= warn_power) & ~perfect]
    metrics: dict[str, Any] = {"task": task, "metric": metric, "features_checked": len(feats), "rows_used": len(f.tr),
                               "leaky_features": len(leaky), "strong_features": len(strong),
                               "gap_features": len(gapped),
                               "beyond_rest_features": int(after_outcome.sum()),
                               "bins": f.nbins,
                               **({"classes": f.classes_total, "classes_scored": f.n_classes}
                                  if task == "classification" else {}),
                               "max_power": (float(top[base]) if top is not None and np.isfinite(top[base])
                                             else float("nan")),
                               "top_feature": _label_of(table["feature"].iloc[0]) if top is not None else ""}
    status, summary, advice = _verdict(table, leaky, strong, gapped, after_outcome, metrics, datas[0].name, label,
                                       len(feats), max_power, warn_power, max_gap, gap_alpha, rest_gap)
    if f.classes_total > f.n_classes:
        summary += (f" (scored on the {f.n_classes - 1} most frequent of {f.classes_total} classes, "
                    "the rest as one 'other' class)")
    return CheckResult(cid, status, summary, metrics, {"features": table}, advice,
                       {"power": table[base].to_numpy(dtype=float)})
