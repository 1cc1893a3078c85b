"""`tropt suggest`: the candidates tropt.suggest derives from a findings.json, on the command line (with their
hypotheses and findings, optionally as JSON); correctness FAILs block with exit 1; a bad file is exit 2."""

from __future__ import annotations

import json

import tropt
from tropt.cli import main
from tropt.result import CheckResult, Report


def _findings(tmp_path, *results: CheckResult) -> str:
    path = tmp_path / "findings.json"
    Report(list(results), {"tropt": tropt.__version__}).to_json(str(path))
    return str(path)


def test_suggest_prints_the_candidates_and_writes_json(tmp_path, capsys):
    r = CheckResult("perf.precision", "warn", "recommend bf16", {"recommended": "bf16", "setup_precision": "fp32",
                                                                  "fp32_step_ms": 10.0, "bf16_step_ms": 5.0})
    out_json = tmp_path / "suggestions.json"
    code = main(["suggest", "--findings", _findings(tmp_path, r), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0
    assert "1 candidate(s) to compare" in out and "precision_bf16" in out and "from perf.precision" in out
    doc = json.loads(out_json.read_text())
    assert list(doc["candidates"]) == ["precision_bf16"] and doc["blocking"] == []


def test_suggest_is_blocked_by_a_correctness_fail(tmp_path, capsys):
    r = CheckResult("data.exact_duplicates", "fail", "40 val rows copy train rows", {"leaked_rows": 40})
    assert main(["suggest", "--findings", _findings(tmp_path, r)]) == 1
    out = capsys.readouterr().out
    assert "blocked" in out and "data.exact_duplicates" in out


def test_suggest_on_a_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main(["suggest", "--findings", str(tmp_path / "nope.json")]) == 2
    assert "tropt: error:" in capsys.readouterr().err
