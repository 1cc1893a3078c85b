"""Stage-1 data checks side by side with peers, in one run; prints times, peak memory and ratios (never asserts).

Run it with the peers' environment (tropt is imported from this source tree):

    .venv-peers/bin/python benchmarks/bench_data.py            # everything (deepchecks alone takes ~1 min)
    .venv-peers/bin/python benchmarks/bench_data.py --quick    # smaller sizes, no 10M Parquet
    .venv/bin/python benchmarks/bench_data.py --exact          # only the exact-leakage goal (1M x 20), ~1 min

Each tool runs in its own fresh process (same seeded data) so its peak RSS is its own; times are medians.
1. exact train/test duplicates, 1M rows x 20 columns (10 float, 5 int, 5 string: 3 Arrow/object strings and 2
   categorical), 1% of test copied from train: tropt.data.check_exact_duplicates vs ``pandas.util.hash_pandas_object``
   + ``np.isin`` (the raw hash floor) vs deepchecks ``TrainTestSamplesMix``. The goal (<= 2x the floor, for the check
   alone and through ``tropt.diagnose(splits=..., checks=["data.exact_duplicates"])``, whose run identity reuses the
   check's fingerprints) is judged on interleaved repeats in one process: floor, check and diagnose take turns, and
   the ratio of each repeat is printed as median (min, max). The load average is printed before and after.
2. near duplicates, 50k x 64 float32 (40k train, 10k test, 500 planted near-copies): tropt vs scikit-learn
   ``NearestNeighbors`` (cosine, k=1) vs cleanlab ``Datalab`` ``near_duplicate``.
3. a 10M-row Parquet train split (+1M test) checked for exact duplicates: peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _common import LoadWatch, spread  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    """Peak RSS since the last :func:`reset_peak` (Linux VmHWM), else since the process started."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> float:
    """Reset the peak-RSS mark to the current RSS (Linux: write 5 to clear_refs); returns the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    return rss_mb()


# ---------------------------------------------------------------------------------------------------- data
def table(n_train: int, n_test: int, seed: int = 0):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    n = n_train + n_test
    cols = {}
    for i in range(10):
        cols[f"f{i}"] = rng.normal(size=n)
    for i in range(5):
        cols[f"i{i}"] = rng.integers(0, 1_000_000, n)
    words = np.array([f"w{k:05d}" for k in range(20_000)], dtype=object)
    for i in range(5):
        cols[f"s{i}"] = words[rng.integers(0, len(words), n)]
    df = pd.DataFrame(cols)
    for i in (3, 4):  # categorical string columns beside plain ones
        df[f"s{i}"] = df[f"s{i}"].astype("category")
    train, test = df.iloc[:n_train].reset_index(drop=True), df.iloc[n_train:].reset_index(drop=True)
    k = n_test // 100
    src = rng.choice(n_train, k, replace=False)
    test.iloc[:k] = train.iloc[src].to_numpy()
    test = test.astype(train.dtypes.to_dict())
    return train, test, k


def vectors(n_train: int, n_test: int, d: int = 64, k: int = 500, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    train = rng.normal(size=(n_train, d)).astype(np.float32)
    test = rng.normal(size=(n_test, d)).astype(np.float32)
    src = rng.choice(n_train, k, replace=False)
    test[:k] = train[src] + 1e-3 * rng.normal(size=(k, d)).astype(np.float32)
    return train, test, src


# ---------------------------------------------------------------------------------------------------- workers
def work_exact(tool: str, n_train: int, n_test: int, repeats: int) -> dict:
    import numpy as np
    import pandas as pd

    train, test, k = table(n_train, n_test)
    base = reset_peak()
    times, found = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        if tool == "tropt":
            from tropt.data import check_exact_duplicates

            found = check_exact_duplicates({"train": train, "test": test}, progress=False).metrics["leaked_rows"]
        elif tool == "hash+isin":
            a = pd.util.hash_pandas_object(train, index=False).to_numpy()
            b = pd.util.hash_pandas_object(test, index=False).to_numpy()
            found = int(np.isin(b, a).sum())
        elif tool == "deepchecks":
            from deepchecks.tabular import Dataset
            from deepchecks.tabular.checks import TrainTestSamplesMix

            cat = [c for c in train.columns if c.startswith("s")]
            res = TrainTestSamplesMix().run(Dataset(train, cat_features=cat), Dataset(test, cat_features=cat))
            value = res.value
            found = round(float(value["ratio"] * len(test))) if isinstance(value, dict) and "ratio" in value else value
        times.append(time.perf_counter() - t)
    return {"tool": tool, "median_s": float(np.median(times)), "min_s": min(times), "max_s": max(times),
            "n": len(times), "found": found, "planted": k,
            "peak_mb_over_data": peak_mb() - base, "peak_rss_mb": peak_mb()}


def work_alternate(n_train: int, n_test: int, repeats: int) -> dict:
    """The raw hash floor, the check alone and the check through ``diagnose``, interleaved in one process (the
    order rotates each repeat): the fair time ratios on a shared machine. Returns every repeat's times."""
    import numpy as np
    import pandas as pd

    import tropt
    from tropt.data import check_exact_duplicates

    train, test, k = table(n_train, n_test)
    splits = {"train": train, "test": test}

    def floor():
        a = pd.util.hash_pandas_object(train, index=False).to_numpy()
        b = pd.util.hash_pandas_object(test, index=False).to_numpy()
        return int(np.isin(b, a).sum())

    def check():
        return check_exact_duplicates(splits, progress=False).metrics["leaked_rows"]

    def diagnose():
        rep = tropt.diagnose(splits=splits, checks=["data.exact_duplicates"], progress=False)
        assert rep.identity["data_fingerprint"] and not rep.identity["data_fingerprint_error"]
        return rep["data.exact_duplicates"].metrics["leaked_rows"]

    def hash_only():
        pd.util.hash_pandas_object(train, index=False)
        pd.util.hash_pandas_object(test, index=False)
        return None

    tools = {"hash only": hash_only, "hash+isin": floor, "check": check, "diagnose": diagnose}
    found = {name: fn() for name, fn in tools.items()}  # warm-up: imports and first-call costs, untimed
    times: dict = {name: [] for name in tools}
    for r in range(repeats):
        order = list(tools)[r % len(tools):] + list(tools)[: r % len(tools)]
        for name in order:
            t = time.perf_counter()
            tools[name]()
            times[name].append(time.perf_counter() - t)
    return {"times": times, "found": found, "planted": k}


def work_near(tool: str, n_train: int, n_test: int, repeats: int) -> dict:
    import numpy as np

    train, test, src = vectors(n_train, n_test)
    planted = set(range(len(src)))
    base = reset_peak()
    times, flagged, pairs = [], set(), {}
    for _ in range(repeats):
        t = time.perf_counter()
        if tool == "tropt":
            from tropt.data import check_near_duplicates

            r = check_near_duplicates({"train": train, "test": test}, enabled=True, progress=False)
            ev = r.tables.get("near_duplicates")
            flagged = set(ev["row"]) if ev is not None else set()
            pairs = dict(zip(ev["row"], ev["earlier_row"])) if ev is not None else {}
        elif tool == "sklearn NearestNeighbors":
            from sklearn.neighbors import NearestNeighbors

            nn = NearestNeighbors(n_neighbors=1, metric="cosine").fit(train)
            dist, idx = nn.kneighbors(test)
            hit = np.flatnonzero(dist[:, 0] < 1e-4)  # the same cut-off tropt calibrated (~1 - 0.9999)
            flagged, pairs = set(hit.tolist()), dict(zip(hit.tolist(), idx[hit, 0].tolist()))
        elif tool == "cleanlab Datalab":
            import pandas as pd
            from cleanlab import Datalab

            X = np.concatenate([train, test])
            lab = Datalab(data=pd.DataFrame({"y": np.zeros(len(X), dtype=int)}), label_name="y", verbosity=0)
            lab.find_issues(features=X, issue_types={"near_duplicate": {}})
            issues = lab.get_issues("near_duplicate")
            sets = lab.get_info("near_duplicate")["near_duplicate_sets"]
            flagged, pairs = set(), {}
            for i in np.flatnonzero(issues["is_near_duplicate_issue"].to_numpy()):
                if i >= len(train):
                    partners = [j for j in sets[i] if j < len(train)]
                    if partners:
                        flagged.add(int(i - len(train)))
                        pairs[int(i - len(train))] = int(partners[0])
        times.append(time.perf_counter() - t)
    correct = sum(1 for i in planted if pairs.get(i) == int(src[i]))
    return {"tool": tool, "median_s": float(np.median(times)), "min_s": min(times), "max_s": max(times),
            "n": len(times), "found": len(flagged & planted), "correct_pairs": correct,
            "false": len(flagged - planted), "planted": len(planted), "peak_mb_over_data": peak_mb() - base,
            "peak_rss_mb": peak_mb()}


def write_parquet(path_train: str, path_test: str, n_train: int, n_test: int) -> None:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    def chunk(seed: int, n: int) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        return pd.DataFrame({**{f"f{i}": rng.normal(size=n) for i in range(4)},
                             **{f"i{i}": rng.integers(0, 1_000_000, n) for i in range(2)},
                             "s0": np.array([f"w{k:05d}" for k in rng.integers(0, 20_000, n)], dtype=object)})

    step = 1_000_000
    writer = None
    for a in range(0, n_train, step):
        t = pa.Table.from_pandas(chunk(a, min(step, n_train - a)), preserve_index=False)
        writer = writer or pq.ParquetWriter(path_train, t.schema)
        writer.write_table(t)
    writer.close()
    test = chunk(10**9, n_test)
    k = n_test // 100
    test.iloc[:k] = chunk(0, min(step, n_train)).iloc[:k].to_numpy()  # 1 % copied from train's first rows
    pq.write_table(pa.Table.from_pandas(test.astype(chunk(0, 1).dtypes.to_dict()), preserve_index=False), path_test)


def work_parquet(path_train: str, path_test: str) -> dict:
    from tropt.data import check_exact_duplicates

    t = time.perf_counter()
    r = check_exact_duplicates({"train": path_train, "test": path_test}, progress=False)
    return {"tool": "tropt (Parquet, streamed)", "median_s": time.perf_counter() - t, "found": r.metrics["leaked_rows"],
            "peak_rss_mb": peak_mb()}


def run_worker(kind: str, *args) -> dict:
    """Run one measurement in a fresh process (its own peak RSS) and return its JSON line."""
    out = subprocess.run([sys.executable, __file__, "--worker", kind, *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        return {"tool": args[0] if args else kind,
                "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(title: str, rows: list[dict], ref: str) -> None:
    print(f"\n## {title}")
    base = next((r for r in rows if r.get("tool") == ref and "median_s" in r), None)
    for r in rows:
        if "error" in r:
            print(f"  {r['tool']:<28} ERROR {r['error']}")
            continue
        extra = "".join(f"  {k}={r[k]}" for k in ("found", "correct_pairs", "false", "planted") if k in r)
        ratio = f"  {r['median_s'] / base['median_s']:6.1f}x tropt's time" if base and r is not base else ""
        mem = (f"  peak +{r['peak_mb_over_data']:.0f} MB over data (RSS {r['peak_rss_mb']:.0f} MB)"
               if "peak_mb_over_data" in r else f"  peak RSS {r['peak_rss_mb']:.0f} MB")
        rng = f" (min {r['min_s']:.3f}, max {r['max_s']:.3f}, n={r['n']})" if "min_s" in r else ""
        print(f"  {r['tool']:<28} {r['median_s']:8.3f} s{rng}{ratio}{mem}{extra}")


def show_alternate(n_train: int, n_test: int, repeats: int) -> None:
    """The exact-leakage goal: floor, check and diagnose interleaved in one fresh process."""
    alt = run_worker("alternate", n_train, n_test, repeats)
    if "times" not in alt:
        print(f"  -> alternating: ERROR {alt.get('error')}")
        return
    t = alt["times"]
    print(f"  interleaved in one process, {repeats} repeats (found {alt['found']}, planted {alt['planted']}); the "
          "floor of the old note is hash+isin (hash both frames, test membership); 'hash only' is hash_pandas_object "
          "alone:")
    for name in t:
        print(f"    {name:<10} {spread(t[name], 1, ' s')}")
    for floor in ("hash+isin", "hash only"):
        for name in ("check", "diagnose"):
            ratios = [a / b for a, b in zip(t[name], t[floor])]
            ok = statistics.median(ratios) <= 2.0
            print(f"  -> {name:<8} / {floor:<9} floor: {spread(ratios, 1, 'x', 2)}  "
                  f"target <= 2x: {'met' if ok else 'NOT met'}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--exact", action="store_true",
                   help="only the exact-leakage goal (interleaved floor/check/diagnose)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats of the exact-leakage goal")
    p.add_argument("--worker", nargs="+")
    p.add_argument("--skip", default="", help="comma list of tools to skip, e.g. deepchecks,cleanlab")
    args = p.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "exact":
            res = work_exact(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        elif kind == "alternate":
            res = work_alternate(int(rest[0]), int(rest[1]), int(rest[2]))
        elif kind == "near":
            res = work_near(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        else:
            res = work_parquet(rest[0], rest[1])
        print(json.dumps(res))
        return
    skip = set(args.skip.split(",")) if args.skip else set()
    n_train, n_test = (160_000, 40_000) if args.quick else (800_000, 200_000)
    watch = LoadWatch("bench_data")
    if args.exact:
        print(f"## exact duplicates: {n_train + n_test:,} rows x 20 columns "
              "(10 float, 5 int, 3 string + 2 categorical)")
        show_alternate(n_train, n_test, args.repeats)
        watch.done()
        return
    rows = [run_worker("exact", "tropt", n_train, n_test, 3), run_worker("exact", "hash+isin", n_train, n_test, 3)]
    if "deepchecks" not in skip:
        rows.append(run_worker("exact", "deepchecks", n_train, n_test, 1))
    show(f"exact duplicates: {n_train + n_test:,} rows x 20 columns ({n_train:,} train / {n_test:,} test, "
         "1% of test copied; 10 float, 5 int, 3 string, 2 categorical)", rows, "tropt")
    t = {r["tool"]: r for r in rows if "median_s" in r}
    if "tropt" in t and "hash+isin" in t:
        print(f"  -> tropt / raw hash baseline time: {t['tropt']['median_s'] / t['hash+isin']['median_s']:.2f}x "
              "(target <= 2x)")
    show_alternate(n_train, n_test, 7)
    if "tropt" in t and "deepchecks" in t:
        print(f"  -> deepchecks / tropt time: {t['deepchecks']['median_s'] / t['tropt']['median_s']:.0f}x faster "
              "(target >= 50x)")
    nt, nq = (16_000, 4_000) if args.quick else (40_000, 10_000)
    rows = [run_worker("near", "tropt", nt, nq, 3), run_worker("near", "sklearn NearestNeighbors", nt, nq, 1)]
    if "cleanlab" not in skip:
        rows.append(run_worker("near", "cleanlab Datalab", nt, nq, 1))
    show(f"near duplicates: {nt + nq:,} x 64 float32 ({nq:,} test rows, 500 planted near-copies)", rows, "tropt")
    if not args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            a, b = os.path.join(tmp, "train.parquet"), os.path.join(tmp, "test.parquet")
            write_parquet(a, b, 10_000_000, 1_000_000)
            print(f"\n## 10M-row Parquet ({os.path.getsize(a) / 2**20:.0f} MB on disk) + 1M-row test "
                  "(1% copied = 10,000 rows)")
            r = run_worker("parquet", a, b)
            if "error" in r:
                print(f"  ERROR {r['error']}")
            else:
                print(f"  {r['tool']:<28} {r['median_s']:8.1f} s  peak RSS {r['peak_rss_mb']:.0f} MB "
                      f"(target < 2048 MB)  found={r['found']}")
    watch.done()


if __name__ == "__main__":
    main()
