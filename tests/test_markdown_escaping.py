"""Report.to_markdown() renders user text as text: no HTML or Markdown from a summary, cell or name survives (#16)."""

from __future__ import annotations

import re

import pandas as pd
from nbconvert.filters.markdown_mistune import markdown2html_mistune  # the engine nbconvert renders Markdown with

from tropt.result import CheckResult, Report

PAYLOADS = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>", '"><svg onload=alert(3)>',
            "[click](javascript:alert(4))", "![x](javascript:alert(5))", "a | b\n\n<script>alert(6)</script>",
            "`<b>code</b>`", "line1\n# heading\n<iframe src=javascript:alert(7)>"]


def _hostile_report() -> Report:
    table = pd.DataFrame({p: [p, 1.0] for p in PAYLOADS[:4]} | {"split": PAYLOADS[4:6]})
    table.index = pd.Index(PAYLOADS[6:8], name=PAYLOADS[1])
    results = [CheckResult("data.exact_duplicates", "fail", p, tables={p: table}, advice=[p]) for p in PAYLOADS]
    results.append(CheckResult(PAYLOADS[0], "warn", "a hostile check id from a findings.json"))
    return Report(results)


def test_markdown_renders_no_markup_from_user_text():
    md = _hostile_report().to_markdown()
    page = re.sub(r'<a class="anchor-link" href="#[^"]*">', "", markdown2html_mistune(md))  # nbconvert's own anchors
    lowered = page.lower()
    for tag in ("<script", "<img", "<svg", "<iframe", "<a ", "<b>"):
        assert tag not in lowered, (tag, page)
    assert lowered.count("<h1") == 1  # the report's own title; no heading from a summary
    assert not re.search(r"<[^>]*\bon\w+\s*=", lowered)  # no event-handler attribute anywhere
    assert "javascript:" not in re.findall(r'(?:href|src)="([^"]*)"', lowered)


def test_markdown_table_cells_stay_in_their_columns():
    table = pd.DataFrame({"a|b": ["x | y", "two\nlines"], "c": [1, 2]})
    md = Report([CheckResult("data.exact_duplicates", "fail", "s | t\nu", tables={"rows": table})]).to_markdown()
    page = markdown2html_mistune(md)
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    assert rows and all(r.count("<td") in (0, 3) and r.count("<th") in (0, 3) for r in rows), page
    assert "x | y" in page and "two lines" in page and "s | t u" in page


def test_markdown_keeps_plain_text_readable():
    md = Report([CheckResult("loop.zero_grad", "fail", "call optimizer.zero_grad() & retry",
                             advice=["Use <= 3."])]).to_markdown()
    page = markdown2html_mistune(md)
    assert ("<code>loop.zero_grad</code>" in page and "call optimizer.zero_grad() &amp; retry" in page
            and "Use &lt;= 3." in page)
