"""``loop.loss_scaling``: do the gradients that reach ``optimizer.step()`` depend on the GradScaler's scale, and
does the declared clip clip?

The step runs once with the scaler starting at scale 1 and once at a large scale (2^16, or 2^12 / 2^8 when that
overflows on the first step); the unscaled gradients and the clipped norm must agree. The cause is named from the
evidence: not unscaled, unscaled twice, clipped by norm or by value while still scaled.

With ``Setup(grad_clip=c)``, with or without a scaler, the norm that reaches ``optimizer.step()`` on a step whose raw
norm exceeds c must be at most c (see :mod:`._clip_probe`): FAIL naming a clip over an exhausted generator or over
parameters without gradients, WARN for a clip at another bound, by value, absent, or not isolated.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from ..core.capture import ScalerWatch, StepRecord, observed_at, run_steps
from ..core.compare import compare_tensors
from ..core.modes import quiet_randomness
from ..core.noise_floor import floor_between, reseed
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ._clip_probe import ClipProbe, probe_clip
from ._confirm import (
    Confirmation,
    confirm_clip_before_unscale,
    confirm_proportional,
    confirm_value_clip_before_unscale,
)
from ._invariance_common import STANDARD_STEP_ADVICE
from ._verdicts import defer_multi_step, require_steps, tolerance_for


def _value_clip_signature(grads: dict, scale: float) -> tuple[float, float]:
    """(|g|max × scale, share of entries within 0.1% of it): clip_grad_value_ on scaled gradients piles entries there.

    Gradients clipped by value while multiplied by ``scale`` and unscaled afterwards sit at ±c/scale; true gradients
    rarely share one magnitude.
    """
    flat = [g.abs().flatten() for g in grads.values() if g is not None and g.numel()]
    if not flat:
        return float("nan"), 0.0
    mags = torch.cat(flat).double() * scale
    top = float(mags.max())
    return top, (float((mags >= top * (1 - 1e-3)).double().mean()) if top > 0 else 0.0)


@register(
    "loop.loss_scaling",
    title="AMP loss scaling and clipping order",
    description="GradScaler scale 1 vs 2^16 gives the same unscaled gradients and clipped norm",
    plot="tropt.plots.loop",
)
def check_loss_scaling(setup: Setup, *, scale: float = 2.0**16, tol: float | None = None,
                       progress: bool = True) -> CheckResult:
    """FAIL when the gradients reaching ``optimizer.step()`` depend on the GradScaler's scale.

    The classic cause is clipping still-scaled gradients (``clip_grad_norm_`` before ``scaler.unscale_``); the summary
    names the cause the evidence shows (norm ratio = scale: not unscaled; 1/scale: unscaled twice; norm = grad_clip /
    scale: clipped by norm; entries piled at one magnitude: clipped by value). If the
    large scale overflows on the first step, smaller scales (2^12, 2^8) are tried and reported. SKIP without a scaler.
    """
    setup.validate()
    owner = "ctx.scaler"
    batch = setup.sample_batch()  # one read of the data for every run below
    if not setup.use_scaler:
        own = _step_scaler(setup, batch)
        if own is None:
            return _without_scaler(probe_clip(setup, batch))
        owner = own
    tol = tolerance_for(setup, tol)
    with preserved(setup.model):
        micro = setup.split(batch, setup.accumulation_steps)
        # Every run draws from the same RNG stream (torch, numpy and python's: a mixup lambda from numpy too), so the
        # two scales are compared exactly whatever the step draws; the floor (the scale-1 run on another stream) is
        # reported to say how stochastic the step is.
        ctx = setup.build(init_scale=1.0)
        reseed(setup.seed, 0)
        quiet_randomness(ctx.model)
        # Whichever GradScaler scales the loss (ctx.scaler, or one the step builds itself) starts at the scale under
        # test.
        rec_a, calls_a = run_steps(setup, ctx, [micro], init_scale=1.0)
        require_steps(setup, calls_a, "the scale-1 run")
        ctx = setup.build(init_scale=1.0)
        reseed(setup.seed, 1)
        quiet_randomness(ctx.model)
        rec_f, _ = run_steps(setup, ctx, [micro], init_scale=1.0)
        floor = floor_between(rec_a[0].grads, rec_f[0].grads) if rec_f else float("nan")
        rec_b: list[StepRecord] = []
        used = scale  # the scale the compared run started at (set below; no run at all raises)
        for big in (scale, 2.0**12, 2.0**8):
            ctx = setup.build(init_scale=big)
            reseed(setup.seed, 0)
            quiet_randomness(ctx.model)
            rec_b, _ = run_steps(setup, ctx, [micro], init_scale=big)
            if rec_b:
                used = big
                break
    if not rec_b:
        raise TroptError("every large loss scale (2^16, 2^12, 2^8) overflowed on the first step, so no step ran to "
                         "compare",
                         "check the loss for huge values; fp16 overflows above 65504")
    result = _with_clip(_loss_scaling_verdict(setup, rec_a, rec_b, used, tol, owner), probe_clip(setup, batch))
    result = dataclasses.replace(result, metrics={**result.metrics, "noise_floor": floor,
                                                  "noise_floor_compared": "both scales on one RNG stream: exact"})
    if setup.precision != "fp16" and result.status is Status.PASS:
        result = dataclasses.replace(
            result, status=Status.WARN,
            summary=f"{result.summary}; but with precision={setup.precision!r} loss scaling is unnecessary (only "
                    "fp16's narrow exponent range underflows small gradients)",
            advice=["Drop the GradScaler (use_scaler=False, plain loss.backward() and optimizer.step()), or train in "
                    "fp16 if that is what the scaler was kept for."])
    return defer_multi_step(result, calls_a)


def _without_scaler(clip: ClipProbe | None) -> CheckResult:
    """No scaler to compare: SKIP, unless the declared clip (when there is one) does not hold."""
    summary = ("no GradScaler in this Setup (use_scaler=False) and the step scales no loss with one of its own: "
               "nothing to check")
    if clip is None:
        return CheckResult("loop.loss_scaling", Status.SKIP, summary)
    if clip.status in (Status.WARN, Status.FAIL):
        return CheckResult("loop.loss_scaling", clip.status, clip.sentence, clip.metrics(), clip.tables(),
                           [*clip.advice, STANDARD_STEP_ADVICE])
    return CheckResult("loop.loss_scaling", Status.SKIP, f"{summary} about the loss scale; {clip.sentence}",
                       clip.metrics(), clip.tables())


def _with_clip(result: CheckResult, clip: ClipProbe | None) -> CheckResult:
    """The scale comparison's result with the declared clip's finding: the worse status, both sentences."""
    if clip is None:
        return result
    metrics, tables = {**result.metrics, **clip.metrics()}, {**result.tables, **clip.tables()}
    if clip.status not in (Status.WARN, Status.FAIL):
        summary = f"{result.summary}; {clip.sentence}" if result.status is Status.PASS else result.summary
        return dataclasses.replace(result, summary=summary, metrics=metrics, tables=tables)
    if result.status is Status.PASS:  # the clip's finding leads
        return dataclasses.replace(result, status=clip.status, summary=f"{clip.sentence} (the loss scale itself: "
                                   f"{result.summary})", metrics=metrics, tables=tables,
                                   advice=[*clip.advice, STANDARD_STEP_ADVICE])
    status = Status.FAIL if Status.FAIL in (result.status, clip.status) else result.status
    return dataclasses.replace(result, status=status, summary=f"{result.summary}; {clip.sentence}", metrics=metrics,
                               tables=tables, advice=[*result.advice, *clip.advice])


def _step_scaler(setup: Setup, batch: Any) -> str | None:
    """The type of an enabled GradScaler the step itself uses to scale the loss (one probe step on ``batch``), or
    None.

    A probe step that raises counts as no scaler: the checks that need the step report that error themselves.
    """
    with preserved(setup.model), ScalerWatch() as watch:
        ctx = setup.build()
        quiet_randomness(ctx.model)
        with contextlib.suppress(TroptError):
            setup.run_step(ctx, setup.split(batch, setup.accumulation_steps))
    used = [s for s in watch.used if s.is_enabled()]
    return f"the step's own {type(used[-1]).__name__}" if used else None


def _named(evidence: str, cause: str, conf: Confirmation, metrics: dict, tag: str, joint: str = ": ") -> str:
    """The summary for a clip-order cause: named as certain only when replaying its fix confirms it."""
    metrics.update(conf.metrics())
    if conf.confirmed:
        metrics["cause"] = tag
        return f"{evidence}{joint}{cause}; {conf.sentence()}"
    metrics.update(cause="unnamed", closest_cause=tag)
    return f"{evidence}: cause not isolated (closest explanation: {cause}; {conf.sentence()})"


def _loss_scaling_verdict(setup: Setup, rec_a: list, rec_b: list, used: float, tol: float, owner: str) -> CheckResult:
    a, b = rec_a[0].grads, rec_b[0].grads
    table = compare_tensors(a, b, labels=("scale_1", f"scale_{int(used)}"))
    err = float(table["rel_error"].max())
    norm_a, norm_b = rec_a[0].grad_norm, rec_b[0].grad_norm
    metrics = {"scale_small": 1.0, "scale_large": used, "max_rel_error": err, "tolerance": tol, "scaler": owner,
               "observed_at": observed_at(rec_a + rec_b),
               "clipped_norm_scale_1": norm_a, "clipped_norm_large_scale": norm_b,
               "grad_clip": setup.grad_clip or float("nan")}
    tables = {"parameters": table}
    if err <= tol and abs(norm_a - norm_b) <= tol * max(norm_a, norm_b, 1e-30):
        return CheckResult("loop.loss_scaling", Status.PASS,
                           "unscaled gradients and clipped norm do not depend on the loss scale (max relative error "
                           f"{err:.1e})",
                           metrics, tables)
    # Name the cause from the evidence: how the large-scale gradients relate to the scale-1 ones.
    ratio = norm_b / norm_a if norm_a > 0 else float("nan")
    clip_at, clip_share = _value_clip_signature(b, used)
    metrics.update(grad_norm_ratio=ratio, value_clip_share=clip_share)
    unscale_first = "Call scaler.unscale_(optimizer) once, before anything that reads or changes the gradients"
    if norm_a > 0 and abs(ratio / used - 1) < 0.05:
        conf = confirm_proportional(a, b, used, f"every gradient divided by the scale {used:g}", tol)
        summary = _named(f"the gradients depend on the loss scale (norm ratio {ratio:.3g} at scale {used:g})",
                         "optimizer.step() receives gradients still multiplied by the loss scale", conf, metrics,
                         "not_unscaled")
        advice = ["Step through the scaler: scaler.step(optimizer) (it unscales), or call scaler.unscale_(optimizer) "
                  "first."]
    elif setup.grad_clip is not None and abs(norm_b * used / setup.grad_clip - 1) < 0.05:
        # Clipped to grad_clip while multiplied by the scale, then unscaled: norm grad_clip / scale. When the true norm
        # is itself clipped to grad_clip, unscaling twice gives the same number: say both.
        twice = abs(ratio * used - 1) < 0.05
        conf = confirm_clip_before_unscale(rec_b[0].pre_clip, a, b, used, float(setup.grad_clip), tol)
        summary = _named(f"the gradients depend on the loss scale ({err:.1%}; clipped norm {norm_a:.3g} vs "
                         f"{norm_b:.3g} = grad_clip {setup.grad_clip:g} / scale {used:g})",
                         "clip_grad_norm_ ran on still-scaled gradients"
                         + (" (or they are unscaled twice: here both give this norm)" if twice else ""),
                         conf, metrics, "clip_norm_before_unscale")
        advice = ["Call scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer) and "
                  "scaler.update()."]
    elif norm_a > 0 and abs(ratio * used - 1) < 0.05:
        conf = confirm_proportional(a, b, 1 / used, f"every gradient multiplied back by the scale {used:g}", tol)
        summary = _named(f"the gradients reaching optimizer.step() are 1/{used:g} of the true ones ({ratio:.3g}×)",
                         "they are unscaled twice (e.g. divided by scaler.get_scale() by hand and again by "
                         "scaler.unscale_/scaler.step)", conf, metrics, "unscaled_twice")
        advice = ["Unscale once: let scaler.unscale_(optimizer) or scaler.step(optimizer) do it; do not also divide "
                  "the gradients by the scale yourself."]
    elif clip_share >= 0.5:
        conf = confirm_value_clip_before_unscale(rec_b[0].pre_clip, a, b, used, clip_at, tol)
        summary = _named(f"the gradients depend on the loss scale ({err:.1%}): {clip_share:.0%} of the entries sit "
                         f"exactly at ±{clip_at:.3g} in scaled units", "clip_grad_value_ (or a clamp) ran on "
                         "still-scaled gradients", conf, metrics, "clip_value_before_unscale", joint=", so ")
        advice = [f"{unscale_first}: then clip_grad_value_, scaler.step(optimizer) and scaler.update()."]
    else:
        summary = (f"the gradients that reach optimizer.step() depend on the loss scale ({err:.1%} relative error; "
                   f"norm ratio {ratio:.3g} at scale {used:g}): something reads or changes them while still scaled")
        advice = [f"{unscale_first} (clipping, manual scaling, logging-based decisions); scale only the loss "
                  "(scaler.scale(loss).backward()) and step through scaler.step(optimizer)."]
    return CheckResult("loop.loss_scaling", Status.FAIL, summary, metrics, tables, [*advice, STANDARD_STEP_ADVICE])
