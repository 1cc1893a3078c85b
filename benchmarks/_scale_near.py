"""Near duplicates at scale (issue #22): the approximate index, MinHash LSH for text, and the peers; prints times,
ratios and counts (never asserts). Timings on the shared project machines are noisy: compare medians, rerun quiet.

    python benchmarks/_scale_near.py --only near     # 1M x 64: 800k train / 200k test, 1,000 planted near-copies
    python benchmarks/_scale_near.py --only text     # 1M short texts: 800k / 200k, 1,000 planted near-copies
    python benchmarks/_scale_near.py --only peers    # cleanlab Datalab (50k vectors), deepchecks (100k texts)
    python benchmarks/_scale_near.py --only peers --big   # cleanlab 100k vectors, deepchecks 1M texts
    python benchmarks/_scale_near.py --quick ...     # a tenth of the sizes
(also dispatched by ``benchmarks/bench_data_scale.py --only {near,text,peers,all}``; run with the project's
``.venv``: tropt needs faiss-cpu and datasketch; the peers run in ``.venv-peers`` as a subprocess.)

near: ``check_near_duplicates`` on the table (search="auto" picks the FAISS index above 200k rows), 3 runs. Exact
search is timed on a sample of ``--sample`` test rows against the whole train split (tropt's own exact path, torch
blocked matrix products on the same prepared vectors) and extrapolated *linearly in the number of query rows*
(the reference is the full train split, so the cost per query row is the same): exact(all test rows) =
t(sample) x n_test / sample. Goals: every planted pair found, recall >= 0.99 on the sample (the near duplicates
exact search finds there, found by the index), >= 50x faster than exact search extrapolated.
text: re-cased, re-punctuated and one-word-changed copies; goals >= 99% found and 0 false pairs in an audit of
1,000 reported pairs (a pair is false unless it is a planted pair or its texts differ in at most one word).
peers: cleanlab ``Datalab(near_duplicate)`` on 50k x 64 vectors (its kNN graph is exact: 40 s here) and deepchecks
NLP ``TrainTestSamplesMix`` (normalised-text hashing) on 100k texts, against tropt on the same data.
All data is generated into a temporary directory and deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]
from _common import LoadWatch, spread  # noqa: E402

PEERS_PYTHON = os.environ.get("TROPT_PEERS_PYTHON", os.path.join(ROOT, ".venv-peers", "bin", "python"))
if not os.path.exists(PEERS_PYTHON):
    PEERS_PYTHON = "/work/main/.venv-peers/bin/python"


# ---------------------------------------------------------------------------------------------------- data
def vectors(n_train: int, n_test: int, d: int = 64, k: int = 1000, noise: float = 1e-2, seed: int = 0):
    """Gaussian rows; test rows 0..k-1 are train rows ``src`` plus a little noise (cosine ~0.9999 in 64-d)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    train = rng.standard_normal((n_train, d), dtype=np.float32)
    test = rng.standard_normal((n_test, d), dtype=np.float32)
    src = rng.choice(n_train, k, replace=False)
    test[:k] = train[src] + noise * rng.standard_normal((k, d), dtype=np.float32)
    return train, test, src


def texts(n_train: int, n_test: int, k: int = 1000, seed: int = 0):
    """Short texts (8-14 words of a 30k-word Zipf vocabulary); test texts 0..k-1 are copies of train texts ``src``,
    a third each re-cased, re-punctuated, and with one word changed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(3, 11))) for _ in range(30_000)], dtype=object)
    p = 1.0 / (np.arange(len(vocab)) + 10.0)
    p /= p.sum()

    def make(n: int) -> list[str]:
        lengths = rng.integers(8, 15, n)
        words = vocab[rng.choice(len(vocab), int(lengths.sum()), p=p)]
        cuts = np.cumsum(lengths)[:-1]
        return [" ".join(w).capitalize() + "." for w in np.split(words, cuts)]

    train, test = make(n_train), make(n_test)
    src = rng.choice(n_train, k, replace=False)
    for i, j in enumerate(src):
        t = train[j]
        if i % 3 == 0:
            test[i] = t.upper() if i % 2 else t.swapcase()
        elif i % 3 == 1:
            test[i] = t.replace(" ", ", ", 2).replace(".", "!!")
        else:
            w = t.rstrip(".").split(" ")
            w[int(rng.integers(1, len(w)))] = str(vocab[rng.integers(len(vocab))])
            test[i] = " ".join(w) + "."
    return train, test, src


# ---------------------------------------------------------------------------------------------------- near
def near(quick: bool = False, repeats: int = 3, sample: int = 100_000, rows: int | None = None) -> dict:
    """1M x 64 (800k train / 200k test), 1,000 planted near-copies: the index vs exact search extrapolated."""
    import numpy as np
    import pandas as pd

    from tropt.data import ann, check_near_duplicates
    from tropt.data import neighbours as nb

    n = rows or (100_000 if quick else 1_000_000)
    n_train, n_test = int(n * 0.8), n - int(n * 0.8)
    k = 100 if quick else 1000
    sample = min(sample // (10 if quick else 1), n_test)
    watch = LoadWatch("near")
    train, test, src = vectors(n_train, n_test, k=k)
    tr, te = pd.DataFrame(train), pd.DataFrame(test)
    print(f"## near duplicates: {n:,} rows x 64 float32 ({n_train:,} train / {n_test:,} test, "
          f"{k:,} planted near-copies)")
    times, r = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        r = check_near_duplicates({"train": tr, "test": te}, max_evidence=max(1000, 2 * k), progress=False)
        times.append(time.perf_counter() - t)
    ev = r.tables.get("near_duplicates", pd.DataFrame(columns=["row", "earlier_row"]))
    pairs = dict(zip(ev["row"].astype(int), ev["earlier_row"].astype(int)))
    correct = sum(pairs.get(i) == int(s) for i, s in enumerate(src))
    false = len(set(pairs) - set(range(k)))
    print(f"  tropt check (search='auto'): {spread(times, 1, ' s')}  status={r.status.value}  "
          f"method: {r.metrics.get('method')}")
    print(f"  found {correct} of {k} planted pairs (right earlier row), {false} other rows flagged; "
          f"threshold {r.metrics['threshold']:.6f}; the check's own recall {r.metrics.get('recall', float('nan')):.4f} "
          f"({r.metrics.get('recall_sample.test_in_train')} sampled rows + "
          f"{r.metrics.get('recall_probes.test_in_train')} probes at the threshold)")

    # the same prepared vectors as the check (first split's finite mean/std, a constant component of 1)
    mean, std = nb.finite_mean_std(train)
    scale = np.where(np.isfinite(std) & (std > 0), std, 1.0).astype(np.float32)
    p_train = nb.prepare(train, mean.astype(np.float32), scale, offset=1.0)
    p_test = nb.prepare(test, mean.astype(np.float32), scale, offset=1.0)
    rows_s = ann.sample_rows(n_test, sample, seed=7)
    t = time.perf_counter()
    exact_best, exact_arg = nb.nearest(p_test[rows_s], p_train, "cpu")
    t_exact = time.perf_counter() - t
    extrapolated = t_exact * n_test / len(rows_s)
    thr = r.metrics["threshold"]
    exact_best = nb.pair_similarity(p_test[rows_s], p_train[exact_arg])
    near_rows = rows_s[exact_best >= thr]
    found = sum(int(q) in pairs for q in near_rows)
    t = time.perf_counter()
    index = ann.build(p_train)
    ann.tune(index, p_train, thr)
    approx, _ = ann.nearest(index, p_test)
    t_index = time.perf_counter() - t
    hit1 = np.mean(approx[rows_s] >= exact_best.astype(np.float32) - ann.RECALL_TOLERANCE)
    print(f"  exact search (tropt's torch path) on {len(rows_s):,} sampled test rows x {n_train:,} train rows: "
          f"{t_exact:.1f} s -> all {n_test:,} test rows, extrapolated linearly in query rows: {extrapolated:.0f} s")
    print(f"  recall on the {len(rows_s):,}-row sample: {found} of {len(near_rows)} near duplicates exact search finds "
          f"there were flagged = {found / max(1, len(near_rows)):.4f} (goal >= 0.99); recall@1 of the index "
          f"(any similarity) {hit1:.4f} (random 64-d rows have no meaningful nearest neighbour to miss)")
    print(f"  index alone (build + tune + search, {index.method}): {t_index:.1f} s")
    print(f"  -> exact extrapolated / check: {extrapolated / np.median(times):.0f}x  (goal >= 50x); "
          f"/ index alone: {extrapolated / t_index:.0f}x")
    watch.done()
    return {"check_s": times, "exact_extrapolated_s": extrapolated, "found": correct, "planted": k, "false": false,
            "recall_sample": found / max(1, len(near_rows))}


# ---------------------------------------------------------------------------------------------------- text
def text(quick: bool = False, repeats: int = 1, rows: int | None = None, audit: int = 1000) -> dict:
    """1M short texts (800k / 200k), 1,000 planted near-copies: found share and a false-pair audit."""
    import pandas as pd

    from tropt.data import check_near_duplicates

    n = rows or (100_000 if quick else 1_000_000)
    n_train, n_test = int(n * 0.8), n - int(n * 0.8)
    k = 100 if quick else 1000
    watch = LoadWatch("text")
    train, test, src = texts(n_train, n_test, k)
    tr, te = pd.DataFrame({"text": train}), pd.DataFrame({"text": test})
    print(f"## near-duplicate text: {n:,} short texts ({n_train:,} train / {n_test:,} test, {k:,} planted: "
          "re-cased, re-punctuated, one word changed)")
    times, r = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        r = check_near_duplicates({"train": tr, "test": te}, max_evidence=max(audit, 2 * k), progress=False)
        times.append(time.perf_counter() - t)
    ev = r.tables.get("near_duplicates", pd.DataFrame(columns=["row", "earlier_row"]))
    pairs = dict(zip(ev["row"].astype(int), ev["earlier_row"].astype(int)))
    kinds = ["re-cased", "re-punctuated", "one word changed"]
    found = {kind: sum(pairs.get(i) == int(src[i]) for i in range(k) if i % 3 == j) for j, kind in enumerate(kinds)}
    total = sum(found.values())
    print(f"  tropt check (search='auto'): {spread(times, 1, ' s')}  status={r.status.value}  "
          f"method: {r.metrics.get('method')}")
    print(f"  found {total} of {k} = {100 * total / k:.1f}% (goal >= 99%): "
          + ", ".join(f"{kind} {found[kind]}/{len(range(j, k, 3))}" for j, kind in enumerate(kinds)))
    print(f"  LSH candidates {r.metrics.get('lsh_candidates.test_in_train')}, verified exactly "
          f"{r.metrics.get('lsh_verified.test_in_train')}, left out of oversized buckets "
          f"{r.metrics.get('lsh_bucket_capped.test_in_train')}")

    def norm_words(s: str) -> list[str]:
        import re

        return re.sub(r"[\W_]+", " ", s.lower()).split()

    audited = list(pairs.items())[:audit]
    bad = 0
    for q, e in audited:
        planted = q < k and e == int(src[q])
        a, b = norm_words(test[q]), norm_words(train[e])
        one_word = len(a) == len(b) and sum(x != y for x, y in zip(a, b)) <= 1
        bad += not (planted or one_word)
    print(f"  audit of {len(audited)} reported pairs: {bad} false pairs (goal 0); "
          f"{len(set(pairs) - set(range(k)))} reported rows outside the planted ones")
    watch.done()
    return {"check_s": times, "found": total, "planted": k, "false_in_audit": bad, "audited": len(audited)}


# ---------------------------------------------------------------------------------------------------- peers
_STUBS = '''
import sys, types, importlib.abc, importlib.machinery
class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "download":
            return lambda *a, **k: False
        return type(name, (), {"__init__": lambda self, *a, **k: None})
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = ("textblob", "nltk", "transformers", "seqeval", "umap", "fasttext", "langdetect", "tiktoken",
             "onnxruntime", "huggingface_hub", "sentence_transformers", "numba")
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        return _Stub(spec.name)
    def exec_module(self, module):
        module.__path__ = []
sys.meta_path.insert(0, _Finder())
'''


def _peer_worker(kind: str, folder: str) -> dict:
    """Runs in the peers' environment: one peer on the data saved in ``folder``; its time and what it found."""
    import numpy as np
    import pandas as pd

    src = np.load(os.path.join(folder, "src.npy"))
    if kind == "cleanlab":
        from cleanlab import Datalab

        train, test = np.load(os.path.join(folder, "train.npy")), np.load(os.path.join(folder, "test.npy"))
        t = time.perf_counter()
        X = np.concatenate([train, test])
        lab = Datalab(data=pd.DataFrame({"y": np.zeros(len(X), dtype=int)}), label_name="y", verbosity=0)
        lab.find_issues(features=X, issue_types={"near_duplicate": {}})
        issues = lab.get_issues("near_duplicate")
        sets = lab.get_info("near_duplicate")["near_duplicate_sets"]
        pairs = {}
        for i in np.flatnonzero(issues["is_near_duplicate_issue"].to_numpy()):
            if i >= len(train):
                partners = [j for j in sets[i] if j < len(train)]
                if partners:
                    pairs[int(i - len(train))] = [int(j) for j in partners]
        elapsed = time.perf_counter() - t
        correct = sum(int(src[i]) in pairs.get(i, []) for i in range(len(src)))
        return {"tool": "cleanlab Datalab near_duplicate", "s": elapsed, "found": correct, "flagged": len(pairs)}
    exec(_STUBS, {})  # deepchecks.nlp imports NLP model packages this check never uses; not installed here
    from deepchecks.nlp import TextData
    from deepchecks.nlp.checks.train_test_validation.train_test_sample_mix import TrainTestSamplesMix

    train = pd.read_parquet(os.path.join(folder, "train.parquet"))["text"].tolist()
    test = pd.read_parquet(os.path.join(folder, "test.parquet"))["text"].tolist()
    t = time.perf_counter()
    res = TrainTestSamplesMix().run(TextData(raw_text=train, task_type="other"),
                                    TextData(raw_text=test, task_type="other"))
    elapsed = time.perf_counter() - t
    dup = res.value["duplicates"].reset_index()
    found = 0
    if len(dup):
        cols = list(dup.columns)
        dup = dup.rename(columns={cols[0]: "dup", cols[1]: "ds", cols[2]: "id"})
        by = dup.groupby("dup")
        for _, g in by:
            tr_ids = set(g.loc[g["ds"] == "train", "id"].astype(int))
            te_ids = set(g.loc[g["ds"] == "test", "id"].astype(int))
            found += sum(1 for i in te_ids if i < len(src) and int(src[i]) in tr_ids)
    return {"tool": "deepchecks NLP TrainTestSamplesMix", "s": elapsed, "found": found,
            "flagged": round(float(res.value["ratio"] * len(test)))}


def _run_peer(kind: str, folder: str) -> dict:
    if not os.path.exists(PEERS_PYTHON):
        return {"error": f"no peers' environment at {PEERS_PYTHON} (see shared/recipes/peer-benchmarks.md)"}
    out = subprocess.run([PEERS_PYTHON, "-W", "ignore", __file__, "--peer-worker", kind, folder],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def peers(quick: bool = False, repeats: int = 3, tmp: str | None = None, big: bool = False) -> dict:
    """cleanlab (near-duplicate vectors) and deepchecks (near-duplicate text) against tropt on the same data.

    ``big``: the larger sizes each peer still runs here (cleanlab 100k vectors, ~3 min; deepchecks 1M texts), one
    run each; at 1M texts tropt has no exact search to compare (text beyond 200k rows always goes to MinHash)."""
    import numpy as np
    import pandas as pd

    watch = LoadWatch("peers")
    out = {}
    with tempfile.TemporaryDirectory(dir=tmp) as folder:
        nt, nq, k = (16_000, 4_000, 200) if quick else (80_000, 20_000, 1000) if big else (40_000, 10_000, 500)
        train, test, src = vectors(nt, nq, k=k)
        for name, arr in (("train", train), ("test", test), ("src", src)):
            np.save(os.path.join(folder, f"{name}.npy"), arr)
        print(f"## peers, near-duplicate vectors: {nt + nq:,} x 64 ({nq:,} test rows, {k} planted); cleanlab builds an "
              "exact kNN graph (50k: ~40 s here; --big: 100k)")
        peer = _run_peer("cleanlab", folder)
        tr, te = pd.DataFrame(train), pd.DataFrame(test)
        rows = _time_tropt(tr, te, src, k, ("exact", "index"), 1 if big else repeats)
        _show_peer(peer, rows, k)
        out["vectors"] = {"peer": peer, "tropt": rows}
        for f in os.listdir(folder):
            os.remove(os.path.join(folder, f))

        n = 20_000 if quick else 1_000_000 if big else 100_000
        k = 100 if quick else 1000 if big else 500
        train, test, src = texts(int(n * 0.8), n - int(n * 0.8), k)
        pd.DataFrame({"text": train}).to_parquet(os.path.join(folder, "train.parquet"))
        pd.DataFrame({"text": test}).to_parquet(os.path.join(folder, "test.parquet"))
        np.save(os.path.join(folder, "src.npy"), src)
        print(f"## peers, near-duplicate text: {n:,} short texts ({k} planted: a third each re-cased, re-punctuated, "
              "one word changed; deepchecks' normalised-text hashing can only find the first two thirds)")
        peer = _run_peer("deepchecks", folder)
        tr, te = pd.DataFrame({"text": train}), pd.DataFrame({"text": test})
        rows = _time_tropt(tr, te, src, k, ("index",) if n > 200_000 else ("exact", "index"), 1 if big else repeats)
        _show_peer(peer, rows, k)
        out["text"] = {"peer": peer, "tropt": rows}
    watch.done()
    return out


def _time_tropt(tr: pd.DataFrame, te: pd.DataFrame, src: np.ndarray, k: int, searches: tuple, repeats: int) -> dict:
    """tropt's check on the peers' data with each ``search``: {search: (times, planted pairs found with the right
    row)}."""
    from tropt.data import check_near_duplicates

    rows = {}
    for search in searches:
        times, r = [], None
        for _ in range(repeats):
            t = time.perf_counter()
            r = check_near_duplicates({"train": tr, "test": te}, search=search, max_evidence=2 * k, progress=False)
            times.append(time.perf_counter() - t)
        ev = r.tables["near_duplicates"]
        pairs = dict(zip(ev["row"].astype(int), ev["earlier_row"].astype(int)))
        rows[search] = (times, sum(pairs.get(i) == int(s) for i, s in enumerate(src)))
        print(f"  tropt search={search!r:<8} {spread(times, 1, ' s')}  found {rows[search][1]}/{k}  "
              f"({r.metrics.get('method', 'exact search')})")
    return rows


def _show_peer(peer: dict, rows: dict, k: int) -> None:
    import statistics

    if "error" in peer:
        print(f"  peer: ERROR {peer['error']}")
        return
    print(f"  {peer['tool']}: {peer['s']:.1f} s (1 run)  found {peer['found']}/{k}  flagged {peer['flagged']}")
    for search, (times, _) in rows.items():
        print(f"  -> {peer['tool']} / tropt search={search!r}: "
              f"{peer['s'] / statistics.median(times):.1f}x tropt's time")


# ---------------------------------------------------------------------------------------------------- main
def main(args: argparse.Namespace | list[str] | None = None) -> None:
    """``--only {near,text,peers,all}``; also takes bench_data_scale.py's parsed arguments (only, rows, tmp)."""
    if not isinstance(args, argparse.Namespace):
        p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        p.add_argument("--only", choices=["near", "text", "peers", "all"], default="all")
        p.add_argument("--quick", action="store_true", help="a tenth of the sizes")
        p.add_argument("--repeats", type=int, default=None, help="runs per timing (default: near 3, text 1, peers 3)")
        p.add_argument("--sample", type=int, default=100_000, help="test rows searched exactly for recall and timing")
        p.add_argument("--rows", type=int, default=None, help="rows of the near/text sections (default 1M)")
        p.add_argument("--tmp", default=None)
        p.add_argument("--big", action="store_true",
                       help="peers: the larger sizes (cleanlab 100k vectors, deepchecks 1M texts)")
        p.add_argument("--peer-worker", nargs=2, metavar=("KIND", "FOLDER"))
        args = p.parse_args(args)
        if args.peer_worker:
            print(json.dumps(_peer_worker(*args.peer_worker)))
            return
    only, quick = args.only, getattr(args, "quick", False)
    reps = getattr(args, "repeats", None)
    rows = getattr(args, "rows", None) if only != "all" else None  # bench_data_scale's --rows sizes its exact section
    print("(timings on a machine shared with other agents are noisy: compare medians, rerun quiet before quoting)")
    if only in ("near", "all"):
        near(quick, reps or 3, getattr(args, "sample", 100_000), rows)
    if only in ("text", "all"):
        text(quick, reps or 1, rows)
    if only in ("peers", "all"):
        peers(quick, reps or 3, getattr(args, "tmp", None), getattr(args, "big", False))


if __name__ == "__main__":
    main(sys.argv[1:])
