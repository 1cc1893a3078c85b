"""``loop.accumulation`` for a stochastic step: the noise floor, and the comparison in expectation (issue 27 §1-2).

Before comparing, the 1-micro-batch run is repeated on another RNG stream (:mod:`tropt.core.noise_floor`). A zero
floor keeps the exact comparison. Otherwise R repeats of each configuration (1 micro-batch, K equal micro-batches, K
unequal ones) are compared by their means against the spread between repeats. A cause is named only when its
prediction matches within that spread and the alternatives do not: a scale (``c·loss_fn`` over the whole batch, fitted
with its uncertainty), gradients cleared inside the micro-batch loop (exact within one run), extra optimizer steps.
Otherwise "differs by X% in expectation; cause not isolated". The objects the step keeps on ctx (an EMA model) are
compared between the runs too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from ..core.compare import compare_tensors
from ..core.noise_floor import (
    FIX_ADVICE,
    MORE_REPEATS,
    REPEATS,
    Expectation,
    Fit,
    Repeats,
    floor_between,
    floor_note,
    in_expectation,
    scale_fit,
)
from ..result import CheckResult, Status
from ._accumulation_runs import Plan, steps_per_call_result
from ._batch_dependence import buffer_names
from ._confirm import confirm_in_expectation, confirm_last_only_in_expectation
from ._invariance_common import STANDARD_STEP_ADVICE
from ._micro_sizes import train_batch_sizes, unequal_sizes
from ._stochastic import nondeterministic_kernels, object_differences, per_micro_batch_update
from ._verdicts import latent_when_unused
from .accumulation_causes import ZERO_INSIDE, Run, _divided_twice, _summed, from_factors, loss_grads, update_side_cause

_ID = "loop.accumulation"
_B, _U, _REF = 1000, 2000, 3000  # stream blocks: each configuration draws from its own streams


def floor_of(plan: Plan) -> float:
    """The noise floor: the 1-micro-batch run on stream 0 against the same run on stream 1 (spied on, to name what
    is random). 0.0 for a deterministic step."""
    a0 = plan.one(plan.batch, False, stream=0)
    a1 = plan.one(plan.batch, False, stream=1, spy=True)
    floor = max(floor_between(a0.pre, a1.pre), floor_between(a0.post, a1.post))
    return floor if math.isfinite(floor) else 0.0


def with_floor(result: CheckResult, floor: float, sources: list[str] | None = None) -> CheckResult:
    """The result with ``metrics["noise_floor"]``: how exact the comparison was (0.0: exact); and the functional
    dropout that was switched off to make it so (``functional_dropout_off``), when the floor's rerun saw some."""
    off = [s for s in sources or [] if s.startswith("functional dropout")]
    extra = {"functional_dropout_off": "; ".join(off)} if off else {}
    return dataclasses.replace(result, metrics={**result.metrics, "noise_floor": float(floor), **extra})


def objects_result(plan: Plan, a: Run, b: Run, metrics: dict, tables: dict, steady: dict | None = None,
                   again: Callable[[], tuple[Run, Run]] | None = None) -> CheckResult | None:
    """FAIL when an object the step keeps on ctx (an EMA model) ends in another state with K micro-batches than
    with one, although the gradients match: it is updated per micro-batch, not per optimizer step. ``again`` gives
    the two runs over two steps, tried when one step shows no difference (an EMA updated before optimizer.step()
    follows unchanged parameters in step 1)."""
    # An object that mirrors the model's buffers (timm's ModelEmaV2 copies BatchNorm's num_batches_tracked, which
    # counts forwards, so K micro-batches count K) follows the model there: those entries are not the object's own.
    buffers = tuple(n for n, _ in plan.setup.model.named_buffers())

    def own(x: Run, y: Run) -> list[dict]:
        return [r for r in object_differences(x.objects, y.objects, plan.tol, steady)
                if not any(r["entry"] == n or r["entry"].endswith("." + n) for n in buffers)]

    rows, second = own(a, b), False
    if not rows and again is not None and a.objects:
        rows = own(*again())
        second = bool(rows)
        if second:
            metrics = {**metrics, "ctx_objects_compared_after_steps": 2}
    if not rows:
        return None
    k = plan.k
    table = pd.DataFrame(rows).sort_values("rel_difference", ascending=False, kind="stable").reset_index(drop=True)
    names = ", ".join(f"ctx.{n}" for n in dict.fromkeys(table["object"]))
    counted = per_micro_batch_update(rows, k)
    if second:
        # Equal after one step and different after two, with the same gradients and parameters in both runs: its
        # updates in step 1 all saw the same parameters, so only their number differs, and it shows once the
        # parameters have moved. No other update rule that runs once per optimizer step gives that pattern.
        worst = max(rows, key=lambda r: r["rel_difference"])
        cause = (f"{names} is updated once per micro-batch, not once per optimizer step (before optimizer.step(): "
                 f"equal after step 1, where its {k} updates all see the same parameters; after step 2 its "
                 f"{worst['entry']} differs by {worst['rel_difference']:.1%})")
        tag = "object_updated_per_micro_batch"
    elif counted:
        c = counted[0]
        cause = (f"{names} is updated once per micro-batch, not once per optimizer step: its {c['entry']} is "
                 f"{c['value_kx']:g} after one step of {k} micro-batches and {c['value_1x']:g} with 1")
        tag = "object_updated_per_micro_batch"
    elif steady is not None:
        # Judged in expectation, the two configurations' parameters differ by the step's own noise, and an object
        # that follows them (an EMA) differs with them: only an update count is evidence here, not the values.
        metrics["ctx_objects_compared"] = "update counts only (the step is stochastic)"
        return None
    else:
        cause = (f"{names} ends in a different state with {k} micro-batches than with 1 ({len(table)} entr"
                 f"{'y' if len(table) == 1 else 'ies'}, worst {table['entry'][0]} by {table['rel_difference'][0]:.1%})"
                 "; cause not isolated")
        tag = "object_state_differs"
    # A difference no update count explains is a WARN, like every loop check's "cause not isolated" (issue 27).
    status = Status.WARN if tag == "object_state_differs" else Status.FAIL
    return latent_when_unused(plan.setup, CheckResult(
        _ID, status,
        f"the gradients match, but {cause}",
        {**metrics, "cause": tag, "ctx_objects_differing": names}, {**tables, "ctx_objects": table},
        [f"Update {names} once per optimizer step, after optimizer.step() (under accelerate: only when "
         "accelerator.sync_gradients is True), not inside the micro-batch loop.", STANDARD_STEP_ADVICE]))


def _mean(runs: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for name in runs[0]:
        vals = [r.get(name) for r in runs]
        out[name] = None if any(v is None for v in vals) else torch.stack([torch.as_tensor(v) for v in vals]).mean(0)
    return out


class _Configs:
    """The repeats of each configuration, grown from R to more when the first R leave the verdict ambiguous."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.micro = plan, plan.setup.split(plan.even_batch, plan.k)
        self.a: list[Run] = []
        self.b: list[Run] = []

    def grow(self, r: int, freeze: Any = False) -> None:
        p = self.plan
        self.a += [p.one(p.even_batch, freeze, stream=s) for s in range(len(self.a), r)]
        self.b += [p.many(self.micro, freeze, stream=_B + s) for s in range(len(self.b), r)]

    def compare(self) -> tuple[Expectation, Expectation]:
        return (in_expectation(Repeats.of([x.pre for x in self.a]), Repeats.of([x.pre for x in self.b])),
                in_expectation(Repeats.of([x.post for x in self.a]), Repeats.of([x.post for x in self.b])))

    def judged(self, freeze: Any = False) -> tuple[Expectation, Expectation]:
        self.grow(REPEATS, freeze)
        pre, post = self.compare()
        if (pre.ambiguous or post.ambiguous) and len(self.a) < MORE_REPEATS:
            self.grow(MORE_REPEATS, freeze)
            pre, post = self.compare()
        return pre, post

    def table(self) -> pd.DataFrame:
        return compare_tensors(_mean([x.post for x in self.a]), _mean([x.post for x in self.b]),
                               labels=("1x_mean", f"{self.plan.k}x_mean"))


def in_expectation_result(plan: Plan, floor: float) -> CheckResult:
    """The verdict for a step whose floor is not zero: equal split, then unequal, judged on means of repeats."""
    setup, k = plan.setup, plan.k
    sources = nondeterministic_kernels(plan.sources)
    c = _Configs(plan)
    pre, post = c.judged()
    a, b = c.a[0], c.b[0]
    metrics: dict[str, Any] = {
        "k": k, "batch_size": plan.n, "tolerance": plan.tol, "judged": "in expectation", "repeats": len(c.a),
        "expectation_rel_diff": pre.rel_diff, "expectation_z": pre.z, "expectation_rel_diff_at_step": post.rel_diff,
        "expectation_z_at_step": post.z, "expectation_scale": pre.scale, "expectation_scale_z": pre.scale_z,
        "expectation_z_limit": pre.limit, "max_rel_error": post.rel_diff, "pre_clip_max_rel_error": pre.rel_diff,
        "optimizer_steps_in_k_run": b.calls, "stochastic_sources": "; ".join(sources),
        "batch_dependent_layers": len(plan.bn_layers), "observed_at": f"{a.where} (and before clipping), means of "
                                                                       f"{len(c.a)} repeats"}
    tables = {"parameters": c.table()}
    if a.calls > 1:
        return steps_per_call_result(a.calls, metrics, tables, a.inner_loop)
    if (bad := plan.broken(a, b, metrics, tables)) is not None:
        return bad
    if any(x.calls > 1 for x in c.b):
        calls = max(x.calls for x in c.b)
        return latent_when_unused(setup, CheckResult(
            _ID, Status.FAIL, f"optimizer.step() ran {calls} times for one step of {k} micro-batches",
            {**metrics, "cause": "step_per_micro_batch", "optimizer_steps_per_call": calls}, tables,
            [f"Call optimizer.step() once per {k} micro-batches, after the last backward.",
             "Clear gradients only after that step, not per micro-batch.", STANDARD_STEP_ADVICE]))
    if pre.inside and post.inside:
        objects = objects_result(plan, a, b, metrics, tables, steady=c.a[1].objects if len(c.a) > 1 else None)
        return objects if objects is not None else _uneven(plan, c, floor, sources, pre, metrics, tables)
    if pre.inside:  # the losses are right in expectation; what reaches the step is not
        cause, advice, tag = update_side_cause(setup, b, k, plan.close)  # exact within one run
        if tag == ZERO_INSIDE:
            conf = confirm_last_only_in_expectation([x.post for x in c.a], [x.pre for x in c.a],
                                                    [x.pre for x in c.b])
            metrics.update(conf.metrics())
            if conf.confirmed:
                return _fail(plan, post, f"{cause}; {conf.sentence()}", advice, tag, metrics, tables)
            metrics["closest_cause"] = tag
            return _not_isolated(plan, post, floor, sources, metrics, tables, "at optimizer.step()",
                                 f"closest explanation: {cause}; {conf.sentence()}")
        return _not_isolated(plan, post, floor, sources, metrics, tables, "at optimizer.step()")
    return _loss_side(plan, c, pre, floor, sources, metrics, tables)


def _loss_side(plan: Plan, c: _Configs, pre: Expectation, floor: float, sources: list[str], metrics: dict,
               tables: dict) -> CheckResult:
    """The means differ before clipping: batch-dependent layers or state first, then a scale that explains it."""
    setup, k = plan.setup, plan.k
    if plan.buffers or plan.bn_layers:
        frozen = _Configs(plan)
        fpre, fpost = frozen.judged(plan.freeze)
        metrics.update(frozen_expectation_rel_diff=fpre.rel_diff, frozen_expectation_z=fpre.z)
        if fpre.inside and fpost.inside:
            what = ("BatchNorm's batch statistics" if not plan.buffers else
                    f"the buffers the forward updates ({buffer_names(plan.buffers)})")
            return CheckResult(_ID, Status.WARN,
                               f"equal in expectation once {what} are frozen; live, the means of {len(c.a)} repeats "
                               f"of {k} micro-batches differ by {pre.rel_diff:.1%} ({pre.z:.1f} standard errors): "
                               f"{what} depend on the micro-batch, by design; {floor_note(floor, fpre, sources)}",
                               metrics, tables,
                               [f"Expect accumulation over {k} micro-batches to differ from one big batch: {what} "
                                "see each micro-batch alone. If that matters, use GroupNorm/LayerNorm or larger "
                                "micro-batches.", FIX_ADVICE])
        c = frozen
    ref = Repeats.of([loss_grads(setup, [plan.even_batch], [1.0], plan.freeze if c is not None and
                                 (plan.buffers or plan.bn_layers) else False, stream=_REF + s)
                      for s in range(len(c.a))])
    fa, fb = scale_fit(Repeats.of([x.pre for x in c.a]), ref), scale_fit(Repeats.of([x.pre for x in c.b]), ref)
    metrics.update(reference_factor_1x=fa.c, reference_factor_1x_sigma=fa.sigma, reference_factor_kx=fb.c,
                   reference_factor_kx_sigma=fb.sigma, reference_residual_z_kx=fb.residual_z)
    named = _scale_cause(fa, fb, k, metrics)
    if named is not None:
        conf = confirm_in_expectation(named[2], [x.pre for x in c.a], [x.pre for x in c.b], k, metrics)
        if conf is None:
            return _fail(plan, pre, *named, metrics, tables)
        metrics.update(conf.metrics())
        if conf.confirmed:
            return _fail(plan, pre, f"{named[0]}; {conf.sentence()}", named[1], named[2], metrics, tables)
        metrics["closest_cause"] = named[2]
        return _not_isolated(plan, pre, floor, sources, metrics, tables, "before clipping",
                             f"closest explanation: {named[0]}; {conf.sentence()}")
    cause, advice, tag = update_side_cause(setup, c.b[0], k, plan.close)
    if tag == ZERO_INSIDE:
        return _fail(plan, pre, cause, advice, tag, metrics, tables)
    return _not_isolated(plan, pre, floor, sources, metrics, tables, "before clipping")


def _scale_cause(fa: Fit, fb: Fit, k: int, facts: dict) -> tuple[str, list[str], str] | None:
    """A scale that explains both runs against loss_fn over the whole batch, within the fits' uncertainty, and that
    excludes the right factor 1: a sum, a double division, a constant divisor. None when none is isolated."""
    if not fb.fits or not fb.excludes(1.0) or not math.isfinite(fa.c) or fa.c <= 0:
        return None
    if fa.matches(1.0):
        if fb.matches(k) and fb.excludes(1 / k):
            return (*_summed(k), "summed")
        if fb.matches(1 / k):
            return (*_divided_twice(k), "divided_twice")
        cause, advice, tag = from_factors(1.0, fb.c, k, facts)
        return cause, advice, tag or "scaled"
    d = round(1 / fa.c)
    if d >= 2 and fa.matches(1 / d) and fa.excludes(1.0) and fb.matches(k / d):
        cause, advice, tag = from_factors(1 / d, k / d, k, facts)
        return cause, advice, tag or "scaled"
    return None


def _fail(plan: Plan, e: Expectation, cause: str, advice: list[str], tag: str, metrics: dict,
          tables: dict) -> CheckResult:
    setup, k = plan.setup, plan.k
    metrics["cause"] = tag
    result = CheckResult(_ID, Status.FAIL,
                         f"{k} micro-batches change the mean gradient by {e.rel_diff:.1%} (means of {e.repeats} "
                         f"repeats of this stochastic step: {e.scale:.2f}× along the 1-micro-batch mean, "
                         f"{max(e.scale_z, e.z):.1f} standard errors outside the spread between repeats): {cause}",
                         metrics, tables, [*advice, STANDARD_STEP_ADVICE])
    d = metrics.get("constant_divisor")
    if tag == "constant_divisor" and setup.accumulation_steps > 1 and d == setup.accumulation_steps:
        return dataclasses.replace(result, status=Status.WARN, metrics={**metrics, "latent": True},
                                   summary=f"latent (correct at the configured K={d}): {cause}")
    return latent_when_unused(setup, result)


def _not_isolated(plan: Plan, e: Expectation, floor: float, sources: list[str], metrics: dict, tables: dict,
                  where: str, why: str = "no scale, lost micro-batch or extra update explains it") -> CheckResult:
    metrics["cause"] = "not_isolated"
    return latent_when_unused(plan.setup, CheckResult(
        _ID, Status.WARN,
        f"{plan.k} micro-batches change the mean gradient {where} by {e.rel_diff:.1%} ({e.z:.1f} standard errors "
        f"outside the spread between {e.repeats} repeats; noise floor {floor:.1%}); cause not isolated: {why}",
        metrics, tables,
        ["Make each micro-batch contribute its share of the full-batch loss (weight it by its share of the step's "
         "samples) and call backward() on every micro-batch before one optimizer step.", FIX_ADVICE,
         STANDARD_STEP_ADVICE]))


def _uneven(plan: Plan, c: _Configs, floor: float, sources: list[str], pre: Expectation, metrics: dict,
            tables: dict) -> CheckResult:
    """The equal split is right in expectation: unequal micro-batch sizes (the artificial split), in expectation."""
    p, k, r = plan, plan.k, len(c.a)
    full = c.a if p.n_even == p.n else [p.one(p.batch, False, stream=s) for s in range(r)]
    ub = [p.many(p.uneven_micro, False, stream=_U + s) for s in range(r)]
    u = in_expectation(Repeats.of([x.pre for x in full]), Repeats.of([x.pre for x in ub]))
    sizes = "+".join(map(str, p.uneven_sizes))
    metrics.update(uneven_sizes=sizes, uneven_split="artificial", uneven_expectation_rel_diff=u.rel_diff,
                   uneven_expectation_z=u.z)
    if u.inside:
        return CheckResult(_ID, Status.PASS,
                           f"{k} micro-batches (equal, and unequal {sizes}) give the full-batch gradient in "
                           f"expectation: {floor_note(floor, pre, sources)}", metrics, tables)
    what = (f"equal in expectation for equal micro-batches, but unequal sizes (an artificial {sizes} split) change "
            f"the mean gradient by {u.rel_diff:.1%} ({u.z:.1f} standard errors)")
    advice = ["Weight each micro-batch loss by its share of the step's samples (n_i / n) instead of dividing by K, "
              "or make every micro-batch the same size (drop_last=True).", STANDARD_STEP_ADVICE]
    acc, batch_sizes = p.setup.accumulation_steps, train_batch_sizes(p.setup)
    if acc == 1 or (batch_sizes is not None and not unequal_sizes(batch_sizes, acc)):
        why = ("it does not accumulate" if acc == 1 else
               f"every batch ({', '.join(map(str, sorted(set(batch_sizes or []))))} samples) splits into {acc} equal "
               "micro-batches")
        return CheckResult(_ID, Status.PASS, f"right in expectation for the micro-batches this Setup produces ({why}); "
                           f"latent: {what}", {**metrics, "latent": True}, tables,
                           ["Nothing to fix for this data. Before feeding batches whose size is not a multiple of K:",
                            *advice])
    return CheckResult(_ID, Status.WARN, what, metrics, tables, advice)
