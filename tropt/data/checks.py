"""Stage 1 checks: leakage between splits and label/split sanity.

Every check takes the ordered ``splits`` mapping first (earlier splits first: train, val, test, ...) and checks
each later split against every earlier one. Feature columns are every column except ``label``, ``group`` and
``time`` unless ``features=`` names them; thresholds are keyword defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Report, Status
from .sources import _LABEL, Options, SplitData, column_kind, hash_column, load_splits, session, unify_kinds

MAX_EVIDENCE = 1000  # evidence rows kept per table; metrics always count everything


# ---------------------------------------------------------------------------------------------------- helpers
def _load(splits, label, group, time, features, progress, min_splits=2, needs=frozenset()) -> list[SplitData]:
    return load_splits(splits, Options.make(label, group, time, features), progress=progress, min_splits=min_splits,
                       needs=frozenset(needs))


def _pairs(datas: list[SplitData]) -> list[tuple[SplitData, SplitData]]:
    """(later, earlier) for every later split and every split before it."""
    return [(datas[i], datas[j]) for i in range(1, len(datas)) for j in range(i)]


def _pkey(later: SplitData, earlier: SplitData) -> str:
    return f"{later.name}_in_{earlier.name}"


def _skip(check: str, why: str) -> CheckResult:
    return CheckResult(check, Status.SKIP, why)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def _canon_hashes(series: list[pd.Series], names: list[str]) -> list[np.ndarray]:
    """Canonical value hashes of the same column across splits (ints and floats of one value agree)."""
    kind = unify_kinds([column_kind(s, n) for s, n in zip(series, names)])
    return [hash_column(s, kind) for s in series]


def _labels(datas: list[SplitData], label=None) -> list[pd.Series] | None:
    """Every split's labels (from label=, or y of (X, y) splits), or None when a split has none."""
    out = [d.label for d in datas]
    return None if any(s is None for s in out) else out


def _is_num(s: pd.Series) -> bool:
    return (pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype)) and not pd.api.types.is_complex_dtype(s.dtype)


def _numeric_values(s: pd.Series) -> np.ndarray:
    if pd.api.types.is_bool_dtype(s.dtype):
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    if _is_num(s):
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def infer_task(labels: list[pd.Series], task: str | None = None, num_classes: int | None = None, max_classes: int = 50) -> str:
    """"classification" or "regression" from the label values (or what the user said)."""
    if task is not None:
        if task not in ("classification", "regression"):
            raise DataError(f"task={task!r} is not 'classification' or 'regression'", "pass one of those, or None to infer it")
        return task
    if num_classes is not None:
        return "classification"
    if not all(_is_num(s) for s in labels):
        return "classification"
    v = np.concatenate([_numeric_values(s) for s in labels])
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "classification"
    integral = np.mean(v == np.round(v))
    nunique = len(np.unique(v[: 1_000_000]))
    return "classification" if integral >= 0.99 and nunique <= max_classes else "regression"


def _class_keys(s: pd.Series) -> pd.Series:
    """Class values comparable across splits: numbers as floats → ints where integral, else as they are."""
    if _is_num(s):
        v = _numeric_values(s)
        out = pd.Series(v)
        if np.all(v[np.isfinite(v)] == np.round(v[np.isfinite(v)])):
            return out.astype("Int64") if np.isnan(v).any() else out.astype(np.int64)
        return out
    return s.astype(object).where(s.notna(), None)


def _counts_table(labels: list[pd.Series], names: list[str]) -> pd.DataFrame:
    counts = {}
    for s, n in zip(labels, names):
        counts[n] = _class_keys(s).dropna().value_counts()
    df = pd.DataFrame(counts).fillna(0).astype(np.int64)
    try:
        df = df.sort_index()
    except TypeError:  # mixed class types
        df = df.loc[sorted(df.index, key=str)]
    df.index.name = "class"
    return df


# ---------------------------------------------------------------------------------------------------- exact duplicates
@register("data.exact_duplicates", title="Exact duplicates across splits",
          description="rows of a later split with an exact copy (same features) in an earlier split", needs="splits")
def check_exact_duplicates(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                           max_fraction: float = 0.01, max_evidence: int = MAX_EVIDENCE, progress: bool = True) -> CheckResult:
    """Find rows of later splits whose features exactly match a row of an earlier split.

    Fingerprints are canonical (-0.0 == 0.0, NaN == NaN, column order and index ignored) and cover the feature
    columns only: every column except ``label``, ``group`` and ``time`` unless ``features=`` lists them.
    WARN for any leaked row (or conflicting labels), FAIL when more than ``max_fraction`` of a later split leaked.
    """
    cid = "data.exact_duplicates"
    datas = _load(splits, label, group, time, features, progress)
    allfp = np.concatenate([d.fp for d in datas])
    codes, uniq = pd.factorize(allfp)
    bounds = np.cumsum([0] + [d.n for d in datas])
    split_codes = [codes[bounds[i]:bounds[i + 1]] for i in range(len(datas))]
    firsts = []
    for c in split_codes:
        f = np.full(len(uniq), -1, dtype=np.int64)
        f[c[::-1]] = np.arange(len(c) - 1, -1, -1)
        firsts.append(f)
    metrics: dict[str, Any] = {"leaked_rows": 0, "leaked_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows, evidence = [], []
    index = {d.name: i for i, d in enumerate(datas)}
    compared = 0
    for later, earlier in _pairs(datas):
        li, ei = index[later.name], index[earlier.name]
        match = firsts[ei][split_codes[li]]
        hit = np.flatnonzero(match >= 0)
        frac = len(hit) / later.n
        compared += later.n
        metrics["leaked_rows"] += len(hit)
        metrics[f"leaked_rows.{_pkey(later, earlier)}"] = len(hit)
        metrics[f"leaked_fraction.{_pkey(later, earlier)}"] = frac
        metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n, "leaked_rows": len(hit), "leaked_fraction": frac})
        room = max_evidence - len(evidence)
        if room > 0 and len(hit):
            take = hit[:room]
            ev = pd.DataFrame({"split": later.name, "row": later.row_id[take], "earlier_split": earlier.name,
                               "earlier_row": earlier.row_id[match[take]],
                               "fingerprint": [f"{v:016x}" for v in later.fp[take]]})
            if later.label is not None and earlier.label is not None:
                ev["label"] = later.label.to_numpy()[take]
                ev["earlier_label"] = earlier.label.to_numpy()[match[take]]
            evidence.append(ev)
            evidence = [pd.concat(evidence, ignore_index=True)]
    metrics["leaked_fraction"] = metrics["leaked_rows"] / compared if compared else 0.0
    within_total = 0
    for d, c, f in zip(datas, split_codes, firsts):
        within = d.n - int((f >= 0).sum())
        metrics[f"duplicates_within.{d.name}"] = within
        within_total += within
    metrics["duplicates_within"] = within_total

    # Same features, different labels (anywhere in the splits): label noise or a feature set too poor to decide.
    conflicting, conflict_rows, conflict_table = 0, 0, None
    labels = _labels(datas, label)
    if labels is not None:
        lh = np.concatenate(_canon_hashes(labels, [d.name for d in datas]))
        counts = np.bincount(codes, minlength=len(uniq))
        dup = counts[codes] > 1
        if dup.any():
            sub = pd.DataFrame({"code": codes[dup], "lab": lh[dup]})
            nlab = sub.drop_duplicates().groupby("code").size()
            bad_codes = nlab.index[nlab.to_numpy() > 1].to_numpy()
            conflicting = len(bad_codes)
            rows_mask = np.zeros(len(codes), dtype=bool)
            rows_mask[np.flatnonzero(dup)[np.isin(codes[dup], bad_codes)]] = True
            conflict_rows = int(rows_mask.sum())
            if conflict_rows:
                pos = np.flatnonzero(rows_mask)[:max_evidence]
                sid = np.searchsorted(bounds, pos, side="right") - 1
                conflict_table = pd.DataFrame({
                    "split": [datas[s].name for s in sid],
                    "row": [datas[s].row_id[p - bounds[s]] for s, p in zip(sid, pos)],
                    "label": [labels[s].iloc[p - bounds[s]] for s, p in zip(sid, pos)],
                    "fingerprint": [f"{allfp[p]:016x}" for p in pos],
                }).sort_values(["fingerprint", "split"], kind="stable").reset_index(drop=True)
    metrics["conflicting_labels"] = conflicting
    metrics["conflicting_label_rows"] = conflict_rows
    metrics["feature_columns"] = len(datas[0].feature_columns) if datas[0].tabular and datas[0].feature_columns else 0

    tables = {"pairs": pd.DataFrame(pair_rows)}
    if evidence:
        tables["leaked_rows"] = evidence[0]
    if conflict_table is not None:
        tables["conflicting_labels"] = conflict_table
    leaked, worst = metrics["leaked_rows"], metrics["max_pair_fraction"]
    advice = []
    if leaked:
        worst_pair = max(pair_rows, key=lambda r: r["leaked_fraction"])
        advice.append(f"Drop the {leaked} leaked rows from the later splits (listed in 'leaked_rows'), or de-duplicate "
                      "the data before splitting so every copy lands in one split.")
        if group is None:
            advice.append("If copies come from one entity (user, patient, document), re-split by that id and pass group= to check it.")
        summary = (f"{leaked} row(s) of later splits have an exact copy in an earlier split "
                   f"(worst: {worst_pair['leaked_rows']} of {worst_pair['rows']} {worst_pair['split']} rows in "
                   f"{worst_pair['earlier_split']}, {_pct(worst_pair['leaked_fraction'])})")
    else:
        summary = f"no row of a later split has an exact copy in an earlier split ({', '.join(f'{d.name}: {d.n}' for d in datas)} rows)"
    if conflicting:
        summary += f"; {conflicting} feature vector(s) appear with different labels ({conflict_rows} rows)"
        advice.append("Review the rows with identical features but different labels ('conflicting_labels'): fix the labels or drop them.")
    if within_total:
        summary += f"; {within_total} duplicate row(s) within splits"
    status = Status.FAIL if worst > max_fraction else Status.WARN if leaked or conflicting else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)


# ---------------------------------------------------------------------------------------------------- near duplicates
@register("data.near_duplicates", title="Near duplicates across splits",
          description="rows/samples of a later split nearly identical (cosine) to one in an earlier split", needs="splits")
def check_near_duplicates(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                          enabled: bool | str = "auto", threshold: float | None = None, calibration: float = 0.05,
                          min_similarity: float = 0.95, phash_max_distance: int = 10, max_fraction: float = 0.01,
                          max_auto_rows: int = 200_000, max_auto_cost: float = 2e11, device: str | None = None,
                          max_evidence: int = MAX_EVIDENCE, progress: bool = True) -> CheckResult:
    """Exact cosine nearest neighbour of every later-split row among each earlier split's rows.

    Vectors are the numeric features (tables: standardised with the first split's mean/std; tensors: centred),
    L2-normalised. A pair is a near duplicate when its similarity is at least ``threshold``, by default
    ``max(min_similarity, cos(calibration * median nearest-neighbour angle))``: far closer than rows typically are.
    Images additionally get a 16x16 average hash; a Hamming distance ``<= phash_max_distance`` also counts.
    ``enabled="auto"`` runs for tensors/images and numeric tables up to ``max_auto_rows`` rows and an estimated
    ``max_auto_cost`` multiply-adds (x50 on a GPU); ``True`` forces it, ``False`` skips.
    """
    from . import neighbours as nb

    cid = "data.near_duplicates"
    if enabled is False:
        return _skip(cid, "near-duplicate search disabled (near_duplicates=False)")
    datas = _load(splits, label, group, time, features, progress, needs={"numeric"})
    missing = [d for d in datas if d.numeric is None]
    if missing:
        return _skip(cid, f"no vectors to compare in split {missing[0].name!r}: {missing[0].numeric_note or 'not numeric'}")
    dims = {d.numeric.shape[1] for d in datas}
    if len(dims) != 1:
        return _skip(cid, f"samples have different sizes across splits ({sorted(dims)} values)")
    dim = dims.pop()
    tabular = datas[0].tabular
    if tabular and dim < 3:
        return _skip(cid, f"only {dim} numeric feature column(s): cosine similarity cannot tell rows apart in so few dimensions")
    dev = nb.pick_device(device)
    cost = sum(a.n * b.n * dim for a, b in _pairs(datas))
    if enabled == "auto":
        total = sum(d.n for d in datas)
        if tabular and total > max_auto_rows:
            return _skip(cid, f"table of {total:,} rows is above the automatic limit ({max_auto_rows:,}); pass near_duplicates=True to run it")
        budget = max_auto_cost * (50 if dev.startswith("cuda") else 1)
        if cost > budget:
            return _skip(cid, f"exact search would take ~{cost:.2e} multiply-adds (automatic limit {budget:.1e}); "
                              "pass near_duplicates=True to run it (a GPU helps: device='cuda')")
    elif enabled is not True:
        raise DataError(f"near_duplicates={enabled!r} is not 'auto', True or False", "pass 'auto', True or False")

    ref = datas[0].numeric
    mean = np.nanmean(ref, axis=0).astype(np.float32) if tabular else ref.mean(axis=0, dtype=np.float64).astype(np.float32)
    mean = np.nan_to_num(mean)
    scale = None
    if tabular:
        scale = np.nanstd(ref, axis=0).astype(np.float32)
        scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0).astype(np.float32)
    prepared = {d.name: nb.prepare(d.numeric, mean, scale) for d in datas}
    images = all(d.image_shape is not None for d in datas) and len({d.image_shape for d in datas}) == 1
    hashes = {d.name: nb.average_hash(d.numeric, d.image_shape) for d in datas} if images and phash_max_distance >= 0 else None

    metrics: dict[str, Any] = {"leaked_rows": 0, "leaked_fraction": 0.0, "max_pair_fraction": 0.0, "dimensions": dim, "device": dev}
    pair_rows, evidence, hist_rows = [], [], []
    thresholds = []
    compared = 0
    edges = np.linspace(-9, 0.5, 96)
    for later, earlier in _pairs(datas):
        best, arg = nb.nearest(prepared[later.name], prepared[earlier.name], dev, progress, f"tropt: {later.name} vs {earlier.name}")
        angle = np.arccos(best.astype(np.float64))
        nonexact = angle[angle > 1e-3]
        typical = float(np.median(nonexact)) if nonexact.size else float(np.pi / 2)
        # Far closer than rows typically are: the expected share of unrelated rows that close falls like
        # ratio**(dim-1), so low-dimensional data gets a smaller ratio (false positives below ~1e-5 per row).
        ratio = min(calibration, 1e-5 ** (1.0 / max(dim - 1, 1)))
        thr = float(threshold) if threshold is not None else max(min_similarity, float(np.cos(ratio * typical)))
        thresholds.append(thr)
        flagged = best >= thr
        match = arg.copy()
        ham = None
        if hashes is not None:
            ham, harg = nb.hamming_nearest(hashes[later.name], hashes[earlier.name], dev)
            by_hash = (ham <= phash_max_distance) & ~flagged
            match[by_hash] = harg[by_hash]
            flagged = flagged | by_hash
        hit = np.flatnonzero(flagged)
        frac = len(hit) / later.n
        compared += later.n
        exact = int(np.sum(later.fp[hit] == earlier.fp[match[hit]]))
        key = _pkey(later, earlier)
        metrics["leaked_rows"] += len(hit)
        metrics[f"leaked_rows.{key}"] = len(hit)
        metrics[f"exact_copies.{key}"] = exact
        metrics[f"threshold.{key}"] = thr
        metrics[f"median_nn_similarity.{key}"] = float(np.median(best))
        metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n, "near_duplicates": len(hit),
                          "of_which_exact": exact, "fraction": frac, "threshold": thr, "median_nn_similarity": float(np.median(best))})
        counts, _ = np.histogram(np.log10(np.maximum(1.0 - best.astype(np.float64), 1e-9)), bins=edges)
        hist_rows.append(counts)
        room = max_evidence - sum(len(e) for e in evidence)
        if room > 0 and len(hit):
            order = hit[np.argsort(-best[hit], kind="stable")][:room]
            sim = np.einsum("ij,ij->i", prepared[later.name][order], prepared[earlier.name][match[order]])
            ev = pd.DataFrame({"split": later.name, "row": later.row_id[order], "earlier_split": earlier.name,
                               "earlier_row": earlier.row_id[match[order]], "similarity": np.clip(sim, -1, 1).astype(np.float64),
                               "exact": later.fp[order] == earlier.fp[match[order]]})
            if ham is not None:
                ev["hash_distance"] = np.rint((hashes[later.name].shape[1] - np.einsum("ij,ij->i", hashes[later.name][order], hashes[earlier.name][match[order]])) / 2).astype(int)
            evidence.append((ev, later, earlier, order, match[order]))
    metrics["leaked_fraction"] = metrics["leaked_rows"] / compared if compared else 0.0
    metrics["threshold"] = float(min(thresholds))
    tables = {"pairs": pd.DataFrame(pair_rows)}
    series: dict[str, Any] = {"log10_distance_edges": edges, "log10_distance_counts": np.sum(hist_rows, axis=0)}
    if evidence:
        tables["near_duplicates"] = pd.concat([e[0] for e in evidence], ignore_index=True)
        if images:
            thumbs = []
            for ev, later, earlier, order, m in evidence:
                for a, b in zip(order, m):
                    if len(thumbs) >= 6:
                        break
                    thumbs.append([nb.thumbnail(later.numeric[a], later.image_shape), nb.thumbnail(earlier.numeric[b], earlier.image_shape)])
            series["pair_images"] = np.asarray(thumbs, dtype=np.float32)
    leaked, worst = metrics["leaked_rows"], metrics["max_pair_fraction"]
    what = "samples" if not tabular else "rows"
    if leaked:
        wp = max(pair_rows, key=lambda r: r["fraction"])
        summary = (f"{leaked} {what} of later splits have a near duplicate in an earlier split (worst: {wp['near_duplicates']} "
                   f"of {wp['rows']} {wp['split']} {what}, {_pct(wp['fraction'])}; {wp['of_which_exact']} exact copies)")
        advice = [f"Remove the near-duplicate {what} listed in 'near_duplicates' from the later split, or group near copies "
                  "(same source, augmentations, re-encodings) and split by that group.",
                  "If these are legitimately similar but distinct samples, raise threshold= (the similarity cut-off)."]
    else:
        summary = f"no near duplicates across splits (similarity threshold {metrics['threshold']:.4f}, {dim} dimensions)"
        advice = []
    status = Status.FAIL if worst > max_fraction else Status.WARN if leaked else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)


# ---------------------------------------------------------------------------------------------------- group leakage
@register("data.group_leakage", title="Group (entity) leakage",
          description="entity ids (group=) present in more than one split", needs="splits")
def check_group_leakage(splits: Mapping[str, Any], *, group=None, label=None, time=None, features=None,
                        max_fraction: float = 0.01, max_evidence: int = MAX_EVIDENCE, progress: bool = True) -> CheckResult:
    """Entities (``group=`` column: user, patient, document id) that appear in more than one split.

    ``affected_rows`` counts rows of later splits whose group also appears in an earlier split. WARN for any,
    FAIL when more than ``max_fraction`` of a later split is affected.
    """
    cid = "data.group_leakage"
    if group is None:
        return _skip(cid, "no group= column given: pass the entity id column (user, patient, ...) to check for shared entities")
    datas = _load(splits, label, group, time, features, progress)
    names = [d.name for d in datas]
    hashes = _canon_hashes([d.group for d in datas], names)
    uniq_sets = [pd.unique(h) for h in hashes]
    metrics: dict[str, Any] = {"shared_groups": 0, "affected_rows": 0, "affected_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows = []
    affected_total, compared = 0, 0
    for i in range(1, len(datas)):
        earlier_all = np.concatenate(uniq_sets[:i])
        in_earlier = pd.Index(earlier_all).unique()
        affected_total += int(pd.Index(hashes[i]).isin(in_earlier).sum())
        compared += datas[i].n
        for j in range(i):
            mask = pd.Index(hashes[i]).isin(pd.Index(uniq_sets[j]))
            rows = int(mask.sum())
            shared = int(pd.Index(uniq_sets[i]).isin(pd.Index(uniq_sets[j])).sum())
            frac = rows / datas[i].n
            key = _pkey(datas[i], datas[j])
            metrics[f"shared_groups.{key}"] = shared
            metrics[f"affected_rows.{key}"] = rows
            metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
            pair_rows.append({"split": datas[i].name, "earlier_split": datas[j].name, "groups": len(uniq_sets[i]),
                              "shared_groups": shared, "rows": datas[i].n, "affected_rows": rows, "affected_fraction": frac})
    # Groups seen in two or more splits, with their rows per split.
    allh = np.concatenate(uniq_sets)
    h_counts = pd.Series(allh).value_counts()
    shared_h = h_counts.index[h_counts.to_numpy() > 1].to_numpy()
    metrics["shared_groups"] = len(shared_h)
    metrics["affected_rows"] = affected_total
    metrics["affected_fraction"] = affected_total / compared if compared else 0.0
    tables = {"pairs": pd.DataFrame(pair_rows)}
    if len(shared_h):
        cols = {}
        value = {}
        for d, h in zip(datas, hashes):
            m = np.isin(h, shared_h)
            vc = pd.Series(h[m]).value_counts()
            cols[f"rows_in_{d.name}"] = vc
            first = pd.Series(d.group.to_numpy()[m], index=h[m])
            for k, v in first[~first.index.duplicated()].items():
                value.setdefault(k, v)
        t = pd.DataFrame(cols).reindex(shared_h).fillna(0).astype(np.int64)
        t.insert(0, "group", [value[k] for k in t.index])
        t = t.sort_values(list(t.columns[1:]), ascending=False, kind="stable").head(max_evidence).reset_index(drop=True)
        tables["shared_groups"] = t
    shared, worst = metrics["shared_groups"], metrics["max_pair_fraction"]
    if shared:
        summary = (f"{shared} {group!r} value(s) appear in more than one split; {affected_total} row(s) of later splits "
                   f"({_pct(metrics['affected_fraction'])}) belong to an entity seen earlier")
        advice = [f"Re-split by {group!r} so every entity is in exactly one split (e.g. sklearn GroupShuffleSplit / GroupKFold "
                  f"with groups=df[{group!r}]).",
                  "Or drop the affected rows (listed by entity in 'shared_groups') from the later splits."]
    else:
        summary = f"no {group!r} value is shared between splits ({', '.join(f'{d.name}: {len(u)}' for d, u in zip(datas, uniq_sets))} groups)"
        advice = []
    status = Status.FAIL if worst > max_fraction else Status.WARN if shared else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)


# ---------------------------------------------------------------------------------------------------- temporal leakage
def _times(s: pd.Series, split: str, col: Any) -> tuple[np.ndarray, bool]:
    """Times as float64 (ns since epoch for dates) and whether they are datetimes."""
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        if getattr(s.dt, "tz", None) is not None:
            s = s.dt.tz_convert("UTC").dt.tz_localize(None)
        v = s.to_numpy(dtype="datetime64[ns]")
        out = v.view(np.int64).astype(np.float64)
        out[np.isnat(v)] = np.nan
        return out, True
    if _is_num(s):
        return s.to_numpy(dtype=np.float64, na_value=np.nan), False
    parsed = pd.to_datetime(s, errors="coerce", utc=True, format="mixed")
    bad = parsed.isna() & s.notna()
    if bad.mean() > 0.5 or (bad.any() and parsed.notna().sum() == 0):
        example = s[bad].iloc[0]
        raise DataError(f"split {split!r}: time column {col!r} cannot be read as dates (e.g. {example!r})",
                        "pass a datetime or numeric column as time=, or convert it with pd.to_datetime first")
    v = parsed.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    out = v.view(np.int64).astype(np.float64)
    out[np.isnat(v)] = np.nan
    return out, True


def _fmt_time(v: float, is_dt: bool) -> Any:
    if not np.isfinite(v):
        return None
    return pd.Timestamp(int(v)) if is_dt else v


@register("data.temporal_leakage", title="Temporal leakage",
          description="rows of a later split dated before the end of an earlier split", needs="splits")
def check_temporal_leakage(splits: Mapping[str, Any], *, time=None, label=None, group=None, features=None,
                           max_fraction: float = 0.01, random_split_fraction: float = 0.5,
                           max_evidence: int = MAX_EVIDENCE, progress: bool = True) -> CheckResult:
    """Rows of later splits dated strictly before the last timestamp of an earlier split.

    A later split mostly (``>= random_split_fraction``) inside an earlier split's period is reported as the
    random-split-of-time-ordered-data pattern. WARN for any overlap, FAIL above ``max_fraction`` of a later split.
    """
    cid = "data.temporal_leakage"
    if time is None:
        return _skip(cid, "no time= column given: pass the timestamp column to check that later splits come later")
    datas = _load(splits, label, group, time, features, progress)
    parsed = [_times(d.time, d.name, time) for d in datas]
    is_dt = all(p[1] for p in parsed)
    ts = [p[0] for p in parsed]
    ranges = []
    for d, t in zip(datas, ts):
        ok = t[np.isfinite(t)]
        ranges.append({"split": d.name, "rows": d.n, "start": _fmt_time(ok.min() if ok.size else np.nan, is_dt),
                       "end": _fmt_time(ok.max() if ok.size else np.nan, is_dt), "missing_times": int(d.n - ok.size)})
    metrics: dict[str, Any] = {"overlap_rows": 0, "overlap_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows, evidence = [], []
    compared = 0
    index = {d.name: i for i, d in enumerate(datas)}
    random_pairs = []
    for later, earlier in _pairs(datas):
        tl, te = ts[index[later.name]], ts[index[earlier.name]]
        te_ok = te[np.isfinite(te)]
        if te_ok.size == 0:
            continue
        end = te_ok.max()
        before = np.isfinite(tl) & (tl < end)
        rows = int(before.sum())
        frac = rows / later.n
        compared += later.n
        key = _pkey(later, earlier)
        metrics["overlap_rows"] += rows
        metrics[f"overlap_rows.{key}"] = rows
        metrics[f"overlap_fraction.{key}"] = frac
        metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
        if frac >= random_split_fraction:
            random_pairs.append(f"{later.name}/{earlier.name}")
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n, "earlier_end": _fmt_time(end, is_dt),
                          "rows_before_end": rows, "fraction": frac})
        room = max_evidence - sum(len(e) for e in evidence)
        if rows and room > 0:
            idx = np.flatnonzero(before)
            idx = idx[np.argsort(tl[idx], kind="stable")][:room]
            evidence.append(pd.DataFrame({"split": later.name, "row": later.row_id[idx],
                                          "time": [_fmt_time(v, is_dt) for v in tl[idx]], "earlier_split": earlier.name,
                                          "earlier_end": _fmt_time(end, is_dt)}))
    metrics["overlap_fraction"] = metrics["overlap_rows"] / compared if compared else 0.0
    metrics["pattern"] = "random split of time-ordered data" if random_pairs else ("partial overlap" if metrics["overlap_rows"] else "time-ordered")
    tables = {"ranges": pd.DataFrame(ranges), "pairs": pd.DataFrame(pair_rows)}
    if evidence:
        tables["rows_before_end"] = pd.concat(evidence, ignore_index=True)
    # Histograms on one grid for the timeline plot.
    allt = np.concatenate([t[np.isfinite(t)] for t in ts])
    series: dict[str, Any] = {}
    if allt.size:
        edges = np.linspace(allt.min(), allt.max() if allt.max() > allt.min() else allt.min() + 1, 61)
        series["time_edges"] = edges
        for d, t in zip(datas, ts):
            series[f"time_counts:{d.name}"] = np.histogram(t[np.isfinite(t)], bins=edges)[0]
    rows, worst = metrics["overlap_rows"], metrics["max_pair_fraction"]
    if random_pairs:
        summary = (f"the splits look like a random split of time-ordered data: {_pct(worst)} of a later split lies before "
                   f"the end of an earlier one ({', '.join(random_pairs)})")
        advice = [f"Split by time: sort by {time!r} and cut at one date, so every later split comes after every earlier one.",
                  "If time order does not matter for this task, drop time= (and say why in the report)."]
    elif rows:
        wp = max(pair_rows, key=lambda r: r["fraction"])
        summary = (f"{rows} row(s) of later splits are dated before the end of an earlier split (worst: {wp['rows_before_end']} "
                   f"of {wp['rows']} {wp['split']} rows before {wp['earlier_end']}, the end of {wp['earlier_split']})")
        advice = [f"Drop the rows listed in 'rows_before_end' from the later split, or re-split at one cut-off date on {time!r}."]
    else:
        summary = "every later split starts after the earlier splits end (time-ordered)"
        advice = []
    status = Status.FAIL if worst > max_fraction else Status.WARN if rows else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)


# ---------------------------------------------------------------------------------------------------- target leakage
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
    if len(warn):
        w = warn.sort_values("effect", ascending=False).iloc[0]
        summary = f"label distribution of {w['split']!r} differs from {w['earlier_split']!r}: {eff} {w['effect']:.3f} (p={w['p_value']:.2g})"
        advice = ["Re-split with stratification on the label (e.g. sklearn train_test_split(..., stratify=y)) if the "
                  "splits should share one distribution.",
                  "If the shift is real (a later period), evaluate with per-class metrics and re-weight or recalibrate."]
        status = Status.FAIL if len(fail) else Status.WARN
    else:
        summary = f"label distributions agree across splits (largest {eff} {metrics['max_effect']:.3f})"
        advice = []
        status = Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)


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
        return _skip(cid, f"{label!r} looks like a regression target (many distinct non-integer values): class coverage does not apply")
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


# ---------------------------------------------------------------------------------------------------- all of stage 1
CHECKS = {
    "data.exact_duplicates": check_exact_duplicates,
    "data.near_duplicates": check_near_duplicates,
    "data.group_leakage": check_group_leakage,
    "data.temporal_leakage": check_temporal_leakage,
    "data.target_leakage": check_target_leakage,
    "data.label_shift": check_label_shift,
    "data.class_coverage": check_class_coverage,
    "data.label_sanity": check_label_sanity,
}


def check_splits(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                 near_duplicates: bool | str = "auto", progress: bool = True) -> Report:
    """Run every stage-1 check on ``splits`` (ordered: earlier splits first) and return a :class:`tropt.Report`.

    Each split is scanned once and shared between the checks. Bad input that concerns every check (columns that
    differ between splits, an unknown label/group/time column, an empty split, unhashable values) raises
    :class:`tropt.errors.DataError`; a check that fails for its own reasons becomes an ERROR result.
    """
    from ..diagnosis import run_check
    from ..identity import run_identity
    from ..registry import find_spec

    with session():
        load_splits(splits, Options.make(label, group, time, features), progress=progress, min_splits=2)
        options = {"label": label, "group": group, "time": time, "features": features, "progress": progress}
        results = []
        for cid in CHECKS:
            opts = dict(options)
            if cid == "data.near_duplicates":
                opts["enabled"] = near_duplicates
            results.append(run_check(find_spec(cid), splits, opts))
    return Report(results, run_identity(None, splits, checks=list(CHECKS)))
