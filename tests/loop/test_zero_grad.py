"""loop.zero_grad with known answers: a missing or misplaced zero_grad is caught."""

from __future__ import annotations

from support.loop_cases import mlp_setup, run_all, statuses

from tropt.loop import check_zero_grad
from tropt.result import Status


def step_without_zero_grad(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    ctx.optimizer.step()
    if ctx.scheduler is not None:
        ctx.scheduler.step()


def test_missing_zero_grad_is_caught_by_zero_grad_only():
    results = run_all(mlp_setup(step_without_zero_grad, k=2))
    r = results["loop.zero_grad"]
    assert r.status is Status.FAIL and "left over from step 1" in r.summary
    assert r.metrics["leak_equals_leftover_gradient"] is True
    assert "zero_grad" in r.advice[0]
    assert {c: s for c, s in statuses(results).items() if s is Status.FAIL} == {"loop.zero_grad": Status.FAIL}


def test_zero_grad_between_backward_and_step_is_caught():
    def step(ctx, mbs):
        ctx.loss_fn(ctx.model, mbs[0]).backward()
        ctx.optimizer.zero_grad()
        ctx.optimizer.step()

    r = check_zero_grad(mlp_setup(step, scheduler=False))
    assert r.status is Status.FAIL and "no gradient reaches optimizer.step()" in r.summary
