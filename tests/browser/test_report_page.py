"""The demo report as a person opens it (#15): the verdict first, FAIL before WARN before PASS with coloured
badges, no stderr block and no input code, under 6,000 px with the evidence collapsed. A screenshot is saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.lab import ROOT

pytestmark = pytest.mark.browser

SAMPLES = ROOT / "data" / "samples"
# Exactly what `make demo` runs (every check), so the page measured is the demo's.
DEMO = ["diagnose", "-p", "setup", f"{SAMPLES / 'sample_setup.py'}:make_setup",
        "-p", "splits", json.dumps({"train": str(SAMPLES / "train.csv"), "test": str(SAMPLES / "test.csv")}),
        "-p", "label", "churned", "-p", "group", "customer_id", "-p", "time", "signup_date", "--fail-on", "never"]
ARTIFACTS = ROOT / "tests" / "browser" / "artifacts"
COLOURS = {"fail": "rgb(207, 34, 46)", "warn": "rgb(154, 103, 0)", "pass": "rgb(26, 127, 55)",
           "skip": "rgb(110, 119, 129)", "error": "rgb(130, 80, 223)"}


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, "-m", "tropt.cli", "report", *DEMO, "-o", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "report.html"


def test_demo_report_opens_with_the_verdict(demo_report, chromium):
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    failed = []
    page.on("requestfailed", lambda req: failed.append(req.url))
    page.goto(demo_report.as_uri())
    page.wait_for_selector(".tropt-verdict")
    # The verdict is the first thing on the page: nothing visible above it but the notebook's title.
    verdict_top = page.eval_on_selector(".tropt-verdict", "e => e.getBoundingClientRect().top + window.scrollY")
    first_result = page.eval_on_selector(".tropt-result", "e => e.getBoundingClientRect().top + window.scrollY")
    assert verdict_top < 900 and verdict_top < first_result
    # FAIL before WARN before PASS/SKIP, each status a coloured badge.
    order = page.eval_on_selector_all(".tropt-verdict .tropt-finding", "els => els.map(e => e.dataset.status)")
    rank = {"fail": 0, "error": 1, "warn": 2}
    assert order and order[0] == "fail" and order == sorted(order, key=rank.__getitem__), order
    rest = page.eval_on_selector(".tropt-verdict .tropt-rest", "e => e.getBoundingClientRect().top")
    last = page.eval_on_selector_all(".tropt-verdict .tropt-finding",
                                     "els => els[els.length - 1].getBoundingClientRect().top")
    assert rest > last  # PASS and SKIP collapsed into one line after the findings
    badges = page.eval_on_selector_all(".tropt-badge",
                                       "els => els.map(e => [e.textContent, getComputedStyle(e).backgroundColor])")
    assert {text.lower() for text, _ in badges} >= {"fail", "pass"}
    for text, colour in badges:
        assert colour == COLOURS[text.lower()], (text, colour)
    # No stderr block, no input code.
    assert page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    assert "TqdmWarning" not in page.content() and "IProgress" not in page.content()
    assert page.locator(".jp-CodeCell .jp-InputArea, .jp-CodeMirrorEditor, .highlight").count() == 0
    assert "load_setup" not in page.inner_text("body")
    # Evidence collapsed, the page short.
    assert page.locator("details[open]").count() == 0
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 6000, height
    assert failed == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo_report.png"), full_page=True)
    page.close()
