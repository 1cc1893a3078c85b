"""GradientMonitor.log_to and Report.log_to: written to TensorBoard, MLflow (sqlite store) and W&B (offline),
read back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import mlflow_tracking_uri
from torch import nn

import tropt
from tropt.dynamics import diagnose_curves, read_wandb
from tropt.errors import TroptError


def _monitored(steps=12, vanish=False):
    torch.manual_seed(0)
    if vanish:  # planted: a deep sigmoid MLP, whose first layers get almost no gradient
        layers = [nn.Linear(8, 32), nn.Sigmoid()]
        for _ in range(11):
            layers += [nn.Linear(32, 32), nn.Sigmoid()]
        model = nn.Sequential(*layers, nn.Linear(32, 3))
    else:
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with tropt.GradientMonitor(model) as mon:
        for _ in range(steps):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return mon


def _report():
    rng = np.random.default_rng(0)
    curve = diagnose_curves(np.exp(np.arange(200) / 40) + 0.01 * rng.standard_normal(200))  # diverging: FAIL
    return tropt.Report([_monitored().result(), curve])


def _accumulator(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def _text(acc, tag):
    return acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def test_monitor_log_to_summary_writer(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    mon = _monitored()
    with SummaryWriter(str(tmp_path)) as w:
        verdict = mon.log_to(w)
        mon.log_to(w)  # a second call adds no duplicate gradient-norm points
    acc = _accumulator(tmp_path)
    norms = acc.Scalars("tropt/grad_norm/global")
    assert [e.step for e in norms] == list(range(12))
    np.testing.assert_allclose([e.value for e in norms], mon.global_norms(), rtol=1e-6)
    assert acc.Scalars("tropt/model.gradient_flow/status")[-1].value == verdict.status.rank
    assert "tropt/grad_rms/0" in acc.Tags()["scalars"]
    assert _text(acc, "tropt/model.gradient_flow/text_summary").startswith("PASS model.gradient_flow")
    img = acc.Images("tropt/model.gradient_flow")[-1]
    assert img.width > 100 and img.height > 100


def test_monitor_log_to_names_a_vanishing_gradient(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path)) as w:
        verdict = _monitored(vanish=True).log_to(w)
    assert verdict.status.value == "fail"
    assert "vanish" in _text(_accumulator(tmp_path), "tropt/model.gradient_flow/text_summary").lower()


def test_report_log_to_summary_writer(tmp_path):
    pytest.importorskip("tensorboard")
    report = _report()
    report.log_to(str(tmp_path / "tb"), step=3)  # a directory: a SummaryWriter there
    acc = _accumulator(tmp_path / "tb")
    assert acc.Scalars("tropt/status")[-1].value == report.status.rank == tropt.Status.FAIL.rank
    assert acc.Scalars("tropt/dynamics.loss_curve/points")[-1].value == 200
    assert _text(acc, "tropt/dynamics.loss_curve/text_summary").startswith("FAIL dynamics.loss_curve: diverging")
    assert "diverging" in _text(acc, "tropt/verdict/text_summary").lower()
    assert {"tropt/dynamics.loss_curve", "tropt/model.gradient_flow"} <= set(acc.Tags()["images"])


def test_log_to_mlflow_sqlite_store(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with mlflow_tracking_uri(uri):
        # no global set
        exp = MlflowClient(uri).create_experiment("tropt-log", artifact_location=str(tmp_path / "artifacts"))
        with mlflow.start_run(experiment_id=exp) as run:
            mon = _monitored()
            mon.log_to("mlflow")
            _report().log_to(run, step=12)
        runs = mlflow.search_runs(experiment_names=["tropt-log"])
        assert len(runs) == 1
        row = runs.iloc[0]
        assert row["tags.tropt/dynamics.loss_curve"].startswith("FAIL dynamics.loss_curve")
        assert row["metrics.tropt/status"] == tropt.Status.FAIL.rank
        hist = MlflowClient(uri).get_metric_history(run.info.run_id, "tropt/grad_norm/global")
        assert [m.step for m in hist] == list(range(12))
        np.testing.assert_allclose([m.value for m in hist], mon.global_norms(), rtol=1e-6)
        arts = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id, "tropt")}
        assert "tropt/model.gradient_flow" in arts


def test_log_to_mlflow_without_an_active_run_says_how_to_fix():
    pytest.importorskip("mlflow")
    import mlflow

    if mlflow.active_run() is not None:
        pytest.skip("an MLflow run is active in this process")
    with pytest.raises(TroptError, match="no active MLflow run"):
        _monitored(steps=2).log_to("mlflow")


def test_log_to_wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="tropt-log", dir=str(tmp_path), mode="offline")
    mon = _monitored()
    mon.log_to(run)
    _report().log_to("wandb", step=12)
    run.finish()
    _wait_for_wandb(tmp_path / "wandb")
    run_dir = next((tmp_path / "wandb").glob("offline-run-*"))
    assert (run_dir / "files" / "media" / "images").is_dir()  # the figures
    curves = read_wandb(run_dir, step_key="tropt/step")
    np.testing.assert_allclose(curves["tropt/grad_norm/global"][1], mon.global_norms(), rtol=1e-6)
    assert curves["tropt/grad_norm/global"][0].tolist() == list(range(12))
    assert curves["tropt/status"][1][-1] == tropt.Status.FAIL.rank
    assert "tropt/dynamics.loss_curve/points" in curves


def test_unknown_target_is_an_error():
    with pytest.raises(TroptError, match="cannot log to a int"):
        _monitored(steps=2).log_to(3)


def _wait_for_wandb(wandb_dir, timeout=60.0):
    """wandb.finish() in offline mode may return before wandb's service wrote the run file: wait for its exit record."""
    import time

    from tropt.dynamics.logs import wandb_finished

    deadline = time.monotonic() + timeout
    while not wandb_finished(wandb_dir):
        assert time.monotonic() < deadline, "wandb never wrote the run's exit record"
        time.sleep(0.1)


class _RecordingWriter:
    """Anything with SummaryWriter's methods is a TensorBoard target: this one records what add_text got."""

    def __init__(self):
        self.texts = {}

    def add_scalar(self, *a, **k):
        pass

    def add_figure(self, *a, **k):
        pass

    def add_text(self, tag, text, step=None):
        self.texts[tag] = text

    def flush(self):
        pass


MARKDOWN_PAYLOADS = ["[click](http://evil.example/)", "![img](http://evil.example/x.png)",
                     "<img src=http://evil.example/y.png>", "line\n# heading\n> quote", "`code` **bold** _em_"]


def test_report_log_to_tensorboard_renders_no_markup_from_user_text():
    markdown = pytest.importorskip("markdown")  # what TensorBoard's text plugin renders with
    hostile = " ".join(MARKDOWN_PAYLOADS)
    report = tropt.Report([tropt.CheckResult("data.class_coverage", "fail", hostile, advice=[hostile]),
                           tropt.CheckResult(hostile, "warn", "a hostile id from a findings.json")])
    writer = _RecordingWriter()
    report.log_to(writer, figures=False)
    from tropt.sinks import as_sink

    sink = as_sink(writer)
    sink.text("tropt/note", hostile, 0)  # plain text handed to the sink directly is made inert too
    assert {"tropt/verdict", "tropt/data.class_coverage", "tropt/note"} <= set(writer.texts)
    for tag, text in writer.texts.items():
        page = markdown.markdown(text, extensions=["markdown.extensions.tables", "markdown.extensions.fenced_code"])
        for markup in ("<a ", "<img", "<h1", "<blockquote", "<code>code", "<strong>bold", "<em>em"):
            assert markup not in page, (tag, markup, page)
        assert "evil.example" in page  # the text is still there, as text
    assert writer.texts["tropt/data.class_coverage"].startswith("FAIL data.class_coverage: ")
