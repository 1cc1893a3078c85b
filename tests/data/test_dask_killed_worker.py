"""A Dask partition that kills every worker reading it (KilledWorker) is a DataError naming the split and the
partition, not a raw KilledWorker: in the first rows read for the column kinds, and in the map over partitions."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from tropt.data import check_exact_duplicates
from tropt.errors import DataError


def _die_on_marker(part: pd.DataFrame) -> pd.DataFrame:
    if (part["x"] == -1.0).any():  # the poisoned partition: the worker process dies reading it
        os._exit(1)
    return part


def _poisoned(rows: int, at: int):
    dd = pytest.importorskip("dask.dataframe")
    rng = np.random.default_rng(0)
    train = pd.DataFrame({"x": rng.normal(size=rows), "y": rng.integers(0, 2, rows)})
    train.loc[at, "x"] = -1.0
    return dd.from_pandas(train, npartitions=3, sort=False).map_partitions(_die_on_marker, meta=train.iloc[:0])


def test_a_partition_that_kills_every_worker_is_named():
    distributed = pytest.importorskip("distributed")
    import dask

    test = pd.DataFrame({"x": np.arange(60.0) + 10, "y": np.arange(60) % 2})
    # 300 rows: the first rows read (for the column kinds) reach partition 2; 36,000 rows: only the map does.
    cases = [(_poisoned(300, 250), 2), (_poisoned(36_000, 30_000), 2)]
    # One task at a time on the one worker (so only the poisoned one is blamed for its death), no retries.
    config = {"distributed.scheduler.allowed-failures": 0, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(config), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                     dashboard_address=None) as cluster, distributed.Client(cluster):
        for ddf, part in cases:
            want = rf"split 'train': every Dask worker that read partition {part} \(of 3\) died"
            with pytest.raises(DataError, match=want) as err:
                check_exact_duplicates({"train": ddf, "test": test}, label="y", progress=False)
            assert f"get_partition({part})" in err.value.fix
