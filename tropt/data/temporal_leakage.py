"""``data.temporal_leakage``: rows of a later split dated before the end of an earlier split.

A split's time column is reduced where it is held: in memory, or per partition on the Dask workers
(:mod:`tropt.data.dask_splits`); both run the same summaries (:mod:`tropt.data.times`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Status
from . import dask_splits
from ._common import MAX_EVIDENCE, _load, _pairs, _pct, _pkey, _skip
from .times import rows_before, time_summary, time_values


def temporal_stats(datas: list, time: Any, max_evidence: int) -> list[dict]:
    """Each split's time summary; splits whose time column stayed on the Dask workers are summarised there."""
    out = []
    for d in datas:
        if d.time is None and d.dask_parts is not None and d.dask_parts.get("time") is not None:
            out.append(dask_splits.distributed_time_summary(d, time))
        else:
            t, is_dt = time_values(d.time, d.name, time)
            out.append({**time_summary(t, is_dt), "_t": t})
    return out


def _rows_before(datas: list, stats: list[dict], ends: list, max_evidence: int) -> list:
    """``[later][earlier] -> (rows, first times, first positions)`` of later rows dated before each earlier split's
    end."""
    out = []
    for li, d in enumerate(datas):
        wanted = [ends[ei] if ei < li and stats[ei]["finite"] else None for ei in range(len(datas))]
        if "_t" in stats[li]:
            t = stats[li]["_t"]
            out.append(rows_before(t, np.arange(len(t)), wanted, max_evidence))
        else:
            out.append(dask_splits.distributed_rows_before(d, stats[li], wanted, max_evidence))
    return out


def _time_histograms(datas: list, stats: list[dict], edges: np.ndarray) -> list[np.ndarray]:
    """Each split's counts of finite times on ``edges`` (summed over partitions for a split held on Dask workers)."""
    out = []
    for d, st in zip(datas, stats):
        if "_t" in st:
            t = st["_t"]
            out.append(np.histogram(t[np.isfinite(t)], bins=edges)[0])
        else:
            out.append(dask_splits.distributed_time_histogram(d, edges))
    return out


def _fmt_time(v: float, is_dt: bool) -> Any:
    if not np.isfinite(v):
        return None
    return pd.Timestamp(int(v)) if is_dt else v


def _same_time_kind(datas: list, stats: list[dict], time: Any) -> None:
    """Raise unless every split's time column holds dates, or every one plain numbers."""
    kinds = {d.name: ("dates" if st["is_dt"] else "numbers") for d, st in zip(datas, stats)}
    if len(set(kinds.values())) > 1:
        # Nanoseconds since 1970 against e.g. epoch seconds or day numbers: any comparison would be meaningless.
        raise DataError(f"time column {time!r} holds dates in some splits and plain numbers in others "
                        f"({', '.join(f'{k}: {v}' for k, v in kinds.items())})",
                        "give every split the same kind of time column: "
                        "convert numbers with pd.to_datetime(..., unit='s') "
                        "(or the unit they are in), or use numbers everywhere")


def _overlaps(datas: list, stats: list[dict], is_dt: bool, random_split_fraction: float,
              max_evidence: int) -> tuple[dict, list, list, list]:
    """(metrics, pair rows, evidence frames, pairs that look randomly split) of every (later, earlier) pair."""
    metrics: dict[str, Any] = {"overlap_rows": 0, "overlap_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows: list[dict] = []
    evidence: list[pd.DataFrame] = []
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
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n,
                          "earlier_end": _fmt_time(end, is_dt),
                          "rows_before_end": rows, "fraction": frac})
        room = max_evidence - sum(len(e) for e in evidence)
        if rows and room > 0:
            evidence.append(pd.DataFrame({"split": later.name, "row": later.row_id[cand_pos[:room]],
                                          "time": [_fmt_time(v, is_dt) for v in cand_t[:room]],
                                          "earlier_split": earlier.name,
                                          "earlier_end": _fmt_time(end, is_dt)}))
    metrics["overlap_fraction"] = metrics["overlap_rows"] / compared if compared else 0.0
    metrics["pattern"] = ("random split of time-ordered data" if random_pairs
                          else ("partial overlap" if metrics["overlap_rows"] else "time-ordered"))
    return metrics, pair_rows, evidence, random_pairs


def _timeline(datas: list, stats: list[dict]) -> dict[str, Any]:
    """Histograms of every split's times on one grid, for the timeline plot."""
    series: dict[str, Any] = {}
    finite = [st for st in stats if st["finite"]]
    if finite:
        lo, hi = min(st["min"] for st in finite), max(st["max"] for st in finite)
        edges = np.linspace(lo, hi if hi > lo else lo + 1, 61)
        series["time_edges"] = edges
        for d, counts in zip(datas, _time_histograms(datas, stats, edges)):
            series[f"time_counts:{d.name}"] = counts
    return series


@register("data.temporal_leakage", title="Temporal leakage",
          description="rows of a later split dated before the end of an earlier split", needs="splits",
          plot="tropt.plots.data")
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
    stats = temporal_stats(datas, time, max_evidence)
    _same_time_kind(datas, stats, time)
    is_dt = all(st["is_dt"] for st in stats)
    ranges = []
    for d, st in zip(datas, stats):
        ranges.append({"split": d.name, "rows": d.n, "start": _fmt_time(st["min"], is_dt),
                       "end": _fmt_time(st["max"], is_dt), "missing_times": int(d.n - st["finite"])})
    metrics, pair_rows, evidence, random_pairs = _overlaps(datas, stats, is_dt, random_split_fraction, max_evidence)
    tables = {"ranges": pd.DataFrame(ranges), "pairs": pd.DataFrame(pair_rows)}
    if evidence:
        tables["rows_before_end"] = pd.concat(evidence, ignore_index=True)
    series = _timeline(datas, stats)
    rows, worst = metrics["overlap_rows"], metrics["max_pair_fraction"]
    if random_pairs:
        summary = ("the splits look like a random split of time-ordered data: "
                   f"{_pct(worst)} of a later split lies before "
                   f"the end of an earlier one ({', '.join(random_pairs)})")
        advice = [f"Split by time: sort by {time!r} and cut at one date, "
                  "so every later split comes after every earlier one.",
                  "If time order does not matter for this task, drop time= (and say why in the report)."]
    elif rows:
        wp = max(pair_rows, key=lambda r: r["fraction"])
        summary = (f"{rows} row(s) of later splits are dated before the end of an earlier split "
                   f"(worst: {wp['rows_before_end']} "
                   f"of {wp['rows']} {wp['split']} rows before {wp['earlier_end']}, the end of {wp['earlier_split']})")
        advice = [f"Drop the rows listed in 'rows_before_end' from the later split, "
                  f"or re-split at one cut-off date on {time!r}."]
    else:
        summary = "every later split starts after the earlier splits end (time-ordered)"
        advice = []
    status = Status.FAIL if worst > max_fraction else Status.WARN if rows else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)
