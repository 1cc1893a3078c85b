"""`tropt report` under hostile input and faults: no injection, no lost report, no mixed output (issue #16)."""

from __future__ import annotations

import json
import os

import pytest

from tropt.cli import main

from support import SAMPLES

SPLITS = json.dumps({"train": os.path.join(SAMPLES, "train.csv"), "test": os.path.join(SAMPLES, "test.csv")})


@pytest.fixture
def no_kernel(monkeypatch):
    """Fail the test if a notebook would be executed (papermill.execute_notebook is the only way a kernel starts)."""
    import papermill

    calls = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError("a kernel started")))
    return calls


@pytest.mark.parametrize("name", ["__import__('pathlib').Path('{marker}').touch();x", "lable", "output_dir", "1x", "label "])
def test_parameter_names_must_be_declared_identifiers(name, no_kernel, tmp_path, capsys):
    marker = tmp_path / "pwned"
    code = main(["report", "data", "-p", "splits", SPLITS, "-p", name.format(marker=marker), "1", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and no_kernel == [] and not marker.exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tropt: error: "), err
    assert "splits, label, group, time" in lines[0] or "-o OUT_DIR" in lines[0], err


def test_declared_parameters_are_the_notebooks_own():
    from tropt.report.runner import declared_parameters, notebook_path

    assert declared_parameters(notebook_path("data"))[:4] == ["splits", "label", "group", "time"]


def _tropt_report(*args, env=None, timeout=600):
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "tropt")
    return subprocess.run([exe, "report", *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_report_draws_inline_whatever_mplbackend_says(tmp_path):
    proc = _tropt_report("data", "-p", "splits", SPLITS, "-p", "label", "churned", "-p", "group", "customer_id",
                         "-o", str(tmp_path), env={"MPLBACKEND": "Agg"})
    assert proc.returncode == 1, proc.stderr  # the sample's planted leaks
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64") >= 5  # one per data check that has a picture (1 with the Agg backend)
