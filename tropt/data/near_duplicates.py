"""``data.near_duplicates``: rows/samples of a later split nearly identical (cosine) to one in an earlier split.

The search itself (vectors, exact or index search, MinHash LSH for text, image hashes, the calibrated threshold)
is :mod:`tropt.data.near_search`; this module decides whether and how to search, and judges what it found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Status
from . import neighbours as nb
from ._common import MAX_EVIDENCE, _load, _pairs, _pct, _skip
from .feature_space import judge_chance, space_words
from .near_search import NearDuplicateOptions, NearSearch, SearchPlan, _index_bytes

__all__ = ["NearDuplicateOptions", "check_near_duplicates"]


def _fmt_sim(x: float) -> str:
    """A similarity with enough digits to show its distance from 1 (0.9999966 is not '1.0000')."""
    digits = max(4, int(np.ceil(-np.log10(max(1.0 - x, 1e-12)))) + 2)
    return f"{x:.{digits}f}"


def _shape_text(d: Any) -> str:
    return "×".join(map(str, d.image_shape)) if d.image_shape is not None else f"{d.numeric.shape[1]} values"


def _shape_mismatch(cid: str, datas: list) -> CheckResult:
    """Splits whose samples differ in shape: evaluation data not prepared like training data (this check's finding;
    the others compare labels or fingerprints and need not repeat it). Images of different sizes are a FAIL (a
    resize or crop applied to one split only); other samples (sequences of another length) a WARN."""
    first = datas[0]
    odd = [d for d in datas[1:] if _shape_text(d) != _shape_text(first)]
    images = all(d.image_shape is not None for d in [first, *odd])
    what = "images" if images else "samples"
    table = pd.DataFrame([{"split": d.name, "sample_shape": _shape_text(d), "values": int(d.numeric.shape[1]),
                           "same_as_first": _shape_text(d) == _shape_text(first)} for d in datas])
    summary = (f"{what} of {first.name!r} are {_shape_text(first)} but "
               + ", ".join(f"{d.name!r} {what} are {_shape_text(d)}" for d in odd)
               + ": the splits are not prepared alike (a resize, crop or padding applied to one split only), so the "
                 "model is evaluated on inputs unlike those it trains on; "
                 "near duplicates cannot be compared across them")
    advice = [f"Give every split the same preprocessing as {first.name!r} (the same resize/crop, e.g. "
              f"transforms.Resize and CenterCrop to {_shape_text(first)}, or the same padding length) and rerun."]
    metrics = {"shape_mismatch": True, **{f"sample_shape.{d.name}": _shape_text(d) for d in datas}}
    return CheckResult(cid, Status.FAIL if images else Status.WARN, summary, metrics, {"sample_shapes": table}, advice)


def _gate(splits: Mapping[str, Any], o: NearDuplicateOptions) -> CheckResult | None:
    """A SKIP when disabled, or (``enabled="auto"``) when a large table's index would hold too much; bad options
    raise."""
    cid = "data.near_duplicates"
    if o.enabled is False:
        return _skip(cid, "near-duplicate search disabled (near_duplicates=False)")
    if o.enabled not in ("auto", True):
        raise DataError(f"near_duplicates={o.enabled!r} is not 'auto', True or False", "pass 'auto', True or False")
    if o.search not in ("auto", "exact", "index"):
        raise DataError(f"search={o.search!r} is not 'auto', 'exact' or 'index'", "pass one of those")
    if o.enabled == "auto":  # decide on memory before asking for the numeric matrix (a large table's biggest cost)
        sized = _load(splits, o.label, o.group, o.time, o.features, o.progress)
        need = _index_bytes(sized)
        if sized[0].tabular and sum(d.n for d in sized) > o.max_auto_rows and need > o.max_auto_index_bytes:
            return _skip(cid, f"table of {sum(d.n for d in sized):,} rows: the approximate index would hold "
                              f"~{need / 1e9:.1f} GB of vectors (automatic limit "
                              f"{o.max_auto_index_bytes / 1e9:.1f} GB); pass near_duplicates=True to run it")
    return None


def _plan(datas: list, o: NearDuplicateOptions) -> SearchPlan | CheckResult:
    """How to compare the splits, or the SKIP / shape-mismatch result when they cannot be compared."""
    cid = "data.near_duplicates"
    tabular = datas[0].tabular
    use_text = tabular and all(d.text_norm is not None for d in datas)
    total = sum(d.n for d in datas)
    missing = [d for d in datas if d.numeric is None]
    if missing and not use_text:
        return _skip(cid, f"no vectors to compare in split {missing[0].name!r}: "
                          f"{missing[0].numeric_note or 'not numeric'}"
                          + (" and no free-text columns" if tabular else ""))
    dims = {d.numeric.shape[1] for d in datas} if not missing else set()
    layouts = {d.image_shape for d in datas}
    if len(dims) > 1 or (not missing and None not in layouts and len(layouts) > 1):  # 3x8x8 vs 3x9x9, or 8x8x3
        return _shape_mismatch(cid, datas)
    num_dim = dims.pop() if dims else 0
    # Numeric-only tables need 3 columns (fewer cannot tell rows apart); beside free text any numeric column counts,
    # else rows with the same text and different numbers would score 1.0.
    use_numeric = bool(num_dim) and (use_text or not (tabular and num_dim < 3))
    if not use_numeric and not use_text:
        return _skip(cid, f"only {num_dim} numeric feature column(s): "
                          "cosine similarity cannot tell rows apart in so few dimensions")
    dev = nb.pick_device(o.device)
    num_vec_dim = num_dim + (1 if tabular else 0)
    cost = sum(a.n * b.n * (num_vec_dim + nb.TEXT_DIM * use_text) for a, b in _pairs(datas))
    budget = o.max_auto_cost * (50 if dev.startswith("cuda") else 1)
    big = total > o.max_auto_rows or cost > budget
    use_index = o.search == "index" or (o.search == "auto" and big)
    if use_text and not use_index and any(d.text is None for d in datas):
        use_index = True  # text too long to vectorise (limits.TEXT_MAX_ROWS): only MinHash LSH can compare it
    text_lsh = use_text and use_index  # free text by MinHash LSH, not by trigram vectors
    dim = (num_dim if use_numeric else 0) + (nb.TEXT_DIM if use_text and not text_lsh else 0)
    vec_dim = dim + (1 if use_numeric and tabular else 0)  # the vectors compared (tables: + the constant component)
    return SearchPlan(tabular, use_text, use_numeric, num_dim, dev, use_index, text_lsh, dim, vec_dim, big, total)


def _words(s: NearSearch, datas: list) -> tuple[str, list[str]]:
    """The summary and advice for what the search found."""
    plan, metrics, pair_rows = s.plan, s.metrics, s.pair_rows
    leaked = metrics["leaked_rows"]
    what = "samples" if not plan.tabular else "rows"
    if leaked:
        wp = max(pair_rows, key=lambda r: r["fraction"])
        summary = (f"{leaked} {what} of later splits have a near duplicate in an earlier split "
                   f"(worst: {wp['near_duplicates']} "
                   f"of {wp['rows']} {wp['split']} {what}, {_pct(wp['fraction'])}; "
                   f"{wp['of_which_exact']} exact copies)")
        advice = [f"Remove the near-duplicate {what} listed in 'near_duplicates' from the later split, "
                  "or group near copies "
                  "(same source, augmentations, re-encodings) and split by that group.",
                  "If these are legitimately similar but distinct samples, raise threshold= (the similarity cut-off)."]
        return summary, advice
    text = f"; text columns {metrics['text_columns']} compared as normalised text" if plan.use_text else ""
    if plan.text_lsh:
        numbers = f" and {plan.num_dim} numeric columns" if plan.use_numeric else ""
        summary = (f"no near duplicates across splits (text columns {metrics['text_columns']}{numbers}; shingle "
                   f"Jaccard threshold {metrics['threshold']:.2f})")
    else:
        summary = (f"no near duplicates across splits (similarity threshold {_fmt_sim(metrics['threshold'])}, "
                   f"{plan.dim} dimensions{text})")
    return summary, []


def _judged(splits: Mapping[str, Any], datas: list, s: NearSearch, o: NearDuplicateOptions, summary: str,
            advice: list[str]) -> tuple[float, str, list[str]]:
    """The pair fraction the verdict rests on: exact copies in a feature space too small to judge are chance (the
    same rule as data.exact_duplicates, near rows included), so only the other near duplicates count then."""
    metrics, pair_rows = s.metrics, s.pair_rows
    worst = metrics["max_pair_fraction"]
    if not (worst > o.max_fraction and s.plan.tabular and any(r["of_which_exact"] for r in pair_rows)):
        return worst, summary, advice
    at = {d.name: i for i, d in enumerate(datas)}
    pairs = [(at[r["split"]], at[r["earlier_split"]]) for r in pair_rows]
    over = [p for p, r in zip(pairs, pair_rows) if r["of_which_exact"] and r["fraction"] > o.max_fraction]
    judged = judge_chance(splits, o.label, o.group, o.time, o.features, o.progress, datas, o.small_space, over)
    assert judged is not None  # measured for a tabular split
    chance = [judged.of(p) for p in pairs]
    metrics["small_feature_space"] = any(chance)
    if not any(chance):
        return worst, summary, advice
    judged_frac = max(((r["near_duplicates"] - r["of_which_exact"]) if c else r["near_duplicates"]) / r["rows"]
                      for r, c in zip(pair_rows, chance))
    metrics["max_pair_fraction_not_exact"] = judged_frac
    excused = sum(r["of_which_exact"] for r, c in zip(pair_rows, chance) if c)
    summary = (f"feature space too small to judge exact copies ({space_words(judged.space)} for "
               f"{sum(d.n for d in datas)} rows): the {excused} exact copies "
               f"among the near duplicates are expected by chance; " + summary)
    advice = ["Exact copies cannot show leakage here: check it by the entity instead (pass group= with the "
              "user/patient/session id)."] + (advice if judged_frac > 0 else [])
    return judged_frac, summary, advice


@register("data.near_duplicates", title="Near duplicates across splits",
          description="rows/samples of a later split nearly identical (cosine) to one in an earlier split",
          needs="splits",
          plot="tropt.plots.data")
def check_near_duplicates(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                          enabled: bool | str = "auto", threshold: float | None = None, calibration: float = 0.05,
                          min_similarity: float = 0.95, phash_max_distance: int = 10,
                          hash_calibration: float = 0.1, hash_confirm: float = 0.3, max_fraction: float = 0.01,
                          small_space: float = 10.0,
                          max_auto_rows: int = 200_000, max_auto_cost: float = 2e11, device: str | None = None,
                          search: str = "auto", min_jaccard: float = 0.5, recall_sample: int = 1000,
                          min_recall: float = 0.95, max_auto_index_bytes: float = 2e9,
                          max_evidence: int = MAX_EVIDENCE, progress: bool = True) -> CheckResult:
    """Exact cosine nearest neighbour of every later-split row among each earlier split's rows.

    Vectors are the numeric features (tables: standardised with the first split's finite mean/std, plus a constant
    component of 1 so that magnitude counts, not only direction; tensors: centred), L2-normalised; the similarity of
    each nearest pair is recomputed in float64 from the distance, so cut-offs within 1e-7 of 1 are resolved. A
    table's free-text columns (strings with mostly distinct values, or long multi-word ones with
    many different values; low-cardinality strings are categories and are not compared) add a block of hashed
    character trigrams of the row's text, lower-cased with punctuation and spacing collapsed (so copies that differ
    only in case, spacing or punctuation match exactly); with both blocks the similarity is their average, and a
    table needs 3 numeric columns or free text (beside free text, every numeric column is compared). A pair is a
    near duplicate when its similarity is at least ``threshold``, by default
    ``max(min_similarity, cos(calibration * median nearest-neighbour angle))``, the angle measured among the earlier
    split's own rows (a later split made mostly of copies cannot move it): far closer than rows typically are.
    Images additionally get a 16x16 average hash; a Hamming distance up to the hash threshold also counts:
    ``min(phash_max_distance, floor(hash_calibration * median))``, the median being the earlier split's own hashes'
    distance to their nearest other hash (exact copies aside). Small or simple images (upscaled 8x8 digits) hash
    alike even when unrelated (median 13 of 256 bits), so a fixed 10 would flag a third of a healthy split. A hash
    match alone is too coarse to decide on small images (different handwriting of one digit on 8x8 images hashes
    identically), so it must be confirmed: the per-sample correlation of the pair's 16x16 grayscale thumbnails (what
    the hash thresholds, each minus its own mean: blind to brightness and contrast, like the hash) must reach
    ``max(min_similarity, cos(hash_confirm * median nearest-neighbour angle))`` of those vectors among the earlier
    split's own samples.
    Exact copies in a table whose feature space is too small to judge (see data.exact_duplicates, ``small_space``)
    happen by chance: they are counted and listed, but only the other near duplicates can make a FAIL.
    ``enabled="auto"`` runs it (tables above ``max_auto_rows`` rows only while the index would hold at most
    ``max_auto_index_bytes`` of vectors: 2 GB, ~33M rows x 4 columns or ~2.5M rows x 64), ``True`` runs it at any
    size, ``False`` skips. ``search="auto"`` searches exactly up to
    ``max_auto_rows`` rows and an estimated ``max_auto_cost`` multiply-adds (x50 on a GPU) and above that with an
    approximate index, and says so (``metrics["method"]``): FAISS IVF-Flat on the same vectors, the threshold
    calibrated as for exact search, its recall at the threshold measured against exact brute force on
    up to ``recall_sample`` sampled later rows (fewer on large tables, at least 256: the cost of each sampled exact
    search is capped) plus 2,000 probes (earlier rows moved to exactly the threshold), a
    recall below ``min_recall`` said in the summary; free text by MinHash LSH over 5-character shingles of the
    normalised text, every candidate verified by its exact shingle Jaccard (a near duplicate from ``min_jaccard``);
    average hashes in a FAISS multi-index binary hash table. ``search="exact"`` or ``"index"`` forces one. The index
    needs the ``tropt[ann]`` extra (faiss-cpu, datasketch).
    """
    o = NearDuplicateOptions(
        label=label, group=group, time=time, features=features, enabled=enabled, threshold=threshold,
        calibration=calibration, min_similarity=min_similarity, phash_max_distance=phash_max_distance,
        hash_calibration=hash_calibration, hash_confirm=hash_confirm, max_fraction=max_fraction,
        small_space=small_space, max_auto_rows=max_auto_rows, max_auto_cost=max_auto_cost, device=device, search=search,
        min_jaccard=min_jaccard, recall_sample=recall_sample, min_recall=min_recall,
        max_auto_index_bytes=max_auto_index_bytes, max_evidence=max_evidence, progress=progress)
    skipped = _gate(splits, o)
    if skipped is not None:
        return skipped
    datas = _load(splits, label, group, time, features, progress, needs={"numeric"})
    plan = _plan(datas, o)
    if isinstance(plan, CheckResult):
        return plan
    finder = NearSearch(datas, plan, o)
    for later, earlier in _pairs(datas):
        finder.pair(later, earlier)
    tables, series = finder.tables_and_series()
    summary, advice = _words(finder, datas)
    judged, summary, advice = _judged(splits, datas, finder, o, summary, advice)
    metrics = finder.metrics
    if plan.use_index:
        summary, advice = _say_index(metrics, finder.methods, finder.recalls, plan.big, plan.total, max_auto_rows,
                                     min_recall, summary, advice)
    status = Status.FAIL if judged > max_fraction else Status.WARN if metrics["leaked_rows"] else Status.PASS
    return CheckResult("data.near_duplicates", status, summary, metrics, tables, advice, series)


def _say_index(metrics: dict, methods: dict, recalls: list, big: bool, total: int, max_auto_rows: int,
               min_recall: float, summary: str, advice: list) -> tuple[str, list]:
    """Record how the index searched and say it in the summary; a low recall also in the advice."""
    metrics["method"] = "; ".join(methods.values())
    why = (f"{total:,} rows, above the exact-search limit of {max_auto_rows:,}" if total > max_auto_rows
           else "exact search above its cost limit (max_auto_cost)" if big else "search='index'")
    said = f"; searched with an approximate index ({why}): {metrics['method']}"
    if recalls:
        metrics["recall"] = float(min(recalls))
        said += f", recall {metrics['recall']:.3f} at the threshold against exact search on a sample"
        if metrics["recall"] < min_recall:
            said += f" — LOW RECALL (< {min_recall}): near duplicates may be missed"
            advice = [*advice, f"The index's recall ({metrics['recall']:.3f}) is below {min_recall}: rerun with "
                               "search='exact' (device='cuda' helps) to search every pair."]
    if "lsh_recall_at_threshold" in metrics:
        said += (f", texts paired from Jaccard {metrics['threshold']:.2f} with probability "
                 f"{metrics['lsh_recall_at_threshold']:.3f}, every pair verified exactly")
    return summary + said, advice
