"""Stage-1 data checks at scale (issue #22): exact leakage over a partitioned Parquet dataset on a local Dask cluster,
and (in benchmarks/_scale_near.py, when present) near duplicates with an ANN index, MinHash text and the peers.

``--only exact``: generates ``--rows`` rows x 20 columns (19 features of float64/float32/int32/int64/string kinds and
an int8 label) as two hive-partitioned Parquet datasets (train 90%, test 10%, ``shard=k/part-*.parquet``) in a
temporary directory, in chunks, with ``rows // 10,000`` test rows that copy a train row's features (spread over the
train chunks and placed at random test positions); then, on a ``LocalCluster`` of ``--workers`` worker processes
(1 thread each):

* the raw ``pyarrow`` read of the same columns (``pyarrow.dataset`` batches, all cores), timed before and after;
* ``tropt.data.check_exact_duplicates`` on the two dataset paths, ``--repeats`` times on the same cluster
  (fingerprints per partition on the workers, the join on the client), with the workers' RSS polled (psutil, every
  0.2 s) and the client's peak RSS. ``dask.dataframe`` is imported before the clock starts (a Dask user has it).

Two ratios: the first check against the first raw read (both cold: the page cache holds the files, but neither
process has touched that much memory yet, and on a VM first touches of memory are expensive), and the median of
the later checks against the second raw read (both warm). The goal (<= 3x) is judged on both.

Prints absolute times, the ratio to the raw read, the planted count against the count found, the peaks and the load
average before/after; deletes the data. Never asserts. The machine may be shared: times taken while the load was
above the core count are marked ``[loaded]`` (benchmarks/_common.py).

``--only near|text|peers|all`` calls ``_scale_near.main(args)`` (benchmarks/_scale_near.py, when present) with the
parsed arguments: ``args.only`` names the section(s), ``args.rows`` is None unless given.

    python benchmarks/bench_data_scale.py --only exact --rows 10000000

    python benchmarks/bench_data_scale.py --only exact --rows 100000000      # 100M rows: ~10 GB on disk
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import LoadWatch  # noqa: E402

CHUNK = 1_000_000  # rows per generated file (one Dask partition each)
SHARDS = 8  # hive partitions per split
FEATURES = ([f"f64_{i}" for i in range(6)] + [f"f32_{i}" for i in range(6)] + [f"i32_{i}" for i in range(5)]
            + ["i64_0", "cat"])
CATS = np.array([f"category_{i:02d}" for i in range(50)], dtype=object)


# ---------------------------------------------------------------------------------------------------- data
def _chunk(rng: np.random.Generator, n: int) -> dict:
    cols: dict = {}
    for c in FEATURES:
        if c.startswith("f64"):
            cols[c] = rng.normal(size=n)
        elif c.startswith("f32"):
            cols[c] = rng.normal(size=n).astype(np.float32)
        elif c.startswith("i32"):
            cols[c] = rng.integers(0, 1_000_000, n, dtype=np.int32)
        elif c.startswith("i64"):
            cols[c] = rng.integers(0, 2**62, n, dtype=np.int64)
        else:
            cols[c] = CATS[rng.integers(0, len(CATS), n)]
    cols["y"] = rng.integers(0, 10, n, dtype=np.int8)
    return cols


def _write(cols: dict, root: str, index: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(root, f"shard={index % SHARDS}")
    os.makedirs(folder, exist_ok=True)
    table = pa.table({k: pa.array(v) if k != "cat" else pa.array(v, type=pa.string()) for k, v in cols.items()})
    pq.write_table(table, os.path.join(folder, f"part-{index:05d}.parquet"), row_group_size=250_000)


def generate(root: str, rows: int, seed: int = 0) -> tuple[str, str, int]:
    """(train path, test path, planted count): train 90%, test 10%, rows // 10,000 planted copies."""
    train_rows, test_rows = int(rows * 0.9), rows - int(rows * 0.9)
    planted = max(1, rows // 10_000)
    train_dir, test_dir = os.path.join(root, "train"), os.path.join(root, "test")
    n_train_chunks = -(-train_rows // CHUNK)
    per_chunk = -(-planted // n_train_chunks)
    stash: list[dict] = []
    taken = 0
    for i in range(n_train_chunks):
        n = min(CHUNK, train_rows - i * CHUNK)
        rng = np.random.default_rng([seed, 0, i])
        cols = _chunk(rng, n)
        k = min(per_chunk, planted - taken, n)
        if k > 0:
            pick = rng.choice(n, k, replace=False)
            stash.append({c: cols[c][pick] for c in FEATURES})
            taken += k
        _write(cols, train_dir, i)
    copies = {c: np.concatenate([s[c] for s in stash]) for c in FEATURES}
    n_test_chunks = -(-test_rows // CHUNK)
    rng_place = np.random.default_rng([seed, 2])
    where = np.sort(rng_place.choice(test_rows, planted, replace=False))  # test positions of the copies
    for j in range(n_test_chunks):
        a, n = j * CHUNK, min(CHUNK, test_rows - j * CHUNK)
        cols = _chunk(np.random.default_rng([seed, 1, j]), n)
        lo, hi = np.searchsorted(where, [a, a + n])
        for c in FEATURES:
            cols[c][where[lo:hi] - a] = copies[c][lo:hi]
        _write(cols, test_dir, j)
    return train_dir, test_dir, planted


def du_gb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 1e9


# ---------------------------------------------------------------------------------------------------- measuring
class RssPoller:
    """Peak RSS of a set of processes, polled in a thread (psutil): a worker's peak between polls may be missed,
    so the interval is short."""

    def __init__(self, pids: dict, interval: float = 0.2) -> None:
        import psutil

        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.peak = {name: 0 for name in pids}
        self.interval, self._stop = interval, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, p in self.procs.items():
                with contextlib.suppress(Exception):  # a worker that restarted: keep its last peak
                    self.peak[name] = max(self.peak[name], p.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def peak_rss_gb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2
    return float("nan")


def raw_read(paths: list[str], columns: list[str]) -> tuple[float, int]:
    """Seconds and rows of reading ``columns`` of every dataset with pyarrow (batches, all cores, nothing kept)."""
    import pyarrow.dataset as ds

    t0, rows = time.perf_counter(), 0
    for p in paths:
        for batch in ds.dataset(p, format="parquet", partitioning="hive").to_batches(columns=columns):
            rows += batch.num_rows
    return time.perf_counter() - t0, rows


def bench_exact(rows: int, workers: int, tmp: str | None, repeats: int = 3) -> None:
    import dask.dataframe  # noqa: F401 - imported before the clock starts: a Dask user has it
    from distributed import Client, LocalCluster

    from tropt.data import check_exact_duplicates

    watch = LoadWatch("exact")
    root = tempfile.mkdtemp(prefix="tropt-scale-", dir=tmp)
    try:
        t0 = time.perf_counter()
        train, test, planted = generate(root, rows)
        gen_s = time.perf_counter() - t0
        print(f"[exact] generated {rows:,} rows x {len(FEATURES) + 1} columns ({du_gb(root):.2f} GB Parquet, "
              f"{SHARDS} hive partitions per split, {CHUNK:,} rows per file) in {gen_s:.1f} s; "
              f"planted copies: {planted:,}")
        cols = [*FEATURES, "y"]
        raw1, got_rows = raw_read([train, test], cols)
        print(f"[exact] raw pyarrow read of the same {len(cols)} columns: {raw1:.1f} s ({got_rows:,} rows)")
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                             memory_limit=0) as cluster, Client(cluster) as client:
            pids = client.run(os.getpid)
            import psutil

            # Each worker imports tropt's data module on its first task (torch comes with it): say what that costs.
            client.run(lambda: __import__("tropt.data.dask_splits"))
            idle = {w: psutil.Process(pid).memory_info().rss for w, pid in pids.items()}
            print("[exact] worker RSS before the check, tropt imported: "
                  + ", ".join(f"{v / 1024**3:.2f} GB" for v in idle.values()))

            client_before = psutil.Process().memory_info().rss
            times, res = [], None
            with RssPoller({**pids, "client": os.getpid()}) as poll:
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    res = check_exact_duplicates({"train": train, "test": test}, label="y", features=FEATURES,
                                                 progress=False)
                    times.append(time.perf_counter() - t0)
                    found = res.metrics["leaked_rows"]
                    print(f"[exact] tropt check_exact_duplicates on a LocalCluster of {workers} worker processes: "
                          f"{times[-1]:.1f} s; status {res.status.value}; leaked rows found {found:,} / "
                          f"planted {planted:,} "
                          f"({'exact' if found == planted else 'MISMATCH'})")
        raw2, _ = raw_read([train, test], cols)
        print(f"[exact] raw pyarrow read again: {raw2:.1f} s")
        print(f"[exact] cold: first check / first raw read = {times[0]:.1f} / {raw1:.1f} s = "
              f"{times[0] / raw1:.2f}x (goal <= 3x)")
        if len(times) > 1:
            warm = float(np.median(times[1:]))
            print(f"[exact] warm: median of later checks / second raw read = {warm:.1f} / {raw2:.1f} s = "
                  f"{warm / raw2:.2f}x (goal <= 3x)")
        for w, b in poll.peak.items():
            if w != "client":
                print(f"[exact] peak RSS worker {w}: {b / 1024**3:.2f} GB (goal < 3 GB)")
        print(f"[exact] client process RSS: {client_before / 1024**3:.2f} GB before the check, "
              f"peak {poll.peak['client'] / 1024**3:.2f} GB "
              "during it (it gathers 9 bytes per row, fingerprints and labels, and joins the fingerprints with one "
              "sort)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        watch.done()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["exact", "near", "text", "peers", "all"], default="all")
    ap.add_argument("--rows", type=int, default=None, help="rows of the exact section's dataset (default 100M); "
                    "the near/text/peers sections read it as their size when they accept one")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="checks run on the same cluster (the first is the cold one)")
    ap.add_argument("--tmp", default=None, help="directory for the generated data (default: the system's temp dir)")
    args = ap.parse_args(argv)
    if args.only in ("exact", "all"):
        bench_exact(args.rows or 100_000_000, args.workers, args.tmp, args.repeats)
    if args.only in ("near", "text", "peers", "all"):
        if importlib.util.find_spec("_scale_near") is None:
            print(f"[{args.only}] benchmarks/_scale_near.py is not here: the near/text/peers sections are not run")
        else:
            import _scale_near

            _scale_near.main(args)


if __name__ == "__main__":
    main()
