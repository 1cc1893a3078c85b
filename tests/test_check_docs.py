"""Every registered check has its page (docs/checks/<id>.md, shipped in the package) and every result links to it."""

import html
import re
from pathlib import Path

import pytest

import tropt
from tropt.checkdocs import check_doc_path, explain
from tropt.result import CheckResult, Report, Status
from tropt.verdict import doc_url

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("## What it does", "## Statuses", "## Usual causes and the minimal fix", "## Thresholds", "## Cost")
REGISTERED = list(tropt.list_checks()["id"])


@pytest.mark.parametrize("check", REGISTERED)
def test_every_registered_check_has_its_page(check):
    page = ROOT / "docs" / "checks" / f"{check}.md"
    assert page.is_file(), f"docs/checks/{check}.md is missing"
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# `{check}`")
    for section in SECTIONS:
        assert section in text, f"{check}: no {section!r} section"
    for status in ("PASS", "ERROR", "SKIP"):
        assert f"**{status}**" in text
    assert check_doc_path(check).samefile(page)  # the package ships docs/checks itself
    assert explain(check).text == text


@pytest.mark.parametrize("status", list(Status))
def test_every_result_links_to_its_page(status):
    results = [CheckResult(check, status, f"summary of {check}", advice=["Fix it."]) for check in REGISTERED]
    page = Report(results)._repr_html_()
    for r in results:
        links = re.findall(r'href="([^"]+)"', r._repr_html_())
        assert [html.unescape(u) for u in links] == [doc_url(r.check)], r.check
        assert html.escape(doc_url(r.check)) in page
        assert Path(check_doc_path(r.check)).is_file()


def test_docs_url_can_point_at_a_site(monkeypatch):
    monkeypatch.setenv("TROPT_DOCS_URL", "https://example.org/tropt/checks/")
    html_text = CheckResult("loop.zero_grad", "fail", "s")._repr_html_()
    assert 'href="https://example.org/tropt/checks/loop.zero_grad.md"' in html_text


def test_an_unknown_id_has_no_page_and_no_link():
    assert "what this means" not in CheckResult("custom.thing", "fail", "s")._repr_html_()
    with pytest.raises(tropt.TroptError, match=r"no page for check 'custom\.thing'"):
        explain("custom.thing")
