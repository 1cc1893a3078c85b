"""Reading curves from where users log: TensorBoard (tensorboard's reader and the fallback must agree), MLflow, W&B."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tropt.dynamics import diagnose_curves, read_mlflow, read_tensorboard, read_wandb
from tropt.dynamics.logs import read_tensorboard_builtin


def _falling(n=120, seed=0, diverge_at=None):
    rng = np.random.default_rng(seed)
    y = 2.0 * np.exp(-np.arange(n) / 30) + 0.3 + 0.02 * rng.standard_normal(n)
    if diverge_at is not None:
        y[diverge_at:] = y[diverge_at] * np.exp(np.arange(n - diverge_at) / 8)
    return y


def _write_tb(logdir, n=120):
    """SummaryWriter with scalars, histograms, text, images and a TF2-style scalar tensor, plus a restart."""
    pytest.importorskip("tensorboard")
    import torch
    from tensorboard.compat.proto import summary_pb2, tensor_pb2
    from torch.utils.tensorboard import SummaryWriter

    y = _falling(n)
    w = SummaryWriter(str(logdir))
    for step, v in enumerate(y):
        w.add_scalar("train/loss", float(v), step)
        if step % 10 == 0:
            w.add_scalar("val/loss", float(v) + 0.1, step)
            w.add_histogram("weights", torch.randn(50), step)
            w.add_text("note", f"step {step}", step)
            tensor = tensor_pb2.TensorProto(dtype=1, float_val=[float(v) * 2], tensor_shape={})
            summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="tf2/loss", tensor=tensor,
                                                                         metadata={"plugin_data": {"plugin_name": "scalars"}})])
            w._get_file_writer().add_summary(summ, step)
    w.add_image("img", torch.rand(3, 4, 4), 0)
    w.add_scalar("train/loss", 9.0, 5)  # a step written again after a restart
    w.close()
    return y


def test_fallback_reader_equals_event_accumulator(tmp_path):
    _write_tb(tmp_path / "run" / "version_0")
    tb = read_tensorboard(tmp_path / "run", engine="tensorboard")
    builtin = read_tensorboard_builtin(tmp_path / "run")
    assert set(tb) == set(builtin) == {"train/loss", "val/loss", "tf2/loss"}
    for tag in tb:
        np.testing.assert_array_equal(tb[tag][0], builtin[tag][0])
        np.testing.assert_array_equal(tb[tag][1], builtin[tag][1])
    assert tb["train/loss"][0].size == 121 and tb["tf2/loss"][0].size == 12
    # cross-check against EventAccumulator used directly, as tensorboard's UI would
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    f = next((tmp_path / "run" / "version_0").glob("*tfevents*"))
    acc = EventAccumulator(str(f), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    direct = sorted((e.step, e.value) for e in acc.Scalars("val/loss"))
    np.testing.assert_array_equal(np.array(direct)[:, 1], builtin["val/loss"][1])


def test_auto_engine_is_tensorboards_and_diagnoses_the_same(tmp_path):
    _write_tb(tmp_path)
    a = diagnose_curves(tmp_path)
    assert a.metrics["points"] == 121 and a.metrics["val_points"] == 12


def test_builtin_reader_ignores_text_and_histograms(tmp_path):
    _write_tb(tmp_path)
    assert "note" not in read_tensorboard_builtin(tmp_path) and "weights" not in read_tensorboard_builtin(tmp_path)


def test_unknown_engine_is_an_error(tmp_path):
    from tropt.errors import TroptError

    with pytest.raises(TroptError, match="engine"):
        read_tensorboard(tmp_path, engine="tf")


def _mlflow(tmp_path, y, experiment="exp"):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment(experiment)
    run = client.create_run(exp)
    from mlflow.entities import Metric

    metrics = [Metric("train_loss", float(v), 0, i) for i, v in enumerate(y)]
    metrics += [Metric("val_loss", float(v) + 0.1, 0, i) for i, v in enumerate(y) if i % 10 == 0]
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id)
    return mlflow, uri, run.info.run_id


def test_mlflow_run_read_back_and_diagnosed(tmp_path):
    y = _falling(150, diverge_at=100)
    mlflow, uri, run_id = _mlflow(tmp_path, y)
    curves = read_mlflow(run_id, tracking_uri=uri)
    np.testing.assert_allclose(curves["train_loss"][1], y)
    assert curves["val_loss"][0].tolist() == list(range(0, 150, 10))
    by_name = read_mlflow(experiment="exp", tracking_uri=uri)
    np.testing.assert_array_equal(by_name["train_loss"][1], curves["train_loss"][1])
    from support import mlflow_tracking_uri

    with mlflow_tracking_uri(uri):
        r = diagnose_curves(f"runs:/{run_id}")
    assert r.status.value == "fail" and r.metrics["class"] == "diverging"
    assert r.metrics["val_points"] == 15
    (tmp_path / "h").mkdir()
    _, h_uri, h_run = _mlflow(tmp_path / "h", _falling(150), "healthy")
    assert diagnose_curves(read_mlflow(h_run, tracking_uri=h_uri)).metrics["class"] != "diverging"


def test_wandb_offline_run_read_back_and_diagnosed(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    y = _falling(150, diverge_at=100)
    run = wandb.init(project="tropt-test", dir=str(tmp_path), mode="offline")
    for i, v in enumerate(y):
        row = {"train/loss": float(v)}
        if i % 10 == 0:
            row["val/loss"] = float(v) + 0.1
        run.log(row)
    run.log({"train/loss": math.nan})  # a NaN is kept as a NaN loss
    run.finish()
    _wait_for_wandb(tmp_path / "wandb")
    curves = read_wandb(tmp_path / "wandb")
    np.testing.assert_allclose(curves["train/loss"][1][:150], y)
    assert math.isnan(curves["train/loss"][1][-1])
    assert curves["val/loss"][0].tolist() == list(range(0, 150, 10))
    run_dir = next((tmp_path / "wandb").glob("offline-run-*"))
    r = diagnose_curves(run_dir)
    assert r.status.value == "fail" and "non_finite" in r.metrics["classes"]
    assert r.metrics["val_points"] == 15


def _wait_for_wandb(wandb_dir, timeout=60.0):
    """wandb.finish() in offline mode may return before wandb's service wrote the run file: wait for its exit record."""
    import time

    from tropt.dynamics.logs import wandb_finished

    deadline = time.monotonic() + timeout
    while not wandb_finished(wandb_dir):
        assert time.monotonic() < deadline, "wandb never wrote the run's exit record"
        time.sleep(0.1)
