"""``data.class_coverage``: classes missing from a split, and classes below a minimum count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..registry import register
from ..result import CheckResult, Status
from ._common import _counts_table, _labels, _load, _skip, infer_task, regression_reason


@register("data.class_coverage", title="Class coverage",
          description="classes missing from a split, and classes below a minimum count", needs="splits",
          plot="tropt.plots.data")
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
    assert labels is not None  # checked just above
    if infer_task(labels, task) != "classification":
        return _skip(cid, f"{label!r} looks like a regression target ({regression_reason(labels, task)}): "
                          "class coverage "
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
        advice.append(f"Re-split with stratification on the label so {first!r} holds every class, "
                      "or remove those classes from the later splits.")
        status = Status.FAIL
    elif missing or rare:
        bits = []
        if missing:
            bits.append(f"{metrics['missing_in_later']} class(es) of {first!r} missing from a later split")
        if rare:
            bits.append(f"{metrics['rare_classes']} class(es) with fewer than {min_count} rows in some split")
        summary = "; ".join(bits)
        advice.append("Stratify the split on the label so every class is represented; "
                      "merge or drop classes too rare to learn or evaluate.")
        status = Status.WARN
    else:
        summary = f"all {len(counts)} classes appear in every split with at least {min_count} rows"
        status = Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)
