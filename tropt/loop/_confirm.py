"""Confirm a named cause by applying its fix to what tropt observed, for ``loop.accumulation`` and
``loop.loss_scaling``.

A cause is a prediction; naming it needs more than "closest of the candidates". Where tropt can apply the fix to the
evidence it already holds (fresh copies' gradients), it does, and the cause stands as certain only when the fixed
gradients satisfy the invariance within the check's own tolerance:

- a scale cause of accumulation (summed losses, a constant divisor, dividing by K twice): the reference
  normalisation rescales each run by the factor the cause predicts; the two runs must then agree;
- a cause computed from ``loss_fn`` per micro-batch (per-micro-batch means, only one micro-batch's loss): the
  observation with the cause's predicted share taken out must match the one-micro-batch run;
- ``zero_grad`` or clipping inside the micro-batch loop: the K backward passes' sum, clipped once as the
  one-micro-batch run was clipped, must be what that run stepped with;
- clipping before unscaling (``loop.loss_scaling``): the large-scale run's raw gradients, clipped while multiplied by
  the scale and unscaled after, must be what that run stepped with, and clipped after unscaling what the scale-1 run
  stepped with;
- a stochastic step (judged in expectation): the same fixes on every repeat, the fixed means inside the spread between
  repeats.

No extra run of the step: a few tensor operations on gradients already captured (plus one ``loss_fn`` pass over the
micro-batches for a batch-dependent loss), and only when a cause is named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..core.compare import Tensors, max_rel_error
from ._invariance_common import norm_of


@dataclass(frozen=True)
class Confirmation:
    """Whether applying ``fix`` to the observed gradients restores the invariance (``error`` ≤ ``tol``)."""

    fix: str
    error: float
    tol: float
    holds: str = "the invariance holds"  # what the fixed gradients satisfy
    inside: bool | None = None  # a stochastic step: the fixed means lie inside the spread between repeats

    @property
    def confirmed(self) -> bool:
        if self.inside is not None:
            return self.inside
        return math.isfinite(self.error) and self.error <= self.tol

    def sentence(self) -> str:
        within = (f"within the {self.tol:.0e} tolerance" if self.inside is None else
                  "in expectation: the means inside the spread between repeats")
        if self.confirmed:
            # The error itself is in metrics: the sentence stays the same finding whatever batch it was measured on.
            return f"confirmed: with {self.fix} {self.holds} ({within})"
        off = (f"relative error {self.error:.1e} > {self.tol:.0e}" if self.inside is None else
               f"the means {self.error:.1%} apart, outside the spread between repeats")
        return (f"not confirmed: with {self.fix} the gradients still differ ({off}), so this cause does not explain "
                "all of the difference")

    def metrics(self) -> dict:
        return {"confirmed": self.confirmed, "confirmation": self.sentence(), "confirmation_error": self.error}


def scaled(g: Tensors, c: float) -> Tensors:
    """Every tensor of ``g`` times ``c`` (None stays None)."""
    return {n: (None if v is None else v.float() * c) for n, v in g.items()}


def clipped(g: Tensors, c: float | None, eps: float = 1e-6) -> Tensors:
    """``g`` clipped to total norm ``c`` as ``clip_grad_norm_`` does, ``c / (norm + eps)`` (``c`` None: unchanged)."""
    if c is None:
        return dict(g)
    total = norm_of(dict(g))
    return scaled(g, min(1.0, float(c) / (total + eps))) if math.isfinite(total) else dict(g)


# The factors (1-micro-batch run, K-micro-batch run) by which a scale cause multiplies the reference gradient.
_MULTIPLICATIVE = ("summed", "divided_twice", "constant_divisor", "scaled")


def _factors(tag: str, k: int, facts: dict) -> tuple[float, float]:
    ca = float(facts.get("reference_factor_1x", 1.0))
    if tag == "summed":
        return 1.0, float(k)
    if tag == "divided_twice":
        return 1.0, 1.0 / k
    if tag == "constant_divisor":  # every loss divided by the same D: D·ca = 1, and K losses add up to k·ca
        return ca, k * ca
    return ca, float(facts.get("reference_factor_kx", 1.0))


def confirm_accumulation(tag: str | None, a_pre: Tensors, b_pre: Tensors, a_post: Tensors, k: int, tol: float,
                         facts: dict, per_micro: Callable[[], Tensors] | None = None) -> Confirmation | None:
    """Apply the fix of the cause ``tag`` to the observed gradients and re-compare; None when tropt cannot apply it.

    ``a_*``/``b_*``: the 1- and K-micro-batch runs' gradients before clipping and at ``optimizer.step()``; ``facts``
    the metrics :func:`.accumulation_causes.loss_side_cause` filled (reference factors, the closest hypothesis).
    ``per_micro`` (a batch-dependent loss, which no step can make exact): computes ``loss_fn`` per micro-batch
    averaged over the K, what a right step gives with this loss; a scale cause is confirmed against it instead.
    """
    if tag in _MULTIPLICATIVE and per_micro is not None:
        fb = {"summed": float(k), "divided_twice": 1.0 / k}.get(
            tag, float(facts.get("batch_dependent_factor_kx", math.nan)))
        if not (fb and math.isfinite(fb)):
            return None
        return Confirmation("the reference normalisation (each micro-batch loss divided by K)",
                            max_rel_error(scaled(b_pre, 1 / fb), per_micro()), tol,
                            "the step gives what a right step gives with this batch-dependent loss (loss_fn per "
                            "micro-batch divided by K; the loss itself stays inexact under accumulation)")
    if tag in _MULTIPLICATIVE:
        fa, fb = _factors(tag, k, facts)
        if not (fa and fb and math.isfinite(fa) and math.isfinite(fb)):
            return None
        facts["confirmation_factors"] = f"1x: ×{1 / fa:.4g}, {k}x: ×{1 / fb:.4g}"  # what the fix does to each run
        return Confirmation("the reference normalisation (each micro-batch loss divided by K)",
                            max_rel_error(scaled(a_pre, 1 / fa), scaled(b_pre, 1 / fb)), tol)
    if tag is not None and tag == facts.get("closest_hypothesis"):
        # A prediction from loss_fn per micro-batch: the observation minus the cause's share is the fixed gradient.
        return Confirmation(f"the cause's predicted effect taken out of the {k}-micro-batch gradient (loss_fn per "
                            "micro-batch)", float(facts.get("closest_hypothesis_error", math.nan)), tol)
    if tag in ("last_only", "between_backward_and_step"):
        # Clip the K backward passes' sum as the 1-micro-batch run was clipped (to the norm it stepped with, when
        # its step clipped at all): the bound the user's own step applies, declared or not.
        na, npre = norm_of(dict(a_post)), norm_of(dict(a_pre))
        bound = na if npre > 0 and na < npre * (1 - 1e-4) else None
        fix = ("zero_grad once per optimizer step (the sum of the K backward passes" if tag == "last_only" else
               "every backward pass first, then one clip and one step (the sum of the K backward passes")
        clip = f", clipped once to norm {bound:.4g} as the 1-micro-batch run was" if bound is not None else ""
        return Confirmation(f"{fix}{clip})", max_rel_error(a_post, clipped(b_pre, bound, eps=0.0)), tol)
    return None


def confirm_clip_before_unscale(raw: Tensors, at_scale_1: Tensors, at_scale: Tensors, scale: float, clip: float,
                                tol: float) -> Confirmation:
    """Clipping still-scaled gradients, replayed on the large-scale run's raw gradients ``raw`` (pre-clip, unscaled, as
    :class:`tropt.core.capture.StepRecord` keeps them): multiplied by ``scale``, clipped, and unscaled after they must
    give what that run stepped with (the cause); clipped as they are (the fix: unscale first), what the scale-1 run
    stepped with (the invariance). The error is the worse of the two."""
    predicted = scaled(clipped(scaled(raw, scale), clip), 1 / scale)
    err = max(max_rel_error(predicted, at_scale), max_rel_error(clipped(raw, clip), at_scale_1))
    return Confirmation(f"scaler.unscale_ before clip_grad_norm_ (replayed on the scale-{scale:g} run's raw gradients: "
                        "clipped while scaled they give what that run stepped with, unscaled first the scale-1 run's)",
                        err, tol)


def confirm_value_clip_before_unscale(raw: Tensors, at_scale_1: Tensors, at_scale: Tensors, scale: float,
                                      bound: float, tol: float) -> Confirmation:
    """Clipping by value while scaled, replayed as :func:`confirm_clip_before_unscale`: ``clamp(raw·scale, ±bound) /
    scale`` must be what the large-scale run stepped with, ``clamp(raw, ±bound)`` what the scale-1 run did."""
    def clamp(g: Tensors) -> Tensors:
        return {n: (None if v is None else torch.clamp(v.float(), -bound, bound)) for n, v in g.items()}

    err = max(max_rel_error(scaled(clamp(scaled(raw, scale)), 1 / scale), at_scale),
              max_rel_error(clamp(raw), at_scale_1))
    return Confirmation("scaler.unscale_ before clip_grad_value_ (replayed on the "
                        f"scale-{scale:g} run's raw gradients: clamped at ±{bound:.3g} while scaled they give what "
                        "that run stepped with, unscaled first the scale-1 run's)", err, tol)


def confirm_in_expectation(tag: str, a_pre: Sequence[Tensors], b_pre: Sequence[Tensors], k: int,
                           facts: dict) -> Confirmation | None:
    """A scale cause of a stochastic step: its fix (each run's repeats rescaled by the factor the cause predicts) must
    leave the means of the 1- and K-micro-batch repeats inside the spread between them; None for another cause."""
    from ..core.noise_floor import Repeats, in_expectation

    if tag not in _MULTIPLICATIVE:
        return None
    fa, fb = _factors(tag, k, facts)
    if not (fa and fb and math.isfinite(fa) and math.isfinite(fb)):
        return None
    e = in_expectation(Repeats.of([scaled(g, 1 / fa) for g in a_pre]), Repeats.of([scaled(g, 1 / fb) for g in b_pre]))
    facts["confirmation_factors"] = f"1x: ×{1 / fa:.4g}, {k}x: ×{1 / fb:.4g}"
    return Confirmation("the reference normalisation (each micro-batch loss divided by K)", e.rel_diff, math.nan,
                        inside=e.inside)


def confirm_last_only_in_expectation(a_post: Sequence[Tensors], a_pre: Sequence[Tensors],
                                     b_pre: Sequence[Tensors]) -> Confirmation:
    """``zero_grad`` inside the micro-batch loop of a stochastic step: the K backward passes' sums, each clipped as
    its 1-micro-batch repeat was, must have the mean of what the 1-micro-batch repeats stepped with."""
    from ..core.noise_floor import Repeats, in_expectation

    fixed = []
    for post, pre, b in zip(a_post, a_pre, b_pre, strict=False):
        na, npre = norm_of(dict(post)), norm_of(dict(pre))
        fixed.append(clipped(b, na if npre > 0 and na < npre * (1 - 1e-4) else None, eps=0.0))
    e = in_expectation(Repeats.of(list(a_post)), Repeats.of(fixed))
    return Confirmation("zero_grad once per optimizer step (the sum of the K backward passes)", e.rel_diff, math.nan,
                        inside=e.inside)


def confirm_proportional(at_scale_1: Tensors, at_scale: Tensors, factor: float, fix: str, tol: float) -> Confirmation:
    """A cause that multiplies every gradient by one ``factor`` (gradients never unscaled: the scale; unscaled twice:
    1/scale): the large-scale run's gradients divided by it must be the scale-1 run's, entry by entry, not only in
    norm (a norm ratio equal to the scale can also come from a few parameters scaled far more)."""
    return Confirmation(fix, max_rel_error(scaled(at_scale, 1 / factor), at_scale_1), tol,
                        "the gradients that reach optimizer.step() are the scale-1 run's")
