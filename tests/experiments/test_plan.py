"""Stage 7b acceptance: suggest -> compare -> decide -> plan, on problems whose answer is known."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from support.compare_setups import make_setup

import tropt
from tropt.experiments import orchestration
from tropt.experiments.plan import FIELDS, INTERVENTION_FIELDS, NOT_COMPARED, OptimizationPlan
from tropt.experiments.suggest import FindingsError
from tropt.testing import untouched


def _no_compare(*args, **kwargs):
    raise AssertionError("a comparison ran although the plan must not run one")


def _leaky_splits(n_copies: int = 20) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    train = pd.DataFrame(rng.normal(size=(200, 4)), columns=list("abcd")).assign(y=rng.integers(0, 3, 200))
    val = pd.DataFrame(rng.normal(size=(60, 4)), columns=list("abcd")).assign(y=rng.integers(0, 3, 60))
    val.iloc[:n_copies] = train.iloc[:n_copies].to_numpy()  # planted leak: val rows copied from train
    return {"train": train, "val": val}


def assert_complete(plan: OptimizationPlan) -> None:
    """Every plan field is present and non-empty, or says why it is empty."""
    d = plan.to_dict()
    for f in FIELDS:
        assert f in d
        assert d[f] or plan.why_empty.get(f), f"{f} is empty and says not why"
    for f in ("runtime_per_step_ms", "samples_per_s", "convergence_class", "final_metric"):
        assert plan.baseline.get(f) not in (None, ""), f
    assert plan.baseline.get("cost") or plan.baseline.get("cost_per_run") is not None
    for iv in plan.interventions:
        for f in INTERVENTION_FIELDS:
            assert iv.get(f) not in (None, "", [], {}), f"intervention {iv.get('name')}: {f} is empty"
    assert plan.stop_conditions and plan.escalate_conditions and plan.outcome_reason


@pytest.fixture(scope="module")
def too_low_lr():
    """A healthy setup whose SGD learning rate (1e-3) is ~80x below what the LR range test finds."""
    setup = make_setup(lr=1e-3)
    rep = tropt.diagnose(setup, checks=["dynamics.lr_range"], progress=False)
    with untouched(setup):
        plan = tropt.optimize(setup, budget=tropt.Budget(steps=80), report=rep, reinit=True, progress=False)
    return rep, plan


def test_too_low_lr_is_suggested_compared_and_adopted(too_low_lr):
    rep, plan = too_low_lr
    lr = rep["dynamics.lr_range"]
    assert lr.status is tropt.Status.WARN
    sugg = tropt.suggest(rep)
    low, high = lr.metrics["suggested_low"], lr.metrics["suggested_high"]
    assert low <= sugg["lr_range"]["lr"] <= high  # the LR range's value
    assert sugg.details["lr_range"].finding == "dynamics.lr_range" and "0.001" in sugg.details["lr_range"].hypothesis
    assert plan.comparison is not None and "lr_range" in plan.comparison.candidates
    verdict = plan.comparison.decision().set_index("candidate").loc["lr_range"]
    assert verdict["verdict"] == "adopt" and verdict["gain"] > verdict["noise"]  # beats seed noise
    assert plan.outcome == "adopt" and [a["name"] for a in plan.adopted] == ["lr_range"]
    first = plan.interventions[0]
    assert first["name"] == "lr_range" and first["kind"] == "compared candidate"
    assert first["observed"].startswith("adopt") and "seeds" in str(first["identity"])
    assert_complete(plan)


def test_plan_from_saved_files_matches(too_low_lr, tmp_path):
    rep, plan = too_low_lr
    rep.to_json(tmp_path / "findings.json")
    plan.comparison.to_json(tmp_path / "comparison.json")
    again = OptimizationPlan.from_report(str(tmp_path / "findings.json"), str(tmp_path / "comparison.json"))
    assert (again.outcome == plan.outcome
            and [i["name"] for i in again.interventions] == [i["name"] for i in plan.interventions])
    assert again.interventions[0]["hypothesis"] == plan.interventions[0]["hypothesis"]  # carried in comparison.json


def test_data_leak_blocks_and_is_first(monkeypatch):
    monkeypatch.setattr(orchestration, "compare", _no_compare)
    setup = make_setup(lr=1e-3)  # also a too-low LR: the leak must still come first and nothing be compared
    plan = tropt.optimize(setup, splits=_leaky_splits(), label="y", budget=tropt.Budget(steps=50),
                          checks=["data.exact_duplicates", "dynamics.lr_range"], progress=False)
    assert plan.outcome == "blocked" and plan.comparison is None
    first = plan.interventions[0]
    assert first["kind"] == "blocking fix" and first["finding"] == "data.exact_duplicates"
    assert plan.bottlenecks[0]["check"] == "data.exact_duplicates"
    assert "leaked_rows" in first["observed"]  # the evidence travels with it
    assert all(iv["kind"] == "blocking fix" for iv in plan.interventions)  # no candidate derived from a leaky setup
    assert not plan.adopted and "block" in plan.why_empty["adopted"]
    assert_complete(plan)


def test_never_compared_intervention_is_a_hypothesis(too_low_lr):
    rep, _ = too_low_lr
    plan = OptimizationPlan.from_report(rep)
    assert plan.outcome == "not compared" and plan.interventions
    for iv in plan.interventions:
        assert iv["kind"] == "hypothesis" and iv["observed"].startswith(NOT_COMPARED)
    assert_complete(plan)


def test_rendering_round_trip_and_escaping(too_low_lr):
    rep, plan = too_low_lr
    hostile = tropt.Report([tropt.CheckResult("perf.precision", "warn", "<script>alert(1)</script>",
                                              {"recommended": "bf16", "setup_precision": "fp32"}, advice=["*x* <b>"])],
                           rep.identity)
    p = OptimizationPlan.from_report(hostile)
    page = p.to_html()
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert "http://" not in page and "https://" not in page and "<link" not in page  # standalone, offline
    assert "<script>" not in p.to_markdown()
    for q in (plan, p):
        d = q.to_dict()
        assert OptimizationPlan.from_json(json.dumps(d)).to_dict() == d


# ------------------------------------------------------------------------------------------------ bad input
def test_findings_from_another_version(too_low_lr):
    rep, _ = too_low_lr
    d = rep.to_dict()
    d["identity"]["tropt"] = "0.0.1"
    with pytest.raises(FindingsError, match=r"tropt 0\.0\.1.*re-run the diagnosis"):
        OptimizationPlan.from_report(d)
    with pytest.raises(FindingsError, match="re-run"):
        tropt.suggest(json.dumps(d))


def test_plan_with_no_findings(tmp_path):
    with pytest.raises(FindingsError, match="no findings"):
        OptimizationPlan.from_report(tropt.Report([], {}))
    skipped = tropt.Report([tropt.CheckResult("perf.memory", "skip", "no setup")], {})
    with pytest.raises(FindingsError, match="no findings"):
        OptimizationPlan.from_report(skipped)
    with pytest.raises(FindingsError, match="does not exist"):
        OptimizationPlan.from_report(str(tmp_path / "missing.json"))
    with pytest.raises(FindingsError, match="not tropt findings"):
        OptimizationPlan.from_report({"status": "pass"})


def test_budget_the_baseline_alone_exceeds_escalates_with_numbers(monkeypatch):
    monkeypatch.setattr(orchestration, "compare", _no_compare)
    setup = make_setup(lr=1e-3)
    rep = tropt.diagnose(setup, checks=["perf.throughput", "dynamics.lr_range"], progress=False)
    step_ms = rep["perf.throughput"].metrics["step_ms"]
    plan = tropt.optimize(setup, budget=tropt.Budget(steps=1_000_000, seconds=1.0), report=rep, progress=False)
    assert plan.outcome == "escalate" and plan.escalates and plan.comparison is None
    assert "1000000 steps" in plan.outcome_reason and f"{step_ms:.3g} ms" in plan.outcome_reason
    assert "1 s" in plan.outcome_reason  # the limit it exceeds
    assert not plan.adopted and plan.why_empty["adopted"]
    assert_complete(plan)


def test_optimize_rejects_a_missing_budget():
    with pytest.raises(tropt.TroptError, match="budget"):
        tropt.optimize(make_setup(), budget=None)


def test_blocking_fix_shows_its_fix_and_an_errored_correctness_check_is_noted():
    leak = tropt.CheckResult("data.group_leakage", "fail", "12 customers in both splits", {"shared_groups": 12},
                             advice=["Split by customer_id (GroupShuffleSplit)."])
    err = tropt.CheckResult("loop.resume", "error", "save_state raised")
    plan = OptimizationPlan.from_report(tropt.Report([leak, err], {"tropt": tropt.__version__}))
    assert plan.interventions[0]["fix"] == "Split by customer_id (GroupShuffleSplit)."
    assert "**fix**: Split by customer\\_id" in plan.to_markdown()
    assert [b["check"] for b in plan.bottlenecks] == ["data.group_leakage", "loop.resume"]  # FAIL before ERROR
    assert any("loop.resume could not run" in n for n in plan.notes)
