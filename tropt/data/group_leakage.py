"""``data.group_leakage``: entity ids (``group=``: user, patient, document) present in more than one split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..registry import register
from ..result import CheckResult, Status
from ._common import MAX_EVIDENCE, _canon_hashes, _load, _pct, _pkey, _skip


@register("data.group_leakage", title="Group (entity) leakage",
          description="entity ids (group=) present in more than one split", needs="splits",
          plot="tropt.plots.data")
def check_group_leakage(splits: Mapping[str, Any], *, group=None, label=None, time=None, features=None,
                        max_fraction: float = 0.01, max_evidence: int = MAX_EVIDENCE,
                        progress: bool = True) -> CheckResult:
    """Entities (``group=`` column: user, patient, document id) that appear in more than one split.

    ``affected_rows`` counts rows of later splits whose group also appears in an earlier split. WARN for any,
    FAIL when more than ``max_fraction`` of a later split is affected.
    """
    cid = "data.group_leakage"
    if group is None:
        return _skip(cid, "no group= column given: "
                          "pass the entity id column (user, patient, ...) to check for shared entities")
    datas = _load(splits, label, group, time, features, progress)
    names = [d.name for d in datas]
    hashes = _canon_hashes([d.group for d in datas], names)
    uniq_sets = [pd.unique(h) for h in hashes]
    metrics: dict[str, Any] = {"shared_groups": 0, "affected_rows": 0, "affected_fraction": 0.0,
                               "max_pair_fraction": 0.0}
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
                              "shared_groups": shared, "rows": datas[i].n, "affected_rows": rows,
                              "affected_fraction": frac})
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
        value: dict[Any, Any] = {}
        for d, h in zip(datas, hashes):
            m = np.isin(h, shared_h)
            vc = pd.Series(h[m]).value_counts()
            cols[f"rows_in_{d.name}"] = vc
            assert d.group is not None  # group= given (checked at the top)
            first = pd.Series(d.group.to_numpy()[m], index=h[m])
            for k, v in first[~first.index.duplicated()].items():
                value.setdefault(k, v)
        t = pd.DataFrame(cols).reindex(shared_h).fillna(0).astype(np.int64)
        t.insert(0, "group", [value[k] for k in t.index])
        t = t.sort_values(list(t.columns[1:]), ascending=False, kind="stable").head(max_evidence).reset_index(drop=True)
        tables["shared_groups"] = t
    shared, worst = metrics["shared_groups"], metrics["max_pair_fraction"]
    if shared:
        summary = (f"{shared} {group!r} value(s) appear in more than one split; "
                   f"{affected_total} row(s) of later splits "
                   f"({_pct(metrics['affected_fraction'])}) belong to an entity seen earlier")
        advice = [f"Re-split by {group!r} so every entity is in exactly one split "
                  "(e.g. sklearn GroupShuffleSplit / GroupKFold "
                  f"with groups=df[{group!r}]).",
                  "Or drop the affected rows (listed by entity in 'shared_groups') from the later splits."]
    else:
        summary = (f"no {group!r} value is shared between splits "
                   f"({', '.join(f'{d.name}: {len(u)}' for d, u in zip(datas, uniq_sets))} groups)")
        advice = []
    status = Status.FAIL if worst > max_fraction else Status.WARN if shared else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)
