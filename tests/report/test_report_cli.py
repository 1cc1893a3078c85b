"""`tropt report`: papermill-executed notebooks into HTML and findings.json, gating, failures, determinism."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from support import ROOT, SAMPLES

import tropt
from tropt.result import Report

pytestmark = pytest.mark.slow  # each notebook run starts a kernel (about 10 s here)

TROPT = str(Path(sys.executable).parent / "tropt")
SETUP = os.path.join(SAMPLES, "sample_setup.py") + ":make_setup"
SPLITS = {"train": os.path.join(SAMPLES, "train.csv"), "test": os.path.join(SAMPLES, "test.csv")}
# Deterministic checks (perf.* measure time, so their verdicts may move between runs).
CHECKS = ["data", "model.init_loss", "model.eval_metric", "loop"]
PARAMS = ["-p", "setup", SETUP, "-p", "splits", json.dumps(SPLITS), "-p", "label", "churned", "-p", "group",
          "customer_id", "-p", "time", "signup_date", "-p", "checks", json.dumps(CHECKS)]


def report(*args, cwd=ROOT):
    return subprocess.run([TROPT, "report", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def comparable(findings: dict) -> list[dict]:
    """Results without wall-clock fields (durations), which differ between any two runs."""
    return [{k: ({m: x for m, x in v.items() if m != "cost_steps"} if k == "metrics" else v)
             for k, v in r.items() if k != "duration_s"} for r in findings["results"]]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    proc = report("diagnose", *PARAMS, "-o", str(out))
    return out, proc


def test_report_writes_notebook_html_findings_and_gates(demo):
    out, proc = demo
    assert proc.returncode == 1, proc.stderr  # the sample's planted leaks FAIL, default --fail-on fail
    for name in ("report.ipynb", "report.html", "findings.json"):
        assert (out / name).is_file()
    assert f"findings: {out / 'findings.json'}" in proc.stdout and "report status: FAIL" in proc.stdout
    nb = nbformat.read(out / "report.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "churned" in injected[0].source and str(out) in injected[0].source


def test_findings_match_in_process_diagnose(demo):
    out, _ = demo
    findings = json.loads((out / "findings.json").read_text())
    sys.path.insert(0, SAMPLES)
    try:
        import sample_setup
    finally:
        sys.path.remove(SAMPLES)
    in_process = tropt.diagnose(sample_setup.make_setup(), SPLITS, label="churned", group="customer_id",
                                time="signup_date", checks=CHECKS, progress=False)
    assert comparable(findings) == comparable(in_process.to_dict())
    assert findings["identity"]["parameters"]["label"] == "churned" and findings["identity"]["seed"] == 0
    leaked = Report.from_dict(findings)["data.exact_duplicates"]
    assert leaked.metrics["leaked_rows"] == 30  # the sample's known answer


def test_html_shows_every_summary_and_needs_no_network(demo):
    out, _ = demo
    page = (out / "report.html").read_text()
    text = html.unescape(page)
    findings = Report.from_json(str(out / "findings.json"))
    for r in findings:
        assert r.summary in text, r.check
    assert page.count("data:image/png;base64") >= 4  # plots are embedded images
    refs = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)["\']', page)
    external = [u for u in refs if re.match(r"(https?:)?//", u)]
    assert external == [], external
    assert "<script src" not in page and "@import url(" not in page


def test_html_renders_in_headless_chromium(demo, chromium):
    out, _ = demo
    page = chromium.new_page()
    failed = []
    page.on("requestfailed", lambda req: failed.append(req.url))
    page.goto((out / "report.html").as_uri())
    page.wait_for_selector(".tropt-result")
    statuses = page.eval_on_selector_all(".tropt-result",
                                         "els => els.map(e => e.dataset.check + ':' + e.dataset.status)")
    assert "data.exact_duplicates:fail" in statuses and "loop.accumulation:pass" in statuses
    assert page.locator("img").count() >= 4
    assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    assert failed == []
    os.makedirs(os.path.join(ROOT, "tests", "browser", "artifacts"), exist_ok=True)
    page.screenshot(path=os.path.join(ROOT, "tests", "browser", "artifacts", "report.png"), full_page=False)
    page.close()


def test_same_inputs_and_seed_give_the_same_findings(demo, tmp_path):
    out, _ = demo
    proc = report("diagnose", *PARAMS, "-o", str(tmp_path), "--fail-on", "never", "--no-input")
    assert proc.returncode == 0, proc.stderr  # --fail-on never
    first, second = (json.loads((d / "findings.json").read_text()) for d in (out, tmp_path))
    assert comparable(first) == comparable(second)
    moving = ("created_at", "git_commit", "threads", "step_seconds", "cost_steps")  # clock, commits, load, timing
    ident = {k: v for k, v in first["identity"].items() if k not in moving}
    assert ident == {k: v for k, v in second["identity"].items() if k not in moving}
    assert first["identity"]["config_hash"] and first["identity"]["data_fingerprint"]
    assert "setup_obj = load_setup" not in (tmp_path / "report.html").read_text()  # --no-input hides code


@pytest.mark.parametrize("setup_spec, reason", [
    ("nowhere/missing_setup.py:make_setup", "the file nowhere/missing_setup.py does not exist"),
    ("{broken}:make", "make raised RuntimeError: no GPU on this runner"),
])
def test_failing_notebook_exits_2_with_one_line_and_still_writes(setup_spec, reason, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def make():\n    raise RuntimeError('no GPU on this runner')\n")
    out = tmp_path / "out"
    proc = report("diagnose", "-p", "setup", setup_spec.replace("{broken}", str(broken)), "-o", str(out))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tropt: report failed: cell ") and reason in lines[0], proc.stderr
    assert (out / "report.ipynb").is_file() and (out / "report.html").is_file() and not (out / "findings.json").exists()
    assert reason.split(" raised ")[-1] in (out / "report.html").read_text()


def test_data_report_and_fail_on_warn(tmp_path):
    proc = report("data", "-p", "splits", json.dumps(SPLITS), "-p", "label", "churned", "-o", str(tmp_path),
                  "--fail-on", "warn")
    assert proc.returncode == 1, proc.stderr
    findings = json.loads((tmp_path / "findings.json").read_text())
    assert {r["check"].split(".")[0] for r in findings["results"]} == {"data"}


def test_unknown_and_unavailable_report_kinds(tmp_path):
    # every shipped kind exists now ("compare": tests/report/test_report_compare.py)
    proc = report("nope", "-o", str(tmp_path))
    assert proc.returncode == 2 and "invalid choice: 'nope'" in proc.stderr


def test_notebooks_ship_in_the_package():
    from tropt.report import notebook_path

    for kind in ("diagnose", "data"):
        path = notebook_path(kind)
        nb = nbformat.read(path, as_version=4)
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)
        assert os.path.samefile(path, os.path.join(ROOT, "notebooks", path.name))  # notebooks/ is the one source


def test_report_shows_progress_over_its_cells_on_stderr(tmp_path, capfd):
    from tropt.report import run_report

    outcome = run_report("data", {"splits": SPLITS, "label": "churned"}, tmp_path / "out", progress=True)
    err = capfd.readouterr().err
    assert outcome.report is not None and "tropt report" in err and "cell" in err
    html = (tmp_path / "out" / "report.html").read_text()
    assert "tropt-verdict" in html and "show_report" not in html  # the verdict, and no code by default
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html  # progress and warnings never reach the page
