"""Stage 4 invariance checks: run the user's own step under a change that must not change the update, compare.

- ``loop.zero_grad``: step t's gradient vs the same step rerun from the same state with gradients cleared.
- ``loop.accumulation``: one batch as 1 micro-batch vs as K micro-batches (even, then uneven sizes).
- ``loop.loss_scaling``: GradScaler initial scale 1 vs 2^16: unscaled gradients and the clipped norm.
- ``loop.scheduler_cadence``: learning rate and schedule position at each optimizer step with K = 1 vs K = 4.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.batch import split_sizes
from ..errors import StepError, TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ..training import needs_metric
from .harness import (
    PARAMETER_CHANGE,
    TOLERANCE,
    ScalerWatch,
    StepRecorder,
    TrainingState,
    batch_dependent_layers,
    compare_tensors,
    freeze_batch_stats,
    global_rel_error,
    defer_multi_step,
    latent_when_unused,
    max_rel_error,
    nonfinite_result,
    nonfinite_tensors,
    observed_at,
    on_update,
    quiet_randomness,
    require_steps,
    run_steps,
    steps_per_call_note,
    tolerance_for,
)

# Relative gap above which an fp32 hypothesis is not exact (fp32 summation order alone gives about 1e-7).
_HIDDEN_EXACT = 1e-4
_STANDARD_STEP_ADVICE = "Compare your step with tropt.standard_step, the reference implementation of this contract."


def _norm(grads: dict) -> float:
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values() if g is not None))


def _cosine(a: dict, b: dict) -> float:
    dot = sum(float((a[n] * b[n]).sum()) for n in a if a[n] is not None and b.get(n) is not None)
    na, nb = _norm(a), _norm(b)
    return dot / (na * nb) if na > 0 and nb > 0 else float("nan")


# --------------------------------------------------------------------------------------------- zero_grad
@register(
    "loop.zero_grad",
    title="Gradients cleared every step",
    description="step t's gradient equals the gradient of the same step rerun from the same state with gradients cleared",
)
def check_zero_grad(setup: Setup, *, t: int = 2, tol: float | None = None, progress: bool = True) -> CheckResult:
    """FAIL when gradients of earlier steps leak into step ``t`` (missing or misplaced ``zero_grad``).

    Runs ``t - 1`` steps, snapshots the full training state, runs step ``t`` (run A), restores the snapshot,
    clears every gradient and reruns step ``t`` (run B). Both must reach ``optimizer.step()`` with the same
    gradients. Also FAIL when no gradient at all reaches ``optimizer.step()`` (``zero_grad`` between backward
    and step).
    """
    if t < 2:
        raise TroptError(f"check_zero_grad needs t >= 2 (got {t}): a leak needs an earlier step", "use t=2")
    setup.validate()
    tol = tolerance_for(setup, tol)
    k = setup.accumulation_steps
    with preserved(setup.model):
        ctx = setup.build()
        quiet_randomness(ctx.model)
        steps = [setup.split(b, k) for b in setup.batches(t)]
        earlier, calls = run_steps(setup, ctx, steps[:-1])
        require_steps(setup, calls, f"the first {t - 1} step(s)")
        state = TrainingState(ctx)  # the step's own attributes on ctx (counters, hidden state) too
        leftover = {n: (None if p.grad is None else p.grad.detach().float().clone()) for n, p in ctx.model.named_parameters()}
        rec_a, calls_a = run_steps(setup, ctx, [steps[-1]])
        state.restore()
        for p in ctx.model.parameters():
            p.grad = None
        rec_b, calls_b = run_steps(setup, ctx, [steps[-1]])
    require_steps(setup, calls_a + calls_b, f"step {t}")
    result = _zero_grad_verdict(t, tol, earlier, rec_a, rec_b, leftover)
    return defer_multi_step(result, calls + calls_a + calls_b)


def _zero_grad_verdict(t: int, tol: float, earlier: list, rec_a: list, rec_b: list, leftover: dict) -> CheckResult:
    a, b = rec_a[0].grads, rec_b[0].grads
    # NaN against NaN is no match: a loss that went non-finite is the finding, whatever the zero_grad placement.
    earlier_bad = next(((i + 1, r.grads) for i, r in enumerate(earlier) if nonfinite_tensors(r.grads)), None)
    bad = nonfinite_result("loop.zero_grad", {"straight": earlier_bad or (t, a), "fresh": (t, b)})
    if bad is not None:
        return bad
    where = observed_at(rec_a + rec_b)
    by_hand = where == PARAMETER_CHANGE
    what = "update (parameter change)" if by_hand else "gradient"
    table = compare_tensors(a, b, labels=("step_t", "fresh"))
    worst = float(table["rel_error"].max())
    leftover_norm = _norm(leftover)
    metrics = {"t": t, "max_rel_error": worst, "global_rel_error": global_rel_error(a, b), "tolerance": tol,
               "grad_norm_step_t": _norm(a), "grad_norm_fresh": _norm(b), "leftover_grad_norm_before_step_t": leftover_norm,
               "observed_at": where}
    tables = {"parameters": table}
    if _norm(a) == 0.0 and _norm(b) == 0.0:
        return CheckResult(
            "loop.zero_grad", Status.FAIL,
            "the step changes no parameter: every gradient is zero or None when it updates" if by_hand else
            "no gradient reaches optimizer.step(): every gradient is zero or None when the optimizer steps",
            metrics, tables,
            advice=["Call optimizer.zero_grad() after optimizer.step() (or before the first backward of the next step), "
                    "never between backward() and step().", _STANDARD_STEP_ADVICE])
    if worst <= tol:
        return CheckResult("loop.zero_grad", Status.PASS,
                           f"step {t}'s {what} equals a fresh one (max relative error {worst:.1e} ≤ {tol:.0e})", metrics, tables)
    # Evidence: is the extra exactly what the earlier step left behind?
    expected = {n: (b[n] if b.get(n) is not None else 0) + (leftover[n] if leftover.get(n) is not None else 0) for n in b}
    expected = {n: (v if isinstance(v, torch.Tensor) else None) for n, v in expected.items()}
    explained = global_rel_error(a, expected) <= max(tol, 1e-4) if leftover_norm > 0 and not by_hand else False
    metrics["leak_equals_leftover_gradient"] = bool(explained)
    last = earlier[-1].grads if earlier else {}
    metrics["previous_step_grad_norm"] = _norm(last)
    why = ("it equals the fresh gradient plus the gradient left over from step " f"{t - 1}" if explained
           else "gradients from earlier steps leak into it")
    return CheckResult(
        "loop.zero_grad", Status.FAIL,
        f"step {t}'s {what} differs from a fresh one by {worst:.1%} (max over parameters): {why}",
        metrics, tables,
        advice=["Call optimizer.zero_grad(set_to_none=True) once per optimizer step: right after optimizer.step() "
                "(or before the first backward of the next step).", _STANDARD_STEP_ADVICE])


# --------------------------------------------------------------------------------------------- accumulation
def _loss_grads(setup: Setup, micro_batches: list, weights: list[float], freeze: bool, *, autocast: bool = True) -> dict:
    """Gradient of ``sum_i w_i * loss_fn(model, mb_i)`` on a fresh seeded copy: a hypothesis about the user's step.

    ``autocast=False`` computes it in full precision, free of the half-precision noise the tolerance allows for.
    """
    ctx = setup.build()
    quiet_randomness(ctx.model)
    if freeze:
        freeze_batch_stats(ctx.model)
    ctx.model.train()
    for mb, w in zip(micro_batches, weights):
        with ctx.autocast() if autocast else contextlib.nullcontext():
            loss = ctx.loss_fn(ctx.model, mb)
        (loss.float() * w).backward()
    return {n: (None if p.grad is None else p.grad.detach().float().clone()) for n, p in ctx.model.named_parameters()}


@dataclass
class _Run:
    """One observed call of the step: gradients at ``optimizer.step()`` (``post``), what the losses gave before any
    clipping (``pre``, summed over the backward passes), the last backward pass's share, and the optimizer steps."""

    post: dict
    pre: dict
    last: dict
    calls: int
    where: str = "optimizer.step"


def _observe(setup: Setup, micro_batches: list, k: int, *, freeze: bool, what: str) -> _Run:
    """Run the step under test once on a fresh seeded copy (configured for K=k) and observe its first update."""
    ctx = setup.build(accumulation_steps=k)
    quiet_randomness(ctx.model)
    if freeze:
        freeze_batch_stats(ctx.model)
    records, calls = run_steps(setup, ctx, [micro_batches])
    require_steps(setup, calls, what)
    r = records[0]
    return _Run(r.grads, r.pre_clip or r.grads, r.last_backward, calls[0], r.observed_at)


def _scaled(g: dict, c: float) -> dict:
    return {n: (None if v is None else v * c) for n, v in g.items()}


def _scalar_fit(g: dict, ref: dict) -> tuple[float, float]:
    """(c, residual): the c that makes ``g ≈ c·ref`` best (least squares) and the relative error left at that c."""
    rr = sum(float(r.double().pow(2).sum()) for r in ref.values() if r is not None)
    if rr == 0:
        return float("nan"), 1.0
    c = sum(float((g[n].double() * r.double()).sum()) for n, r in ref.items() if r is not None and g.get(n) is not None) / rr
    return c, global_rel_error(g, _scaled(ref, c))


def _near(x: float, y: float, rel: float = 0.02) -> bool:
    return math.isfinite(x) and math.isfinite(y) and abs(x - y) <= rel * max(abs(y), 1e-12)


_PER_MICRO_MEAN = "per_micro_mean"
_PER_MICRO_MEAN_SUMMED = "per_micro_mean_summed"
_CONSTANT_DIVISOR = "constant_divisor"
_ZERO_INSIDE = "last_only"
_DIVIDE_ADVICE = "divide each micro-batch loss by len(micro_batches) (or weight it by its share of the step's samples)"


def _loss_side_cause(setup: Setup, micro: list, whole: object, a: _Run, b: _Run, k: int, close: float,
                     freeze: bool, facts: dict) -> tuple[str, list[str], str | None]:
    """Name what the K-micro-batch losses did wrong, from the gradients before any clipping.

    First decide which run is wrong against an independent reference, the Setup's ``loss_fn`` over the whole batch:
    each run's pre-clip gradient is fitted as ``c·reference``. When both runs are exact multiples, the two factors
    name the cause (a constant divisor, a sum, a double division); otherwise the K run is tested against the
    hypotheses built from ``loss_fn`` per micro-batch (per-micro-batch means, only the last micro-batch).
    """
    ref = _loss_grads(setup, [whole], [1.0], freeze)
    ca, ra = _scalar_fit(a.pre, ref)
    cb, rb = _scalar_fit(b.pre, ref)
    facts.update(reference_factor_1x=ca, reference_factor_kx=cb, reference_residual_1x=ra, reference_residual_kx=rb)
    if ra <= close and rb <= close:
        if _near(cb / ca, k):  # the K run grows with K: every micro-batch loss is divided by the same constant D
            d = 1 / ca
            if _near(d, 1.0):
                return (f"the accumulated gradient is {k}× the full-batch one: micro-batch losses are summed, not averaged",
                        [f"Divide each micro-batch loss by K={k} before backward() (or weight it by its share of the step's samples)."],
                        "summed")
            facts["constant_divisor"] = round(d, 6)
            return (f"your step divides the loss by a constant {d:g} whatever the number of micro-batches: correct at K={d:g}, "
                    f"wrong for any other K (here 1 micro-batch gives {ca:.3g}× the whole-batch gradient, {k} give {cb:.3g}×)",
                    [f"Use the number of micro-batches actually passed: {_DIVIDE_ADVICE}, not a constant {d:g}."],
                    _CONSTANT_DIVISOR)
        if _near(ca, 1.0) and _near(cb * k, 1.0):
            return (f"the accumulated gradient is 1/{k} of the full-batch one: the loss is divided by K twice",
                    ["Divide the loss by K once (either per micro-batch or after accumulating, not both)."], "divided_twice")
        return (f"the {k}-micro-batch gradient is {cb:.3g}× the whole-batch gradient of loss_fn (1 micro-batch: {ca:.3g}×)",
                [f"Make each micro-batch contribute its share of the full-batch loss: {_DIVIDE_ADVICE}."], "scaled")
    base = a.pre if ra > close else _scaled(ref, ca)  # when the 1x run is not the reference, compare with it directly
    last = _loss_grads(setup, micro[-1:], [1.0], freeze)
    c_last, r_last = _scalar_fit(b.pre, last)
    _, r_first = _scalar_fit(b.pre, _loss_grads(setup, micro[:1], [1.0], freeze))
    hypotheses = {
        "summed": (global_rel_error(b.pre, _scaled(base, k)),
                   f"the accumulated gradient is {k}× the full-batch one: micro-batch losses are summed, not averaged",
                   [f"Divide each micro-batch loss by K={k} before backward() (or weight it by its share of the step's samples)."]),
        "divided_twice": (global_rel_error(b.pre, _scaled(base, 1 / k)),
                          f"the accumulated gradient is 1/{k} of the full-batch one: the loss is divided by K twice",
                          ["Divide the loss by K once (either per micro-batch or after accumulating, not both)."]),
        "only_last_loss": (r_last, "only the last micro-batch's loss is backpropagated",
                           ["Call backward() on every micro-batch's loss, then step once."]),
        # A step written for one batch reads micro_batches[0] (an LBFGS closure step, a port of a loop that never
        # accumulated): the other micro-batches are silently dropped.
        "only_first_micro_batch": (r_first, "only the first micro-batch is used: the step reads micro_batches[0] and "
                                   "ignores the others",
                                   ["Loop over every micro-batch the step receives (backward on each, then one optimizer "
                                    "step); a step that never accumulates may keep reading micro_batches[0], but then keep "
                                    "accumulation_steps=1."]),
        _PER_MICRO_MEAN: (global_rel_error(b.pre, _scaled(_loss_grads(setup, micro, [1 / k] * k, freeze), ca if ra <= close else 1.0)),
                          "it equals the average of per-micro-batch mean losses: each micro-batch's loss is normalised by its own item count",
                          ["Each micro-batch loss is a mean over its own items (tokens, pixels, non-padding positions); averaging "
                           "those means weights items unequally. Sum the per-item losses and divide by the total item count of the "
                           "whole optimizer step (the 2024 transformers gradient-accumulation bug)."]),
        _PER_MICRO_MEAN_SUMMED: (
            global_rel_error(b.pre, _scaled(_loss_grads(setup, micro, [1.0] * k, freeze), ca if ra <= close else 1.0)),
            f"it equals the sum of the {k} per-micro-batch mean losses: each micro-batch's loss is normalised by its own "
            "item count and none is divided by K",
            ["Each micro-batch loss is a mean over its own items (tokens, non-padding positions) and the K of them are "
             "summed. Sum the per-item losses and divide by the total item count of the whole optimizer step (a "
             "transformers Trainer passes it to compute_loss as num_items_in_batch; a compute_loss that ignores it "
             "must set loss_is_scaled_for_ga = False)."]),
    }
    tag, (err, cause, advice) = min(hypotheses.items(), key=lambda kv: kv[1][0])
    facts["closest_hypothesis"], facts["closest_hypothesis_error"] = tag, err
    if err <= close:
        return cause, advice, tag
    return (f"before clipping: norm ratio {_norm(b.pre) / _norm(a.pre) if _norm(a.pre) else float('nan'):.3f}, cosine "
            f"{_cosine(a.pre, b.pre):.4f}",
            ["Make each micro-batch contribute its share of the full-batch loss: weight it by its share of the step's "
             "items (samples or tokens) and call backward() on every micro-batch before one optimizer step."], None)


def _update_side_cause(setup: Setup, b: _Run, k: int, close: float) -> tuple[str, list[str], str | None]:
    """Name what happened between the K backward passes and ``optimizer.step()`` when the losses were right."""
    c, r = _scalar_fit(b.post, b.last)
    if r <= close and _norm(b.last) > 0 and global_rel_error(b.pre, b.last) > close:
        return ("only the last micro-batch reaches the step: the gradients are cleared inside the micro-batch loop",
                ["Do not call zero_grad() inside the micro-batch loop; call it once per optimizer step."], _ZERO_INSIDE)
    return ("the micro-batch losses give the right gradient, but what reaches optimizer.step() depends on the number of "
            "micro-batches: something between backward() and step() (clipping per micro-batch, rescaling, zeroing) runs "
            "per micro-batch",
            ["Run backward() on every micro-batch first, then unscale, clip once and step once."], "between_backward_and_step")


@register(
    "loop.accumulation",
    title="Gradient accumulation equivalence",
    description="one batch as 1 micro-batch vs as K micro-batches (even and uneven) gives the same gradient",
)
def check_accumulation(setup: Setup, *, k: int | None = None, tol: float | None = None, progress: bool = True) -> CheckResult:
    """FAIL when feeding one batch as K micro-batches changes the gradient that reaches ``optimizer.step()``.

    K is ``setup.accumulation_steps`` when > 1, else 4. Two things are compared: the gradients before any clipping
    (summed over the step's backward passes), which clipping cannot hide and from which the cause is named against
    the Setup's own ``loss_fn`` over the whole batch; and the gradients at ``optimizer.step()``, for what happens
    between backward and step (``zero_grad`` or clipping per micro-batch). Unequal micro-batch sizes are tried first:
    a match there is a PASS; on a mismatch the equal split decides between WARN (exact only for equal sizes, e.g.
    ``loss / K``: a latent note when this Setup's data always splits equally) and FAIL. A step that divides by a
    constant is right only at that K: a latent WARN when it is the configured K. With batch-dependent layers
    (BatchNorm) the comparison is rerun with their batch statistics frozen: WARN when that isolated rerun matches,
    FAIL when it does not. Non-finite gradients are their own FAIL, never a match. A step that cannot run with K micro-batches is a
    latent WARN while the Setup does not accumulate.
    """
    try:
        return _check_accumulation(setup, k=k, tol=tol)
    except StepError as exc:
        if setup.accumulation_steps > 1 or not getattr(exc, "in_k_run", False):
            raise
        # A step that cannot take smaller micro-batches (e.g. a recurrent state sized for the full batch) is not
        # wrong while the Setup does not accumulate: a latent note, not an ERROR.
        return CheckResult("loop.accumulation", Status.WARN,
                           f"latent (this Setup does not accumulate gradients): the step cannot run with "
                           f"{k or 4} micro-batches: {exc.message}",
                           {"latent": True, "k": k or 4, "error_type": type(exc.__cause__ or exc).__name__},
                           advice=["Nothing to fix while accumulation_steps=1. Before turning accumulation on, make the step "
                                   "accept micro-batches of any size (size per-batch state such as a recurrent hidden state "
                                   "from the micro-batch, e.g. init_hidden(len(mb)))." ] + ([exc.fix] if exc.fix else []))


def _check_accumulation(setup: Setup, *, k: int | None = None, tol: float | None = None) -> CheckResult:
    setup.validate()
    tol = tolerance_for(setup, tol)
    close = max(10 * tol, 1e-4)
    k = int(k) if k is not None else (setup.accumulation_steps if setup.accumulation_steps > 1 else 4)
    if k < 2:
        raise TroptError(f"check_accumulation needs k >= 2 micro-batches (got {k})", "use k=4")
    with preserved(setup.model):  # reading a shuffling DataLoader draws from the global RNG
        batch = setup.sample_batch()
    n = setup.size(batch)
    if n < 2 * k:
        raise TroptError(f"the first batch holds {n} samples, too few to split into {k} and then uneven micro-batches",
                         f"use batches of at least {2 * k} samples for this check (or pass a smaller k)")
    n_even = n - n % k
    even_batch = setup.split(batch, sizes=[n_even, n - n_even])[0] if n_even < n else batch
    # One large micro-batch and K-1 small ones: clearly unequal for every K (a loop that divides by K is off by a lot).
    small = max(1, n // (2 * k))
    uneven_sizes = [n - (k - 1) * small] + [small] * (k - 1)
    uneven_micro = setup.split(batch, sizes=uneven_sizes)
    bn_layers = batch_dependent_layers(setup.model)
    labels = ("1x", f"{k}x")

    def one(full: object, freeze: bool) -> _Run:
        return _observe(setup, [full], 1, freeze=freeze, what="the 1-micro-batch run")

    def many(micro: list, freeze: bool) -> _Run:
        try:
            return _observe(setup, micro, k, freeze=freeze, what=f"the {k}-micro-batch run")
        except StepError as exc:
            exc.in_k_run = True  # the only run that differs from normal training: check_accumulation may call it latent
            raise

    def errors(a: _Run, b: _Run) -> tuple[pd.DataFrame, float, float]:
        table = compare_tensors(a.post, b.post, labels=labels)
        return table, float(table["rel_error"].max()), max_rel_error(a.pre, b.pre)

    def broken(a: _Run, b: _Run, metrics: dict, tables: dict) -> CheckResult | None:
        """Non-finite gradients, or none at all: nothing to compare, and never a PASS."""
        bad = nonfinite_result("loop.accumulation", {"1x": (1, a.post), f"{k}x": (1, b.post)})
        if bad is not None:
            return dataclasses.replace(bad, metrics={**metrics, **bad.metrics}, tables={**tables, **bad.tables})
        if _norm(a.post) > 0 or _norm(b.post) > 0:  # zero equals zero: a step that clears before stepping "matches"
            return None
        return CheckResult("loop.accumulation", Status.WARN,
                           "cannot check accumulation: no gradient reaches optimizer.step() in either run (every gradient is "
                           "zero or None when the optimizer steps)",
                           {**metrics, "see_also": "loop.zero_grad"}, tables,
                           ["Call optimizer.zero_grad() after optimizer.step() (or before the first backward of the next step), "
                            "never between backward() and step(); then rerun this check.", _STANDARD_STEP_ADVICE])

    def fail(a: _Run, b: _Run, micro: list, whole: object, freeze: bool, err: float, pre_err: float, metrics: dict,
             tables: dict, prefix: str) -> CheckResult:
        """The FAIL (or latent WARN) for a mismatch, with the cause decided from the evidence."""
        if b.calls > 1:
            cause, advice, tag = (f"optimizer.step() ran {b.calls} times for one step of {k} micro-batches",
                                  [f"Call optimizer.step() once per {k} micro-batches, after the last backward.",
                                   "Clear gradients only after that step, not per micro-batch."], "step_per_micro_batch")
            metrics["optimizer_steps_per_call"] = b.calls
        elif pre_err > tol:
            cause, advice, tag = _loss_side_cause(setup, micro, whole, a, b, k, close, freeze, metrics)
            if tag not in (_ZERO_INSIDE, "only_last_loss") and _norm(b.last) > 0:
                extra, extra_advice, extra_tag = _update_side_cause(setup, b, k, close)
                if extra_tag == _ZERO_INSIDE:  # the bigger defect first: K-1 micro-batches are lost
                    cause, advice, tag = f"{extra}; also {cause}", extra_advice + advice, extra_tag
        else:
            cause, advice, tag = _update_side_cause(setup, b, k, close)
        metrics["cause"] = tag or "unnamed"
        status = Status.FAIL
        summary = f"{prefix}: {cause}"
        result = CheckResult("loop.accumulation", status, summary, metrics, tables, advice + [_STANDARD_STEP_ADVICE])
        if tag == _CONSTANT_DIVISOR:
            d = metrics["constant_divisor"]
            if setup.accumulation_steps > 1 and _near(d, setup.accumulation_steps):
                return dataclasses.replace(
                    result, status=Status.WARN, metrics={**metrics, "latent": True},
                    summary=f"latent (correct at the configured K={setup.accumulation_steps}): {cause}")
            return result  # wrong at the configured K itself: a real defect whether or not the Setup accumulates
        return latent_when_unused(setup, result)

    with preserved(setup.model):
        a = b = None
        if not bn_layers and n_even == n:
            # Fast path: a loop exact for unequal micro-batches is exact for equal ones, so one uneven run decides
            # a PASS (2 runs); the even split only runs to tell a WARN (uneven-only) from a FAIL.
            a, ub = one(batch, False), many(uneven_micro, False)
            utable, uerr, upre = errors(a, ub)
            metrics = {"k": k, "batch_size": n, "uneven_sizes": "+".join(map(str, uneven_sizes)), "max_rel_error": uerr,
                       "uneven_max_rel_error": uerr, "pre_clip_max_rel_error": upre,
                       "global_rel_error": global_rel_error(a.post, ub.post), "tolerance": tol,
                       "optimizer_steps_in_k_run": ub.calls, "batch_dependent_layers": 0,
                       "observed_at": f"{a.where} (and before clipping)"}
            if (bad := broken(a, ub, metrics, {"parameters": utable})) is not None:
                return bad
            if uerr <= tol and upre <= tol and ub.calls == 1:
                return CheckResult("loop.accumulation", Status.PASS,
                                   f"{k} micro-batches of unequal sizes ({metrics['uneven_sizes']}) give the full-batch gradient "
                                   f"(max relative error {max(uerr, upre):.1e} ≤ {tol:.0e}, before and after clipping); equal sizes follow",
                                   metrics, {"parameters": utable})
        if a is not None and a.calls > 1:
            return _steps_per_call_result(a.calls, metrics, {"parameters": utable})
        even_micro = setup.split(even_batch, k)
        if a is None or n_even != n:
            a = one(even_batch, False)
        b = many(even_micro, False)
        table, err, pre_err = errors(a, b)
        metrics = {"k": k, "batch_size": n, "micro_batch_sizes": "+".join(map(str, split_sizes(n_even, k))),
                   "max_rel_error": err, "pre_clip_max_rel_error": pre_err, "global_rel_error": global_rel_error(a.post, b.post),
                   "tolerance": tol, "optimizer_steps_in_k_run": b.calls,
                   "grad_norm_ratio": _norm(b.post) / _norm(a.post) if _norm(a.post) else float("nan"),
                   "pre_clip_norm_ratio": _norm(b.pre) / _norm(a.pre) if _norm(a.pre) else float("nan"),
                   "grad_cosine": _cosine(a.post, b.post), "batch_dependent_layers": len(bn_layers),
                   "observed_at": f"{a.where} (and before clipping)"}
        tables = {"parameters": table}
        if a.calls > 1:
            return _steps_per_call_result(a.calls, metrics, tables)
        if (bad := broken(a, b, metrics, tables)) is not None:
            return bad
        frozen = False
        mismatch = err > tol or pre_err > tol or b.calls > 1
        if mismatch and bn_layers and b.calls == 1:
            fa, fb = one(even_batch, True), many(even_micro, True)
            ftable, ferr, fpre = errors(fa, fb)
            metrics.update(frozen_max_rel_error=ferr, frozen_pre_clip_max_rel_error=fpre)
            tables = {"parameters_frozen_batch_stats": ftable, "parameters": table,
                      "batch_dependent_layers": pd.DataFrame({"layer": bn_layers})}
            if ferr > tol or fpre > tol:
                return fail(fa, fb, even_micro, even_batch, True, ferr, fpre, metrics, tables,
                            f"{k} micro-batches change the gradient by {max(ferr, fpre):.1%} even with BatchNorm statistics frozen")
            frozen = True
        elif mismatch:
            return fail(a, b, even_micro, even_batch, False, err, pre_err, metrics, tables,
                        f"{k} micro-batches change the gradient by {max(err, pre_err):.1%} (max over parameters"
                        + (", before clipping" if pre_err > err else "") + ")")
        # Even split is exact (possibly with frozen batch statistics): now unequal micro-batch sizes.
        if not (not bn_layers and n_even == n):  # not measured on the fast path above
            ua = a if n_even == n and not frozen else one(batch, frozen)
            ub = many(uneven_micro, frozen)
            utable, uerr, upre = errors(ua, ub)
        else:
            ua = a
        metrics.update(uneven_sizes="+".join(map(str, uneven_sizes)), uneven_max_rel_error=max(uerr, upre))
        uerr = max(uerr, upre)
        tables["parameters_uneven"] = utable
        ucause = None
        if uerr > tol and not frozen:
            ucause = _loss_side_cause(setup, uneven_micro, batch, ua, ub, k, close, False, {})
        if ucause is not None and ucause[2] == _PER_MICRO_MEAN and tol > TOLERANCE["fp32"]:
            # In half precision the equal split's error can hide under the tolerance. Per-micro-batch means are exact
            # for equal-sized micro-batches only when the loss is a mean over samples, not over tokens or positions:
            # ask the loss function itself, in full precision, on the equal split.
            try:
                still = bool(bn_layers)  # BatchNorm's per-micro-batch statistics are not what this asks about
                hidden = global_rel_error(_loss_grads(setup, [even_batch], [1.0], still, autocast=False),
                                          _loss_grads(setup, even_micro, [1 / k] * k, still, autocast=False))
            except Exception:  # noqa: BLE001 - a loss that only runs under autocast: keep the WARN below
                hidden = float("nan")
            metrics["equal_split_error_of_cause_fp32"] = hidden
            if hidden > _HIDDEN_EXACT:
                return latent_when_unused(setup, CheckResult(
                    "loop.accumulation", Status.FAIL,
                    f"{k} micro-batches change the gradient ({uerr:.1%} with unequal sizes {metrics['uneven_sizes']}): {ucause[0]}; "
                    f"equal-sized micro-batches are off too ({hidden:.1%} in fp32), hidden here under the "
                    f"{setup.precision} tolerance ({err:.1%} ≤ {tol:.0e})",
                    {**metrics, "cause": _PER_MICRO_MEAN}, tables, ucause[1] + [_STANDARD_STEP_ADVICE]))
    if frozen:
        summary = (f"accumulation is exact once BatchNorm's batch statistics are frozen (error {metrics['frozen_max_rel_error']:.1e}); "
                   f"with live batch statistics {k} micro-batches differ by {err:.1%}, as BatchNorm does by design")
        advice = [f"Expect accumulation over {k} micro-batches to differ from one big batch: {len(bn_layers)} BatchNorm layer(s) "
                  "normalise each micro-batch by its own statistics.",
                  "If that matters, use GroupNorm/LayerNorm, or larger micro-batches."]
        if uerr > tol:
            advice.append(f"Also: unequal micro-batch sizes ({metrics['uneven_sizes']}) change the gradient by {uerr:.1%}; weight each "
                          "micro-batch loss by its share of the samples.")
        return CheckResult("loop.accumulation", Status.WARN, summary, metrics, tables, advice)
    if uerr <= tol:
        return CheckResult("loop.accumulation", Status.PASS,
                           f"{k} micro-batches give the full-batch gradient (max relative error {max(err, pre_err, uerr):.1e} ≤ "
                           f"{tol:.0e}, even and uneven)", metrics, tables)
    named = ucause is not None and ucause[2] not in (None, _PER_MICRO_MEAN, "scaled")
    what = f"exact for equal micro-batches, but unequal sizes ({metrics['uneven_sizes']}) change the gradient by {uerr:.1%}"
    advice = (ucause[1] if named else
              ["Weight each micro-batch loss by its share of the step's samples (n_i / n) instead of dividing by K, "
               "or make every micro-batch the same size (drop_last=True)."]) + [_STANDARD_STEP_ADVICE]
    if named:
        what += f": {ucause[0]}"
    sizes = _batch_sizes_of(setup)
    acc = setup.accumulation_steps
    if sizes is not None and (acc == 1 or all(s % acc == 0 for s in sizes)):
        # This Setup's data cannot give unequal micro-batches: a note for a future change, not a wrong update now.
        why = ("it does not accumulate (accumulation_steps=1)" if acc == 1 else
               f"every batch ({', '.join(map(str, sorted(set(sizes))))} samples) splits into {acc} equal micro-batches")
        metrics.update(latent=True, train_batch_sizes=", ".join(map(str, sorted(set(sizes)))))
        return CheckResult("loop.accumulation", Status.PASS,
                           f"exact for the micro-batches this Setup produces ({why}); latent: {what}", metrics, tables,
                           ["Nothing to fix for this data. Before feeding batches whose size is not a multiple of K (a short "
                            "last batch, variable-length samples):"] + advice)
    if sizes is not None:
        metrics["train_batch_sizes"] = ", ".join(map(str, sorted(set(sizes))))
    return CheckResult("loop.accumulation", Status.WARN, what, metrics, tables, advice)


def _steps_per_call_result(calls: int, metrics: dict, tables: dict) -> CheckResult:
    """FAIL for a step that runs ``optimizer.step()`` more than once per call even with one micro-batch: every
    update is applied ``calls`` times. Shown without accumulation, so never latent; the other loop checks defer here."""
    return CheckResult("loop.accumulation", Status.FAIL,
                       f"optimizer.step() ran {calls} times per call of the step function with a single micro-batch "
                       f"(expected once): every update is applied {calls} times",
                       {**metrics, "optimizer_steps_per_call": calls, "cause": "steps_per_call"}, tables,
                       ["Call optimizer.step() (or scaler.step(optimizer)) exactly once per call of step(ctx, micro_batches); "
                        "look for a second call in a helper, a callback or a wrapper.", _STANDARD_STEP_ADVICE])


def _batch_sizes_of(setup: Setup) -> list[int] | None:
    """The batch sizes one pass over the training data gives, when they can be known without guessing; else None.

    A DataLoader with a plain batch size (and a sized dataset) is computed, a list of batches is measured, and a
    Dataset is batched by the Setup's ``batch_size``. Custom batch samplers may give any size: None.
    """
    data = setup.train_data
    try:
        if isinstance(data, torch.utils.data.DataLoader):
            bs = data.batch_size
            if bs is None or not hasattr(data.dataset, "__len__") or isinstance(data.dataset, torch.utils.data.IterableDataset):
                return None
            m = len(data.dataset)
            sizes = [bs] * (m // bs) + ([] if data.drop_last or m % bs == 0 else [m % bs])
            return sizes or None
        if isinstance(data, torch.utils.data.Dataset):
            m, bs = len(data), setup.batch_size
            return [bs] * (m // bs) + ([m % bs] if m % bs else [])
        if isinstance(data, (list, tuple)) and len(data) <= 10_000:
            return [setup.size(b) for b in data]
    except Exception:  # noqa: BLE001 - unknown layouts: assume unequal sizes can happen (keep the WARN)
        return None
    return None


# --------------------------------------------------------------------------------------------- loss scaling
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
)
def check_loss_scaling(setup: Setup, *, scale: float = 2.0**16, tol: float | None = None, progress: bool = True) -> CheckResult:
    """FAIL when the gradients reaching ``optimizer.step()`` depend on the GradScaler's scale.

    The classic cause is clipping still-scaled gradients (``clip_grad_norm_`` before ``scaler.unscale_``); the summary
    names the cause the evidence shows (norm ratio = scale: not unscaled; 1/scale: unscaled twice; norm = grad_clip /
    scale: clipped by norm; entries piled at one magnitude: clipped by value). If the
    large scale overflows on the first step, smaller scales (2^12, 2^8) are tried and reported. SKIP without a scaler.
    """
    setup.validate()
    owner = "ctx.scaler"
    if not setup.use_scaler:
        owner = _step_scaler(setup)
        if owner is None:
            return CheckResult("loop.loss_scaling", Status.SKIP,
                               "no GradScaler in this Setup (use_scaler=False) and the step scales no loss with one of its "
                               "own: nothing to check")
    tol = tolerance_for(setup, tol)
    with preserved(setup.model):
        micro = setup.split(setup.sample_batch(), setup.accumulation_steps)
        ctx = setup.build(init_scale=1.0)
        quiet_randomness(ctx.model)
        # Whichever GradScaler scales the loss (ctx.scaler, or one the step builds itself) starts at the scale under test.
        rec_a, calls_a = run_steps(setup, ctx, [micro], init_scale=1.0)
        require_steps(setup, calls_a, "the scale-1 run")
        rec_b, used = [], None
        for big in (scale, 2.0**12, 2.0**8):
            ctx = setup.build(init_scale=big)
            quiet_randomness(ctx.model)
            rec_b, _ = run_steps(setup, ctx, [micro], init_scale=big)
            if rec_b:
                used = big
                break
    if not rec_b:
        raise TroptError("every large loss scale (2^16, 2^12, 2^8) overflowed on the first step, so no step ran to compare",
                         "check the loss for huge values; fp16 overflows above 65504")
    result = _loss_scaling_verdict(setup, rec_a, rec_b, used, tol, owner)
    if setup.precision != "fp16" and result.status is Status.PASS:
        result = dataclasses.replace(
            result, status=Status.WARN,
            summary=f"{result.summary}; but with precision={setup.precision!r} loss scaling is unnecessary (only fp16's narrow "
                    "exponent range underflows small gradients)",
            advice=["Drop the GradScaler (use_scaler=False, plain loss.backward() and optimizer.step()), or train in fp16 "
                    "if that is what the scaler was kept for."])
    return defer_multi_step(result, calls_a)


def _step_scaler(setup: Setup) -> str | None:
    """The type of an enabled GradScaler the step itself uses to scale the loss (one probe step), or None.

    A probe step that raises counts as no scaler: the checks that need the step report that error themselves.
    """
    with preserved(setup.model), ScalerWatch() as watch:
        ctx = setup.build()
        quiet_randomness(ctx.model)
        try:
            setup.run_step(ctx, setup.split(setup.sample_batch(), setup.accumulation_steps))
        except TroptError:
            pass
    used = [s for s in watch.used if s.is_enabled()]
    return f"the step's own {type(used[-1]).__name__}" if used else None


def _loss_scaling_verdict(setup: Setup, rec_a: list, rec_b: list, used: float, tol: float, owner: str) -> CheckResult:
    a, b = rec_a[0].grads, rec_b[0].grads
    table = compare_tensors(a, b, labels=("scale_1", f"scale_{int(used)}"))
    err = float(table["rel_error"].max())
    norm_a, norm_b = rec_a[0].grad_norm, rec_b[0].grad_norm
    metrics = {"scale_small": 1.0, "scale_large": used, "max_rel_error": err, "tolerance": tol, "scaler": owner,
               "observed_at": observed_at(rec_a + rec_b),
               "clipped_norm_scale_1": norm_a, "clipped_norm_large_scale": norm_b, "grad_clip": setup.grad_clip or float("nan")}
    tables = {"parameters": table}
    if err <= tol and abs(norm_a - norm_b) <= tol * max(norm_a, norm_b, 1e-30):
        return CheckResult("loop.loss_scaling", Status.PASS,
                           f"unscaled gradients and clipped norm do not depend on the loss scale (max relative error {err:.1e})",
                           metrics, tables)
    # Name the cause from the evidence: how the large-scale gradients relate to the scale-1 ones.
    ratio = norm_b / norm_a if norm_a > 0 else float("nan")
    clip_at, clip_share = _value_clip_signature(b, used)
    metrics.update(grad_norm_ratio=ratio, value_clip_share=clip_share)
    unscale_first = "Call scaler.unscale_(optimizer) once, before anything that reads or changes the gradients"
    if norm_a > 0 and abs(ratio / used - 1) < 0.05:
        summary = f"optimizer.step() receives gradients still multiplied by the loss scale ({ratio:.3g}×)"
        advice = ["Step through the scaler: scaler.step(optimizer) (it unscales), or call scaler.unscale_(optimizer) first."]
    elif setup.grad_clip is not None and abs(norm_b * used / setup.grad_clip - 1) < 0.05:
        # Clipped to grad_clip while multiplied by the scale, then unscaled: norm grad_clip / scale. When the true norm
        # is itself clipped to grad_clip, unscaling twice gives the same number: say both.
        twice = abs(ratio * used - 1) < 0.05
        summary = (f"the gradients depend on the loss scale ({err:.1%}; clipped norm {norm_a:.3g} vs {norm_b:.3g} = "
                   f"grad_clip {setup.grad_clip:g} / scale {used:g}): clip_grad_norm_ ran on still-scaled gradients"
                   + (" (or they are unscaled twice: here both give this norm)" if twice else ""))
        advice = ["Call scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer) and scaler.update()."]
    elif norm_a > 0 and abs(ratio * used - 1) < 0.05:
        summary = (f"the gradients reaching optimizer.step() are 1/{used:g} of the true ones ({ratio:.3g}×): they are unscaled "
                   "twice (e.g. divided by scaler.get_scale() by hand and again by scaler.unscale_/scaler.step)")
        advice = ["Unscale once: let scaler.unscale_(optimizer) or scaler.step(optimizer) do it; do not also divide the "
                  "gradients by the scale yourself."]
    elif clip_share >= 0.5:
        summary = (f"the gradients depend on the loss scale ({err:.1%}): {clip_share:.0%} of the entries sit exactly at "
                   f"±{clip_at:.3g} in scaled units, so clip_grad_value_ (or a clamp) ran on still-scaled gradients")
        advice = [f"{unscale_first}: then clip_grad_value_, scaler.step(optimizer) and scaler.update()."]
    else:
        summary = (f"the gradients that reach optimizer.step() depend on the loss scale ({err:.1%} relative error; norm ratio "
                   f"{ratio:.3g} at scale {used:g}): something reads or changes them while still scaled")
        advice = [f"{unscale_first} (clipping, manual scaling, logging-based decisions); scale only the loss "
                  "(scaler.scale(loss).backward()) and step through scaler.step(optimizer)."]
    return CheckResult("loop.loss_scaling", Status.FAIL, summary, metrics, tables, advice + [_STANDARD_STEP_ADVICE])


# --------------------------------------------------------------------------------------------- scheduler cadence
def _lr_changes(lrs: np.ndarray) -> bool:
    """Whether any group's learning rate takes more than one value over the recorded optimizer steps."""
    return bool(len(lrs) > 1 and not np.allclose(lrs, lrs[:1], rtol=1e-9, atol=0))


def _same_lrs(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-6, atol=0))


class _HandUpdate(Exception):
    """A call updated the parameters by hand: no learning rate reached an optimizer to compare."""


def _schedule_position(sched: object) -> float:
    pos = getattr(sched, "last_epoch", None)
    return float(pos) if isinstance(pos, (int, float)) else float("nan")


def _lr0(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def _cadence_run(setup: Setup, ctx: object, batches: list, kk: int) -> dict:
    """Run ``batches`` as ``kk`` micro-batches each; record the schedule around every call and optimizer step.

    Positions and learning rates are read at the start and end of every call and, through a second step pre-hook,
    at every ``optimizer.step()``: a scheduler stepped before the optimizer shows there, within its own call.
    """
    quiet_randomness(ctx.model)
    at_step: list[float] = []
    handles = on_update(ctx.optimizer, lambda opt, args, kwargs: at_step.append(_schedule_position(ctx.scheduler)))
    start = _schedule_position(ctx.scheduler)
    before, lr_before, after, lr_after, calls = [], [], [], [], []
    try:
        with StepRecorder(ctx, capture="lr") as rec:
            for b in batches:
                before.append(_schedule_position(ctx.scheduler) - start)
                lr_before.append(_lr0(ctx.optimizer))
                n, values = len(rec.records), rec.before_call()
                setup.run_step(ctx, setup.split(b, kk))
                rec.after_call(values, len(rec.records) - n)  # a hand-written update shows as a record without LRs
                calls.append(len(rec.records) - n)
                after.append(_schedule_position(ctx.scheduler) - start)
                lr_after.append(_lr0(ctx.optimizer))
    finally:
        for h in handles:
            h.remove()
    require_steps(setup, calls, f"the K={kk} run")
    if any(not r.lrs for r in rec.records):
        raise _HandUpdate()
    first = np.cumsum([0] + calls[:-1])  # index of each call's first optimizer step
    stepped = [i for i, c in enumerate(calls) if c > 0]
    lrs = np.array([r.lrs for r in rec.records])
    return {"lrs": lrs, "positions": np.array(after), "calls": calls, "moved": bool(after[-1] != 0 or lr_after[-1] != lr_before[0]),
            # per call with exactly one optimizer step: how far the schedule moved in that call
            "advances": [after[i] - before[i] for i in stepped if calls[i] == 1],
            # per call: how far the schedule had moved (position, LR) by the call's first optimizer.step()
            "early": [(at_step[first[i]] - start - before[i], lrs[first[i], 0], lr_before[i]) for i in stepped]}


@register(
    "loop.scheduler_cadence",
    title="Scheduler steps once per optimizer step",
    description="learning rate and schedule position at each optimizer step are the same with K = 1 and K = 4",
)
def check_scheduler_cadence(setup: Setup, *, steps: int | None = None, k: int = 4, progress: bool = True) -> CheckResult:
    """FAIL when the schedule advances per micro-batch (LR sequence differs between K = 1 and K = ``k``) or more than
    once per optimizer step; WARN when it never moves (fine for a per-epoch scheduler stepped outside the step) or is
    stepped before ``optimizer.step()``.

    Compares, after every optimizer step, the scheduler's position (``last_epoch``) and each group's learning
    rate. ``steps`` defaults to 1 when the scheduler reports its position (decisive on its own), else 2 (3 for a
    learning rate the step sets by hand) so the learning rates can differ. Without a scheduler object the learning
    rate the step writes into ``param_group["lr"]`` (``lr = get_lr(ctx.it)``) is compared the same way; SKIP only
    when it never changes in either run, or without an optimizer. When the runs differ, a K=1 run over ``steps * k``
    optimizer steps confirms "advanced per micro-batch" (the K run reads every K-th of its learning rates).
    """
    if setup.optimizer is None:
        return CheckResult("loop.scheduler_cadence", Status.SKIP,
                           "no optimizer in this Setup (optimizer=None): a hand-written update has no learning rate tropt can "
                           "read, so the schedule cannot be compared")
    setup.validate()
    if steps is not None and steps < 1:
        raise TroptError(f"check_scheduler_cadence needs steps >= 1 (got {steps})", "use steps=2")
    hand_set = setup.scheduler is None  # a step that writes param_group["lr"] itself (e.g. lr = get_lr(ctx.it))
    with preserved(setup.model):
        first = setup.build(accumulation_steps=1)
        has_position = not math.isnan(_schedule_position(first.scheduler))
        # ReduceLROnPlateau counts metric evaluations: stepping it before optimizer.step() shifts no schedule.
        plateau = isinstance(first.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if setup.uses_standard_step and first.scheduler is not None and needs_metric(first.scheduler):
            return CheckResult("loop.scheduler_cadence", Status.SKIP,
                               f"the scheduler is a {type(first.scheduler).__name__}, which steps on a metric in your epoch "
                               "loop (scheduler.step(val_loss) after validation); tropt.standard_step leaves it alone, so "
                               "there is no per-step schedule to compare",
                               {"scheduler": type(first.scheduler).__name__},
                               advice=["Step it once per validation with the metric it watches; to check a loop that "
                                       "steps it inside the training step, pass that step as Setup(step=...)."])
        if steps is None:
            steps = 1 if has_position else 3 if hand_set else 2
        batches = list(setup.batches(steps))
        if min(setup.size(b) for b in batches) < k:
            raise TroptError(f"batches must hold at least K={k} samples to compare K=1 with K={k}", "use bigger batches or k=2")
        try:
            one = _cadence_run(setup, first, batches, 1)
            many = _cadence_run(setup, setup.build(accumulation_steps=k), batches, k)
        except _HandUpdate:
            return CheckResult("loop.scheduler_cadence", Status.SKIP,
                               "the step updates the parameters by hand (no optimizer.step()), so no learning rate reaches an "
                               "optimizer to compare", {"observed_at": PARAMETER_CHANGE})
        if hand_set and not (_lr_changes(one["lrs"]) or _lr_changes(many["lrs"])):
            return CheckResult("loop.scheduler_cadence", Status.SKIP,
                               f"no scheduler in this Setup and the learning rate never changed over {len(batches)} optimizer "
                               f"steps with K=1 or K={k}: no schedule to check",
                               {"steps": len(batches), "k": k, "lr": float(one["lrs"][0, 0]) if len(one["lrs"]) else float("nan")})
        faster = None
        if hand_set and not _same_lrs(one["lrs"], many["lrs"]):
            # A counter kept outside ctx (a module-level global) carries over from run to run: a second fresh K=1 run
            # then differs from the first, and no comparison between runs means anything.
            again = _cadence_run(setup, setup.build(accumulation_steps=1), batches, 1)["lrs"]
            if not _same_lrs(again, one["lrs"]):
                return CheckResult(
                    "loop.scheduler_cadence", Status.WARN,
                    "cannot compare the hand-set learning rate: two fresh runs with K=1 step with different learning rates "
                    f"({one['lrs'][0, 0]:.3g} vs {again[0, 0]:.3g} at the first step), so the step keeps its schedule state "
                    "outside ctx (a module-level counter?) and every run continues where the last one stopped",
                    {"steps": len(batches), "k": k, "schedule": "set by hand in the step", "observed_at": "optimizer.step"},
                    advice=["Keep the iteration counter on the step context (ctx.it = getattr(ctx, 'it', 0) ... ctx.it += 1), "
                            "so every run starts from the same state; then rerun this check."])
        if not _same_lrs(one["lrs"], many["lrs"]) and max(one["calls"] + many["calls"]) <= 1:
            # Does the K run's schedule equal the K=1 schedule read every K optimizer steps (advanced per micro-batch)?
            # Any offset: a counter read after its per-micro-batch increments lands on every K-th value from K-1.
            m = len(many["lrs"])
            ref = _cadence_run(setup, setup.build(accumulation_steps=1), list(setup.batches(m * k)), 1)["lrs"]
            faster = any(_same_lrs(ref[o::k][:m], many["lrs"]) for o in range(k))
    lr1, pos1, calls1 = one["lrs"], one["positions"], one["calls"]
    lrk, posk, callsk = many["lrs"], many["positions"], many["calls"]
    n = min(len(lr1), len(lrk))
    table = pd.DataFrame({
        "step": np.arange(1, len(batches) + 1),
        "lr_k1": [lr1[i, 0] if i < len(lr1) else np.nan for i in range(len(batches))],
        f"lr_k{k}": [lrk[i, 0] if i < len(lrk) else np.nan for i in range(len(batches))],
        "position_k1": pos1, f"position_k{k}": posk,
        "optimizer_steps_k1": calls1, f"optimizer_steps_k{k}": callsk,
    })
    same_lr = len(lr1) == len(lrk) and np.allclose(lr1[:n], lrk[:n], rtol=1e-6, atol=0)
    same_pos = np.allclose(pos1, posk, equal_nan=True)
    metrics = {"steps": len(batches), "k": k, "position_after_k1": float(pos1[-1]), f"position_after_k{k}": float(posk[-1]),
               "schedule": "set by hand in the step" if hand_set else type(first.scheduler).__name__,
               "observed_at": "optimizer.step",
               "optimizer_steps_k1": int(sum(calls1)), f"optimizer_steps_k{k}": int(sum(callsk)),
               "max_lr_rel_diff": float(np.max(np.abs(lr1[:n] - lrk[:n]) / np.maximum(np.abs(lr1[:n]), 1e-30))) if n else float("nan")}
    series = {"lr_k1": lr1[:, 0], f"lr_k{k}": lrk[:, 0]}
    tables = {"schedule": table}
    after_opt = "Call ctx.scheduler.step() once per optimizer step, right after optimizer.step()."

    def result(status: Status, summary: str, advice: list[str] | None = None) -> CheckResult:
        return CheckResult("loop.scheduler_cadence", status, summary, metrics, tables,
                           (advice + [_STANDARD_STEP_ADVICE]) if advice else [], series)

    # A scheduler without last_epoch gives no position; then only the learning rates are compared.
    if has_position and not one["moved"] and not many["moved"]:
        opt_steps = int(sum(calls1))
        return result(Status.WARN,
                      f"the schedule did not move during {opt_steps} optimizer step{'s' if opt_steps != 1 else ''} (position and "
                      "learning rate unchanged): fine if your epoch loop steps it once per epoch, outside the step function; "
                      "a bug if it is meant to step per optimizer step",
                      ["If the scheduler is meant to advance per optimizer step (warm-up, cosine or linear decay over steps), call "
                       "ctx.scheduler.step() once per optimizer step, right after optimizer.step().", "If it is a per-epoch scheduler stepped in your epoch loop, nothing to fix: tropt runs only "
                       "the step function and cannot see that loop."])
    # With K=1 a correct step advances the schedule exactly once per optimizer step.
    adv = one["advances"]
    if has_position and adv and min(adv) >= 2:
        times = f"{adv[0]:.0f} times" if len(set(adv)) == 1 else f"{min(adv):.0f} to {max(adv):.0f} times"
        metrics["schedule_steps_per_optimizer_step"] = float(np.mean(adv))
        return result(Status.FAIL,
                      f"the scheduler is stepped {times} per optimizer step (position {pos1[-1]:.0f} after {sum(calls1)} optimizer "
                      "step(s) with K=1): the schedule runs that much faster than planned",
                      ["Call scheduler.step() exactly once per optimizer step: look for a second call (a callback, a "
                       "helper, or the epoch loop also stepping it).", after_opt])
    if calls1 != callsk:
        per = [c for c in callsk if c]
        metrics["see_also"] = "loop.accumulation"  # named in the summary by diagnose only when it reports the defect
        return result(Status.WARN,
                      f"cannot compare the schedule per optimizer step: optimizer.step() ran {sum(callsk)} times with K={k} but "
                      f"{sum(calls1)} with K=1 over {len(batches)} step(s), so the step does not run the optimizer once per "
                      f"call{' (once per micro-batch?)' if per and max(per) == k else ''}",
                      [f"Call optimizer.step() once per call of the step function, after the backward of the last of the "
                       f"{k} micro-batches; then rerun this check.", after_opt])
    note = steps_per_call_note(calls1 + callsk)
    if note is not None:
        metrics.update(optimizer_steps_per_call=int(max(calls1 + callsk)), see_also="loop.accumulation")
        return result(Status.WARN, f"cannot compare the schedule per optimizer step: {note}",
                      ["Call optimizer.step() exactly once per call of step(ctx, micro_batches); then rerun this check."])
    if hand_set and not same_lr:
        first_diff = next((i for i in range(n) if not np.allclose(lr1[i], lrk[i], rtol=1e-6, atol=0)), n)
        metrics.update(first_differing_step=first_diff + 1, per_micro_batch_confirmed=bool(faster))
        where = (f"at optimizer step {first_diff + 1} the learning rate is {lr1[first_diff, 0]:.3g} with K=1 but "
                 f"{lrk[first_diff, 0]:.3g} with K={k}" if first_diff < n else "the runs made different numbers of steps")
        cause = (f"{where}; the K={k} learning rates are the K=1 schedule read every {k} steps, so the counter that sets the "
                 "learning rate (e.g. ctx.it) advances per micro-batch, not per optimizer step" if faster
                 else f"{where} (the hand-set learning rate depends on how the batch is split)")
        return latent_when_unused(setup, result(
            Status.FAIL, f"the hand-set learning-rate schedule depends on accumulation: {cause}",
            ["Advance the iteration counter that sets the learning rate once per optimizer step (after optimizer.step()), "
             "not once per micro-batch; a warm-up of W steps otherwise ends after W/K optimizer steps."]))
    if not (same_lr and same_pos):
        per_micro = bool(faster) or (pos1[-1] > 0 and abs(posk[-1] / pos1[-1] - k) < 0.5)
        metrics["per_micro_batch_confirmed"] = bool(faster)
        times = f"{k}" if faster or not pos1[-1] > 0 else f"{posk[-1] / pos1[-1]:.0f}"
        cause = (f"it advances {times}× faster with K={k}: the scheduler is stepped per micro-batch" if per_micro
                 else f"the learning rates differ between K=1 and K={k} (positions {pos1[-1]:.0f} vs {posk[-1]:.0f} after {len(batches)} step{'' if len(batches) == 1 else 's'})")
        return latent_when_unused(setup, result(
            Status.FAIL, f"the schedule depends on accumulation: {cause}",
            ["Call scheduler.step() once per optimizer step (after optimizer.step()), not once per micro-batch; "
             "a warm-up of W steps otherwise ends after W/K optimizer steps."]))
    # Stepped before optimizer.step(): the first update already uses the schedule's second learning rate.
    early = next(((d, used, planned) for d, used, planned in one["early"]
                  if (has_position and d > 0) or not math.isclose(used, planned, rel_tol=1e-9)), None)
    if early is not None and not plateau and not hand_set:  # a hand-set LR is written before the step on purpose
        d, used, planned = early
        metrics.update(lr_at_optimizer_step=float(used), lr_planned=float(planned))
        return result(Status.WARN,
                      f"the scheduler is stepped before optimizer.step(): the optimizer steps with learning rate {used:.3g} where the "
                      f"schedule's value for that step is {planned:.3g}, so every update uses the next step's learning rate "
                      "(the schedule's first value is skipped)",
                      [f"Move ctx.scheduler.step() after optimizer.step() (PyTorch's order since 1.1). {after_opt}"])
    if hand_set:
        return result(Status.PASS, f"the hand-set learning rate advances once per optimizer step: same learning rates with "
                                   f"K=1 and K={k} over {len(batches)} optimizer steps")
    return result(Status.PASS,
                  f"the schedule advances once per optimizer step: same learning rates and positions with K=1 and K={k}")
