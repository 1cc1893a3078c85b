"""TroptCallback inside a real lightning ``Trainer.fit``: a report at the end, early warnings, stop_on."""

from __future__ import annotations

import contextlib
import json
import warnings

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

from tropt.integrations.lightning import TroptCallback  # noqa: E402
from tropt.integrations.live import TroptLiveWarning  # noqa: E402


class TinyModule(L.LightningModule):
    def __init__(self, lr: float = 0.5, blow_up_at: int | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        self.lr, self.blow_up_at = lr, blow_up_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.blow_up_at is not None and self.global_step >= self.blow_up_at:
            loss = loss * float("nan")  # planted: the loss (and so every gradient) goes non-finite
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _loader(n=256, seed=0, shuffle=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, generator=g,
                                       shuffle=shuffle)


def _trainer(tmp_path, cb, logger=False, **kw):
    return L.Trainer(max_epochs=kw.pop("max_epochs", 3), callbacks=[cb], logger=logger, default_root_dir=tmp_path,
                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                     accelerator="cpu", devices=1, **kw)


def _params(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_healthy_fit_writes_a_report_with_both_results(tmp_path):
    torch.manual_seed(0)
    module = TinyModule()
    cb = TroptCallback(every=10, out_dir=tmp_path / "tropt")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TroptLiveWarning)  # a healthy run must not be warned about
        _trainer(tmp_path, cb, max_epochs=5).fit(module, _loader(), _loader(64, seed=1, shuffle=False))
    found = json.loads((tmp_path / "tropt" / "findings.json").read_text())
    checks = {r["check"]: r for r in found["results"]}
    assert set(checks) == {"model.gradient_flow", "dynamics.loss_curve"}
    assert checks["model.gradient_flow"]["status"] == "pass"
    assert checks["model.gradient_flow"]["metrics"]["recorded_steps"] == 8  # 5 epochs x 16 batches, one in 10 recorded
    assert checks["dynamics.loss_curve"]["status"] in ("pass", "warn")
    assert checks["dynamics.loss_curve"]["metrics"]["points"] == 80
    assert checks["dynamics.loss_curve"]["metrics"].get("val_points") == 5
    assert (tmp_path / "tropt" / "report.html").stat().st_size > 1000
    assert cb.events == []
    # hooks are gone: another optimizer step after fit records nothing
    rows = cb.live.monitor.rows
    opt = torch.optim.SGD(module.parameters(), lr=0.0)
    module.net(torch.randn(2, 8)).sum().backward()
    opt.step()
    assert cb.live.monitor.rows == rows


def test_nonfinite_loss_is_warned_and_training_continues_without_stop_on(tmp_path):
    torch.manual_seed(0)
    cb = TroptCallback(every=5, out_dir=tmp_path / "tropt")
    with pytest.warns(TroptLiveWarning, match="non-finite"):
        trainer = _trainer(tmp_path, cb, max_epochs=2)
        trainer.fit(TinyModule(blow_up_at=12), _loader())
    assert trainer.global_step == 32  # not stopped
    kinds = {e.kind for e in cb.events}
    assert "nonfinite" in kinds
    found = json.loads((tmp_path / "tropt" / "findings.json").read_text())
    statuses = {r["check"]: r["status"] for r in found["results"]}
    assert statuses["model.gradient_flow"] == "fail" and statuses["dynamics.loss_curve"] == "fail"


def test_stop_on_nonfinite_stops_fit_early(tmp_path):
    torch.manual_seed(0)
    cb = TroptCallback(every=5, stop_on=("nonfinite", "diverging"), out_dir=tmp_path / "tropt")
    with pytest.warns(TroptLiveWarning, match="stopping training"):
        trainer = _trainer(tmp_path, cb, max_epochs=5)
        trainer.fit(TinyModule(blow_up_at=12), _loader())
    assert trainer.global_step < 20  # checked at step 15: stops there, not after 80 steps
    assert cb.live.stop_reason and "non-finite" in cb.live.stop_reason
    assert (tmp_path / "tropt" / "findings.json").exists()


def test_diverging_loss_is_warned(tmp_path):
    torch.manual_seed(0)
    # budget=1: judge at every check (the default 1% budget would judge this ~1 ms step less often)
    cb = TroptCallback(every=10, checks="loss_curve", out_dir=tmp_path / "tropt", stop_on="diverging", budget=1.0)
    with pytest.warns(TroptLiveWarning, match="diverging"):
        trainer = _trainer(tmp_path, cb, max_epochs=20)
        trainer.fit(TinyModule(lr=60.0), _loader())  # planted: a learning rate far too high
    assert any(e.kind in ("diverging", "nonfinite") for e in cb.events)
    assert trainer.global_step < 20 * 16


def test_fit_leaves_the_module_unchanged_apart_from_training(tmp_path):
    """The callback only attaches hooks: a fit with it equals a fit without it, parameter for parameter."""
    runs = []
    for with_cb in (True, False):
        torch.manual_seed(0)
        module = TinyModule()
        cbs = TroptCallback(every=4, out_dir=tmp_path / "t") if with_cb else L.Callback()
        _trainer(tmp_path, cbs, max_epochs=1).fit(module, _loader())
        runs.append(_params(module))
        assert not module._forward_pre_hooks and not any(m._forward_pre_hooks for m in module.modules())
    for k in runs[0]:
        torch.testing.assert_close(runs[0][k], runs[1][k], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["csv", "tensorboard", "mlflow", "wandb"])
def test_logs_to_the_trainers_logger(tmp_path, kind, monkeypatch):
    torch.manual_seed(0)
    if kind == "csv":
        logger = L.pytorch.loggers.CSVLogger(tmp_path)
    elif kind == "tensorboard":
        pytest.importorskip("tensorboard")
        logger = L.pytorch.loggers.TensorBoardLogger(tmp_path)
    elif kind == "mlflow":
        pytest.importorskip("mlflow")
        logger = L.pytorch.loggers.MLFlowLogger(experiment_name="tropt", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                                                artifact_location=str(tmp_path / "artifacts"))
    else:
        pytest.importorskip("wandb")
        monkeypatch.setenv("WANDB_MODE", "offline")
        monkeypatch.setenv("WANDB_SILENT", "true")
        logger = L.pytorch.loggers.WandbLogger(save_dir=str(tmp_path), offline=True, project="tropt")
    cb = TroptCallback(every=8)
    with contextlib.ExitStack() as stack:
        if kind == "mlflow":  # MLFlowLogger sets MLflow's process-wide tracking URI: restore it afterwards
            from support import mlflow_tracking_uri

            stack.enter_context(mlflow_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db"))
        _trainer(tmp_path, cb, logger=logger, max_epochs=1).fit(TinyModule(), _loader())
    assert cb.paths and all(__import__("os").path.exists(p) for p in cb.paths.values())
    if kind == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        assert "tropt/grad_norm/global" in tags["scalars"]
        assert any(t.startswith("tropt/model.gradient_flow") for t in tags["images"])
        assert any("tropt/verdict" in t for t in tags["tensors"])  # add_text is stored as a tensor summary
    elif kind == "wandb":
        import wandb

        from tropt.dynamics import read_wandb

        wandb.finish()
        _wait_for_wandb(tmp_path / "wandb")
        curves = read_wandb(tmp_path / "wandb", step_key="tropt/step")
        assert curves["tropt/grad_norm/global"][0].tolist() == [0, 10]
        assert curves["tropt/model.gradient_flow/status"][1][-1] == __import__("tropt").Status.PASS.rank
    elif kind == "mlflow":
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        hist = client.get_metric_history(logger.run_id, "tropt/grad_norm/global")
        assert [m.step for m in hist] == [0, 10]  # 16 optimizer steps, one in 10 recorded
        run = client.get_run(logger.run_id)
        assert run.data.tags["tropt/model.gradient_flow"].startswith("PASS")
    else:
        import pandas as pd

        df = pd.read_csv(f"{logger.log_dir}/metrics.csv")
        assert "tropt/model.gradient_flow/status" in df.columns


def _wait_for_wandb(wandb_dir, timeout=60.0):
    """wandb.finish() in offline mode may return before wandb's service wrote the run file: wait for its exit record."""
    import time

    from tropt.dynamics.logs import wandb_finished

    deadline = time.monotonic() + timeout
    while not wandb_finished(wandb_dir):
        assert time.monotonic() < deadline, "wandb never wrote the run's exit record"
        time.sleep(0.1)


def test_an_unsupported_lightning_version_is_named(monkeypatch):
    from tropt.errors import SetupError

    monkeypatch.setattr("tropt.integrations._frameworks.metadata.version", lambda dist: "1.9.5")
    with pytest.raises(SetupError, match=r"1\.9\.5 is installed.*>=2\.2,<3"):
        TroptCallback()
