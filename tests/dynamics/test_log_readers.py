"""Reading curves from where users log: DataFrames and CSV files (Lightning's CSVLogger, Hugging Face's
log_history, TensorBoard's CSV export), TensorBoard event files (tensorboard's reader and the fallback must agree),
MLflow and W&B."""

from __future__ import annotations

import math
import struct

import numpy as np
import pandas as pd
import pytest
from support import curves as cf

from tropt.dynamics import diagnose_curves, read_mlflow, read_tensorboard, read_wandb
from tropt.dynamics.logs import read_tensorboard_builtin
from tropt.errors import TroptError
from tropt.result import Status


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
            summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag="tf2/loss", tensor=tensor, metadata={"plugin_data": {"plugin_name": "scalars"}})])
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
    _, uri, run_id = _mlflow(tmp_path, y)
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


def test_dataframe_csv_and_lightning_csvlogger(tmp_path):
    train, vt, val = cf.overfitting(1000, 0, evals=20)
    steps = np.arange(1000)
    # Lightning CSVLogger: sparse rows, one metric per row
    rows = [{"epoch": s // 100, "step": s, "train_loss": v, "val_loss": np.nan} for s, v in zip(steps, train)]
    rows += [{"epoch": int(s) // 100, "step": int(s), "train_loss": np.nan, "val_loss": v} for s, v in zip(vt, val)]
    df = pd.DataFrame(rows)
    path = tmp_path / "metrics.csv"
    df.to_csv(path, index=False)
    for source in (df, str(path)):
        r = diagnose_curves(source)
        assert r.metrics["class"] == "overfitting", source
        assert r.metrics["points"] == 1000 and r.metrics["val_points"] == 20
    # a plain DataFrame with step + loss, and a Series whose index is the step
    plain = pd.DataFrame({"step": steps * 10, "loss": cf.flat(1000)})
    r = diagnose_curves(plain)
    assert r.metrics["class"] == "flat" and r.metrics["last_step"] == 9990
    assert diagnose_curves(pd.Series(cf.healthy(500), index=np.arange(500) * 2)).metrics["last_step"] == 998


def test_hugging_face_log_history_with_its_final_summary_row():
    # pd.DataFrame(trainer.state.log_history): logging rows (loss, learning_rate, epoch, step), eval rows (eval_loss)
    # and one final summary row whose train_loss is a single number, not the curve.
    train, vt, val = cf.overfitting(200, 0, evals=10)
    rows = []
    evals = dict(zip((int(s) for s in vt), val))
    for s, v in enumerate(train):
        rows.append({"loss": v, "grad_norm": 1.0, "learning_rate": 5e-5, "epoch": s / 100, "step": s})
        if s in evals:
            rows.append({"eval_loss": evals[s], "eval_runtime": 3.2, "epoch": s / 100, "step": s})
    rows.append({"train_runtime": 512.3, "train_samples_per_second": 62.4, "total_flos": 1.2e15,
                 "train_loss": 0.61, "epoch": 2.0, "step": 200})
    r = diagnose_curves(pd.DataFrame(rows))
    assert r.metrics["points"] == 200 and r.metrics["val_points"] == len(evals)
    assert r.metrics["class"] == "overfitting"


def test_nan_losses_in_tables_and_series_fail_like_in_an_array(tmp_path):
    """A logger writes NaN once training blows up: every input form must find it (a dropna hid it, leaving a
    curve that "was still improving"); only rows that log another metric (Lightning's sparse rows) are dropped."""
    y = cf.non_finite(1000)  # NaN from step 700 on
    steps = np.arange(1000)
    plain = pd.DataFrame({"step": steps, "loss": y})
    path = tmp_path / "nan_tail.csv"
    plain.to_csv(path, index=False)
    wide = plain.assign(lr=1e-3, train_acc=np.linspace(0.3, 0.9, 1000), val_acc=np.linspace(0.3, 0.8, 1000))
    tb = pd.DataFrame({"Wall time": steps * 1.0, "Step": steps, "Value": y})
    listed = [None if np.isnan(v) else float(v) for v in y]
    for name, source in [("array", y), ("list with None", listed), ("Series", pd.Series(y)), ("DataFrame", plain),
                         ("CSV", str(path)), ("wide DataFrame", wide), ("TensorBoard CSV", tb)]:
        r = diagnose_curves(source)
        assert r.status == Status.FAIL and r.metrics["class"] == "non_finite", (name, r.summary)
        assert r.metrics["first_non_finite_step"] == 700 and r.metrics["non_finite"] == 300, name
        assert r.metrics["points"] == 1000, name
    # Lightning CSVLogger: sparse validation rows leave the training loss empty; they are not NaN losses
    vt = np.arange(99, 1000, 100)
    rows = [{"epoch": s // 100, "step": s, "train_loss": v, "val_loss": np.nan} for s, v in zip(steps, y)]
    rows += [{"epoch": s // 100, "step": s, "train_loss": np.nan, "val_loss": 1.0} for s in vt]
    sparse = pd.DataFrame(rows)
    r = diagnose_curves(sparse)
    assert r.metrics["class"] == "non_finite" and r.metrics["first_non_finite_step"] == 700
    assert r.metrics["points"] == 1000 and r.metrics["non_finite"] == 300 and r.metrics["val_points"] == 10
    healthy_sparse = sparse.assign(train_loss=np.r_[cf.healthy(1000), np.full(vt.size, np.nan)])
    assert diagnose_curves(healthy_sparse).metrics["non_finite"] == 0


def test_tensorboard_csv_export(tmp_path):
    y = cf.diverging(800)
    tb = pd.DataFrame({"Wall time": np.arange(800.0), "Step": np.arange(800) * 5, "Value": y})
    path = tmp_path / "run-train-tag-loss.csv"
    tb.to_csv(path, index=False)
    r = diagnose_curves(str(path))
    assert r.metrics["class"] == "diverging" and r.metrics["last_step"] == 3995


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(num: int, wt: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wt)
    return key + (_varint(len(payload)) + payload if wt == 2 else payload)


def _event(step: int, tag: str, value: float, tensor: bool = False) -> bytes:
    if tensor:  # TF2 style: a one-element TensorProto (dtype DT_FLOAT, packed float_val)
        proto = _field(1, 0, _varint(1)) + _field(5, 2, struct.pack("<f", value))
        val = _field(1, 2, tag.encode()) + _field(8, 2, proto)
    else:  # torch.utils.tensorboard style: simple_value
        val = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    summary = _field(1, 2, val)
    return _field(1, 1, struct.pack("<d", 1.0)) + _field(2, 0, _varint(step)) + _field(5, 2, summary)


def _crc(data: bytes) -> bytes:
    """The TFRecord masked CRC32C (tensorboard's reader checks it; without tensorboard the fallback ignores it)."""
    try:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError:
        return b"\0" * 4
    return struct.pack("<I", masked_crc32c(data))


def _write_events(path, events):
    header = _field(1, 1, struct.pack("<d", 1.0)) + _field(3, 2, b"brain.Event:2")
    with open(path, "wb") as fh:
        for e in [header, *events]:
            n = struct.pack("<Q", len(e))
            fh.write(n + _crc(n) + e + _crc(e))


def test_tensorboard_event_files(tmp_path):
    train, vt, val = cf.overfitting(600, 1, evals=15)
    events = [_event(i, "train/loss", float(v)) for i, v in enumerate(train)]
    events += [_event(int(s), "val/loss", float(v), tensor=True) for s, v in zip(vt, val)]
    run = tmp_path / "run1"
    run.mkdir()
    _write_events(run / "events.out.tfevents.123.host", events)
    curves = read_tensorboard(run)
    assert set(curves) == {"train/loss", "val/loss"}
    assert np.allclose(curves["train/loss"][1], train, rtol=1e-6)
    r = diagnose_curves(str(run))
    assert r.metrics["class"] == "overfitting" and r.metrics["val_points"] == 15


def test_a_lone_column_not_named_like_a_loss_is_not_read_as_one():
    """An accuracy column rises: read as a loss it was judged "diverging". Only a name that says loss is guessed."""
    steps = np.arange(500)
    with pytest.raises(TroptError, match=r"training loss.*'acc'.*diagnose_curves\(df\['my_loss'\]\)"):
        diagnose_curves(pd.DataFrame({"step": steps, "acc": np.linspace(0.2, 0.9, 500)}))
    y = cf.healthy(500)
    for df in (pd.DataFrame({"step": steps, "my_loss": y}), pd.DataFrame({"step": steps, "val_nll": y}),
               pd.DataFrame(y), pd.DataFrame({"step": steps, "loss": y, "acc": np.linspace(0.2, 0.9, 500)})):
        assert diagnose_curves(df).metrics["class"] == "healthy", list(df.columns)
