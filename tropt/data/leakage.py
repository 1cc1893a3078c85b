"""Stage-1 leakage checks on ids and dates: group (entity) leakage and temporal leakage between splits."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Status
from ._common import MAX_EVIDENCE, _canon_hashes, _is_num, _load, _pairs, _pct, _pkey, _skip


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


def time_summary(t: np.ndarray, is_dt: bool) -> dict:
    """Min, max and count of the finite times of a split or partition (reduced over partitions by min/max/sum)."""
    ok = t[np.isfinite(t)]
    return {"min": float(ok.min()) if ok.size else np.nan, "max": float(ok.max()) if ok.size else np.nan,
            "finite": int(ok.size), "is_dt": is_dt}


def merge_time_summaries(parts: list[dict]) -> dict:
    live = [p for p in parts if p["finite"]]
    return {"min": min((p["min"] for p in live), default=np.nan), "max": max((p["max"] for p in live), default=np.nan),
            "finite": sum(p["finite"] for p in parts), "is_dt": parts[0]["is_dt"]}


def rows_before(t: np.ndarray, pos: np.ndarray, ends: list, max_evidence: int) -> list:
    """For each end (None: skipped): (rows with a finite time before it, the first ``max_evidence`` of their times
    and positions by time then position). Partitions' results merge with :func:`merge_rows_before`."""
    out = []
    for end in ends:
        if end is None or not np.isfinite(end):
            out.append(None)
            continue
        idx = np.flatnonzero(np.isfinite(t) & (t < end))
        first = idx[np.argsort(t[idx], kind="stable")][:max_evidence]
        out.append((len(idx), t[first], pos[first]))
    return out


def merge_rows_before(parts: list[list], max_evidence: int) -> list:
    out = []
    for got in zip(*parts):
        if got[0] is None:
            out.append(None)
            continue
        ts, ps = np.concatenate([g[1] for g in got]), np.concatenate([g[2] for g in got])
        order = np.lexsort((ps, ts))[:max_evidence]
        out.append((sum(g[0] for g in got), ts[order], ps[order]))
    return out


def _temporal_stats(datas: list, time: Any, max_evidence: int) -> list[dict]:
    """Each split's time summary; splits whose time column stayed on the Dask workers are summarised there."""
    out = []
    for d in datas:
        if d.time is None and d.dask_parts is not None and d.dask_parts.get("time") is not None:
            from .dask_splits import distributed_time_summary

            out.append(distributed_time_summary(d, time))
        else:
            t, is_dt = _times(d.time, d.name, time)
            out.append({**time_summary(t, is_dt), "_t": t})
    return out


def _rows_before(datas: list, stats: list[dict], ends: list, max_evidence: int) -> list:
    """``[later][earlier] -> (rows, first times, first positions)`` of later rows dated before each earlier split's end."""
    out = []
    for li, d in enumerate(datas):
        wanted = [ends[ei] if ei < li and stats[ei]["finite"] else None for ei in range(len(datas))]
        if "_t" in stats[li]:
            t = stats[li]["_t"]
            out.append(rows_before(t, np.arange(len(t)), wanted, max_evidence))
        else:
            from .dask_splits import distributed_rows_before

            out.append(distributed_rows_before(d, stats[li], wanted, max_evidence))
    return out


def _time_histograms(datas: list, stats: list[dict], edges: np.ndarray) -> list[np.ndarray]:
    """Each split's counts of finite times on ``edges`` (summed over partitions for a split held on Dask workers)."""
    out = []
    for d, st in zip(datas, stats):
        if "_t" in st:
            t = st["_t"]
            out.append(np.histogram(t[np.isfinite(t)], bins=edges)[0])
        else:
            from .dask_splits import distributed_time_histogram

            out.append(distributed_time_histogram(d, edges))
    return out


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
    stats = _temporal_stats(datas, time, max_evidence)
    kinds = {d.name: ("dates" if st["is_dt"] else "numbers") for d, st in zip(datas, stats)}
    if len(set(kinds.values())) > 1:
        # Nanoseconds since 1970 against e.g. epoch seconds or day numbers: any comparison would be meaningless.
        raise DataError(f"time column {time!r} holds dates in some splits and plain numbers in others "
                        f"({', '.join(f'{k}: {v}' for k, v in kinds.items())})",
                        "give every split the same kind of time column: convert numbers with pd.to_datetime(..., unit='s') "
                        "(or the unit they are in), or use numbers everywhere")
    is_dt = all(st["is_dt"] for st in stats)
    ranges = []
    for d, st in zip(datas, stats):
        ranges.append({"split": d.name, "rows": d.n, "start": _fmt_time(st["min"], is_dt),
                       "end": _fmt_time(st["max"], is_dt), "missing_times": int(d.n - st["finite"])})
    metrics: dict[str, Any] = {"overlap_rows": 0, "overlap_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows, evidence = [], []
    compared = 0
    index = {d.name: i for i, d in enumerate(datas)}
    random_pairs = []
    ends = [st["max"] for st in stats]
    befores = _rows_before(datas, stats, ends, max_evidence)
    for later, earlier in _pairs(datas):
        li, ei = index[later.name], index[earlier.name]
        if stats[ei]["finite"] == 0:
            continue
        end = ends[ei]
        rows, cand_t, cand_pos = befores[li][ei]
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
            evidence.append(pd.DataFrame({"split": later.name, "row": later.row_id[cand_pos[:room]],
                                          "time": [_fmt_time(v, is_dt) for v in cand_t[:room]], "earlier_split": earlier.name,
                                          "earlier_end": _fmt_time(end, is_dt)}))
    metrics["overlap_fraction"] = metrics["overlap_rows"] / compared if compared else 0.0
    metrics["pattern"] = "random split of time-ordered data" if random_pairs else ("partial overlap" if metrics["overlap_rows"] else "time-ordered")
    tables = {"ranges": pd.DataFrame(ranges), "pairs": pd.DataFrame(pair_rows)}
    if evidence:
        tables["rows_before_end"] = pd.concat(evidence, ignore_index=True)
    # Histograms on one grid for the timeline plot.
    series: dict[str, Any] = {}
    finite = [st for st in stats if st["finite"]]
    if finite:
        lo, hi = min(st["min"] for st in finite), max(st["max"] for st in finite)
        edges = np.linspace(lo, hi if hi > lo else lo + 1, 61)
        series["time_edges"] = edges
        for d, counts in zip(datas, _time_histograms(datas, stats, edges)):
            series[f"time_counts:{d.name}"] = counts
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
