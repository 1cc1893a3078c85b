"""Splits as Dask collections (issue #22): a hive-partitioned Parquet dataset and a Dask DataFrame give the same
Report as the pandas path on the same data, with planted exact duplicates, group leaks and temporal leaks of known
count; one run on a 2-process LocalCluster; bad input as clear DataErrors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

dd = pytest.importorskip("dask.dataframe")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import tropt  # noqa: E402
from tropt.data import check_exact_duplicates, check_splits, limits  # noqa: E402
from tropt.errors import DataError  # noqa: E402
from tropt.registry import find_spec  # noqa: E402
from tropt.result import Status  # noqa: E402

N_TRAIN, N_TEST = 3000, 1000
DUPES, GROUP_LEAKS, TIME_LEAKS = 17, 23, 11  # planted in the test split


def make_splits(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """train/test with DUPES test rows copying a train row's features, GROUP_LEAKS test rows sharing a train user
    id, and TIME_LEAKS test rows dated before the end of train (all three planted on different test rows)."""
    rng = np.random.default_rng(seed)

    def table(n: int, uid0: int, start: str, days: int) -> pd.DataFrame:
        return pd.DataFrame({
            "uid": np.arange(uid0, uid0 + n),
            "ts": pd.Timestamp(start) + pd.to_timedelta(np.sort(rng.integers(0, days * 86400, n)), unit="s"),
            "x1": rng.normal(size=n), "x2": rng.normal(size=n), "k": rng.integers(0, 1000, n),
            "word": rng.choice(["red", "green", "blue", "cyan"], n),
            "region": rng.choice(["eu", "us", "asia"], n),
            "y": rng.integers(0, 3, n),
        })

    train = table(N_TRAIN, 0, "2024-01-01", 300)
    test = table(N_TEST, 100_000, "2025-01-01", 60)
    feats = ["x1", "x2", "k", "word", "region"]
    src = rng.choice(N_TRAIN, DUPES, replace=False)
    test.loc[:DUPES - 1, feats] = train.loc[src, feats].to_numpy()
    test.loc[DUPES:DUPES + GROUP_LEAKS - 1, "uid"] = rng.choice(N_TRAIN, GROUP_LEAKS, replace=False)
    test.loc[100:100 + TIME_LEAKS - 1, "ts"] = pd.Timestamp("2024-06-01")
    test[["x1", "x2"]] = test[["x1", "x2"]].astype(float)
    test["k"] = test["k"].astype(np.int64)
    return train, test


def write_dataset(df: pd.DataFrame, root) -> str:
    """A hive-partitioned Parquet dataset (region=eu/, region=us/, ...), several files per partition."""
    for region, rows in df.groupby("region", sort=True):
        folder = root / f"region={region}"
        folder.mkdir(parents=True)
        for i, a in enumerate(range(0, len(rows), 400)):
            table = pa.Table.from_pandas(rows.iloc[a:a + 400].drop(columns="region"), preserve_index=False)
            pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=200)
    return str(root)


OPTIONS = {"label": "y", "group": "uid", "time": "ts"}


def assert_same_report(a, b) -> None:
    """Statuses, summaries, metrics and evidence tables equal, check by check."""
    assert [r.check for r in a.results] == [r.check for r in b.results]
    for ra, rb in zip(a.results, b.results):
        assert (ra.check, ra.status, ra.summary) == (rb.check, rb.status, rb.summary)
        assert (json.dumps(ra.to_dict()["metrics"], sort_keys=True, default=str)
                == json.dumps(rb.to_dict()["metrics"], sort_keys=True, default=str)), ra.check
        assert ra.tables.keys() == rb.tables.keys(), ra.check
        for k in ra.tables:
            pd.testing.assert_frame_equal(ra.tables[k], rb.tables[k], check_dtype=False, check_categorical=False,
                                          obj=f"{ra.check} table {k}")
        assert ra.advice == rb.advice
        assert ra.series.keys() == rb.series.keys(), ra.check
        for k in ra.series:
            np.testing.assert_array_equal(np.asarray(ra.series[k]), np.asarray(rb.series[k]),
                                          err_msg=f"{ra.check} series {k}")


def assert_planted(report) -> None:
    ex, gl, tl = report["data.exact_duplicates"], report["data.group_leakage"], report["data.temporal_leakage"]
    assert ex.metrics["leaked_rows"] == DUPES and len(ex.tables["leaked_rows"]) == DUPES
    assert (gl.status in (Status.FAIL, Status.WARN)
            and gl.metrics["shared_groups"] == gl.metrics["affected_rows"] == GROUP_LEAKS)
    assert tl.status != Status.PASS and tl.metrics["overlap_rows"] == TIME_LEAKS


def test_partitioned_parquet_dataset_gives_the_pandas_report(tmp_path, monkeypatch):
    # A small sample limit makes the single-feature models' sample a strict subset drawn across the partitions.
    monkeypatch.setattr(limits, "SAMPLE_ROWS", 500)
    train, test = make_splits()
    paths = {"train": write_dataset(train, tmp_path / "train"), "test": write_dataset(test, tmp_path / "test")}
    assert dd.read_parquet(paths["train"]).npartitions > 3
    on_dask = check_splits(paths, progress=False, **OPTIONS)
    # The same data in memory: what pandas reads of the dataset (hive partitions as a categorical column).
    in_memory = check_splits({k: pd.read_parquet(p) for k, p in paths.items()}, progress=False, **OPTIONS)
    assert_same_report(on_dask, in_memory)
    assert_planted(on_dask)
    assert on_dask["data.target_leakage"].status != Status.ERROR
    # Alone, target_leakage reads only the row sample: drawn across the partitions by Dask (a second pass), it must
    # be the in-memory path's sample, row for row, so the single-feature scores agree.
    alone = tropt.data.check_target_leakage(paths, progress=False, **OPTIONS)
    want = in_memory["data.target_leakage"]
    assert (alone.status, alone.summary, alone.metrics) == (want.status, want.summary, want.metrics)
    from tropt.data.readers import Reader
    from tropt.data.scan import scan
    from tropt.data.split_data import Options

    sample = scan(Reader(paths["test"], "test", Options.make(**OPTIONS)), "test", Options.make(**OPTIONS),
                  kinds=None, needs=frozenset({"sample"})).sample
    assert len(sample) == 500
    ref = scan(pd.read_parquet(paths["test"]), "test", Options.make(**OPTIONS), needs=frozenset({"sample"})).sample
    pd.testing.assert_frame_equal(sample, ref, check_dtype=False, check_categorical=False)
    # Row ids are positions in the dataset, so the evidence points at the dataset's rows.
    ev = on_dask["data.exact_duplicates"].tables["leaked_rows"]
    back = pd.read_parquet(paths["test"]).iloc[ev["row"].to_numpy()]
    full = pd.read_parquet(paths["train"]).iloc[ev["earlier_row"].to_numpy()]
    cols = ["x1", "x2", "k", "word"]
    np.testing.assert_array_equal(back[cols].to_numpy(), full[cols].to_numpy())


def test_a_glob_over_the_files_reads_the_same_rows(tmp_path):
    train, test = make_splits(1)
    train.drop(columns="region").to_parquet(tmp_path / "train.parquet")
    for i, a in enumerate(range(0, N_TEST, 400)):
        test.drop(columns="region").iloc[a:a + 400].to_parquet(tmp_path / f"test-{i}.parquet", index=False)
    glob = str(tmp_path / "test-*.parquet")
    got = check_exact_duplicates({"train": str(tmp_path / "train.parquet"), "test": glob}, progress=False, **OPTIONS)
    want = check_exact_duplicates({"train": train.drop(columns="region"),
                                   "test": test.drop(columns="region").reset_index(drop=True)},
                                  progress=False, **OPTIONS)
    assert got.metrics["leaked_rows"] == want.metrics["leaked_rows"] == DUPES
    pd.testing.assert_frame_equal(got.tables["leaked_rows"], want.tables["leaked_rows"], check_dtype=False)


def test_dask_dataframe_gives_the_pandas_report(monkeypatch):
    monkeypatch.setattr(limits, "SAMPLE_ROWS", 500)
    train, test = make_splits(2)
    test.index = test.index + 50_000  # the evidence shows index labels, as for a pandas DataFrame
    splits = {"train": dd.from_pandas(train, npartitions=4), "test": dd.from_pandas(test, npartitions=3)}
    on_dask = check_splits(splits, progress=False, **OPTIONS)
    in_memory = check_splits({k: v.compute() for k, v in splits.items()}, progress=False, **OPTIONS)
    assert_same_report(on_dask, in_memory)
    assert_planted(on_dask)
    assert on_dask["data.exact_duplicates"].tables["leaked_rows"]["row"].min() >= 50_000
    # A pandas split beside a Dask one: one comparison, the same answers.
    mixed = check_splits({"train": train, "test": splits["test"]}, progress=False, **OPTIONS)
    assert_same_report(mixed, in_memory)


def test_a_clean_dask_split_passes_the_leakage_checks(tmp_path):
    train, test = make_splits(3)
    test = test.iloc[200:].reset_index(drop=True)  # none of the planted rows
    report = check_splits({"train": dd.from_pandas(train, npartitions=3), "test": dd.from_pandas(test, npartitions=2)},
                          progress=False, **OPTIONS)
    for cid in ("data.exact_duplicates", "data.group_leakage", "data.temporal_leakage"):
        assert report[cid].status == Status.PASS, report[cid].summary


def test_local_cluster_runs_the_map_and_the_time_reduce_on_its_workers(tmp_path):
    distributed = pytest.importorskip("distributed")
    from tropt.data import dask_splits

    train, test = make_splits(4)
    paths = {"train": write_dataset(train, tmp_path / "train"), "test": write_dataset(test, tmp_path / "test")}
    in_memory = check_splits({k: pd.read_parquet(p) for k, p in paths.items()}, progress=False, **OPTIONS)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        assert dask_splits.current_client() is client
        on_cluster = check_splits(paths, progress=False, **OPTIONS)
        # Alone (no near-duplicate vectors asked for), the splits are not gathered: the time column stays on the
        # workers and data.temporal_leakage reduces it per partition (min/max, rows before an end, histograms).
        alone = [tropt.data.check_temporal_leakage(paths, progress=False, **OPTIONS)]
        with distributed.get_task_stream(client) as stream:
            alone.append(check_exact_duplicates(paths, progress=False, **OPTIONS))
        exact_tasks = [str(t["key"]) for t in stream.data if "_summarise" in str(t["key"])]
        with distributed.get_task_stream(client) as stream:
            alone.insert(0, tropt.data.check_temporal_leakage(paths, progress=False, **OPTIONS))
    ran = {}
    for t in stream.data:
        for name in ("_summarise", "_part_rows_before", "_part_histogram"):
            if name in str(t["key"]):
                ran.setdefault(name, set()).add(t["worker"])
    assert ran.get("_summarise"), "the fingerprints were not computed on the cluster"
    assert ran.get("_part_rows_before") and ran.get("_part_histogram"), "the time reduce did not run on the cluster"
    # Both splits' maps start before the first is waited on (prefetch), and the scans find those same tasks: one
    # task key per partition (9 files of train, 3 of test). (This FAIL's feature-space bound scans a second time,
    # for the row sample, with the same keys.)
    assert len(set(exact_tasks)) == 9 + 3
    for got in alone[1:]:
        want = in_memory[got.check]
        assert (got.status, got.summary, got.metrics) == (want.status, want.summary, want.metrics)
        for k in want.tables:
            pd.testing.assert_frame_equal(got.tables[k], want.tables[k], check_dtype=False)
        for k in want.series:
            np.testing.assert_array_equal(got.series[k], want.series[k])
    assert_same_report(on_cluster, in_memory)
    assert_planted(on_cluster)
    assert on_cluster["data.exact_duplicates"].metrics["conflicting_labels"] > 0  # copies with another label


# ---------------------------------------------------------------------------------------------------- bad input
def _hide_tropt() -> None:
    """On a worker: forget tropt and refuse to import it again (a worker environment without tropt)."""
    import sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name == "tropt" or name.startswith("tropt."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Refuse())
    for m in [m for m in sys.modules if m == "tropt" or m.startswith("tropt.")]:
        del sys.modules[m]


def _other_version() -> None:
    import tropt

    tropt.__version__ = "0.0.1-other"


@pytest.mark.parametrize("setup, match", [(_hide_tropt, r"cannot import tropt .*No module named 'tropt"),
                                          (_other_version, r"other versions of tropt .*0\.0\.1-other")])
def test_workers_without_this_tropt_are_a_clear_error(tmp_path, setup, match):
    distributed = pytest.importorskip("distributed")
    train, test = make_splits(5)
    paths = {"train": write_dataset(train, tmp_path / "train"), "test": write_dataset(test, tmp_path / "test")}
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        client.run(setup)
        with pytest.raises(DataError, match=match) as err:
            check_exact_duplicates(paths, progress=False, **OPTIONS)
        assert "every worker" in str(err.value) or "same tropt version" in str(err.value)
        report = tropt.diagnose(splits=paths, progress=False, **OPTIONS)  # inside a report: ERROR, the rest runs
        data = [r for r in report.results if find_spec(r.check).needs == "splits"]
        assert data and all(r.status == Status.ERROR for r in data)
        assert "tropt" in report["data.exact_duplicates"].summary


def test_a_glob_that_matches_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"matches no files") as err:
        check_exact_duplicates({"train": str(tmp_path / "nope-*.parquet"), "test": str(tmp_path / "nope-*.parquet")},
                               progress=False)
    assert "pattern" in str(err.value)


def test_partitions_with_different_schemas_name_the_columns(tmp_path):
    train, test = make_splits(5)
    root = tmp_path / "train"
    root.mkdir()
    train.iloc[:1500].to_parquet(root / "a.parquet", index=False)
    odd = train.iloc[1500:].rename(columns={"x2": "x2_renamed"})
    odd["k"] = odd["k"].astype(float)
    odd.to_parquet(root / "b.parquet", index=False)
    with pytest.raises(DataError, match="different schemas") as err:
        check_exact_duplicates({"train": str(root), "test": test}, progress=False)
    msg = str(err.value)
    assert "'x2'" in msg and "'x2_renamed'" in msg and "'k'" in msg and "'x1'" not in msg


def test_a_dask_split_without_the_label_column(tmp_path):
    train, test = make_splits(6)
    splits = {"train": dd.from_pandas(train.drop(columns="y"), npartitions=2),
              "test": dd.from_pandas(test.drop(columns="y"), npartitions=2)}
    with pytest.raises(DataError, match=r"label='y' is not a column"):
        tropt.data.check_label_shift(splits, label="y", progress=False)
    # Inside diagnose: every data check that reads the label is an ERROR, and the report still comes back.
    report = tropt.diagnose(splits=splits, label="y", progress=False)
    reads_label = ["data.exact_duplicates", "data.target_leakage", "data.label_shift", "data.class_coverage",
                   "data.label_sanity"]
    assert all(report[c].status == Status.ERROR
               and "label='y' is not a column" in report[c].summary for c in reads_label)
    assert report["data.group_leakage"].status == Status.SKIP  # no group= given: as for pandas splits
    assert any(r.status == Status.SKIP for r in report.results if find_spec(r.check).needs == "setup")


def test_a_bad_glob_inside_diagnose_is_an_error_result(tmp_path):
    train, _ = make_splits(7)
    report = tropt.diagnose(splits={"train": train, "test": str(tmp_path / "missing-*.parquet")}, label="y",
                            progress=False)
    data = [r for r in report.results if find_spec(r.check).needs == "splits"]
    assert all(r.status == Status.ERROR for r in data) and "matches no files" in data[0].summary


def test_dask_is_imported_only_when_a_split_needs_it():
    import subprocess
    import sys

    code = ("import sys, pandas as pd, tropt; from tropt.data import check_exact_duplicates; "
            "check_exact_duplicates({'a': pd.DataFrame({'x': [1, 2]}), 'b': pd.DataFrame({'x': [2, 3]})}, "
            "progress=False); "
            "print(any(m == 'dask' or m.startswith('dask.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_dask_a_directory_streams_and_a_glob_names_the_extra(tmp_path, monkeypatch):
    import sys

    train, test = make_splits(8)
    paths = {"train": write_dataset(train, tmp_path / "train"), "test": write_dataset(test, tmp_path / "test")}
    with_dask = check_exact_duplicates(paths, progress=False, **OPTIONS)
    monkeypatch.setitem(sys.modules, "dask.dataframe", None)  # `import dask.dataframe` now fails, as when not installed
    streamed = check_exact_duplicates(paths, progress=False, **OPTIONS)  # pyarrow's dataset reader, on this machine
    assert streamed.metrics["leaked_rows"] == with_dask.metrics["leaked_rows"] == DUPES
    pd.testing.assert_frame_equal(streamed.tables["leaked_rows"], with_dask.tables["leaked_rows"], check_dtype=False)
    with pytest.raises(DataError, match=r"tropt\[dask\]"):
        check_exact_duplicates({"train": paths["train"], "test": str(tmp_path / "test" / "*" / "*.parquet")},
                               progress=False, **OPTIONS)
