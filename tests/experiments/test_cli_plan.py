"""`tropt plan --findings findings.json [--comparison comparison.json] -o plan.md|plan.html`."""

from __future__ import annotations

import tropt
from tropt.cli import main
from tropt.experiments.comparison import Comparison
from tropt.result import CheckResult, Report


def _findings(tmp_path, version=None):
    rep = Report([CheckResult("perf.throughput", "pass", "compute-bound",
                              {"step_ms": 2.0, "samples_per_s": 100.0, "limited_by": "compute", "batch_size": 32.0}),
                  CheckResult("perf.precision", "warn", "recommend bf16 <b>",
                              {"recommended": "bf16", "setup_precision": "fp32"})],
                 {"tropt": version or tropt.__version__, "config_hash": "abc"})
    path = tmp_path / "findings.json"
    rep.to_json(path)
    return str(path)


def _run(name, seed, score, stopped_by="budget", seconds=1.0):
    return {"candidate": name, "seed": seed, "status": "ok", "reason": "", "score": score, "final": score,
            "best": score, "steps": 10, "samples": 320, "seconds": seconds, "samples_per_s": 320 / seconds,
            "peak_memory_mb": 1.0,
            "stopped_by": stopped_by, "unstable": False, "curves": {}}


def _comparison(tmp_path, capped: bool):
    recs = [_run("baseline", s, 1.0 + 0.01 * s, "seconds" if capped else "budget") for s in (0, 1, 2)]
    recs += [_run("precision_bf16", s, 1.0 + 0.01 * s) for s in (0, 1, 2)]
    comp = Comparison(recs, {"metric": "val_loss", "seeds": [0, 1, 2], "budget": {"steps": 10, "seconds": 1.0},
                             "candidates": {"baseline": {}, "precision_bf16": {"precision": "bf16"}},
                             "guardrails": None})
    path = tmp_path / "comparison.json"
    comp.to_json(path)
    return str(path)


def test_plan_markdown_and_html(tmp_path, capsys):
    findings = _findings(tmp_path)
    assert main(["plan", "--findings", findings, "-o", str(tmp_path / "plan.md")]) == 0
    md = (tmp_path / "plan.md").read_text()
    assert md.startswith("# tropt optimization plan — NOT COMPARED") and "hypothesis — not yet compared" in md
    assert main(["plan", "--findings", findings, "--comparison", _comparison(tmp_path, False),
                 "-o", str(tmp_path / "plan.html")]) == 0
    page = (tmp_path / "plan.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "precision_bf16" in page and "recommend bf16 &lt;b&gt;" in page
    assert "plan:" in capsys.readouterr().out


def test_plan_escalates_with_exit_1(tmp_path, capsys):
    code = main(["plan", "--findings", _findings(tmp_path), "--comparison", _comparison(tmp_path, True),
                 "-o", str(tmp_path / "plan.md")])
    assert code == 1
    out = capsys.readouterr().out
    assert "ESCALATE" in out and "seconds cap" in out and "3 of its runs" in out


def test_plan_bad_input_exit_2(tmp_path, capsys):
    assert main(["plan", "--findings", _findings(tmp_path, "9.9.9"), "-o", str(tmp_path / "plan.md")]) == 2
    assert "tropt 9.9.9" in capsys.readouterr().err
    assert main(["plan", "--findings", str(tmp_path / "none.json"), "-o", str(tmp_path / "plan.md")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plan", "--findings", _findings(tmp_path), "-o", str(tmp_path / "plan.txt")]) == 2
    assert "extension" in capsys.readouterr().err
    assert not (tmp_path / "plan.md").exists()


def test_speed_candidate_adopted_on_throughput_at_equal_score(tmp_path):
    from tropt.experiments.plan import OptimizationPlan

    findings = _findings(tmp_path)
    fast = ([_run("baseline", s, 1.0 + 0.01 * s) for s in (0, 1, 2)]
            + [_run("precision_bf16", s, 1.0 + 0.01 * s, seconds=0.5) for s in (0, 1, 2)])
    same = ([_run("baseline", s, 1.0 + 0.01 * s) for s in (0, 1, 2)]
            + [_run("precision_bf16", s, 1.0 + 0.01 * s, seconds=0.98) for s in (0, 1, 2)])
    meta = {"metric": "val_loss", "seeds": [0, 1, 2], "budget": {"steps": 10},
            "candidates": {"baseline": {}, "precision_bf16": {"precision": "bf16"}}, "guardrails": None}
    adopted = OptimizationPlan.from_report(findings, Comparison(fast, meta))
    assert adopted.outcome == "adopt" and adopted.interventions[0]["observed"].startswith("adopt (speed): 2.00×")
    kept = OptimizationPlan.from_report(findings, Comparison(same, meta))  # 2% faster: within timing noise
    assert kept.outcome == "keep the baseline" and kept.interventions[0]["observed"].startswith("inconclusive")
