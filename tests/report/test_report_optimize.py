"""`tropt report optimize`: the optimize notebook diagnoses, compares under a stated budget and writes the plan
(plan.md, plan.html, plan.json), findings.json and comparison.json beside the report; exit 1 on escalate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, SAMPLES

from tropt.experiments import Comparison, OptimizationPlan

pytestmark = pytest.mark.slow  # a notebook run starts a kernel

TROPT = str(Path(sys.executable).parent / "tropt")
SETUP = os.path.join(SAMPLES, "sample_setup.py") + ":make_setup"
CANDIDATES = os.path.join(SAMPLES, "sample_candidates.py") + ":make_candidates"


def report(*args):
    return subprocess.run([TROPT, "report", "optimize", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_optimize_report_writes_plan_findings_and_comparison(tmp_path):
    proc = report("-p", "setup", SETUP, "-p", "candidates", CANDIDATES, "-p", "budget", json.dumps({"steps": 40}),
                  "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    for name in ("plan.md", "plan.html", "plan.json", "findings.json", "comparison.json", "report.html"):
        assert (tmp_path / name).exists(), name
    comp = Comparison.from_json(str(tmp_path / "comparison.json"))
    assert set(comp.candidates) >= {"baseline", "sgd", "lr_x3"}
    # Equal samples (issue 30): every run reads the baseline's 40 steps' worth of samples; a candidate that keeps
    # the batch size runs exactly 40 steps, one that changes it runs as many steps as that takes.
    base = comp.runs[comp.runs["candidate"] == "baseline"]
    assert (base["steps"] == 40).all()
    same_batch = comp.runs[comp.runs["candidate"].isin(["baseline", "sgd", "lr_x3"])]
    assert (same_batch["steps"] == 40).all()
    assert (comp.runs["samples"] >= base["samples"].min()).all()
    plan = OptimizationPlan.from_json(str(tmp_path / "plan.json"))
    assert plan.outcome in ("adopt", "keep the baseline", "escalate") and plan.baseline["budget"] == "steps=40"
    assert {"sgd", "lr_x3"} <= {iv["name"] for iv in plan.interventions}
    assert (tmp_path / "plan.md").read_text().startswith("# tropt optimization plan")
    assert f"plan:     {tmp_path / 'plan.md'}" in proc.stdout
    assert "budget per run" in (tmp_path / "report.html").read_text()  # the budget is stated in the report


def test_optimize_report_blocked_by_the_sample_leak(tmp_path):
    splits = {"train": os.path.join(SAMPLES, "train.csv"), "test": os.path.join(SAMPLES, "test.csv")}
    proc = report("-p", "setup", SETUP, "-p", "splits", json.dumps(splits), "-p", "label", "churned",
                  "-p", "checks", json.dumps(["data", "dynamics.lr_range"]), "-p", "budget", json.dumps({"steps": 40}),
                  "-o", str(tmp_path))
    assert proc.returncode == 1, proc.stderr  # the findings FAIL the gate
    plan = OptimizationPlan.from_json(str(tmp_path / "plan.json"))
    assert plan.outcome == "blocked" and plan.interventions[0]["finding"] == "data.exact_duplicates"
    assert not (tmp_path / "comparison.json").exists()  # no comparison ran


def test_optimize_report_escalates_with_exit_1(tmp_path):
    proc = report("-p", "setup", SETUP, "-p", "checks", json.dumps(["perf.throughput"]),
                  "-p", "budget", json.dumps({"steps": 10_000_000, "seconds": 1}), "-o", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    plan = OptimizationPlan.from_json(str(tmp_path / "plan.json"))
    assert plan.outcome == "escalate" and "10000000 steps" in plan.outcome_reason
    assert "ESCALATE" in proc.stdout


def test_optimize_report_needs_a_setup(tmp_path):
    proc = report("-p", "budget", json.dumps({"steps": 40}), "-o", str(tmp_path))
    assert proc.returncode == 2 and "needs a setup" in proc.stderr
