"""The data checks at scale: a Parquet table with label, group and time, each check timed in its own process.

Issue #16 measured 5M rows x 50 columns not finishing in 9m40s at 3.85 GB peak RSS; the goal is under 60 s and
2 GB for the whole data stage. This script generates the table once (to /tmp, streamed by row group, so the generator
stays small), then runs, each in a fresh process so peak RSS is its own:

* ``scan``: reading and summarising the splits once as ``diagnose`` does (fingerprints, labels, groups, times,
  the row sample; the numeric matrix only for splits small enough for the automatic near-duplicate search);
* every data check alone (its own scan included);
* ``all``: ``tropt.diagnose(checks="data")``, the way a report runs them (one scan shared), with each check's
  share of the time.

    python benchmarks/bench_scale.py --rows 1000000          # find the stage that scales badly
    python benchmarks/bench_scale.py --rows 5000000 --only all

Prints seconds and peak RSS (Linux VmHWM); never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DATA_CHECKS = ["data.exact_duplicates", "data.near_duplicates", "data.group_leakage", "data.temporal_leakage",
               "data.target_leakage", "data.label_shift", "data.class_coverage", "data.label_sanity"]


def peak_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def generate(rows: int, cols: int, out: str, test_share: float = 0.2, chunk: int = 250_000, seed: int = 0) -> dict:
    """train.parquet and test.parquet: ``cols`` columns in all (label, group, time, the rest features), 1% of test
    rows copied from train, test later in time with a 2% overlap (known answers for the leakage checks)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    paths = {"train": os.path.join(out, "train.parquet"), "test": os.path.join(out, "test.parquet")}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    n_test = int(rows * test_share)
    sizes = {"train": rows - n_test, "test": n_test}
    n_float, n_int = cols - 3 - (cols - 3) // 5, (cols - 3) // 5
    rng = np.random.default_rng(seed)
    start = np.datetime64("2024-01-01T00:00:00", "s")
    kept = None  # a few train rows, copied into test
    for split, n in sizes.items():
        writer = None
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            data = {f"f{i}": rng.normal(size=m) for i in range(n_float)}
            data |= {f"i{i}": rng.integers(0, 1000, m) for i in range(n_int)}
            data["label"] = rng.integers(0, 5, m)
            data["user"] = rng.integers(0, rows // 10, m) + (0 if split == "train" else int(rows // 10 * 0.98))
            offset = lo if split == "train" else sizes["train"] + lo - int(0.02 * sizes["train"])
            data["ts"] = start + (np.arange(m) + offset).astype("timedelta64[s]") * 60
            if split == "train" and kept is None:
                kept = {k: v[:: 100][: n_test // 100] for k, v in data.items()}
            if split == "test" and lo == 0:
                k = min(len(kept["label"]), m)
                for c in data:
                    data[c][:k] = kept[c][:k]
            t = pa.table(data)
            writer = writer or pq.ParquetWriter(paths[split], t.schema)
            writer.write_table(t)
        writer.close()
    return paths


def child(what: str, paths: dict) -> dict:
    import tropt
    from tropt.data.cache import session
    from tropt.data.load import Options, load_splits

    t = time.perf_counter()
    if what == "scan":  # as inside diagnose: one read of each split for every check
        with session():
            datas = load_splits(paths, Options.make(label="label", group="user", time="ts"))
        extra = {"rows": sum(d.n for d in datas)}
    else:
        report = tropt.diagnose(splits=paths, label="label", group="user", time="ts",
                                checks="data" if what == "all" else [what], progress=False)
        extra = {"results": {r.check: [r.status.value, round(r.duration_s or 0.0, 2), r.summary[:90]] for r in report}}
    return {"what": what, "seconds": round(time.perf_counter() - t, 2), "peak_rss_mb": round(peak_mb()), **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=50)
    parser.add_argument("--only", nargs="*", help="scan, all, or check ids (default: scan, every check, all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = f"/tmp/tropt-scale-{args.rows}x{args.cols}"
    if args.child:
        print(json.dumps(child(args.child, json.loads(os.environ["TROPT_SCALE_PATHS"]))))
        return
    t = time.perf_counter()
    paths = generate(args.rows, args.cols, out)
    size = sum(os.path.getsize(p) for p in paths.values()) / 2**20
    print(f"data: {args.rows:,} rows x {args.cols} columns, {size:.0f} MiB of Parquet in {out} "
          f"({time.perf_counter() - t:.1f} s)")
    env = {**os.environ, "TROPT_SCALE_PATHS": json.dumps(paths), "PYTHONPATH": ROOT}
    for what in args.only or ["scan", *DATA_CHECKS, "all"]:
        proc = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--cols", str(args.cols),
                               "--child", what], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"{what:<24} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{what:<24} {r['seconds']:>8.1f} s  peak {r['peak_rss_mb']:>6} MB")
        for check, (status, secs, summary) in r.get("results", {}).items():
            if what == "all" or check == what:
                print(f"    {check:<22} {status:<5} {secs:>7.1f} s  {summary}")


if __name__ == "__main__":
    main()
