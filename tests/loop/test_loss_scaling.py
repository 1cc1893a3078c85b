"""loop.loss_scaling with known answers: clipping or unscaling in the wrong order is caught, and the cause follows
the evidence."""

from __future__ import annotations

import pytest
import torch
from support.loop_cases import mlp_setup, run_all, statuses

from tropt.loop import check_loss_scaling
from tropt.result import Status


def step_clip_before_unscale(ctx, micro_batches):
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        ctx.scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)  # still scaled!
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()
    ctx.scheduler.step()


def test_clipping_before_unscale_is_caught_by_loss_scaling_only():
    results = run_all(mlp_setup(step_clip_before_unscale, clip=0.5, scaler=True))
    r = results["loop.loss_scaling"]
    assert r.status is Status.FAIL and "clip_grad_norm_ ran on still-scaled gradients" in r.summary
    assert "unscale_(optimizer) before clip_grad_norm_" in r.advice[0]
    assert [c for c, s in statuses(results).items() if s is Status.FAIL] == ["loop.loss_scaling"]


def scaled_backward(ctx, micro_batches):
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        ctx.scaler.scale(loss).backward()


def step_unscaled_twice(ctx, micro_batches):
    scaled_backward(ctx, micro_batches)
    for p in ctx.model.parameters():  # a manual unscale...
        if p.grad is not None:
            p.grad /= ctx.scaler.get_scale()
    ctx.scaler.step(ctx.optimizer)  # ...and the scaler's own
    ctx.scaler.update()
    ctx.optimizer.zero_grad()


def step_clip_value_before_unscale(ctx, micro_batches):
    scaled_backward(ctx, micro_batches)
    torch.nn.utils.clip_grad_value_(ctx.model.parameters(), 0.01)  # still scaled
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()


def test_loss_scaling_cause_matches_the_evidence_not_the_clip_setting():
    """With grad_clip set, a manual second unscale and clip_grad_value_ before unscale_ are named as what they are."""
    twice = check_loss_scaling(mlp_setup(step_unscaled_twice, clip=1.0, scaler=True, scheduler=False))
    assert (twice.status is Status.FAIL and "unscaled twice" in twice.summary
            and "clip_grad_norm_" not in twice.summary), twice.summary
    assert twice.metrics["grad_norm_ratio"] * twice.metrics["scale_large"] == pytest.approx(1, rel=0.05)
    assert "do not also divide the gradients by the scale" in twice.advice[0]
    value = check_loss_scaling(mlp_setup(step_clip_value_before_unscale, clip=1.0, scaler=True, scheduler=False))
    assert (value.status is Status.FAIL and "clip_grad_value_" in value.summary
            and "clip_grad_norm_" not in value.summary), value.summary
    assert value.metrics["value_clip_share"] > 0.5 and "±0.01 in scaled units" in value.summary
    norm = check_loss_scaling(mlp_setup(step_clip_before_unscale, clip=1.0, scaler=True))  # still named as before
    assert norm.status is Status.FAIL and "clip_grad_norm_ ran on still-scaled gradients" in norm.summary
