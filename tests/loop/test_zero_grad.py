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


# ------------------------------------------------------------------ several optimizers (issue 28)
def test_two_optimizers_healthy_gan_passes_for_each_optimizer():
    from support.two_optimizers import gan_setup

    for form in ("tuple", "dict", "ctx"):
        r = check_zero_grad(gan_setup(form), progress=False)
        assert r.status is Status.PASS, (form, r.summary)
        assert r.metrics["optimizers"] == 2, form  # both updates compared, not only the first
        assert len(r.tables["optimizers"]) == 2


def test_missing_netD_zero_grad_is_found_and_named_with_its_parameters():
    from support.two_optimizers import gan_setup

    r = check_zero_grad(gan_setup("dict", zero_d=False), progress=False)
    assert r.status is Status.FAIL, r.summary
    assert "at D.step() (it holds netD.*)" in r.summary and "left over from step 1" in r.summary
    assert r.metrics["optimizer"] == "D" and r.metrics["leak_equals_leftover_gradient"] is True
    assert "D.zero_grad" in r.advice[0]


def test_missing_zero_grad_of_an_optimizer_kept_on_ctx_is_named():
    from support.two_optimizers import gan_setup

    # G's gradients leak; D is cleared: the finding is ctx.opt_g, holding netG's parameters
    r = check_zero_grad(gan_setup("ctx", zero_g=False), progress=False)
    assert r.status is Status.FAIL, r.summary
    assert "at ctx.opt_g.step() (it holds netG.*)" in r.summary and "left over from step 1" in r.summary


def test_a_difference_the_leftover_gradient_does_not_explain_is_not_blamed_on_it():
    """#27 §2: state carried outside ctx (a closure counter scaling the loss) changes the rerun step; the leftover
    gradient is zero (zero_grad is called), so "gradients from earlier steps leak" would be a wrong cause."""
    from support.two_optimizers import gan_setup

    r = check_zero_grad(gan_setup("tuple", carry={}), progress=False)
    assert r.status is Status.WARN, r.summary
    assert "cause not isolated" in r.summary and "differs from a fresh one by" in r.summary
    assert "leak" not in r.summary
    assert r.metrics["leak_equals_leftover_gradient"] is False


def test_single_optimizer_leak_scaled_by_a_factor_is_still_named():
    """A leftover that reaches the step times a factor (here the loss is halved each call, the leftover is not) is
    not exactly fresh + leftover: the least-squares factor still isolates it, and the summary gives it."""
    calls = {"n": 0}

    def step(ctx, micro_batches):
        calls["n"] += 1
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        for p in ctx.model.parameters():  # the step rescales the accumulated gradient: leftover times 0.5 too
            if p.grad is not None:
                p.grad.mul_(0.5)
        ctx.optimizer.step()

    r = check_zero_grad(mlp_setup(step, k=1), progress=False)
    assert r.status is Status.FAIL and "left over from step 1 times 0.5" in r.summary, r.summary


def test_a_leak_the_step_then_clips_is_named_with_the_clip():
    """Without zero_grad, step t clips the sum of the fresh and the leftover gradient: step t's gradient is neither
    fresh + leftover nor fresh + f * leftover, but c * (fresh before clipping + leftover). The cause is named
    (cleanrl's PPO with clip_grad_norm_(0.5) and a forgotten zero_grad)."""
    import torch

    def step(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1e-3)  # always clips: the norms are far above
        ctx.optimizer.step()

    r = check_zero_grad(mlp_setup(step, k=1), progress=False)
    assert r.status is Status.FAIL, r.summary
    assert "plus the gradient left over from step 1, clipped together with it" in r.summary
