"""How ``data.near_duplicates`` finds each later row's nearest earlier row: one unit vector per row (numeric and/or
text blocks), exact cosine search (:mod:`tropt.data.neighbours`) or an approximate index (:mod:`tropt.data.ann`),
free text by MinHash LSH (:mod:`tropt.data.minhash`), image average hashes confirmed by thumbnail correlation, and a
threshold calibrated on the earlier split's own nearest-neighbour spacing (:class:`NearSearch`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from . import ann
from . import minhash as mh
from . import neighbours as nb
from ._common import MAX_EVIDENCE, _pkey
from .split_data import SplitData


@dataclass(frozen=True)
class NearDuplicateOptions:
    """The keyword options of :func:`tropt.data.check_near_duplicates` (documented there), bundled."""

    label: Any = None
    group: Any = None
    time: Any = None
    features: Any = None
    enabled: bool | str = "auto"
    threshold: float | None = None
    calibration: float = 0.05
    min_similarity: float = 0.95
    phash_max_distance: int = 10
    hash_calibration: float = 0.1
    hash_confirm: float = 0.3
    max_fraction: float = 0.01
    small_space: float = 10.0
    max_auto_rows: int = 200_000
    max_auto_cost: float = 2e11
    device: str | None = None
    search: str = "auto"
    min_jaccard: float = 0.5
    recall_sample: int = 1000
    min_recall: float = 0.95
    max_auto_index_bytes: float = 2e9
    max_evidence: int = MAX_EVIDENCE
    progress: bool = True


@dataclass(frozen=True)
class SearchPlan:
    """How the splits are compared: which blocks, on which device, exactly or with an index."""

    tabular: bool
    use_text: bool  # free-text columns compared (trigram vectors, or MinHash LSH with text_lsh)
    use_numeric: bool
    num_dim: int  # numeric columns (or values per sample)
    device: str
    use_index: bool  # an approximate index instead of exact search
    text_lsh: bool  # free text by MinHash LSH, not by trigram vectors
    dim: int  # dimensions compared (numeric + trigram blocks)
    vec_dim: int  # the vectors compared (tables: + the constant component)
    big: bool  # above the exact-search limits (rows or cost)
    total: int  # rows of every split


DEVIATION_FLOOR = 0.5  # a table column's scale is at least this times its median deviation from its median
DEVIATION_ELEMENTS = 1 << 22  # values of the row sample the deviations are measured on (32 MB in float64)


def deviation_scale(x: np.ndarray) -> np.ndarray:
    """Per column, the median absolute deviation from the column's median over the finite values that differ from
    it (0 for a constant column or one without finite values), on evenly spaced rows (at most DEVIATION_ELEMENTS
    values). Half of it is below the std of any column whose values do vary (0.34 std for a normal column), so it
    only lifts the scale of columns that are near-constant: the size of their rare deviations, not how rare."""
    x2 = x.reshape(len(x), -1)
    rows = max(1, min(len(x2), DEVIATION_ELEMENTS // max(1, x2.shape[1])))
    v = x2[:: -(-len(x2) // rows)].astype(np.float64)
    v[~np.isfinite(v)] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-missing columns: NaN, made 0 below
        dev = np.abs(v - np.nanmedian(v, axis=0))
        dev[dev == 0] = np.nan
        out = np.nanmedian(dev, axis=0)
    return np.nan_to_num(out, nan=0.0)


def prepare_vectors(datas: list[SplitData], plan: SearchPlan) -> dict[str, np.ndarray]:
    """One unit vector per row: the numeric block (standardised with the first split's statistics) and/or the text
    block (hashed trigrams of the normalised text), each weighted so that the cosine is their average."""
    tabular = plan.tabular
    blocks: dict[str, list[np.ndarray]] = {d.name: [] for d in datas}
    if plan.use_numeric:
        # Statistics over finite values only (±inf counts as missing): one inf made every vector NaN.
        mean64, std64 = nb.finite_mean_std(datas[0].numeric, with_std=tabular)
        mean = mean64.astype(np.float32)
        scale = None
        if tabular:
            scale = np.where(np.isfinite(std64) & (std64 > 0), std64, 1.0)
            # A near-constant column (a border pixel, 0 in all but a few rows) has a tiny std because it rarely
            # deviates, not because its deviations are small: dividing by it made noise of 0.01 a third of a
            # standard deviation, and 64 such columns hid copies. Its scale is at least half its typical deviation.
            scale = np.fmax(scale, DEVIATION_FLOOR * deviation_scale(datas[0].numeric)).astype(np.float32)
        for d in datas:
            # Tables: a constant 1 (one standard deviation) next to the standardised features makes magnitude
            # count; tensors/images keep pure cosine (brightness/contrast changes are still near copies).
            blocks[d.name].append(nb.prepare(d.numeric, mean, scale, offset=1.0 if tabular else None))
    if plan.use_text and not plan.text_lsh:
        for d in datas:
            blocks[d.name].append(nb.prepare_text(d.text))
    weight = np.float32(1.0 / np.sqrt(max(1, len(blocks[datas[0].name]))))
    return {name: (b[0] if len(b) == 1 else np.concatenate(b, axis=1) * weight) for name, b in blocks.items() if b}


class NearSearch:
    """The near-duplicate search over every (later, earlier) pair of splits: :meth:`pair` finds and records one
    pair's near duplicates into ``metrics``, ``pair_rows``, ``evidence`` and the similarity histogram. What is built
    once per earlier split (its yardsticks, index, MinHash signatures) is kept between pairs."""

    def __init__(self, datas: list[SplitData], plan: SearchPlan, opts: NearDuplicateOptions) -> None:
        self.datas, self.plan, self.opts = datas, plan, opts
        self.prepared = prepare_vectors(datas, plan)
        self.images = all(d.image_shape is not None for d in datas) and len({d.image_shape for d in datas}) == 1
        self.hashes = ({d.name: nb.average_hash(d.numeric, d.image_shape) for d in datas}
                       if self.images and opts.phash_max_distance >= 0 else None)
        # The hash's own thumbnails compared continuously (per-sample correlation): they confirm a hash match. At the
        # hash's resolution a one-pixel shift of a large image still correlates; on 8x8 images it is the pixels.
        self.standardised = ({d.name: nb.standardise_rows(nb.pooled_gray(d.numeric, d.image_shape)) for d in datas}
                             if self.hashes is not None else {})
        self.corr_typical_of: dict[str, float | None] = {}
        self.metrics: dict[str, Any] = {"leaked_rows": 0, "leaked_fraction": 0.0, "max_pair_fraction": 0.0,
                                        "dimensions": plan.dim, "device": plan.device}
        if plan.use_text:
            self.metrics["text_columns"] = ", ".join(map(str, datas[0].text_columns))
        self.pair_rows: list[dict] = []
        self.evidence: list[tuple] = []
        self.hist_rows: list[np.ndarray] = []
        self.thresholds: list[float] = []
        self.typical_of: dict[str, float | None] = {}
        self.hash_typical_of: dict[str, float | None] = {}
        self.compared = 0
        self.edges = np.linspace(-9, 0.5, 96)
        self.indexes: dict[str, Any] = {}  # earlier split -> its approximate index (built once)
        self.signatures: dict[str, np.ndarray] = {}  # earlier split -> MinHash signatures of its texts
        self.methods: dict[str, str] = {}
        self.recalls: list[float] = []
        # Far closer than rows typically are: the expected share of unrelated rows that close falls like
        # ratio**(dim-1), so low-dimensional data gets a smaller ratio (false positives below ~1e-5 per row).
        self.ratio = min(opts.calibration, 1e-5 ** (1.0 / max(plan.vec_dim - 1, 1)))

    def cut(self, typical: float) -> float:
        """The similarity threshold for an earlier split whose rows are ``typical`` radians from their neighbours."""
        o = self.opts
        if o.threshold is not None:
            return float(o.threshold)
        return max(o.min_similarity, float(np.cos(self.ratio * typical)))

    def pair(self, later: SplitData, earlier: SplitData) -> None:
        """Find and record the near duplicates of ``later``'s rows in ``earlier``."""
        key = _pkey(later, earlier)
        best, arg, vec_best = self._nearest(later, earlier, key)
        thr, flagged = self._threshold(later, earlier, key, best, vec_best)
        match = arg.copy()
        ham = None
        pair_extra: dict[str, Any] = {}
        if self.hashes is not None:
            ham, flagged, pair_extra = self._hash_matches(later, earlier, key, flagged, match)
        self._record(later, earlier, key, best, match, flagged, thr, ham, vec_best, pair_extra)

    def _nearest(self, later: SplitData, earlier: SplitData, key: str) -> tuple[np.ndarray, np.ndarray, Any]:
        """Each later row's best earlier row: (similarity, its position, the vector similarity or None)."""
        plan, prepared, dev = self.plan, self.prepared, self.plan.device
        # The yardstick is how close the earlier split's own rows are to each other: when most of the later split is
        # near copies, its own nearest-neighbour distances are the copies' and would hide them.
        if earlier.name in prepared and earlier.name not in self.typical_of:
            self.typical_of[earlier.name] = _typical_angle(prepared[earlier.name], dev, plan.use_index)
        if plan.text_lsh:
            return _text_pairs(later, earlier, prepared if plan.use_numeric else None, self.signatures,
                               self.opts.min_jaccard, self.metrics, self.methods, key)
        if plan.use_index:
            best, arg = _index_pairs(later, earlier, prepared, self.indexes, self.typical_of[earlier.name], self.cut,
                                     self.opts.progress, self.methods)
            return best, arg, best
        best, arg = nb.nearest(prepared[later.name], prepared[earlier.name], dev, self.opts.progress,
                               f"tropt: {later.name} vs {earlier.name}")
        best = nb.pair_similarity(prepared[later.name], prepared[earlier.name][arg])  # the same pairs, exactly near 1
        return best, arg, best

    def _threshold(self, later: SplitData, earlier: SplitData, key: str, best: np.ndarray,
                   vec_best: np.ndarray | None) -> tuple[float, np.ndarray]:
        """The pair's threshold and the later rows at or above it; the index's recall at it (index search)."""
        plan, o = self.plan, self.opts
        typical = self.typical_of.get(earlier.name)
        if typical is None and vec_best is not None:  # an earlier split of one row, or only exact copies of each other
            angle = np.arccos(vec_best.astype(np.float64))
            nonexact = angle[angle > 1e-3]
            typical = float(np.median(nonexact)) if nonexact.size else float(np.pi / 2)
        thr = self.cut(typical) if vec_best is not None else float(o.min_jaccard)
        if plan.text_lsh:
            flagged = best >= o.min_jaccard
            if vec_best is not None:  # beside the text, the numbers must be near copies too
                flagged &= vec_best >= thr
                self.metrics[f"numeric_threshold.{key}"] = thr
            thr = float(o.min_jaccard)  # the pair's similarity is its shingle Jaccard
        else:
            flagged = best >= thr
        self.thresholds.append(thr)
        if plan.use_index and not plan.text_lsh:
            prepared = self.prepared
            rec = _measure_recall(self.indexes[earlier.name], prepared[earlier.name], prepared[later.name], best, thr,
                                  _capped_queries(prepared[earlier.name], o.recall_sample), plan.device)
            self.metrics.update({f"{k}.{key}": v for k, v in rec.items()})
            self.recalls.append(rec["recall"])
        return thr, flagged

    def _hash_matches(self, later: SplitData, earlier: SplitData, key: str, flagged: np.ndarray,
                      match: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
        """Add the image pairs whose average hashes are close and whose thumbnails correlate (``match`` is updated in
        place): (Hamming distances, the rows flagged now, the pair's hash thresholds)."""
        o, hashes, dev, use_index = self.opts, self.hashes, self.plan.device, self.plan.use_index
        if use_index:
            ham, harg, self.methods["hash"] = ann.hamming_nearest(hashes[later.name], hashes[earlier.name],
                                                                  o.phash_max_distance, o.progress)
        else:
            ham, harg = nb.hamming_nearest(hashes[later.name], hashes[earlier.name], dev)
        if earlier.name not in self.hash_typical_of:  # the earlier split's own spacing, as for the cosine yardstick
            own_h = (ann.hamming_self_nearest(hashes[earlier.name]) if use_index
                     else nb.hamming_self_nearest(hashes[earlier.name], device=dev))
            own_h = own_h[own_h > 0]
            self.hash_typical_of[earlier.name] = float(np.median(own_h)) if own_h.size else None
        typical_h = self.hash_typical_of[earlier.name]
        if typical_h is None and (ham > 0).any():
            typical_h = float(np.median(ham[ham > 0]))
        hthr = (o.phash_max_distance if typical_h is None
                else min(o.phash_max_distance, int(np.floor(o.hash_calibration * typical_h))))
        self.metrics[f"hash_threshold.{key}"] = hthr
        cand = np.flatnonzero((ham <= hthr) & ~flagged)
        # A hash of a small image is too coarse to decide alone (different handwriting of one digit on 8x8
        # images hashes identically): a hash match counts only when the pair's per-sample correlation, which
        # is blind to brightness and contrast like the hash, is also far closer than the earlier split's own
        # nearest neighbours are.
        if earlier.name not in self.corr_typical_of:
            self.corr_typical_of[earlier.name] = _typical_angle(self.standardised[earlier.name], dev, use_index)
        typical_c = self.corr_typical_of[earlier.name]
        cthr = (max(o.min_similarity, float(np.cos(o.hash_confirm * typical_c))) if typical_c is not None
                else o.min_similarity)
        corr = nb.pair_similarity(self.standardised[later.name][cand], self.standardised[earlier.name][harg[cand]])
        self.metrics[f"hash_confirm_threshold.{key}"] = cthr
        self.metrics[f"hash_only_rejected.{key}"] = int(np.sum(corr < cthr))
        by_hash = np.zeros(len(ham), dtype=bool)
        by_hash[cand[corr >= cthr]] = True
        match[by_hash] = harg[by_hash]
        return ham, flagged | by_hash, {"hash_threshold": hthr, "hash_confirm_threshold": cthr}

    def _record(self, later: SplitData, earlier: SplitData, key: str, best: np.ndarray, match: np.ndarray,
                flagged: np.ndarray, thr: float, ham: np.ndarray | None, vec_best: np.ndarray | None,
                pair_extra: dict) -> None:
        """The pair's counts into the metrics and pair rows, its histogram, and its first rows as evidence."""
        metrics, text_lsh = self.metrics, self.plan.text_lsh
        hit = np.flatnonzero(flagged)
        frac = len(hit) / later.n
        self.compared += later.n
        exact = int(np.sum(later.fp[hit] == earlier.fp[match[hit]]))
        metrics["leaked_rows"] += len(hit)
        metrics[f"leaked_rows.{key}"] = len(hit)
        metrics[f"exact_copies.{key}"] = exact
        metrics[f"threshold.{key}"] = thr
        metrics[f"median_nn_similarity.{key}"] = float(np.median(best))
        metrics["max_pair_fraction"] = max(metrics["max_pair_fraction"], frac)
        self.pair_rows.append({"split": later.name, "earlier_split": earlier.name, "rows": later.n,
                               "near_duplicates": len(hit), "of_which_exact": exact, "fraction": frac, "threshold": thr,
                               "median_nn_similarity": float(np.median(best)), **pair_extra})
        counts, _ = np.histogram(np.log10(np.maximum(1.0 - best.astype(np.float64), 1e-9)), bins=self.edges)
        self.hist_rows.append(counts)
        room = self.opts.max_evidence - sum(len(e) for e in self.evidence)
        if room > 0 and len(hit):
            prepared, hashes = self.prepared, self.hashes
            order = hit[np.argsort(-best[hit], kind="stable")][:room]
            sim = best[order] if text_lsh else nb.pair_similarity(prepared[later.name][order],
                                                                  prepared[earlier.name][match[order]])
            ev = pd.DataFrame({"split": later.name, "row": later.row_id[order], "earlier_split": earlier.name,
                               "earlier_row": earlier.row_id[match[order]], "similarity": sim,
                               "exact": later.fp[order] == earlier.fp[match[order]]})
            if text_lsh and vec_best is not None:
                ev["numeric_similarity"] = vec_best[order]
            if self.plan.use_text:
                ev["text"] = later.text_preview[order]
                ev["earlier_text"] = earlier.text_preview[match[order]]
            if ham is not None:
                ev["hash_distance"] = np.rint((hashes[later.name].shape[1] - np.einsum(
                    "ij,ij->i", hashes[later.name][order], hashes[earlier.name][match[order]])) / 2).astype(int)
            self.evidence.append((ev, later, earlier, order, match[order]))

    def tables_and_series(self) -> tuple[dict, dict]:
        """The overall metrics, the pair and evidence tables, and the distance histogram (and image pairs)."""
        metrics = self.metrics
        metrics["leaked_fraction"] = metrics["leaked_rows"] / self.compared if self.compared else 0.0
        metrics["threshold"] = float(min(self.thresholds))
        tables = {"pairs": pd.DataFrame(self.pair_rows)}
        series: dict[str, Any] = {"log10_distance_edges": self.edges,
                                  "log10_distance_counts": np.sum(self.hist_rows, axis=0)}
        if self.evidence:
            tables["near_duplicates"] = pd.concat([e[0] for e in self.evidence], ignore_index=True)
            if self.images:
                thumbs = []
                for _ev, later, earlier, order, m in self.evidence:
                    for a, b in zip(order, m):
                        if len(thumbs) >= 6:
                            break
                        thumbs.append([nb.thumbnail(later.numeric[a], later.image_shape),
                                       nb.thumbnail(earlier.numeric[b], earlier.image_shape)])
                series["pair_images"] = np.asarray(thumbs, dtype=np.float32)
        return tables, series


# ------------------------------------------------------------------------------------------------ search helpers
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
    queries = _capped_queries(vectors, 2048) if capped else 2048
    own = np.arccos(nb.self_nearest(vectors, max_queries=queries, device=device))
    own = own[own > 1e-3]
    return float(np.median(own)) if own.size else None


def _index_pairs(later, earlier, prepared: dict, indexes: dict, typical: float | None, cut, progress: bool,
                 methods: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each later row's approximate nearest earlier row (FAISS IVF on the earlier split, built once) and the pair's
    exact float64 similarity. With the threshold known beforehand, the index's nprobe is first raised until probes at
    the threshold are found (:func:`tropt.data.ann.tune`)."""
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
