"""The report notebooks under papermill itself: a mapping passed with -p (which papermill hands over as text) is read
as JSON, the hint for a missing parameter works under papermill (-y keeps the type), and a notebook run without
output_dir writes nothing into the current directory (nor into notebooks/)."""

from __future__ import annotations

import json
import os
import re

import pytest
from support import ROOT, SAMPLES

from tropt.errors import TroptError
from tropt.report import notebook_path
from tropt.report.params import hint, output_path, structured
from tropt.report.runner import current_interpreter_kernel

SPLITS = {"train": os.path.join(SAMPLES, "train.csv"), "test": os.path.join(SAMPLES, "test.csv")}


def test_papermill_p_text_is_read_as_json_and_nothing_is_written_without_output_dir(tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(os.path.join(ROOT, "notebooks")))
    with current_interpreter_kernel() as kernel:
        # what `papermill data_checks.ipynb out.ipynb -p splits '{...}' -p label churned` passes: the JSON as text
        papermill.execute_notebook(str(notebook_path("data")), str(tmp_path / "out.ipynb"), kernel_name=kernel,
                                   parameters={"splits": json.dumps(SPLITS), "label": "churned"},
                                   progress_bar=False, log_output=False)
    out = json.loads((tmp_path / "out.ipynb").read_text())
    errors = [o for c in out["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    assert sorted(os.listdir(tmp_path)) == ["out.ipynb"]  # no findings.json in the current directory
    assert sorted(os.listdir(os.path.join(ROOT, "notebooks"))) == before


def test_the_hint_for_a_missing_mapping_works_under_papermill():
    text = hint("splits", '{"train": "train.csv"}', "data")
    assert "tropt report data -p splits '{\"train\": \"train.csv\"}'" in text
    assert "papermill -y '{\"splits\": {\"train\": \"train.csv\"}}'" in text
    yaml_arg = text.split("papermill -y '")[1].split("'")[0]
    assert json.loads(yaml_arg) == {"splits": {"train": "train.csv"}}  # what -y parses: the mapping, typed


def test_structured_reads_text_as_json_and_names_bad_json():
    assert structured('{"steps": 3}', "budget", "{}") == {"steps": 3}
    assert structured("[0, 1]", "seeds", "[]") == [0, 1]
    assert structured("data", "checks", "[]") == "data" and structured(None, "splits", "{}") is None
    with pytest.raises(TroptError, match=r"parameter budget='\{steps: 3\}' is not valid JSON"):
        structured("{steps: 3}", "budget", '{"steps": 300}')


def test_output_path_is_none_without_a_directory(tmp_path):
    assert output_path(None, "findings.json") is None and output_path("", "x") is None
    assert output_path(tmp_path / "o", "plan.md") == str(tmp_path / "o" / "plan.md") and (tmp_path / "o").is_dir()


def test_the_html_report_has_no_instructions_scrolls_wide_tables_and_embeds_its_pages(tmp_path, monkeypatch):
    """An executed data report: the notebook's "Run by ..." instructions are left out, tables scroll, and every
    "what this means" link points at the page embedded in the same file (no file:// path, dead once shared)."""
    pytest.importorskip("papermill")
    from tropt.report import run_report

    monkeypatch.delenv("TROPT_DOCS_URL", raising=False)
    outcome = run_report("data", {"splits": SPLITS, "label": "churned"}, tmp_path / "out")
    assert outcome.report is not None
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Run by" not in page and "parameters cell" not in page
    assert "file://" not in page
    links = set(re.findall(r'href="#tropt-doc-([A-Za-z0-9_.]+)"', page))
    assert "data.exact_duplicates" in links
    for cid in links:
        assert f'id="tropt-doc-{cid}"' in page
    assert ".jp-OutputArea-output{overflow-x:auto}" in page


def test_a_configured_docs_url_is_linked_and_nothing_is_embedded(tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    from tropt.report import run_report

    monkeypatch.setenv("TROPT_DOCS_URL", "https://docs.example.org/checks")
    run_report("data", {"splits": SPLITS, "label": "churned"}, tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'href="https://docs.example.org/checks/data.exact_duplicates.md"' in page
    assert "tropt-doc-" not in page and "file://" not in page
