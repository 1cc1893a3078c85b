"""compare(tracking=...) with a store that cannot be written: refused before the first run, naming the store (and
the file), in bounded time; a logging failure after the runs returns the comparison with the error recorded."""

from __future__ import annotations

import subprocess
import warnings

import pytest
from support.compare_setups import adam, make_setup

import tropt
from tropt.errors import TroptError


def _compare(callback=None, **kw):
    setup = make_setup(lr=0.05)
    return tropt.compare(setup, {"adam": {"optimizer": adam(3e-3)}}, budget=tropt.Budget(steps=6), seeds=(0,),
                         reinit=True, eval_every=3, progress=False, callback=callback, **kw)


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs (root can write through file permissions, not through a read-only mount)."""
    where = tmp_path / "ro"
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(where)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs root to mount a read-only tmpfs")
    yield where
    subprocess.run(["umount", str(where)], check=False)


def test_a_read_only_store_is_refused_before_the_first_run(read_only_dir):
    pytest.importorskip("mlflow")
    calls = []
    with pytest.raises(TroptError, match="cannot be written") as err:
        _compare(callback=calls.append, tracking=str(read_only_dir))
    assert str(read_only_dir) in str(err.value)
    assert calls == []  # refused before any run started


def test_an_unreachable_server_is_refused_before_the_first_run():
    pytest.importorskip("mlflow")
    calls = []
    with pytest.raises(TroptError, match=r"the MLflow store http://127\.0\.0\.1:9 cannot be used"):
        _compare(callback=calls.append, tracking="http://127.0.0.1:9")
    assert calls == []


def test_a_logging_failure_after_the_runs_keeps_the_comparison(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    def refuse(self, *a, **k):
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(MlflowClient, "create_run", refuse)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        comp = _compare(tracking=str(tmp_path))
    assert len(comp.runs) == 2  # baseline and adam, one seed each
    info = comp.meta["tracking"]
    assert info["error"] == "ConnectionError: the tracking server went away" and info["run_ids"] == {}
    assert any("logging to MLflow failed" in str(w.message) for w in seen)
