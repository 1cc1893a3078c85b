"""Executors and tracking: identical results sequentially, on a Dask LocalCluster and in a process pool; a worker that
dies is a failed run; MLflow runs read back with mlflow.search_runs match the table."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os

import pandas as pd
import pytest
from support.compare_setups import adam, make_setup

import tropt

SAME = ["candidate", "seed", "status", "stopped_by", "steps", "samples", "score", "final", "best", "best_step",
        "final_val_accuracy", "non_finite", "spikes", "curve_class"]


def _compare(**kw):
    # A lambda in the Setup and in the candidate: runs travel with cloudpickle.
    setup = make_setup(lr=0.05)
    return tropt.compare(setup, {"adam": {"optimizer": adam(3e-3)}}, budget=tropt.Budget(steps=30), seeds=(0, 1),
                         reinit=True, eval_every=10, progress=False, **kw)


@pytest.fixture(scope="module")
def sequential():
    return _compare()


def _assert_same(a, b):
    pd.testing.assert_frame_equal(a.runs[SAME], b.runs[SAME])
    for r in a.runs.itertuples():
        assert a.curves(r.candidate, r.seed) == b.curves(r.candidate, r.seed)


@pytest.mark.slow  # starting two worker processes takes ~10 s on a loaded 2-core machine; `make test` runs it
def test_identical_on_a_dask_local_cluster(sequential):
    pytest.importorskip("dask.distributed")
    from tropt.experiments import dask_executor

    with dask_executor(n_workers=2) as ex:
        on_dask = _compare(executor=ex)
    assert on_dask.meta["executor"] == "DaskExecutor"
    _assert_same(sequential, on_dask)


def test_identical_in_a_process_pool(sequential):
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as ex:
        pooled = _compare(executor=ex)
    _assert_same(sequential, pooled)


def test_a_worker_that_dies_is_a_failed_run():
    main = os.getpid()

    def dies(ctx, micro_batches):
        if os.getpid() != main:
            os._exit(3)  # the worker process vanishes without a Python exception
        return tropt.standard_step(ctx, micro_batches)

    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as ex:
        comp = tropt.compare(make_setup(), {"dies": {"step": dies}}, budget=tropt.Budget(steps=5), seeds=(0, 1, 2),
                             executor=ex, progress=False)
    dead = comp.runs.query("candidate == 'dies'")
    assert (dead["status"] == "failed").all()
    assert dead["reason"].str.contains("the executor lost this run").all()
    assert dead["reason"].str.contains("BrokenProcessPool").all()
    assert comp.decision().iloc[0]["verdict"] == "inconclusive"


@pytest.mark.slow  # creating MLflow's SQLite schema takes ~10 s; `make test` runs it
def test_mlflow_runs_match_the_table(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    comp = _compare(tracking=str(tmp_path))
    info = comp.meta["tracking"]
    assert info["uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}" and (tmp_path / "mlflow.db").exists()
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(info["uri"])
    try:
        found = mlflow.search_runs(experiment_ids=[info["experiment_id"]])
    finally:
        mlflow.set_tracking_uri(previous)
    assert len(found) == len(comp.runs) == 4
    found = found.assign(seed=found["params.seed"].astype(int)).rename(columns={"params.candidate": "candidate"})
    merged = comp.runs.merge(found, on=["candidate", "seed"], suffixes=("", "_mlflow"))
    assert len(merged) == 4
    assert (merged["metrics.score"] - merged["score"]).abs().max() < 1e-9
    assert (merged["metrics.steps"] == merged["steps"]).all()
    assert (merged["tags.tropt.status"] == merged["status"]).all()
    assert merged["tags.tropt.identity.config_hash"].notna().all()
    adam_run = merged.query("candidate == 'adam'").iloc[0]
    assert (adam_run["params.override.optimizer"] == comp.meta["candidates"]["adam"]["optimizer"]
            == "Adam(lr=0.003)")  # issue #30: by what it builds, not "adam.<locals>.<lambda>"
    client = mlflow.tracking.MlflowClient(tracking_uri=info["uri"])
    history = client.get_metric_history(adam_run["run_id"], "train_loss")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        comp.curves("adam", int(adam_run["seed"]))["train_loss"])
