"""Issue #30: cost and quality side by side (to_frame per run, the plan's table and Pareto view), fair budgets for a
batch-size candidate, and readable plans (candidates by what they change, one data fingerprint, no WARN among the
bottlenecks)."""

from __future__ import annotations

import pytest
import torch
from support.compare_setups import make_setup
from support.synthetic_comparisons import comparison

import tropt
from tropt.experiments.plan import OptimizationPlan

BASE = {0: 1.00, 1: 1.03, 2: 0.98}


def _report(*results):
    return tropt.Report(list(results) or [tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")],
                        {"tropt": tropt.__version__, "config_hash": "c0ffee", "data_fingerprint": "fp-diagnosis"})


def _report_of(comp):
    """The findings of the Setup the comparison ran on (a plan mixing two Setups is refused)."""
    return tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")],
                        {"tropt": tropt.__version__, **comp.meta["identity"]})


def _priced():
    """'better' is 0.1 better at twice the baseline's time, 'cheap' equal at half, 'bad' worse and slower."""
    comp = comparison({"baseline": BASE, "better": {s: v - 0.1 for s, v in BASE.items()},
                       "cheap": {0: 1.001, 1: 1.029, 2: 0.981}, "bad": {s: v + 0.1 for s, v in BASE.items()}},
                      seconds={"better": 2.0, "cheap": 0.5, "bad": 3.0},
                      overrides={"baseline": {}, "better": {"model": "Wide"}, "cheap": {"model": "Tiny"},
                                 "bad": {"model": "Odd"}})
    for r in comp.records:
        r["cost"] = r["seconds"] / 1000
    comp.meta["identity"] = {"config_hash": "c0ffee", "data_fingerprint": "fp-comparison"}
    return comp


def test_to_frame_reports_every_cost_per_run_and_the_relative_cost():
    frame = _priced().to_frame()
    # Before: cost was summed over the 3 runs (0.006) while seconds were averaged (2.0).
    assert frame.loc["better", "cost"] == pytest.approx(0.002) and frame.loc["better", "seconds"] == 2.0
    assert frame.loc["better", "total_cost"] == pytest.approx(0.006)
    assert frame.loc["better", "relative_cost"] == pytest.approx(2.0)
    assert frame.loc["cheap", "seconds_per_step"] == pytest.approx(0.05)  # 0.5 s over 10 steps


def test_the_plan_shows_cost_and_quality_side_by_side_with_the_pareto_front():
    plan = OptimizationPlan.from_report(_report(), _priced())
    rows = {r["name"]: r for r in plan.costs}
    assert rows["better"]["pareto"] and rows["cheap"]["pareto"] and not rows["bad"]["pareto"]
    md = plan.to_markdown()
    assert "## Cost and quality" in md and "relative cost" in md
    better = next(line for line in md.splitlines() if line.startswith("| better |"))
    assert "2.00×" in better and "model=Wide" in better and "| yes |" in better
    page = plan.to_html()
    assert "tropt-costs" in page and "<svg" in page  # the table and the Pareto view
    again = OptimizationPlan.from_json(plan.to_json())
    assert [r["name"] for r in again.costs] == list(rows)


def test_a_plan_has_one_data_fingerprint_and_no_warn_among_its_bottlenecks():
    warn = tropt.CheckResult("perf.memory", "warn", "the peak is 80% of the device", advice=["Lower the batch."])
    plan = OptimizationPlan.from_report(_report(warn), _priced())
    md = plan.to_markdown()
    assert md.count("fp-diagnosis") == 1 and "fp-comparison" not in md
    assert not plan.bottlenecks and [w["check"] for w in plan.warnings] == ["perf.memory"]
    bottlenecks = md.split("## Bottlenecks")[1].split("##")[0]
    assert "perf.memory" not in bottlenecks and "perf.memory" in md.split("## Warnings")[1]


def _momentum_factory(lr: float, momentum: float):
    return lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)


def test_candidates_read_by_what_they_change():
    comp = tropt.compare(make_setup(), {"sgd_m": {"optimizer": _momentum_factory(0.05, 0.9)}},
                         budget=tropt.Budget(steps=10), progress=False)
    assert comp.meta["candidates"]["sgd_m"] == {"optimizer": "SGD(lr=0.05, momentum=0.9)"}
    md = OptimizationPlan.from_report(_report_of(comp), comp).to_markdown()
    assert "<locals>" not in md and "given by the user" not in md
    assert "### 1. sgd\\_m — optimizer=SGD(lr=0.05, momentum=0.9) (compared candidate, your candidate)" in md


def test_a_batch_size_candidate_is_compared_at_equal_samples():
    comp = tropt.compare(make_setup(), {"batch_64": {"batch_size": 64}}, budget=tropt.Budget(steps=20),
                         progress=False)
    runs = comp.runs
    assert set(runs.query("candidate == 'baseline'")["samples"]) == {640}
    # Before: 20 steps of 64 samples, twice the baseline's data
    assert set(runs.query("candidate == 'batch_64'")["samples"]) == {640}
    assert set(runs.query("candidate == 'batch_64'")["steps"]) == {10}
    assert comp.compared_at == "equal samples" and any("batch_64 reads batches of 64" in n for n in comp.notes)
    plan = OptimizationPlan.from_report(_report_of(comp), comp)
    assert plan.baseline["compared_at"].startswith("equal samples")
    same = tropt.compare(make_setup(), {"lr": {"lr": 0.1}}, budget=tropt.Budget(steps=5), progress=False)
    assert same.compared_at == "equal steps"
