"""The root cause first, the symptoms after it, for every stage-4 check (issue 27 §5): a loop.* FAIL that isolates
a defect in the step explains the findings of the checks that ran that step when their own evidence is a kind that
defect produces (tropt.linking.EXPLAINS). Known answers: a planted scheduler-cadence bug and a planted zero_grad
leak each put their root first, their symptoms after it with advice that changes no hyperparameter, and the plan's
first fix is the root; the same step without the bug links nothing; a FAIL with no root keeps its own advice.
"""

from __future__ import annotations

import re
import warnings

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from support import real_loops as rl

import tropt
from tropt.experiments.plan import OptimizationPlan
from tropt.linking import EXPLAINS, is_root, link_findings, symptom_kinds
from tropt.result import CheckResult, Report, Status
from tropt.result import link_findings as link_from_result
from tropt.verdict import verdict

HYPERPARAMETER = re.compile(r"learning rate|clip|batch size|\blr\b", re.IGNORECASE)


def _ce(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def decaying_schedule_setup(*, per_micro: bool, lr: float = 0.2) -> tropt.Setup:
    """A classifier whose LambdaLR decays by 0.97 per optimizer step; ``per_micro`` is the planted bug: the scheduler
    is stepped once per micro-batch, so with K=4 the learning rate decays 4x too fast and training stalls."""
    def step(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
            if per_micro:  # BUG: the schedule advances per micro-batch
                ctx.scheduler.step()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
        if not per_micro:
            ctx.scheduler.step()

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(128, 8, generator=g), torch.randint(0, 4, (128,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    return tropt.Setup(model, _ce, lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9), batches,
                       step=step, scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.97 ** s),
                       accumulation_steps=4, num_classes=4)


def _diagnose(setup: tropt.Setup, checks: list[str]) -> Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about a scheduler stepped before the optimizer: the bug
        # The overfit run pinned (32 samples, 100 steps) so the known answer does not move with the budget's defaults.
        return tropt.diagnose(setup, checks=checks, budget="quick", progress=False,
                              options={"model.overfit_batch": {"samples": 32, "steps": 100}})


def _ids(rep) -> list[str]:
    return [f.check for f in verdict(rep).findings]


def _first_blocking(rep: Report) -> dict:
    plan = OptimizationPlan.from_report(rep)
    return next(iv for iv in plan.interventions if iv["kind"] == "blocking fix")


CADENCE_CHECKS = ["model.overfit_batch", "loop.scheduler_cadence"]
LEAK_CHECKS = ["model.overfit_batch", "loop.zero_grad", "dynamics.loss_curve"]


def test_planted_scheduler_per_micro_batch_is_the_root_of_the_stalled_overfit():
    rep = _diagnose(decaying_schedule_setup(per_micro=True), CADENCE_CHECKS)
    root, overfit = rep["loop.scheduler_cadence"], rep["model.overfit_batch"]
    assert root.status is Status.FAIL and "per micro-batch" in root.summary, root.summary
    assert "symptom_of" not in root.metrics
    assert overfit.status is Status.FAIL, overfit.summary  # the learning rate decayed 4x too fast: it stalls
    assert overfit.metrics["symptom_of"] == "loop.scheduler_cadence"
    assert "loop.scheduler_cadence" in overfit.summary and "loop.scheduler_cadence" in overfit.advice[0]
    assert not any(HYPERPARAMETER.search(a) for a in overfit.advice), overfit.advice
    ids = _ids(rep)
    assert ids.index("loop.scheduler_cadence") < ids.index("model.overfit_batch"), ids
    assert ids[0] == "loop.scheduler_cadence", ids
    first = _first_blocking(rep)
    assert first["finding"] == "loop.scheduler_cadence" and "scheduler.step()" in first["fix"], first


def test_the_same_schedule_stepped_once_per_optimizer_step_links_nothing():
    rep = _diagnose(decaying_schedule_setup(per_micro=False), CADENCE_CHECKS)
    assert [r.check for r in rep if r.status is Status.FAIL] == []
    assert not any("symptom_of" in r.metrics for r in rep)


def test_planted_zero_grad_leak_is_the_root_of_the_overfit_and_loss_curve_fails():
    rep = _diagnose(rl.manual_sgd_setup(forget_zero_grad=True), LEAK_CHECKS)
    assert rep["loop.zero_grad"].status is Status.FAIL and "left over" in rep["loop.zero_grad"].summary
    # the leaked gradients make training go nowhere: the overfit run ends worse than its zeroed-input baseline (a
    # WARN: the model reads its input, so "ignores its input" is not its cause) and the loss curve is flagged (flat
    # or diverging, as the curve classifier reads a loss that ends above its start)
    overfit = rep["model.overfit_batch"]
    assert overfit.status is Status.WARN and "is worse than" in overfit.summary, overfit.summary
    for cid in ("model.overfit_batch", "dynamics.loss_curve"):
        r = rep[cid]
        assert r.status in (Status.FAIL, Status.WARN), (cid, r.summary)
        assert r.metrics["symptom_of"] == "loop.zero_grad", cid
        assert not any(HYPERPARAMETER.search(a) or "raise" in a.lower() for a in r.advice), r.advice
    ids = _ids(rep)
    assert ids[0] == "loop.zero_grad", ids
    first = _first_blocking(rep)
    assert first["finding"] == "loop.zero_grad" and "zero_grad" in first["fix"], first


def test_a_healthy_step_links_nothing():
    rep = _diagnose(rl.manual_sgd_setup(), LEAK_CHECKS)
    assert rep["loop.zero_grad"].status is Status.PASS
    assert not any("symptom_of" in r.metrics for r in rep)


def test_a_diverging_overfit_with_a_healthy_step_stays_as_it_is():
    rep = _diagnose(decaying_schedule_setup(per_micro=False, lr=30.0), [*CADENCE_CHECKS, "loop.zero_grad"])
    overfit = rep["model.overfit_batch"]
    assert overfit.status is Status.FAIL and "diverge" in overfit.summary, overfit.summary
    assert not any("symptom_of" in r.metrics for r in rep)
    assert any("learning rate" in a for a in overfit.advice)  # its own advice: nothing upstream explains it
    assert _ids(rep)[0] == "model.overfit_batch"


# ----------------------------------------------------------------------------------------- the rule, synthetically
def _r(check: str, status: str, summary: str, metrics: dict | None = None, **kw) -> CheckResult:
    return CheckResult(check, status, summary, metrics or {}, advice=kw.pop("advice", ["Lower the learning rate."]),
                       **kw)


ZERO_GRAD = _r("loop.zero_grad", "fail", "step 2 equals the fresh gradient plus the gradient left over from step 1",
               advice=["Call optimizer.zero_grad(set_to_none=True) once per optimizer step."])
SCALING = _r("loop.loss_scaling", "fail", "the clipped gradients depend on the loss scale: clip before unscale",
             advice=["Call scaler.unscale_(optimizer) before clipping."])
TRAIN_MODE = _r("loop.train_mode", "fail", "2 dropout/batch-norm module(s) run in eval mode while your step trains",
                advice=["Call model.train() before the training steps."])


def test_a_nonfinite_comparison_or_a_cause_not_isolated_is_no_root():
    nonfinite = _r("loop.zero_grad", "fail", "non-finite gradients at step 2: nothing can be compared",
                   {"nonfinite_step": 2})
    unisolated = _r("loop.zero_grad", "fail", "step 2 differs by 40%; cause not isolated")
    unnamed = _r("loop.accumulation", "fail", "4 micro-batches change the gradient", {"cause": "not_isolated"})
    assert not any(is_root(r) for r in (nonfinite, unisolated, unnamed))
    assert all(is_root(r) for r in (ZERO_GRAD, SCALING, TRAIN_MODE))
    overfit = _r("model.overfit_batch", "fail", "the loss diverges", {"peak_loss": 9.0})
    assert not any("symptom_of" in r.metrics for r in link_findings([overfit, nonfinite]))


def test_each_root_explains_only_the_kinds_it_produces():
    nonfinite_overfit = _r("model.overfit_batch", "fail", "the loss became non-finite at step 3")
    stalled_overfit = _r("model.overfit_batch", "fail", "the loss stalls at a floor of 0.8")
    gap = _r("model.eval_metric", "fail", "the metric on the training batch and on evaluation disagree: a gap of 30%")
    # a loss_scaling defect explains non-finite steps, not a stall
    out = {r.check: r for r in link_findings([nonfinite_overfit, SCALING])}
    assert out["model.overfit_batch"].metrics["symptom_of"] == "loop.loss_scaling"
    assert out["model.overfit_batch"].metrics["symptom_kind"] == "non-finite"
    assert "symptom_of" not in link_findings([stalled_overfit, SCALING])[0].metrics
    # a train_mode defect explains an eval gap, not a non-finite loss
    assert link_findings([gap, TRAIN_MODE])[0].metrics["symptom_of"] == "loop.train_mode"
    assert "symptom_of" not in link_findings([nonfinite_overfit, TRAIN_MODE])[0].metrics
    # a zero_grad leak explains the stall
    assert link_findings([stalled_overfit, ZERO_GRAD])[0].metrics["symptom_of"] == "loop.zero_grad"
    # a resume or DDP defect shows only in runs no other check makes: a root, explaining nothing
    resume = _r("loop.resume", "fail", "the optimizer state differs after resuming: exp_avg was not saved")
    assert is_root(resume) and EXPLAINS["loop.resume"] == {}
    assert "symptom_of" not in link_findings([stalled_overfit, resume])[0].metrics


def test_a_model_defect_is_no_symptom_but_a_loss_that_never_fell_is():
    ignores = _r("model.overfit_batch", "fail", "the model ignores its input: its loss 0.9 does not beat 0.85",
                 {"start_loss": 1.4, "final_loss": 0.9})
    never_fell = _r("model.overfit_batch", "fail", "the model ignores its input: its loss 1.9 does not beat 0.85",
                    {"start_loss": 1.4, "final_loss": 1.9})
    assert symptom_kinds(ignores) == frozenset()
    assert "symptom_of" not in link_findings([ignores, ZERO_GRAD])[0].metrics
    assert link_findings([never_fell, ZERO_GRAD])[0].metrics["symptom_of"] == "loop.zero_grad"


def test_loss_curve_kinds_are_read_from_its_flagged_classes():
    findings = pd.DataFrame({"class": ["overfitting", "flat"], "flagged": [True, False], "evidence": ["", ""]})
    curve = _r("dynamics.loss_curve", "warn", "overfitting: the validation loss rises", tables={"findings": findings})
    assert symptom_kinds(curve) == frozenset({"eval gap"})
    out = link_findings([TRAIN_MODE, curve])
    assert out[1].metrics["symptom_of"] == "loop.train_mode"
    assert out[1].status is Status.WARN and "Fix the step first" in out[1].advice[0]
    assert "symptom_of" not in link_findings([ZERO_GRAD, curve])[1].metrics  # a leak is no generalisation gap


def test_a_cause_less_loop_fail_follows_the_root_and_the_first_root_in_contract_order_wins():
    ddp = _r("loop.ddp", "fail", "under DDP the gradients differ by 83%; cause not isolated", {"cause": "not_isolated"})
    stalled = _r("model.overfit_batch", "fail", "the loss stalls at a floor of 0.8")
    cadence = _r("loop.scheduler_cadence", "fail", "the schedule depends on accumulation: stepped per micro-batch",
                 advice=["Call scheduler.step() once per optimizer step."])
    out = {r.check: r for r in link_findings([stalled, ZERO_GRAD, cadence, ddp])}
    assert out["loop.ddp"].metrics["symptom_of"] == "loop.zero_grad"
    assert out["model.overfit_batch"].metrics["symptom_of"] == "loop.zero_grad"
    assert "symptom_of" not in out["loop.scheduler_cadence"].metrics  # a root of its own
    ids = _ids(list(out.values()))
    assert ids[:2] == ["loop.zero_grad", "loop.scheduler_cadence"], ids
    assert link_findings(list(out.values())) == list(out.values())  # linking twice changes nothing


def test_link_findings_is_still_importable_from_the_result_model():
    results = [_r("model.overfit_batch", "fail", "the loss stalls at a floor of 0.8"), ZERO_GRAD]
    assert link_from_result(results) == link_findings(results)


def test_the_table_has_one_row_per_stage_4_check():
    from tropt.registry import PUBLIC_IDS

    assert set(EXPLAINS) == {c for c, stage in PUBLIC_IDS.items() if stage == 4}


def test_loss_curve_kinds_fall_back_to_its_classes_metric():
    curve = _r("dynamics.loss_curve", "fail", "the curve says so", {"classes": "diverging, overfitting"})
    assert symptom_kinds(curve) == frozenset({"diverges", "eval gap"})
    assert link_findings([ZERO_GRAD, curve])[1].metrics["symptom_kind"] == "diverges"
