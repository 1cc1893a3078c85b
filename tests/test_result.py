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


# ---------------------------------------------------------------------------------------------- hostile values (#31)
def _big_value_result(value: str) -> CheckResult:
    table = pd.DataFrame({"class": ["a", value], "rows": [3, 5]}).set_index("class")
    return CheckResult("data.class_coverage", "fail", f"1 class(es) appear in later splits but never in 'train': "
                       f"{value!r}, 'b'", metrics={"missing": value}, tables={"counts": table},
                       advice=[f"Remove the class {value!r} from the later splits."])


def test_a_huge_value_is_shortened_where_shown_and_kept_in_the_evidence():
    value = "Z" * 1_000_000
    r = _big_value_result(value)
    shown = "'" + "Z" * 200 + "…' (1,000,000 chars)"
    assert r.summary == f"1 class(es) appear in later splits but never in 'train': {shown}, 'b'"
    assert r.advice == [f"Remove the class {shown} from the later splits."]
    report = Report([r], identity={"split": value})
    assert len(report.to_html()) < 50_000 and len(report.to_markdown()) < 50_000
    assert len(r._repr_html_()) < 20_000 and "(1,000,000 chars)" in r._repr_html_()  # the table cell, shortened
    back = Report.from_json(report.to_json())
    assert back["data.class_coverage"].tables["counts"].index[1] == value  # the evidence keeps the whole value
    assert back["data.class_coverage"].metrics["missing"] == value and back.identity["split"] == value
    assert back["data.class_coverage"].summary == r.summary  # shortening is idempotent


def test_a_long_sentence_is_capped_and_short_text_is_untouched():
    words = "word " * 100_000
    r = CheckResult("loop.resume", "fail", words, advice=[words])
    assert len(r.summary) < 2000 and "(500,000 chars)" in r.summary and len(r.advice[0]) < 2000
    plain = "a path /" + "x" * 250 + " stays whole"
    assert CheckResult("loop.resume", "fail", plain).summary == plain


def test_lone_surrogates_survive_every_rendering(tmp_path):
    odd = "bad\udcffname"  # what os.listdir returns for a non-UTF-8 file name
    table = pd.DataFrame({"class": pd.Series([odd], dtype=object), "rows": [1]})
    r = CheckResult("data.class_coverage", "fail", f"class {odd!r} is missing", tables={odd: table}, advice=[odd])
    report = Report([r], identity={"split": odd})
    back = Report.from_json(report.to_json(tmp_path / "findings.json"))
    assert back.to_dict() == report.to_dict()
    report.to_html(tmp_path / "report.html")
    assert "bad\\udcffname" in (tmp_path / "report.html").read_text(encoding="utf-8")
    str(report).encode("utf-8")  # printable: the surrogate is shown as an escape


_FULL_DISK = """
import json, resource, signal, sys
import pandas as pd
from tropt.result import CheckResult, Report
from tropt.errors import TroptError

out = {}
table = pd.DataFrame({"v": ["y" * 100] * 200})
big = Report([CheckResult("loop.resume", "fail", "z " * 100, tables={"t": table}) for _ in range(40)])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the disk is full after 4 kB
for name in ("to_json", "to_html"):
    try:
        getattr(big, name)(sys.argv[1] + "/" + name)
        out[name] = "written"
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def test_a_failed_write_keeps_the_earlier_file_and_names_the_path(tmp_path):
    import subprocess
    import sys

    small = Report(_results())
    small.to_json(tmp_path / "to_json")
    small.to_html(tmp_path / "to_html")
    before = {name: (tmp_path / name).read_text() for name in ("to_json", "to_html")}
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("to_json", "to_html"):
        kind, message = outcome[name]
        assert kind == "TroptError" and str(tmp_path / name) in message, outcome
        assert (tmp_path / name).read_text() == before[name]  # intact, not truncated
    assert Report.from_json(str(tmp_path / "to_json")).to_dict() == small.to_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["to_html", "to_json"]  # no temporary file left


def test_report_and_verdict_print_readably():
    import tropt

    report = Report(_results())
    text = str(report)
    lines = text.splitlines()
    assert lines[0].startswith("verdict: FAIL")
    for r in report:
        assert any(line.split()[:2] == [r.status.value.upper(), r.check] and r.summary in line for line in lines)
    v = str(tropt.verdict(report))
    assert v.splitlines()[0].startswith("verdict: FAIL") and "Verdict(" not in v and "**" not in v
    assert "gradients differ by 50%" in v and v in text
    page = tropt.explain("loop.accumulation")
    assert repr(page) == str(page) == page.text and "\n" in repr(page)
