"""``data.label_sanity``: labels a loss function cannot use, or that cannot teach anything."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..registry import register
from ..result import CheckResult, Status
from ._common import MAX_EVIDENCE, _labels, _load, _skip, infer_task
from .columns import is_numeric, numeric_values
from .split_data import SplitData


class _Problems:
    """The problems found, each with its rows (the first ``max_evidence`` of them kept as evidence)."""

    def __init__(self, max_evidence: int) -> None:
        self.max_evidence = max_evidence
        self.problems: list[dict] = []
        self.bad_rows: list[dict] = []
        self.fail = self.warn = False

    def note(self, split: SplitData, problem: str, mask: np.ndarray | None, severe: bool, values: pd.Series) -> None:
        rows = int(mask.sum()) if mask is not None else split.n
        ex = values[mask].head(3).tolist() if mask is not None else values.head(1).tolist()
        self.problems.append({"split": split.name, "problem": problem, "rows": rows,
                              "examples": ", ".join(map(str, ex)), "severity": "fail" if severe else "warn"})
        self.fail |= severe
        self.warn |= not severe
        if mask is not None and len(self.bad_rows) < self.max_evidence:
            idx = np.flatnonzero(mask)[: self.max_evidence - len(self.bad_rows)]
            for i in idx:
                self.bad_rows.append({"split": split.name, "row": split.row_id[i], "label": values.iloc[i],
                                      "problem": problem})


def _split_problems(found: _Problems, d: SplitData, s: pd.Series, first: bool, task: str,
                    num_classes: int | None) -> np.ndarray | None:
    """Note one split's label problems; for numeric class labels, return its valid class ids (else None)."""
    s = s.reset_index(drop=True)
    ids = None
    na = s.isna().to_numpy()
    if na.any():
        found.note(d, "missing label (NaN/None)", na, True, s)
    num = is_numeric(s)
    v = numeric_values(s) if num else None
    if num:
        assert v is not None  # numeric_values(s) when num
        inf = np.isinf(v)
        if inf.any():
            found.note(d, "infinite label", inf, True, s)
    if task == "classification" and num:
        assert v is not None
        fin = np.isfinite(v)
        nonint = fin & (v != np.round(v))
        if nonint.any():
            found.note(d, "non-integer class id", nonint, True, s)
        neg = fin & (v < 0)
        if neg.any():
            ignore = " (-100 is CrossEntropyLoss's ignore_index: intended?)" if np.all(v[neg] == -100) else ""
            found.note(d, "negative class id" + ignore, neg, True, s)
        if num_classes is not None:
            big = fin & (v >= num_classes)
            if big.any():
                found.note(d, f"class id >= num_classes ({num_classes})", big, True, s)
        ids = np.unique(v[fin & ~nonint & ~neg])
    nunique = s.nunique(dropna=True)
    if nunique <= 1 and d.n > 1:
        found.note(d, "constant label" if nunique == 1 else "no label values", None, first, s.dropna())
    return ids


def _id_gaps(found: _Problems, all_ids: list[np.ndarray]) -> int:
    """Missing class ids in 0..max id over all splits (noted as a warning), when ``num_classes`` was not given."""
    ids = np.unique(np.concatenate(all_ids)) if all_ids else np.empty(0)
    if not (ids.size and ids.max() + 1 > ids.size):
        return 0
    gaps = int(ids.max() + 1 - ids.size)
    found.problems.append({"split": "all", "problem": f"class ids have {gaps} gap(s) in 0..{int(ids.max())}", "rows": 0,
                           "examples": ", ".join(str(int(x))
                                                 for x in np.setdiff1d(np.arange(int(ids.max()) + 1), ids)[:5]),
                           "severity": "warn"})
    found.warn = True
    return gaps


def _advice(problems: list[dict], gaps: int) -> list[str]:
    advice = []
    kinds = {p["problem"].split(" (")[0] for p in problems}
    if any(k.startswith(("missing label", "infinite label")) for k in kinds):
        advice.append("Drop or fix the rows with missing/infinite labels (listed in 'bad_rows') before training.")
    if any(k.startswith(("non-integer", "negative", "class id >=")) for k in kinds):
        advice.append("Map labels to integer class ids 0..num_classes-1 "
                      "(e.g. pd.factorize or sklearn LabelEncoder) and set the "
                      "output layer to num_classes units.")
    if "constant label" in kinds:
        advice.append("A constant label teaches nothing: check the label column and how the split was made.")
    if gaps:
        advice.append("Re-index the class ids contiguously, or confirm the missing ids are real classes "
                      "(the model needs max id + 1 outputs).")
    return advice


@register("data.label_sanity", title="Label sanity",
          description="missing/inf labels, non-integer or negative class ids, ids outside [0, num_classes), "
                      "constant labels", needs="splits")
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
    assert labels is not None  # checked just above
    task = infer_task(labels, task, num_classes)
    found = _Problems(max_evidence)
    all_ids = []
    for i, (d, s) in enumerate(zip(datas, labels)):
        ids = _split_problems(found, d, s, i == 0, task, num_classes)
        if ids is not None:
            all_ids.append(ids)
    gaps = 0
    if task == "classification" and all_ids and num_classes is None:
        gaps = _id_gaps(found, all_ids)
    problems = found.problems
    metrics = {"task": task, "problems": len(problems),
               "bad_rows": sum(p["rows"] for p in problems
                               if p["problem"] != "constant label" and p["split"] != "all"),
               "class_id_gaps": gaps}
    if num_classes is not None:
        metrics["num_classes"] = num_classes
    tables: dict[str, pd.DataFrame] = {}
    if problems:
        tables["problems"] = pd.DataFrame(problems)
    if found.bad_rows:
        tables["bad_rows"] = pd.DataFrame(found.bad_rows)
    if problems:
        summary = "; ".join(f"{p['split']}: {p['problem']}" + (f" ({p['rows']} rows)" if p["rows"] else "")
                            for p in problems[:4])
        if len(problems) > 4:
            summary += f"; and {len(problems) - 4} more"
    else:
        summary = f"labels are valid {task} targets in every split"
    status = Status.FAIL if found.fail else Status.WARN if found.warn else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, _advice(problems, gaps))
