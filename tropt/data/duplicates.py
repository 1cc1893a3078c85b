"""Stage-1 duplicate checks: exact and near copies of a later split's rows in an earlier split."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..errors import DataError
from ..registry import register
from ..result import CheckResult, Status
from ._common import MAX_EVIDENCE, _label_kind, _labels, _load, _pairs, _pct, _pkey, _skip
from .sources import hash_column


# ---------------------------------------------------------------------------------------------------- exact duplicates
@register("data.exact_duplicates", title="Exact duplicates across splits",
          description="rows of a later split with an exact copy (same features) in an earlier split", needs="splits")
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
    """
    cid = "data.exact_duplicates"
    datas = _load(splits, label, group, time, features, progress)
    labels = _labels(datas, label)
    stats = _exact_stats(datas, labels, max_evidence)
    metrics: dict[str, Any] = {"leaked_rows": 0, "leaked_fraction": 0.0, "max_pair_fraction": 0.0}
    pair_rows, evidence = [], []
    compared = 0
    for (li, ei), (count, later_pos, earlier_pos, fps) in stats["pairs"].items():
        later, earlier = datas[li], datas[ei]
        frac = count / later.n
        compared += later.n
        metrics["leaked_rows"] += count
        metrics[f"leaked_rows.{_pkey(later, earlier)}"] = count
        metrics[f"leaked_fraction.{_pkey(later, earlier)}"] = frac
        metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
        pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n, "leaked_rows": count, "leaked_fraction": frac})
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
    for d, within in zip(datas, stats["within"]):
        metrics[f"duplicates_within.{d.name}"] = within
    within_total = sum(stats["within"])
    metrics["duplicates_within"] = within_total
    metrics["distinct_vectors"] = stats["distinct"]

    # Same features, different labels (anywhere in the splits): label noise or a feature set too poor to decide.
    conflicting, conflict_rows, conflict_table = stats["conflicting"], stats["conflict_rows"], None
    if conflict_rows:
        sid, pos, fps = stats["conflict_evidence"]
        conflict_table = pd.DataFrame({
            "split": [datas[s].name for s in sid],
            "row": [datas[s].row_id[p] for s, p in zip(sid, pos)],
            "label": [labels[s].iloc[p] for s, p in zip(sid, pos)],
            "fingerprint": [f"{v:016x}" for v in fps],
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
    space, chance = None, False
    if worst > max_fraction and datas[0].tabular:
        chance, space = _small_space(splits, label, group, time, features, progress, datas, small_space)
        if np.isfinite(space[0]):
            metrics["feature_combinations_log10"] = round(space[0], 3)
        for d, distinct, repeat in zip(datas, stats["split_distinct"], stats["repeat_rows"]):
            metrics[f"distinct_vectors.{d.name}"] = distinct
            metrics[f"within_repeat_rate.{d.name}"] = repeat / d.n  # rows sharing their vector within the split
    metrics["small_feature_space"] = bool(chance)
    if leaked and chance:
        # Few possible feature vectors for the rows: copies across splits are what chance gives (rows repeat within
        # each split too), so they say nothing about leakage. Not FAIL; the numbers and the evidence stay.
        worst_pair = max(pair_rows, key=lambda r: r["leaked_fraction"])
        wl = worst_pair["split"]
        summary = (f"feature space too small to judge exact copies: {_space_words(space)} ({stats['distinct']} distinct vectors) for "
                   f"{sum(d.n for d in datas)} rows, so {worst_pair['leaked_rows']} of {worst_pair['rows']} {wl} rows "
                   f"matching {worst_pair['earlier_split']} ({_pct(worst_pair['leaked_fraction'])}) is expected by chance; "
                   f"{_pct(metrics[f'within_repeat_rate.{wl}'])} of {wl} rows repeat within {wl} too")
        advice.append("Exact copies cannot show leakage here: check it by the entity instead (pass group= with the "
                      "user/patient/session id), or include the columns that identify a record in features=.")
    elif leaked:
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
    status = Status.FAIL if worst > max_fraction and not chance else Status.WARN if leaked or conflicting else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice)


def _exact_stats(datas: list, labels: list | None, max_evidence: int) -> dict:
    """The exact-copy join of the splits' fingerprints (:func:`exact_join`). A Dask split's fingerprints were
    gathered by its scan (8 bytes a row), so the join runs here for every kind of split: it is one sort, and cutting
    it into buckets joined on the workers moved every fingerprint again, which took longer than the join (#22)."""
    kind = _label_kind(labels, [d.name for d in datas]) if labels is not None else None
    return exact_join([d.fp for d in datas], labels, kind, max_evidence)


_MARK_BLOCK = 1 << 20  # rows per block when marking the repeated rows: a block's temporaries are reused


def repeated_rows(fps: list[np.ndarray]) -> list[np.ndarray]:
    """Per array of ``fps``, the (ascending) positions of the entries whose value occurs more than once over all of
    them. One sort (SIMD in numpy >= 2) finds the repeated values; a bit table on their top bits and a binary search
    of the few rows it lets through mark the rows, a block at a time. Several times faster than hashing every row
    (most rows of a real table are unique), and it allocates one array of the fingerprints' size: on a virtual
    machine, first touches of fresh memory cost more than this arithmetic."""
    s = np.concatenate(fps) if len(fps) != 1 else fps[0].copy()
    s.sort()
    rep = s[1:][s[1:] == s[:-1]]
    del s
    if len(rep) == 0:
        return [np.empty(0, dtype=np.int64) for _ in fps]
    rep = rep[np.concatenate([[True], rep[1:] != rep[:-1]])]
    bits = int(min(26, max(12, np.ceil(np.log2(64 * len(rep))))))
    shift = np.uint64(64 - bits)
    table = np.zeros(1 << bits, dtype=bool)
    table[(rep >> shift).astype(np.intp)] = True
    buf = np.empty(min(_MARK_BLOCK, max(len(f) for f in fps)), dtype=np.uint64)
    out = []
    for fp in fps:
        found = []
        for a in range(0, len(fp), _MARK_BLOCK):
            blk = fp[a:a + _MARK_BLOCK]
            top = np.right_shift(blk, shift, out=buf[:len(blk)]).view(np.int64)  # < 2**26: a valid index
            cand = np.flatnonzero(table[top])
            at = np.searchsorted(rep, blk[cand])
            at[at == len(rep)] = 0
            found.append(cand[rep[at] == blk[cand]] + a)
        out.append(np.concatenate(found) if found else np.empty(0, dtype=np.int64))
    return out


def exact_join(fps: list[np.ndarray], labels: list[pd.Series] | None, label_kind: str | None, max_evidence: int) -> dict:
    """Exact copies among the rows of every split, from their fingerprints ``fps[s]`` (and labels, compared by
    ``label_kind``). Only rows whose fingerprint occurs more than once (:func:`repeated_rows`) can pair, repeat or
    conflict, so only those are factorised and have their labels hashed.

    Returns, by row position: ``pairs[(later, earlier)] = (count, first later positions, their first earlier
    positions, fingerprints)``, ``within`` / ``split_distinct`` / ``repeat_rows`` per split, ``distinct``,
    ``conflicting``, ``conflict_rows`` and ``conflict_evidence`` (split index, position, fingerprint of the first
    conflicting rows)."""
    local = repeated_rows(fps)  # each split's repeated rows, by row
    bounds = np.cumsum([0] + [len(f) for f in fps])
    rows = np.concatenate([loc + b for loc, b in zip(local, bounds)])  # their global row numbers, ascending
    codes, uniq = pd.factorize(np.concatenate([f[loc] for f, loc in zip(fps, local)]))
    cut = np.cumsum([0] + [len(loc) for loc in local])
    split_codes = [codes[cut[i]:cut[i + 1]] for i in range(len(fps))]
    firsts = []  # per split: the first row (in the split) holding each repeated value, -1 where none
    for c, loc in zip(split_codes, local):
        f = np.full(len(uniq), -1, dtype=np.int64)
        f[c[::-1]] = loc[::-1]
        firsts.append(f)
    out: dict[str, Any] = {"pairs": {}, "distinct": int(bounds[-1]) - len(rows) + len(uniq), "within": [],
                           "split_distinct": [], "repeat_rows": []}
    for li in range(1, len(fps)):
        for ei in range(li):
            match = firsts[ei][split_codes[li]]
            hit = np.flatnonzero(match >= 0)
            take = local[li][hit[:max_evidence]]
            out["pairs"][(li, ei)] = (len(hit), take, match[hit[:max_evidence]], fps[li][take])
    for i, (c, f) in enumerate(zip(split_codes, firsts)):
        within = len(c) - int((f >= 0).sum())  # unique rows are distinct in their split too
        out["split_distinct"].append(len(fps[i]) - within)
        out["within"].append(within)
        out["repeat_rows"].append(int(np.count_nonzero(np.bincount(c, minlength=len(uniq))[c] > 1)) if within else 0)
    out["conflicting"], out["conflict_rows"] = 0, 0
    out["conflict_evidence"] = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.uint64))
    if labels is not None and len(rows):
        lh = np.concatenate([hash_column(lab.iloc[loc], label_kind) for lab, loc in zip(labels, local)])
        sub = pd.DataFrame({"code": codes, "lab": lh})
        nlab = sub.drop_duplicates().groupby("code").size()
        bad_codes = nlab.index[nlab.to_numpy() > 1].to_numpy()
        bad = rows[np.isin(codes, bad_codes)]
        out["conflicting"], out["conflict_rows"] = len(bad_codes), len(bad)
        first = bad[:max_evidence]
        sid = np.searchsorted(bounds, first, side="right") - 1
        local_first = first - bounds[sid]
        out["conflict_evidence"] = (sid, local_first, np.array([fps[i][p] for i, p in zip(sid, local_first)], dtype=np.uint64))
    return out


def _feature_space(splits, label, group, time, features, progress) -> tuple[float, int, str]:
    """log10 of how many value combinations the feature columns can take, the number of feature columns, and how
    that bound was found.

    The product of each column's distinct values (missing counting as one, in the splits' row samples) is one bound;
    it ignores dependence between columns (20 one-hot columns of 6 answers: 2^20, yet only 1,296 combinations
    exist). When every column is discrete (at most sqrt(rows) distinct values, so values repeat by chance within
    the column), the rows themselves give a second bound: the earliest split's sample of N rows shows D distinct
    vectors, and a space of S equally likely vectors gives D = S (1 - exp(-N / S)) on average, solved for S
    (infinite when no row repeats). A continuous table whose rows were copied (each value three times) is not
    discrete and keeps the product bound."""
    datas = _load(splits, label, group, time, features, progress, needs={"sample"})
    cols = datas[0].feature_columns
    frames = [d.sample for d in datas if d.sample is not None]
    both = pd.concat([f[cols] for f in frames], ignore_index=True) if len(frames) > 1 else frames[0][cols]
    distinct = [both[c].nunique(dropna=False) for c in cols]
    if any(k >= 0.5 * len(both) for k in distinct):  # a mostly-distinct column: the sample cannot bound it
        return float("inf"), len(cols), "product"
    product = float(sum(np.log10(max(1, k)) for k in distinct))
    first = datas[0].sample
    if first is None or len(first) < 2 or max(distinct, default=1) > np.sqrt(len(both)):
        return product, len(cols), "product"
    n = len(first)
    d = int(first[cols].drop_duplicates().shape[0])
    if d >= n:
        return product, len(cols), "product"
    lo, hi = float(d), float(d)
    while hi * (1 - np.exp(-n / hi)) < d:  # occupancy D(S) grows with S towards n
        hi *= 2
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mid * (1 - np.exp(-n / mid)) < d else (lo, mid)
    observed = float(np.log10(hi))
    if observed < product - np.log10(2):  # clearly fewer than the product (otherwise its "at most" is plainer)
        return observed, len(cols), f"rows: {d} distinct of {n} {datas[0].name} rows"
    return product, len(cols), "product"


def _small_space(splits, label, group, time, features, progress, datas, small_space: float) -> tuple[bool, tuple | None]:
    """Whether a table's feature space is too small to judge exact copies (at most ``small_space`` x rows)."""
    if not datas[0].tabular:
        return False, None
    space = _feature_space(splits, label, group, time, features, progress)
    return bool(space[0] <= np.log10(small_space * sum(d.n for d in datas))), space


def _space_words(space: tuple) -> str:
    if space[2] == "product":
        return f"{space[1]} feature column(s) take at most {10 ** space[0]:,.0f} value combinations"
    return f"{space[1]} discrete feature column(s) show about {10 ** space[0]:,.0f} possible combinations ({space[2]})"


# ---------------------------------------------------------------------------------------------------- near duplicates
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
                 "model is evaluated on inputs unlike those it trains on; near duplicates cannot be compared across them")
    advice = [f"Give every split the same preprocessing as {first.name!r} (the same resize/crop, e.g. "
              f"transforms.Resize and CenterCrop to {_shape_text(first)}, or the same padding length) and rerun."]
    metrics = {"shape_mismatch": True, **{f"sample_shape.{d.name}": _shape_text(d) for d in datas}}
    return CheckResult(cid, Status.FAIL if images else Status.WARN, summary, metrics, {"sample_shapes": table}, advice)


@register("data.near_duplicates", title="Near duplicates across splits",
          description="rows/samples of a later split nearly identical (cosine) to one in an earlier split", needs="splits")
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
    each nearest pair is recomputed in float64 from the distance, so cut-offs within 1e-7 of 1 are resolved. A table's free-text columns (strings with mostly distinct values, or long multi-word ones with
    many different values; low-cardinality strings are categories and are not compared) add a block of hashed
    character trigrams of the row's text, lower-cased with punctuation and spacing collapsed (so copies that differ
    only in case, spacing or punctuation match exactly); with both blocks the similarity is their average, and a
    table needs 3 numeric columns or free text (beside free text, every numeric column is compared). A pair is a near duplicate when its similarity is at least ``threshold``, by default
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
    from . import ann
    from . import neighbours as nb

    cid = "data.near_duplicates"
    if enabled is False:
        return _skip(cid, "near-duplicate search disabled (near_duplicates=False)")
    if enabled not in ("auto", True):
        raise DataError(f"near_duplicates={enabled!r} is not 'auto', True or False", "pass 'auto', True or False")
    if search not in ("auto", "exact", "index"):
        raise DataError(f"search={search!r} is not 'auto', 'exact' or 'index'", "pass one of those")
    if enabled == "auto":  # decide on memory before asking for the numeric matrix (a large table's biggest cost)
        sized = _load(splits, label, group, time, features, progress)
        need = _index_bytes(sized)
        if sized[0].tabular and sum(d.n for d in sized) > max_auto_rows and need > max_auto_index_bytes:
            return _skip(cid, f"table of {sum(d.n for d in sized):,} rows: the approximate index would hold ~{need / 1e9:.1f} GB "
                              f"of vectors (automatic limit {max_auto_index_bytes / 1e9:.1f} GB); pass near_duplicates=True "
                              "to run it")
    datas = _load(splits, label, group, time, features, progress, needs={"numeric"})
    tabular = datas[0].tabular
    use_text = tabular and all(d.text_norm is not None for d in datas)
    total = sum(d.n for d in datas)
    missing = [d for d in datas if d.numeric is None]
    if missing and not use_text:
        return _skip(cid, f"no vectors to compare in split {missing[0].name!r}: {missing[0].numeric_note or 'not numeric'}"
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
        return _skip(cid, f"only {num_dim} numeric feature column(s): cosine similarity cannot tell rows apart in so few dimensions")
    dev = nb.pick_device(device)
    num_vec_dim = num_dim + (1 if tabular else 0)
    cost = sum(a.n * b.n * (num_vec_dim + nb.TEXT_DIM * use_text) for a, b in _pairs(datas))
    budget = max_auto_cost * (50 if dev.startswith("cuda") else 1)
    big = total > max_auto_rows or cost > budget
    use_index = search == "index" or (search == "auto" and big)
    if use_text and not use_index and any(d.text is None for d in datas):
        use_index = True  # text too long to vectorise (sources.TEXT_MAX_ROWS): only MinHash LSH can compare it
    text_lsh = use_text and use_index  # free text by MinHash LSH, not by trigram vectors
    dim = (num_dim if use_numeric else 0) + (nb.TEXT_DIM if use_text and not text_lsh else 0)
    vec_dim = dim + (1 if use_numeric and tabular else 0)  # the vectors compared (tables: + the constant component)

    # One unit vector per row: the numeric block (standardised with the first split's statistics) and/or the text
    # block (hashed trigrams of the normalised text), each weighted so that the cosine is their average.
    blocks: dict[str, list[np.ndarray]] = {d.name: [] for d in datas}
    if use_numeric:
        # Statistics over finite values only (±inf counts as missing): one inf made every vector NaN.
        mean64, std64 = nb.finite_mean_std(datas[0].numeric, with_std=tabular)
        mean = mean64.astype(np.float32)
        scale = None
        if tabular:
            scale = np.where(np.isfinite(std64) & (std64 > 0), std64, 1.0).astype(np.float32)
        for d in datas:
            # Tables: a constant 1 (one standard deviation) next to the standardised features makes magnitude
            # count; tensors/images keep pure cosine (brightness/contrast changes are still near copies).
            blocks[d.name].append(nb.prepare(d.numeric, mean, scale, offset=1.0 if tabular else None))
    if use_text and not text_lsh:
        for d in datas:
            blocks[d.name].append(nb.prepare_text(d.text))
    weight = np.float32(1.0 / np.sqrt(max(1, len(blocks[datas[0].name]))))
    prepared = {name: (b[0] if len(b) == 1 else np.concatenate(b, axis=1) * weight) for name, b in blocks.items() if b}
    images = all(d.image_shape is not None for d in datas) and len({d.image_shape for d in datas}) == 1
    hashes = {d.name: nb.average_hash(d.numeric, d.image_shape) for d in datas} if images and phash_max_distance >= 0 else None
    # The hash's own thumbnails compared continuously (per-sample correlation): they confirm a hash match. At the
    # hash's resolution a one-pixel shift of a large image still correlates; on 8x8 images it is the pixels.
    standardised = ({d.name: nb.standardise_rows(nb.pooled_gray(d.numeric, d.image_shape)) for d in datas}
                    if hashes is not None else {})
    corr_typical_of: dict[str, float | None] = {}

    metrics: dict[str, Any] = {"leaked_rows": 0, "leaked_fraction": 0.0, "max_pair_fraction": 0.0, "dimensions": dim, "device": dev}
    if use_text:
        metrics["text_columns"] = ", ".join(map(str, datas[0].text_columns))
    pair_rows, evidence, hist_rows = [], [], []
    thresholds = []
    typical_of: dict[str, float | None] = {}
    hash_typical_of: dict[str, float | None] = {}
    compared = 0
    edges = np.linspace(-9, 0.5, 96)
    indexes: dict[str, Any] = {}  # earlier split -> its approximate index (built once)
    signatures: dict[str, np.ndarray] = {}  # earlier split -> MinHash signatures of its texts
    methods: dict[str, str] = {}
    recalls: list[float] = []
    for later, earlier in _pairs(datas):
        key = _pkey(later, earlier)
        has_vectors = earlier.name in prepared
        # The yardstick is how close the earlier split's own rows are to each other: when most of the later split is
        # near copies, its own nearest-neighbour distances are the copies' and would hide them.
        if has_vectors and earlier.name not in typical_of:
            typical_of[earlier.name] = _typical_angle(prepared[earlier.name], dev, use_index)
        # Far closer than rows typically are: the expected share of unrelated rows that close falls like
        # ratio**(dim-1), so low-dimensional data gets a smaller ratio (false positives below ~1e-5 per row).
        ratio = min(calibration, 1e-5 ** (1.0 / max(vec_dim - 1, 1)))

        def cut(typical: float) -> float:
            return float(threshold) if threshold is not None else max(min_similarity, float(np.cos(ratio * typical)))

        if text_lsh:
            best, arg, vec_best = _text_pairs(later, earlier, prepared if use_numeric else None, signatures, min_jaccard,
                                              metrics, methods, key)
        elif use_index:
            best, arg = _index_pairs(later, earlier, prepared, indexes, typical_of[earlier.name], cut, progress, methods)
            vec_best = best
        else:
            best, arg = nb.nearest(prepared[later.name], prepared[earlier.name], dev, progress, f"tropt: {later.name} vs {earlier.name}")
            best = nb.pair_similarity(prepared[later.name], prepared[earlier.name][arg])  # the same pairs, exactly near 1
            vec_best = best
        typical = typical_of.get(earlier.name)
        if typical is None and vec_best is not None:  # an earlier split of one row, or only exact copies of each other
            angle = np.arccos(vec_best.astype(np.float64))
            nonexact = angle[angle > 1e-3]
            typical = float(np.median(nonexact)) if nonexact.size else float(np.pi / 2)
        thr = cut(typical) if vec_best is not None else float(min_jaccard)
        if text_lsh:
            flagged = best >= min_jaccard
            if vec_best is not None:  # beside the text, the numbers must be near copies too
                flagged &= vec_best >= thr
                metrics[f"numeric_threshold.{key}"] = thr
            thr = float(min_jaccard)  # the pair's similarity is its shingle Jaccard
        else:
            flagged = best >= thr
        thresholds.append(thr)
        if use_index and not text_lsh:
            rec = _measure_recall(indexes[earlier.name], prepared[earlier.name], prepared[later.name], best, thr,
                                  _capped_queries(prepared[earlier.name], recall_sample), dev)
            metrics.update({f"{k}.{key}": v for k, v in rec.items()})
            recalls.append(rec["recall"])
        match = arg.copy()
        ham = None
        if hashes is not None:
            if use_index:
                ham, harg, methods["hash"] = ann.hamming_nearest(hashes[later.name], hashes[earlier.name], phash_max_distance, progress)
            else:
                ham, harg = nb.hamming_nearest(hashes[later.name], hashes[earlier.name], dev)
            if earlier.name not in hash_typical_of:  # the earlier split's own spacing, as for the cosine yardstick
                own_h = (ann.hamming_self_nearest(hashes[earlier.name]) if use_index
                         else nb.hamming_self_nearest(hashes[earlier.name], device=dev))
                own_h = own_h[own_h > 0]
                hash_typical_of[earlier.name] = float(np.median(own_h)) if own_h.size else None
            typical_h = hash_typical_of[earlier.name]
            if typical_h is None and (ham > 0).any():
                typical_h = float(np.median(ham[ham > 0]))
            hthr = phash_max_distance if typical_h is None else min(phash_max_distance, int(np.floor(hash_calibration * typical_h)))
            metrics[f"hash_threshold.{_pkey(later, earlier)}"] = hthr
            cand = np.flatnonzero((ham <= hthr) & ~flagged)
            # A hash of a small image is too coarse to decide alone (different handwriting of one digit on 8x8
            # images hashes identically): a hash match counts only when the pair's per-sample correlation, which
            # is blind to brightness and contrast like the hash, is also far closer than the earlier split's own
            # nearest neighbours are.
            if earlier.name not in corr_typical_of:
                corr_typical_of[earlier.name] = _typical_angle(standardised[earlier.name], dev, use_index)
            typical_c = corr_typical_of[earlier.name]
            cthr = max(min_similarity, float(np.cos(hash_confirm * typical_c))) if typical_c is not None else min_similarity
            corr = nb.pair_similarity(standardised[later.name][cand], standardised[earlier.name][harg[cand]])
            metrics[f"hash_confirm_threshold.{_pkey(later, earlier)}"] = cthr
            metrics[f"hash_only_rejected.{_pkey(later, earlier)}"] = int(np.sum(corr < cthr))
            by_hash = np.zeros(len(ham), dtype=bool)
            by_hash[cand[corr >= cthr]] = True
            match[by_hash] = harg[by_hash]
            flagged = flagged | by_hash
            pair_extra = {"hash_threshold": hthr, "hash_confirm_threshold": cthr}
        else:
            pair_extra = {}
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
                          "of_which_exact": exact, "fraction": frac, "threshold": thr, "median_nn_similarity": float(np.median(best)), **pair_extra})
        counts, _ = np.histogram(np.log10(np.maximum(1.0 - best.astype(np.float64), 1e-9)), bins=edges)
        hist_rows.append(counts)
        room = max_evidence - sum(len(e) for e in evidence)
        if room > 0 and len(hit):
            order = hit[np.argsort(-best[hit], kind="stable")][:room]
            sim = best[order] if text_lsh else nb.pair_similarity(prepared[later.name][order], prepared[earlier.name][match[order]])
            ev = pd.DataFrame({"split": later.name, "row": later.row_id[order], "earlier_split": earlier.name,
                               "earlier_row": earlier.row_id[match[order]], "similarity": sim,
                               "exact": later.fp[order] == earlier.fp[match[order]]})
            if text_lsh and vec_best is not None:
                ev["numeric_similarity"] = vec_best[order]
            if use_text:
                ev["text"] = later.text_preview[order]
                ev["earlier_text"] = earlier.text_preview[match[order]]
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
        text = f"; text columns {metrics['text_columns']} compared as normalised text" if use_text else ""
        if text_lsh:
            numbers = f" and {num_dim} numeric columns" if use_numeric else ""
            summary = (f"no near duplicates across splits (text columns {metrics['text_columns']}{numbers}; shingle "
                       f"Jaccard threshold {metrics['threshold']:.2f})")
        else:
            summary = f"no near duplicates across splits (similarity threshold {_fmt_sim(metrics['threshold'])}, {dim} dimensions{text})"
        advice = []
    judged = worst
    if worst > max_fraction and tabular and any(r["of_which_exact"] for r in pair_rows):
        chance, space = _small_space(splits, label, group, time, features, progress, datas, small_space)
        metrics["small_feature_space"] = chance
        if chance:
            # The same rule as data.exact_duplicates: exact copies among few possible vectors are chance.
            judged = max((r["near_duplicates"] - r["of_which_exact"]) / r["rows"] for r in pair_rows)
            metrics["max_pair_fraction_not_exact"] = judged
            summary = (f"feature space too small to judge exact copies ({_space_words(space)} for "
                       f"{sum(d.n for d in datas)} rows): the {sum(r['of_which_exact'] for r in pair_rows)} exact copies "
                       f"among the near duplicates are expected by chance; " + summary)
            advice = ["Exact copies cannot show leakage here: check it by the entity instead (pass group= with the "
                      "user/patient/session id)."] + (advice if judged > 0 else [])
    if use_index:
        summary, advice = _say_index(metrics, methods, recalls, big, total, max_auto_rows, min_recall, summary, advice)
    status = Status.FAIL if judged > max_fraction else Status.WARN if leaked else Status.PASS
    return CheckResult(cid, status, summary, metrics, tables, advice, series)


# ------------------------------------------------------------------------------- near duplicates: search helpers
def _index_bytes(datas) -> float:
    """Memory the index path holds for tables: per row its numeric matrix, prepared vectors and the index's copy
    (float32, numeric columns + 1), and for free text its normalised text and MinHash signature (~600 bytes)."""
    per_row = 12 * (len(datas[0].numeric_columns) + 1) + (600 if datas[0].text_columns or any(
        k == "text" for k in datas[0].kinds.values()) else 0)
    return float(sum(d.n for d in datas) * per_row)


# multiply-adds of each exact search on a sample when the index is used (the self-nearest search that calibrates
# the threshold, and the sampled later rows of the recall measurement): 2,048 calibration queries (as for exact
# search) up to ~190k rows x 64 dimensions, fewer (at least 256) beyond; at 800k x 64, ~490 queries each. The median
# of ~500 nearest-neighbour angles is within a few percent of the full one, and the recall at the threshold rests
# mostly on the 2,000 probes, whose true neighbour is known without a search.
CALIBRATION_COST = 2.5e10


def _capped_queries(vectors: np.ndarray, wanted: int) -> int:
    """How many exact-search queries against ``vectors`` CALIBRATION_COST allows, between 256 and ``wanted``."""
    return int(np.clip(CALIBRATION_COST / max(1, vectors.size), min(256, wanted), wanted))


def _typical_angle(vectors: np.ndarray, device: str, capped: bool = False) -> float | None:
    """Median angle between up to 2,048 sampled rows of one split and their nearest other row (exact search; with
    ``capped``, as many queries as CALIBRATION_COST allows, at least 256): the yardstick of the threshold. None when
    every row is an exact copy."""
    from . import neighbours as nb

    queries = _capped_queries(vectors, 2048) if capped else 2048
    own = np.arccos(nb.self_nearest(vectors, max_queries=queries, device=device))
    own = own[own > 1e-3]
    return float(np.median(own)) if own.size else None


def _index_pairs(later, earlier, prepared: dict, indexes: dict, typical: float | None, cut, progress: bool,
                 methods: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each later row's approximate nearest earlier row (FAISS IVF on the earlier split, built once) and the pair's
    exact float64 similarity. With the threshold known beforehand, the index's nprobe is first raised until probes at
    the threshold are found (:func:`tropt.data.ann.tune`)."""
    from . import ann
    from . import neighbours as nb

    ref, query = prepared[earlier.name], prepared[later.name]
    if earlier.name not in indexes:
        indexes[earlier.name] = ann.build(ref)
        if typical is not None:
            ann.tune(indexes[earlier.name], ref, cut(typical))
    index = indexes[earlier.name]
    methods["vectors"] = index.method
    _, arg = ann.nearest(index, query, progress, f"tropt: {later.name} vs {earlier.name} (index)")
    return nb.pair_similarity(query, ref[arg]), arg


def _measure_recall(index, ref: np.ndarray, query: np.ndarray, best: np.ndarray, thr: float, size: int,
                    device: str = "cpu") -> dict:
    """The index's recall at the threshold against exact brute-force search: sampled later rows whose exact nearest
    neighbour reaches ``thr`` plus ann.PROBES probes (earlier rows turned to exactly ``thr``), and recall@1."""
    from . import ann

    rec = ann.recall(ref, query, best.astype(np.float32), thr, size, device=device)
    found, probes = ann.probe_recall(index, ref, thr, ann.PROBES)
    near_found = round((rec.near_recall or 0.0) * rec.near_queries)
    total = rec.near_queries + probes
    return {"recall": (near_found + found) / total if total else 1.0, "recall_at_1": rec.recall,
            "recall_sample": rec.sample, "recall_near_in_sample": rec.near_queries, "recall_probes": probes}


def _text_pairs(later, earlier, prepared: dict | None, signatures: dict, min_jaccard: float, metrics: dict,
                methods: dict, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each later row's most similar earlier text by MinHash LSH, verified by exact shingle Jaccard; with numeric
    columns, also the pair's numeric-block similarity (exact)."""
    from . import minhash as mh
    from . import neighbours as nb

    if earlier.name not in signatures:
        signatures[earlier.name] = mh.signatures(earlier.text_norm)
    tm = mh.near_texts(later.text_norm, earlier.text_norm, min_jaccard, earlier_sig=signatures[earlier.name])
    methods["text"] = tm.method
    metrics[f"lsh_candidates.{key}"] = tm.candidates
    metrics[f"lsh_verified.{key}"] = tm.verified
    metrics[f"lsh_bucket_capped.{key}"] = tm.capped
    metrics["lsh_recall_at_threshold"] = tm.collision_probability(min_jaccard)
    vec = None
    if prepared is not None:
        vec = nb.pair_similarity(prepared[later.name], prepared[earlier.name][tm.match])
    return tm.jaccard, tm.match, vec


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
            advice = advice + [f"The index's recall ({metrics['recall']:.3f}) is below {min_recall}: rerun with "
                               "search='exact' (device='cuda' helps) to search every pair."]
    if "lsh_recall_at_threshold" in metrics:
        said += (f", texts paired from Jaccard {metrics['threshold']:.2f} with probability "
                 f"{metrics['lsh_recall_at_threshold']:.3f}, every pair verified exactly")
    return summary + said, advice
