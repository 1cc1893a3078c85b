"""loop.loss_scaling with known answers: clipping or unscaling in the wrong order is caught, and the cause follows
the evidence."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.loop_cases import mlp_setup, run_all, statuses

import tropt
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
    assert twice.metrics["confirmed"] and twice.metrics["cause"] == "unscaled_twice", twice.summary
    value = check_loss_scaling(mlp_setup(step_clip_value_before_unscale, clip=1.0, scaler=True, scheduler=False))
    assert (value.status is Status.FAIL and "clip_grad_value_" in value.summary
            and "clip_grad_norm_" not in value.summary), value.summary
    assert value.metrics["value_clip_share"] > 0.5 and "±0.01 in scaled units" in value.summary
    norm = check_loss_scaling(mlp_setup(step_clip_before_unscale, clip=1.0, scaler=True))  # still named as before
    assert norm.status is Status.FAIL and "clip_grad_norm_ ran on still-scaled gradients" in norm.summary


def step_never_unscaled(ctx, micro_batches):
    scaled_backward(ctx, micro_batches)
    ctx.optimizer.step()  # the scaler's step (which unscales) bypassed, and no update (it would raise without it)
    ctx.optimizer.zero_grad()


def test_gradients_never_unscaled_are_named_only_once_every_entry_is_the_scale_times_the_true_one():
    """The norm ratio equal to the scale is the hint; the cause is named when every gradient divided by the scale is
    the scale-1 run's (confirmed), and the control step that unscales passes."""
    r = check_loss_scaling(mlp_setup(step_never_unscaled, scaler=True, scheduler=False))
    assert r.status is Status.FAIL and "still multiplied by the loss scale" in r.summary, r.summary
    assert r.metrics["confirmed"] and r.metrics["cause"] == "not_unscaled" and "confirmed:" in r.summary
    assert r.metrics["confirmation_error"] < 1e-4


# ------------------------------------------------------------------ a declared clip must clip (issue 27, section 4)
def step_clip_over_an_exhausted_generator(ctx, micro_batches):
    params = ctx.model.parameters()
    n_weights = sum(p.numel() for p in params)  # logging the size empties the generator...
    assert n_weights > 0
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    torch.nn.utils.clip_grad_norm_(params, ctx.grad_clip)  # ...so this clips nothing
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def step_scaled_clip_over_an_exhausted_generator(ctx, micro_batches):
    params = ctx.model.parameters()
    assert sum(p.numel() for p in params) > 0
    scaled_backward(ctx, micro_batches)
    ctx.scaler.unscale_(ctx.optimizer)  # the right order, over an empty generator
    torch.nn.utils.clip_grad_norm_(params, ctx.grad_clip)
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()


@pytest.mark.filterwarnings("ignore:`parameters` is an empty generator")
@pytest.mark.parametrize("clip", [0.05, 1e3])  # the raw norm exceeds it, or is scaled up until it does
def test_a_clip_over_an_exhausted_generator_fails_naming_it(clip):
    r = check_loss_scaling(mlp_setup(step_clip_over_an_exhausted_generator, clip=clip, scheduler=False))
    assert r.status is Status.FAIL, r.summary  # it SKIPped: no GradScaler
    assert r.summary.startswith("the declared clip clips nothing: clip_grad_norm_ ran over an exhausted generator")
    assert r.metrics["clip_raw_norm"] > clip and r.metrics["clip_norm_at_step"] > clip
    assert r.metrics["clip_norm_at_step"] == pytest.approx(r.metrics["clip_raw_norm"], rel=1e-5)  # nothing clipped
    assert (clip > 1) == (r.metrics["clip_gradient_factor"] > 1)
    calls = r.tables["clip_calls"]
    assert list(calls["function"]) == ["clip_grad_norm_"] and list(calls["parameters"]) == ["exhausted generator"]
    assert list(calls["max_norm"]) == [clip] and "list(model.parameters())" in r.advice[0]


@pytest.mark.filterwarnings("ignore:`parameters` is an empty generator")
def test_a_clip_over_an_exhausted_generator_fails_with_a_scaler_too():
    r = check_loss_scaling(mlp_setup(step_scaled_clip_over_an_exhausted_generator, clip=0.05, scaler=True,
                                     scheduler=False))
    # both scales clip nothing alike, so the scale comparison alone PASSed
    assert r.status is Status.FAIL and "clip_grad_norm_ ran over an exhausted generator" in r.summary, r.summary
    assert r.metrics["max_rel_error"] <= r.metrics["tolerance"]


@pytest.mark.parametrize("clip", [0.05, 1e3])
def test_the_standard_step_clip_holds(clip):
    r = check_loss_scaling(mlp_setup(clip=clip))
    assert r.status is Status.SKIP and "no GradScaler" in r.summary, r.summary
    assert f"the declared grad_clip {clip:g} holds" in r.summary
    assert r.metrics["clip_norm_at_step"] <= clip * (1 + 1e-6) < r.metrics["clip_raw_norm"]
    scaled = check_loss_scaling(mlp_setup(clip=clip, scaler=True))
    assert scaled.status is Status.PASS and scaled.metrics["clip_tested"] is True, scaled.summary


def test_a_declared_clip_the_step_never_applies_warns():
    def step_without_clip(ctx, micro_batches):  # the step ignores ctx.grad_clip
        tropt.standard_step(dataclasses.replace(ctx, grad_clip=None), micro_batches)

    r = check_loss_scaling(mlp_setup(step_without_clip, clip=0.05, scheduler=False))
    assert r.status is Status.WARN and "calls no gradient-clipping function" in r.summary, r.summary
    assert r.metrics["clip_norm_at_step"] > 0.05


def test_a_clip_at_another_max_norm_warns_naming_both():
    def step_clip_at_ten(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 10.0)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    r = check_loss_scaling(mlp_setup(step_clip_at_ten, clip=1.0, scheduler=False))
    assert r.status is Status.WARN and "max_norm=10, not the declared grad_clip 1" in r.summary, r.summary


# ------------------------------------------------------------------ the step's own randomness (issue 27, section 1)
def step_numpy_mixup(ctx, micro_batches):
    """A mixup weight drawn from numpy inside the step (mixup-cifar10's np.random.beta), under a GradScaler."""
    import numpy as np

    for mb in micro_batches:
        lam = float(np.random.beta(1.0, 1.0))
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) * (0.5 + lam) / len(micro_batches)
        ctx.scaler.scale(loss).backward()
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()


def test_a_step_drawing_from_numpy_is_compared_on_one_stream_and_reports_its_floor():
    """Both scales draw the same numpy lambda, so the healthy step passes; the scale-1 run on another stream gives the
    floor, in metrics. (Before, only torch was seeded: the two runs drew different lambdas and the step FAILed as if
    its gradients depended on the loss scale.)"""
    r = check_loss_scaling(mlp_setup(step_numpy_mixup, scaler=True, scheduler=False))
    assert r.status is Status.PASS, r.summary
    assert r.metrics["noise_floor"] > 1e-3 and "one RNG stream" in r.metrics["noise_floor_compared"]
    deterministic = check_loss_scaling(mlp_setup(scaler=True, scheduler=False))  # the standard step draws nothing
    assert deterministic.status is Status.PASS and deterministic.metrics["noise_floor"] == 0.0
