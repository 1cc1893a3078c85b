"""The cost of a diagnosis in step-equivalents of the user's step (issue 32): every model-side result carries
``metrics["cost_steps"]``, the report's identity the total, and its footer says it; timing the step mutates nothing
of the user's."""

from __future__ import annotations

import pytest
import torch
from support.model_fixtures import healthy

import tropt
from tropt.core.step_cost import add_costs, step_seconds
from tropt.output import cost_line
from tropt.result import CheckResult, Status
from tropt.testing import untouched


def test_step_seconds_times_the_users_step_on_a_copy_and_restores_its_closure():
    calls = {"n": 0}
    setup = healthy()
    inner = tropt.standard_step

    def step(ctx, micro_batches):
        calls["n"] += 1  # state the step keeps in its closure: the user's, not tropt's
        return inner(ctx, micro_batches)

    setup = setup.replace(step=step)
    with untouched(setup):
        s = step_seconds(setup, warmup=1, steps=2)
    assert s is not None and s > 0
    assert calls["n"] == 3  # one warm-up, two timed


def test_a_step_that_raises_has_no_cost_and_no_error():
    def broken(ctx, micro_batches):
        raise RuntimeError("the user's step is broken")

    assert step_seconds(healthy().replace(step=broken)) is None


def test_add_costs_divides_each_model_side_check_by_the_step():
    rs = [CheckResult("model.init_loss", Status.PASS, "ok", duration_s=0.5),
          CheckResult("data.label_shift", Status.PASS, "ok", duration_s=9.0)]
    totals = add_costs(rs, 0.25, {"model.init_loss"})
    assert rs[0].metrics["cost_steps"] == 2.0 and "cost_steps" not in rs[1].metrics
    assert totals == {"step_seconds": 0.25, "cost_steps": 2.0}
    assert add_costs(rs, None, {"model.init_loss"}) == {}


def test_diagnose_reports_each_checks_cost_and_the_total_in_its_footer():
    torch.manual_seed(0)
    report = tropt.diagnose(healthy(), checks=["model.init_loss", "loop.zero_grad"], progress=False)
    costs = [r.metrics["cost_steps"] for r in report.results]
    assert all(c > 0 for c in costs), costs
    assert report.identity["cost_steps"] == pytest.approx(sum(costs), abs=0.2)
    line = cost_line(report.identity)
    assert line and "step-equivalents of your step" in line
    assert f"{report.identity['cost_steps']:,.0f} step-equivalents of your step" in report.to_markdown()
    assert "step-equivalents of your step" in report.to_html()
    assert cost_line({}) is None
