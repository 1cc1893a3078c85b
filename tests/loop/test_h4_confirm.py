"""Issue 27 §2, "confirm the fix when tropt can apply it to copies": a named cause stands as certain only when its fix,
applied to the observed gradients, restores the invariance. Known answers: planted bugs whose result says
"confirmed: with X the invariance holds", and two bugs at once, where the nearest cause explains only part of the
difference: the result must not say confirmed and must not name the cause as certain."""

from __future__ import annotations

import pytest
import torch
from support.loop_cases import lm_setup, mlp_setup, token_losses

from tropt.loop import check_accumulation, check_loss_scaling
from tropt.loop._confirm import Confirmation, clipped, confirm_accumulation, scaled
from tropt.result import Status


def _stepped(body):
    def step(ctx, micro_batches):
        body(ctx, micro_batches)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return step


def summed(ctx, micro_batches):
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()


def zero_grad_inside(ctx, micro_batches):
    for mb in micro_batches:
        ctx.optimizer.zero_grad()
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()


def token_mean_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        total, count = token_losses(ctx.model, mb)
        (total / count / len(micro_batches)).backward()


def summed_and_first_weighted(ctx, micro_batches):
    """Two bugs: the losses are summed (4×) and the first micro-batch's loss weighs 0.02% more. "Summed" is the nearest
    cause (within the naming margin) but dividing by K does not restore the invariance."""
    for i, mb in enumerate(micro_batches):
        (ctx.loss_fn(ctx.model, mb) * (1.0002 if i == 0 else 1.0)).backward()


@pytest.mark.parametrize("setup, cause, fix", [
    (lambda: mlp_setup(_stepped(summed), k=4, scheduler=False), "summed", "the reference normalisation"),
    (lambda: mlp_setup(_stepped(zero_grad_inside), k=4, scheduler=False), "last_only",
     "zero_grad once per optimizer step"),
    (lambda: lm_setup(_stepped(token_mean_per_micro_batch)), "per_micro_mean", "the cause's predicted effect"),
])
def test_a_planted_accumulation_bug_is_named_and_confirmed(setup, cause, fix):
    r = check_accumulation(setup())
    assert r.status is Status.FAIL and r.metrics["cause"] == cause, r.summary
    assert r.metrics["confirmed"] is True and r.metrics["confirmation_error"] <= r.metrics["tolerance"]
    assert f"confirmed: with {fix}" in r.summary and "the invariance holds" in r.summary
    assert r.metrics["confirmation"] in r.summary and "not confirmed" not in r.summary


def test_two_accumulation_bugs_are_not_confirmed_and_the_cause_is_not_named_as_certain():
    r = check_accumulation(mlp_setup(_stepped(summed_and_first_weighted), k=4, scheduler=False))
    assert r.status is Status.WARN, r.summary  # broken, but no cause isolated: a WARN, as in loop.zero_grad/loop.ddp
    assert r.metrics["cause"] == "unnamed" and r.metrics["closest_cause"] == "summed"
    assert r.metrics["confirmed"] is False and r.metrics["confirmation_error"] > r.metrics["tolerance"]
    assert "cause not isolated (closest explanation:" in r.summary and "not confirmed: with" in r.summary
    assert "; confirmed" not in r.summary


def test_a_cause_whose_fix_tropt_cannot_apply_carries_no_confirmation():
    def step(ctx, micro_batches):  # one update per micro-batch: the count is the evidence
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
            ctx.optimizer.step()
            ctx.optimizer.zero_grad()
    r = check_accumulation(mlp_setup(step, k=4, scheduler=False))
    assert r.status is Status.FAIL and r.metrics["cause"] == "step_per_micro_batch"
    assert "confirmed" not in r.metrics and "confirmed" not in r.summary


def test_the_confirmation_replays_the_fix_on_the_gradients():
    g = {"w": torch.tensor([3.0, 4.0]), "b": None}
    assert confirm_accumulation("summed", g, scaled(g, 4), g, 4, 1e-5, {}).confirmed
    assert not confirm_accumulation("summed", g, scaled(g, 3.9), g, 4, 1e-5, {}).confirmed
    assert confirm_accumulation("step_per_micro_batch", g, g, g, 4, 1e-5, {}) is None
    # zero_grad inside with a clip: the K passes' sum clipped as the 1-micro-batch run was
    assert confirm_accumulation("last_only", g, g, clipped(g, 1.0, eps=0.0), 4, 1e-5, {}).confirmed
    c = Confirmation("X", 0.5, 1e-5)
    assert not c.confirmed and c.sentence().startswith("not confirmed: with X")


# ------------------------------------------------------------------------------------------------ loop.loss_scaling
def scaled_backward(ctx, micro_batches):
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        ctx.scaler.scale(loss).backward()


def _through_scaler(clip):
    def step(ctx, micro_batches):
        scaled_backward(ctx, micro_batches)
        clip(ctx)
        ctx.scaler.step(ctx.optimizer)
        ctx.scaler.update()
        ctx.optimizer.zero_grad()
    return step


def clip_norm_scaled(ctx):
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)  # still scaled


def clip_value_scaled(ctx):
    torch.nn.utils.clip_grad_value_(ctx.model.parameters(), 0.01)  # still scaled


def clip_norm_scaled_and_one_tensor_rescaled(ctx):
    """Two bugs: clip before unscale, and the first weight's gradient bumped 3% after the clip (the norm still fits
    grad_clip / scale within the naming margin)."""
    clip_norm_scaled(ctx)
    next(ctx.model.parameters()).grad.mul_(1.03)


@pytest.mark.parametrize("clip, cause, fix", [
    (clip_norm_scaled, "clip_norm_before_unscale", "scaler.unscale_ before clip_grad_norm_"),
    (clip_value_scaled, "clip_value_before_unscale", "scaler.unscale_ before clip_grad_value_"),
])
def test_a_clip_before_unscale_is_confirmed_by_replaying_the_fix(clip, cause, fix):
    r = check_loss_scaling(mlp_setup(_through_scaler(clip), clip=0.5, scaler=True, scheduler=False))
    assert r.status is Status.FAIL and r.metrics["cause"] == cause, r.summary
    assert r.metrics["confirmed"] is True and f"confirmed: with {fix}" in r.summary
    assert "the invariance holds" in r.summary and "not confirmed" not in r.summary


def test_a_clip_before_unscale_with_a_second_bug_is_not_confirmed():
    r = check_loss_scaling(mlp_setup(_through_scaler(clip_norm_scaled_and_one_tensor_rescaled), clip=0.5,
                                     scaler=True, scheduler=False))
    assert r.status is Status.FAIL, r.summary
    assert r.metrics["cause"] == "unnamed" and r.metrics["closest_cause"] == "clip_norm_before_unscale"
    assert r.metrics["confirmed"] is False and "cause not isolated (closest explanation:" in r.summary
    assert "not confirmed: with scaler.unscale_ before clip_grad_norm_" in r.summary and "; confirmed" not in r.summary


def test_with_a_batch_dependent_loss_a_scale_cause_is_confirmed_against_what_a_right_step_gives():
    from test_accumulation import two_tower_setup  # in-batch negatives: no step makes K micro-batches exact

    r = check_accumulation(two_tower_setup(_stepped(summed)))
    assert r.status is Status.FAIL and r.metrics["cause"] == "summed" and r.metrics["confirmed"] is True, r.summary
    assert "what a right step gives with this batch-dependent loss" in r.summary
    assert "the invariance holds" not in r.summary  # it cannot: the loss itself is inexact under accumulation


def test_a_scale_cause_of_a_stochastic_step_is_confirmed_in_expectation():
    from support.stochastic_cases import diffusion_setup, step_diffusion_not_divided

    r = check_accumulation(diffusion_setup(step_diffusion_not_divided))
    assert r.status is Status.FAIL and r.metrics["cause"] == "summed" and r.metrics["confirmed"] is True, r.summary
    assert "confirmed: with the reference normalisation" in r.summary and "in expectation" in r.summary


def test_an_unconfirmed_cause_in_expectation_is_the_not_isolated_warning():
    c = Confirmation("X", 0.4, float("nan"), inside=False)
    assert not c.confirmed and "outside the spread between repeats" in c.sentence()
    assert Confirmation("X", 0.4, float("nan"), inside=True).sentence().startswith("confirmed: with X")


def test_zero_grad_inside_a_stochastic_step_is_confirmed_in_expectation():
    from support.stochastic_cases import diffusion_setup

    r = check_accumulation(diffusion_setup(_stepped(zero_grad_inside)))
    assert r.metrics["judged"] == "in expectation", r.summary
    assert r.status is Status.FAIL and r.metrics["cause"] == "last_only" and r.metrics["confirmed"] is True, r.summary
    assert "confirmed: with zero_grad once per optimizer step" in r.summary
