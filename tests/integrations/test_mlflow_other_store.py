"""Report.log_to for an MLflow run created by an MlflowClient on its own tracking URI: logged through that client
into that store with ``log_to((client, run))``; the run alone is a clear error, and no stray mlflow.db appears in
the working directory either way."""

from __future__ import annotations

import pytest
from support import mlflow_tracking_uri

import tropt
from tropt.errors import TroptError
from tropt.result import CheckResult, Status


def _report() -> tropt.Report:
    return tropt.Report([CheckResult("model.init_loss", Status.WARN, "loss at init 3.2, expected 1.1",
                                     {"loss": 3.2}, advice=["check the last layer's bias"])])


def test_a_run_of_another_store_is_logged_through_its_client(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (tmp_path / "store").mkdir()
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("other", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp)
    with mlflow_tracking_uri(f"sqlite:///{work / 'mlflow.db'}"):  # the default store: the working directory's
        with pytest.raises(TroptError, match=rf"run {run.info.run_id} is not in the current tracking store") as err:
            _report().log_to(run)
        assert "(client, run)" in err.value.fix
        assert not (work / "mlflow.db").exists()
        _report().log_to((client, run), figures=False)
    assert not (work / "mlflow.db").exists()
    got = client.get_run(run.info.run_id)
    assert got.data.metrics["tropt/status"] == Status.WARN.rank
    assert got.data.tags["tropt/model.init_loss"].startswith("WARN model.init_loss")
