"""`tropt report compare`: the compare notebook runs a comparison from a setup and a candidates function (no Python
literals on the command line) and writes the table, curves, trade-off plot and decisions into the HTML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from support import ROOT, SAMPLES

from tropt.experiments import Comparison

pytestmark = pytest.mark.slow  # a notebook run starts a kernel

TROPT = str(Path(sys.executable).parent / "tropt")
SETUP = os.path.join(SAMPLES, "sample_setup.py") + ":make_setup"
CANDIDATES = os.path.join(SAMPLES, "sample_candidates.py") + ":make_candidates"


def report(*args):
    return subprocess.run([TROPT, "report", "compare", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_compare_report_writes_comparison_and_html(tmp_path):
    proc = report("-p", "setup", SETUP, "-p", "candidates", CANDIDATES, "-p", "budget", json.dumps({"steps": 40}),
                  "-p", "seeds", "[0, 1, 2]", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    comp = Comparison.from_json(str(tmp_path / "comparison.json"))
    assert comp.candidates == ["baseline", "sgd", "lr_x3"] and len(comp.records) == 9
    assert (comp.runs["steps"] == 40).all()
    assert f"comparison: {tmp_path / 'comparison.json'}" in proc.stdout and comp.summary() in proc.stdout
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png") >= 2  # curves and trade-off
    for verdict in comp.decision()["verdict"]:
        assert verdict in page
    # the per-candidate table, scored by the Setup's own metric (the sample's balanced accuracy)
    assert "balanced_accuracy_mean" in comp.to_frame().columns and "balanced_accuracy_mean" in page


def test_compare_report_without_candidates_fails_with_the_fix(tmp_path):
    proc = report("-p", "setup", SETUP, "-o", str(tmp_path))
    assert proc.returncode == 2
    assert "needs a setup and candidates" in proc.stderr and "-p candidates" in proc.stderr


def test_compare_notebook_ships_in_the_package():
    from tropt.report import notebook_path

    path = notebook_path("compare")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert os.path.samefile(path, os.path.join(ROOT, "notebooks", "compare.ipynb"))
