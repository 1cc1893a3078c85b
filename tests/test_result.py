import json

import numpy as np
import pandas as pd
import pytest

from tropt.result import CheckResult, Report, Status


def _results():
    leaked = pd.DataFrame({"test_index": range(25), "train_index": range(100, 125), "value": np.linspace(0, 1, 25)})
    return [
        CheckResult("data.exact_duplicates", Status.WARN, "25 test rows copied from train",
                    metrics={"leaked_rows": 25, "leaked_fraction": 0.025, "note": "x"}, tables={"leaked": leaked},
                    advice=["Drop the copied rows from test."], series={"curve": np.array([1.0, 0.5, 0.25])}),
        CheckResult("loop.accumulation", Status.FAIL, "gradients differ by 50%",
                    metrics={"rel_error": 0.5, "nan": float("nan")}),
        CheckResult("loop.resume", Status.PASS, "resume is exact"),
        CheckResult("loop.ddp", Status.SKIP, "single process"),
    ]


def test_status_values_and_order():
    assert [s.value for s in Status] == ["pass", "warn", "fail", "error", "skip"]
    assert Status("fail") is Status.FAIL
    assert Status.SKIP.rank < Status.PASS.rank < Status.WARN.rank < Status.ERROR.rank < Status.FAIL.rank


def test_report_status_is_worst_and_lookup():
    r = Report(_results())
    assert r.status is Status.FAIL
    assert r["loop.resume"].status is Status.PASS
    assert "loop.ddp" in r and "loop.zero_grad" not in r
    with pytest.raises(KeyError, match=r"loop\.accumulation"):
        r["loop.zero_grad"]
    assert Report([]).status is Status.SKIP
    assert Report(_results()[2:]).status is Status.PASS
    assert r.counts() == {"pass": 1, "warn": 1, "fail": 1, "error": 0, "skip": 1}


def test_gate():
    warn_only = Report([_results()[0]])
    assert warn_only.failed("warn") and not warn_only.failed("fail") and not warn_only.failed("never")
    err = Report([CheckResult("loop.resume", "error", "could not run")])
    assert err.failed("fail")  # a check that could not run proves nothing
    with pytest.raises(ValueError, match="fail_on"):
        err.failed("sometimes")


def test_json_round_trip():
    r = Report(_results(), identity={"seed": 3, "torch": "2.13"})
    text = r.to_json()
    data = json.loads(text)  # strict JSON: NaN became null
    assert data["results"][1]["metrics"]["nan"] is None
    back = Report.from_json(text)
    assert back.to_dict() == r.to_dict()
    leaked = back["data.exact_duplicates"].tables["leaked"]
    pd.testing.assert_frame_equal(leaked, r["data.exact_duplicates"].tables["leaked"])
    np.testing.assert_array_equal(back["data.exact_duplicates"].series["curve"], [1.0, 0.5, 0.25])
    assert back.identity == {"seed": 3, "torch": "2.13"}


def test_json_file_round_trip(tmp_path):
    r = Report(_results())
    path = tmp_path / "sub" / "findings.json"
    r.to_json(path)
    assert Report.from_json(str(path)).to_dict() == r.to_dict()


def test_html_repr_has_status_summary_metrics_truncated_evidence_and_advice():
    html = _results()[0]._repr_html_()
    assert "WARN" in html and "#9a6700" in html  # badge and colour
    assert "25 test rows copied from train" in html
    assert "leaked_rows" in html and "Drop the copied rows from test." in html
    assert "15 more rows" in html  # 25 rows, 10 shown
    page = Report(_results()).to_html()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "http://" not in page and "https://" not in page  # standalone
    for r in _results():
        assert r.summary in page


def test_html_escapes_user_text():
    r = CheckResult("loop.resume", "fail", "<script>alert(1)</script>")
    assert "<script>" not in r._repr_html_()


def test_to_frame_and_markdown():
    r = Report(_results())
    df = r.to_frame()
    assert list(df["check"]) == r.checks and list(df["status"]) == ["warn", "fail", "pass", "skip"]
    md = r.to_markdown()
    assert "| FAIL | `loop.accumulation` | gradients differ by 50% |" in md
    assert "Drop the copied rows from test." in md and "15 more rows" in md


def test_metrics_must_be_flat():
    with pytest.raises(TypeError, match="number or string"):
        CheckResult("loop.resume", "pass", "x", metrics={"bad": [1, 2]})


def test_default_plot_draws_series():
    from tropt.errors import TroptError
    from tropt.plots import plot_series

    ax = plot_series(_results()[0])  # the fallback picture for checks without their own plotter
    assert ax.get_lines() and "data.exact_duplicates" in ax.get_title(loc="left")
    with pytest.raises(TroptError, match="nothing to plot"):
        plot_series(_results()[2])
