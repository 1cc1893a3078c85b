"""Right verdict, right cause (stage 4): which run is wrong is decided against loss_fn over the whole batch, causes
are named from the gradients before clipping, and a non-finite value is its own finding, never a match."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import tropt
from tropt.loop import check_accumulation, check_ddp, check_resume, check_zero_grad
from tropt.result import Status
from tropt.testing import untouched

from test_loop_invariance import lm_setup, mlp_setup, step_global_token_mean, token_losses

ACCUM = 4  # a module constant, as many loops have it


def step_constant_divisor(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / ACCUM).backward()  # right only when len(micro_batches) == ACCUM
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def clipped(step_body):
    """The same step with clip_grad_norm_(…, 1.0) between the backward passes and optimizer.step()."""
    def step(ctx, micro_batches):
        step_body(ctx, micro_batches)
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return step


def backward_not_divided(ctx, micro_batches):
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()


def backward_token_mean_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        total, count = token_losses(ctx.model, mb)
        (total / count / len(micro_batches)).backward()


def backward_zero_grad_inside(ctx, micro_batches):
    for mb in micro_batches:
        ctx.optimizer.zero_grad()  # clears what the earlier micro-batches gave
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()


def unclipped(step_body):
    def step(ctx, micro_batches):
        step_body(ctx, micro_batches)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return step


def test_constant_divisor_is_right_at_its_own_k_and_named_for_what_it_is():
    # Configured K=4 = the constant: the K=4 run is right, the K=1 reference run is 1/4 off. A latent WARN.
    setup = mlp_setup(step_constant_divisor, k=4, scheduler=False)
    with untouched(setup):
        r = check_accumulation(setup)
    assert r.status is Status.WARN and r.metrics["latent"] and r.metrics["cause"] == "constant_divisor", r.summary
    assert "divides the loss by a constant 4 whatever the number of micro-batches: correct at K=4" in r.summary
    assert r.metrics["reference_factor_kx"] == pytest.approx(1.0, rel=1e-4)
    assert r.metrics["reference_factor_1x"] == pytest.approx(0.25, rel=1e-4)
    assert "len(micro_batches)" in r.advice[0] and "normalised by its own item count" not in r.summary
    # At another configured K the same step is wrong where it is used: FAIL, same cause.
    for k in (1, 2):
        r = check_accumulation(mlp_setup(step_constant_divisor, k=k, scheduler=False))
        assert r.status is Status.FAIL and "latent" not in r.metrics, (k, r.summary)
        assert r.metrics["cause"] == "constant_divisor" and "correct at K=4" in r.summary


@pytest.mark.parametrize("body, cause, words", [
    (backward_not_divided, "summed", "summed, not averaged"),
    (backward_zero_grad_inside, "last_only", "only the last micro-batch reaches the step"),
])
def test_the_same_bug_gets_the_same_verdict_and_cause_with_and_without_clipping(body, cause, words):
    results = {}
    for name, step in (("plain", unclipped(body)), ("clip 1.0", clipped(body))):
        r = check_accumulation(mlp_setup(step, k=4, scheduler=False))
        assert r.status is Status.FAIL and r.metrics["cause"] == cause and words in r.summary, (name, r.summary)
        results[name] = r
    # Clipping to norm 1 hides a sum's magnitude at optimizer.step(): the evidence that decides is the pre-clip
    # comparison, which the result keeps. Zeroing inside the loop loses gradients after backward: pre-clip agrees.
    pre, tol = results["clip 1.0"].metrics["pre_clip_max_rel_error"], results["clip 1.0"].metrics["tolerance"]
    assert (pre > tol) == (cause == "summed")


def test_token_mean_per_micro_batch_is_named_under_clipping_too():
    for step in (unclipped(backward_token_mean_per_micro_batch), clipped(backward_token_mean_per_micro_batch)):
        r = check_accumulation(lm_setup(step))
        assert r.status is Status.FAIL and r.metrics["cause"] == "per_micro_mean", r.summary
        assert "normalised by its own item count" in r.summary
    assert check_accumulation(lm_setup(step_global_token_mean)).status is Status.PASS  # control


def test_a_correct_clipped_step_passes():
    def body(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) * (len(mb[1]) / sum(len(m[1]) for m in micro_batches))).backward()
    r = check_accumulation(mlp_setup(clipped(body), k=4, scheduler=False))
    assert r.status is Status.PASS, r.summary


def test_two_optimizer_steps_per_call_fail_in_accumulation_with_the_count():
    def step(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.optimizer.step()
        ctx.optimizer.step()  # applied twice
        ctx.optimizer.zero_grad()
    for k in (1, 4):
        r = check_accumulation(mlp_setup(step, k=k, scheduler=False))
        assert r.status is Status.FAIL and "optimizer.step() ran 2 times per call" in r.summary, r.summary
        assert r.metrics["optimizer_steps_per_call"] == 2 and "latent" not in r.metrics


# ------------------------------------------------------------------ non-finite values are findings, never matches
def nan_grad_loss(model, batch):
    x, y = batch
    out = model(x)
    # value 0, gradient NaN: d sqrt(u)/du is inf at u = 0, times du/d(out) = 0
    return F.cross_entropy(out, y) + torch.sqrt((out * 0).pow(2).sum(1)).sum()


@pytest.mark.parametrize("check", [check_zero_grad, check_accumulation, check_resume, check_ddp])
def test_non_finite_gradients_never_pass_and_name_no_other_cause(check):
    setup = mlp_setup(k=2, scheduler=False).replace(loss_fn=nan_grad_loss)
    r = check(setup)
    assert r.status is Status.FAIL and "non-finite" in r.summary and "at step" in r.summary, r.summary
    assert "normalises its loss" not in r.summary and "relative error 0.0e+00" not in r.summary
    assert len(r.tables["nonfinite"]) > 0 and r.metrics["nonfinite_step"] >= 1
    # The same Setup with a finite loss: no such finding.
    assert "non-finite" not in check(mlp_setup(k=2, scheduler=False)).summary


def test_a_step_that_cannot_take_smaller_micro_batches_is_latent_without_accumulation():
    def step(ctx, micro_batches):  # a per-batch state sized for the full batch, as a naive recurrent loop keeps
        if not hasattr(ctx, "state"):
            ctx.state = torch.zeros(24, 4)
        for x, y in micro_batches:
            F.cross_entropy(ctx.model(x) + ctx.state, y).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    r = check_accumulation(mlp_setup(step, k=1, scheduler=False))
    assert r.status is Status.WARN and r.metrics["latent"] and "cannot run with 4 micro-batches" in r.summary, r.summary
    report = tropt.diagnose(mlp_setup(step, k=2, scheduler=False), checks=["loop.accumulation"], progress=False)
    assert report["loop.accumulation"].status is Status.ERROR  # with accumulation on, the step is broken where it is used
