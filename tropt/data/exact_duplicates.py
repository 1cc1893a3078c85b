"""``data.exact_duplicates``: rows of a later split with an exact copy (same features) in an earlier split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..registry import register
from ..result import CheckResult, Status
from ._common import MAX_EVIDENCE, _label_kind, _labels, _load, _pct, _pkey
from .exact_join import exact_join
from .feature_space import Chance, judge_chance, refutation_words, space_words


def _exact_stats(datas: list, labels: list | None, max_evidence: int) -> dict:
    """The exact-copy join of the splits' fingerprints (:func:`exact_join`). A Dask split's fingerprints were
    gathered by its scan (8 bytes a row), so the join runs here for every kind of split: it is one sort, and cutting
    it into buckets joined on the workers moved every fingerprint again, which took longer than the join (#22)."""
    kind = _label_kind(labels, [d.name for d in datas]) if labels is not None else None
    return exact_join([d.fp for d in datas], labels, kind, max_evidence)


def _leaks(datas: list, stats: dict, max_evidence: int) -> tuple[dict, list, list]:
    """(metrics, pair rows, evidence) of the copies of every (later, earlier) pair of splits."""
    metrics: dict[str, Any] = {"leaked_rows": 0, "leaked_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows: list[dict] = []
    evidence: list[pd.DataFrame] = []
    compared = 0
    for (li, ei), (count, later_pos, earlier_pos, fps) in stats["pairs"].items():
        later, earlier = datas[li], datas[ei]
        frac = count / later.n
        compared += later.n
        metrics["leaked_rows"] += count
        metrics[f"leaked_rows.{_pkey(later, earlier)}"] = count
        metrics[f"leaked_fraction.{_pkey(later, earlier)}"] = frac
        metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n, "leaked_rows": count,
                          "leaked_fraction": frac})
        room = max_evidence - len(evidence)
        if room > 0 and count:
            take, match = later_pos[:room], earlier_pos[:room]
            ev = pd.DataFrame({"split": later.name, "row": later.row_id[take], "earlier_split": earlier.name,
                               "earlier_row": earlier.row_id[match],
                               "fingerprint": [f"{v:016x}" for v in fps[:room]]})
            if later.label is not None and earlier.label is not None:
                ev["label"] = later.label.to_numpy()[take]
                ev["earlier_label"] = earlier.label.to_numpy()[match]
            evidence.append(ev)
            evidence = [pd.concat(evidence, ignore_index=True)]
    metrics["leaked_fraction"] = metrics["leaked_rows"] / compared if compared else 0.0
    return metrics, pair_rows, evidence


def _conflicts(datas: list, labels: list | None, stats: dict) -> pd.DataFrame | None:
    """The rows whose features are the same while their labels differ (anywhere in the splits), or None."""
    if not stats["conflict_rows"]:
        return None
    assert labels is not None  # conflicts are only counted with labels
    sid, pos, fps = stats["conflict_evidence"]
    return pd.DataFrame({
        "split": [datas[s].name for s in sid],
        "row": [datas[s].row_id[p] for s, p in zip(sid, pos)],
        "label": [labels[s].iloc[p] for s, p in zip(sid, pos)],
        "fingerprint": [f"{v:016x}" for v in fps],
    }).sort_values(["fingerprint", "split"], kind="stable").reset_index(drop=True)


def _words(datas: list, stats: dict, metrics: dict, pair_rows: list, chance: bool, judged: Chance | None,
           group: Any) -> tuple[str, list[str]]:
    """The summary and advice for the copies found (chance copies in a feature space too small to judge)."""
    leaked, conflicting, within_total = metrics["leaked_rows"], stats["conflicting"], metrics["duplicates_within"]
    advice = []
    if leaked and chance:
        assert judged is not None  # chance comes with the feature space it was judged by
        space = judged.space
        # Few possible feature vectors for the rows: copies across splits are what chance gives (rows repeat within
        # each split too), so they say nothing about leakage. Not FAIL; the numbers and the evidence stay.
        worst_pair = max(pair_rows, key=lambda r: r["leaked_fraction"])
        wl = worst_pair["split"]
        summary = (f"feature space too small to judge exact copies: {space_words(space)} ({stats['distinct']} distinct "
                   f"vectors) for "
                   f"{sum(d.n for d in datas)} rows, so {worst_pair['leaked_rows']} of {worst_pair['rows']} {wl} rows "
                   f"matching {worst_pair['earlier_split']} ({_pct(worst_pair['leaked_fraction'])}) "
                   "is expected by chance; "
                   f"{_pct(metrics[f'within_repeat_rate.{wl}'])} of {wl} rows repeat within {wl} too")
        advice.append("Exact copies cannot show leakage here: check it by the entity instead (pass group= with the "
                      "user/patient/session id), or include the columns that identify a record in features=.")
    elif leaked:
        worst_pair = max(pair_rows, key=lambda r: r["leaked_fraction"])
        advice.append(f"Drop the {leaked} leaked rows from the later splits (listed in 'leaked_rows'), or de-duplicate "
                      "the data before splitting so every copy lands in one split.")
        if group is None:
            advice.append("If copies come from one entity (user, patient, document), "
                          "re-split by that id and pass group= to check it.")
        summary = (f"{leaked} row(s) of later splits have an exact copy in an earlier split "
                   f"(worst: {worst_pair['leaked_rows']} of {worst_pair['rows']} {worst_pair['split']} rows in "
                   f"{worst_pair['earlier_split']}, {_pct(worst_pair['leaked_fraction'])})")
        summary += _refuted_words(datas, judged)
    else:
        summary = ("no row of a later split has an exact copy in an earlier split "
                   f"({', '.join(f'{d.name}: {d.n}' for d in datas)} rows)")
    if conflicting:
        summary += f"; {conflicting} feature vector(s) appear with different labels ({stats['conflict_rows']} rows)"
        advice.append("Review the rows with identical features but different labels ('conflicting_labels'): "
                      "fix the labels or drop them.")
    if within_total:
        summary += f"; {within_total} duplicate row(s) within splits"
    return summary, advice


def _refuted_words(datas: list, judged: Chance | None) -> str:
    """Why the copies are not chance although the repeated rows alone make the feature space look small ('' when
    the space did not look small)."""
    if judged is None or not judged.small:
        return ""
    refuted = [(pair, nb) for pair, nb in judged.pairs.items() if nb["refuted"]]
    if not refuted:
        return ""
    (li, ei), nb = max(refuted, key=lambda r: r[1]["exact_rate"])
    return (f"; the repeated rows alone suggest a small feature space ({space_words(judged.space)}), but "
            + refutation_words(nb, datas[li].name, datas[ei].name))


def _judge(splits: Mapping[str, Any], datas: list, stats: dict, metrics: dict, opts: tuple[Any, Any, Any, Any, bool],
           max_fraction: float, small_space: float) -> tuple[bool, Chance | None]:
    """(whether every pair above ``max_fraction`` is chance in a feature space too small to judge, the judgement);
    the feature space and each judged pair's near rows go into ``metrics``."""
    over = [(li, ei) for (li, ei), (count, *_rest) in stats["pairs"].items() if count / datas[li].n > max_fraction]
    if not over or not datas[0].tabular:
        return False, None
    judged = judge_chance(splits, *opts, datas, small_space, over)
    assert judged is not None  # measured for a tabular split
    judged.record(metrics, datas)
    for d, distinct, repeat in zip(datas, stats["split_distinct"], stats["repeat_rows"]):
        metrics[f"distinct_vectors.{d.name}"] = distinct
        metrics[f"within_repeat_rate.{d.name}"] = repeat / d.n  # rows sharing their vector within the split
    return all(judged.of(pair) for pair in over), judged


@register("data.exact_duplicates", title="Exact duplicates across splits",
          description="rows of a later split with an exact copy (same features) in an earlier split", needs="splits",
          plot="tropt.plots.data")
def check_exact_duplicates(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                           max_fraction: float = 0.01, small_space: float = 10.0, max_evidence: int = MAX_EVIDENCE,
                           progress: bool = True) -> CheckResult:
    """Find rows of later splits whose features exactly match a row of an earlier split.

    Fingerprints are canonical (-0.0 == 0.0, NaN == NaN, column order and index ignored) and cover the feature
    columns only: every column except ``label``, ``group`` and ``time`` unless ``features=`` lists them.
    WARN for any leaked row (or conflicting labels), FAIL when more than ``max_fraction`` of a later split leaked,
    except in a feature space too small to judge: when a table's feature columns can take at most ``small_space``
    times as many value combinations as there are rows (4 five-point answers: 625), rows coincide by chance
    across and within splits, and the copies are a WARN with the distinct counts and within-split repeat rates.
    The bound is the product of the columns' distinct counts or, for discrete columns, the number of vectors the
    earliest split's repeating rows imply (one-hot columns are dependent: 20 of them may hold 1,296 answers).
    Rows copied before a random split repeat too, and make that bound small, so chance must also show in rows the
    copies cannot make: in a small space, later rows with an earlier row differing in a few columns (the space's
    step, at least 2) are at least as common as later rows with an exact copy
    (:func:`tropt.data.feature_space.neighbourhood`, on the splits' row samples). When rows matched only exactly
    outnumber rows matched only nearly beyond a sign test (digits with 5%, 10% or all of its rows copied: under 1%
    near), the copies are not chance and FAIL as above.
    """
    cid = "data.exact_duplicates"
    datas = _load(splits, label, group, time, features, progress)
    labels = _labels(datas, label)
    stats = _exact_stats(datas, labels, max_evidence)
    metrics, pair_rows, evidence = _leaks(datas, stats, max_evidence)
    for d, within in zip(datas, stats["within"]):
        metrics[f"duplicates_within.{d.name}"] = within
    metrics["duplicates_within"] = sum(stats["within"])
    metrics["distinct_vectors"] = stats["distinct"]
    # Same features, different labels (anywhere in the splits): label noise or a feature set too poor to decide.
    conflict_table = _conflicts(datas, labels, stats)
    metrics["conflicting_labels"] = stats["conflicting"]
    metrics["conflicting_label_rows"] = stats["conflict_rows"]
    metrics["feature_columns"] = len(datas[0].feature_columns) if datas[0].tabular and datas[0].feature_columns else 0
    tables = {"pairs": pd.DataFrame(pair_rows)}
    if evidence:
        tables["leaked_rows"] = evidence[0]
    if conflict_table is not None:
        tables["conflicting_labels"] = conflict_table
    leaked, worst = metrics["leaked_rows"], metrics["max_pair_fraction"]
    chance, judged = _judge(splits, datas, stats, metrics, (label, group, time, features, progress), max_fraction,
                            small_space)
    metrics["small_feature_space"] = bool(chance)
    summary, advice = _words(datas, stats, metrics, pair_rows, chance, judged, group)
    status = (Status.FAIL if worst > max_fraction and not chance
              else Status.WARN if leaked or stats["conflicting"] else Status.PASS)
    return CheckResult(cid, status, summary, metrics, tables, advice)
