"""``loop.zero_grad``: are gradients cleared once per optimizer step?

Step t's gradient at ``optimizer.step()`` is compared with the gradient of the same step rerun from the same state
with every gradient cleared first: a leak from earlier steps (a missing or misplaced ``zero_grad``) shows as the
difference, and is named when it equals the gradient the previous step left behind. With several optimizers (a
GAN's discriminator and generator) each one's update is compared on its own, in the order they step: the first one
that differs is the finding, named with the parameters it holds; a later one that differs may only follow from it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd
import torch

from ..core.capture import PARAMETER_CHANGE, StepRecord, TrainingState, observed_at, run_steps
from ..core.compare import compare_tensors, global_rel_error, nonfinite_tensors
from ..core.modes import quiet_randomness
from ..core.optimizer_params import FrozenOptimizer, frozen_optimizer
from ..core.own_hooks import dense
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ._invariance_common import STANDARD_STEP_ADVICE, norm_of
from ._stochastic import QuietFunctionalDropout
from ._verdicts import defer_multi_step, nonfinite_result, require_steps, tolerance_for
from ._zero_grad_floor import LEAK_FIX, Rerun, judge_in_expectation, measure_floor

CHECK = "loop.zero_grad"


@register(
    CHECK,
    title="Gradients cleared every step",
    description="step t's gradient equals the gradient of the same step rerun from the same state with gradients "
                "cleared",
    plot="tropt.plots.loop",
)
def check_zero_grad(setup: Setup, *, t: int = 2, tol: float | None = None, progress: bool = True) -> CheckResult:
    """FAIL when gradients of earlier steps leak into step ``t`` (missing or misplaced ``zero_grad``).

    Runs ``t - 1`` steps, snapshots the full training state, runs step ``t`` (run A), restores the snapshot,
    clears every gradient and reruns step ``t`` (run B). Both must reach every ``optimizer.step()`` with the same
    gradients (each optimizer's judged on its own). Also FAIL when no gradient at all reaches ``optimizer.step()``
    (``zero_grad`` between backward and step).
    """
    if t < 2:
        raise TroptError(f"check_zero_grad needs t >= 2 (got {t}): a leak needs an earlier step", "use t=2")
    setup.validate()
    tol = tolerance_for(setup, tol)
    k = setup.accumulation_steps
    with preserved(setup.model), QuietFunctionalDropout():
        ctx = setup.build()
        quiet_randomness(ctx.model)
        steps = [setup.split(b, k) for b in setup.batches(t)]
        earlier, calls = run_steps(setup, ctx, steps[:-1])
        require_steps(setup, calls, f"the first {t - 1} step(s)")
        # The step's own attributes on ctx (counters, hidden state) too, and the state it carries on the model, on
        # objects on ctx and in its closure: step t reruns from the same hidden state (core/carried_state.py).
        state = TrainingState(ctx, setup.step)
        rerun = Rerun(setup, ctx, state, steps[-1])  # keeps the leftover gradients for run A's repeats
        leftover = {n: (None if p.grad is None else dense(p.grad.detach()).float().clone())
                    for n, p in ctx.model.named_parameters()}
        rec_a, calls_a = run_steps(setup, ctx, [steps[-1]])
        carried = state.carried.changed()
        state.restore()  # every optimizer of ctx.optimizers and its scheduler too
        for p in ctx.model.parameters():
            p.grad = None
        rec_b, calls_b = run_steps(setup, ctx, [steps[-1]])
        floor = measure_floor(rerun, rec_b, tol)
        judged = (judge_in_expectation(t, tol, rerun, leftover, floor,
                                       observed_at(rec_a + rec_b) == PARAMETER_CHANGE)
                  if floor.in_expectation else None)
        frozen = frozen_optimizer(ctx.model, ctx.optimizer)
        held = _held_parameters(ctx)
    require_steps(setup, calls_a + calls_b, f"step {t}")
    result = judged or _zero_grad_verdict(t, tol, earlier, rec_a, rec_b, leftover, frozen, held)
    result.metrics.update(floor.metrics(tol))
    if carried:  # restored before the rerun, so not the leak; named so a reader sees what was carried
        result.metrics["carried_state"] = ", ".join(carried)
    if state.carried.attached:
        result = _attached_cause(result, state.carried.attached, t)
        result.metrics["carried_state_attached"] = (
            f"{', '.join(state.carried.attached)} still held step {t - 1}'s autograd graph when step {t} began (not "
            "detached): a step that computes from it backpropagates into earlier steps; detach it between batches "
            "(hidden = hidden.detach(), repackage_hidden)")
    return defer_multi_step(result, calls + calls_a + calls_b)


def _attached_cause(result: CheckResult, attached: list[str], t: int) -> CheckResult:
    """A difference the leftover gradient does not explain, with carried state that still held the previous step's
    graph when step ``t`` began: that state is the cause the summary names (a step computing from it backpropagates
    into earlier steps). Any other result is returned as it is."""
    if result.status is not Status.WARN or result.metrics.get("leak_equals_leftover_gradient") is not False:
        return result
    names = ", ".join(attached)
    state = f"the hidden state {names} is" if len(attached) == 1 else f"the carried states {names} are"
    summary = (f"{state} not detached between steps (it held step {t - 1}'s autograd graph when step {t} began): "
               + result.summary.replace("; cause not isolated: ", "; "))
    advice = [f"Detach {names} between batches (hidden = hidden.detach(), repackage_hidden in pytorch/examples): "
              f"step {t}'s backward reaches into step {t - 1}'s graph, so its update depends on the earlier steps; "
              "backward(retain_graph=True) only hides the error PyTorch raises for it.", *result.advice]
    return dataclasses.replace(result, summary=summary, advice=advice)


def _held_parameters(ctx: Any) -> dict[str, list[str]]:
    """Optimizer name -> the names of the model parameters it holds (every optimizer: the Setup's and the step's)."""
    from ..core.capture import stepping_optimizers

    names = {id(p): n for n, p in ctx.model.named_parameters()}
    return {name: list(dict.fromkeys(names[id(p)] for o in stepping_optimizers(opt) for g in o.param_groups
                                     for p in g["params"] if id(p) in names))
            for name, opt in ctx.all_optimizers()}


def _pairs(rec_a: list[StepRecord], rec_b: list[StepRecord],
           several: bool = False) -> list[tuple[str, StepRecord, StepRecord]]:
    """Run A's and run B's updates paired in step order: (label, A's record, B's record). The label is the
    optimizer's name ("" for a single optimizer or a hand-written update)."""
    several = several or len({r.optimizer for r in rec_a + rec_b}) > 1
    seen: dict[str, int] = {}
    out = []
    for ra, rb in zip(rec_a, rec_b):
        i = seen[ra.optimizer] = seen.get(ra.optimizer, -1) + 1
        label = (ra.optimizer + (f" (update {i + 1})" if i else "")) if several else ""
        out.append((label, ra, rb))
    return out


def _owner(names: list[str]) -> str:
    """The parameters an optimizer holds, as their top-level modules (``netD.*``) when they share few of them."""
    tops = list(dict.fromkeys(n.split(".", 1)[0] for n in names))
    if len(tops) <= 3 and all("." in n for n in names):
        return ", ".join(f"{t}.*" for t in tops)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _zero_grad_verdict(t: int, tol: float, earlier: list, rec_a: list, rec_b: list, leftover: dict,
                       frozen: FrozenOptimizer | None = None, held: dict[str, list[str]] | None = None) -> CheckResult:
    pairs = _pairs(rec_a, rec_b, len(held or {}) > 1)
    # NaN against NaN is no match: a loss that went non-finite is the finding, whatever the zero_grad placement.
    earlier_bad = next(((i + 1, r.grads) for i, r in enumerate(earlier) if nonfinite_tensors(r.grads)), None)
    for _, ra, rb in pairs:
        bad = nonfinite_result(CHECK, {"straight": earlier_bad or (t, ra.grads), "fresh": (t, rb.grads)})
        if bad is not None:
            return bad
    where = observed_at(rec_a + rec_b)
    by_hand = where == PARAMETER_CHANGE
    what = "update (parameter change)" if by_hand else "gradient"
    rows, tables = [], {}
    for label, ra, rb in pairs:
        table = compare_tensors(ra.grads, rb.grads, labels=("step_t", "fresh"))
        rows.append({"optimizer": label or "optimizer", "max_rel_error": float(table["rel_error"].max()),
                     "global_rel_error": global_rel_error(ra.grads, rb.grads), "grad_norm_step_t": norm_of(ra.grads),
                     "grad_norm_fresh": norm_of(rb.grads),
                     **_explained(ra.grads, rb.grads, leftover, tol, by_hand, rb.pre_clip)})
        tables[f"parameters ({label})" if label else "parameters"] = table
    first_bad = next((i for i, r in enumerate(rows) if r["max_rel_error"] > tol), None)
    shown = rows[first_bad if first_bad is not None else 0]
    metrics: dict[str, Any] = {
        "t": t, "max_rel_error": max(r["max_rel_error"] for r in rows),
        "global_rel_error": shown["global_rel_error"], "tolerance": tol,
        "grad_norm_step_t": sum(r["grad_norm_step_t"] ** 2 for r in rows) ** 0.5,
        "grad_norm_fresh": sum(r["grad_norm_fresh"] ** 2 for r in rows) ** 0.5,
        "leftover_grad_norm_before_step_t": norm_of(leftover), "observed_at": where}
    if len(rows) > 1:
        metrics["optimizers"] = len({r.optimizer for r in rec_a})
        tables = {"optimizers": pd.DataFrame(rows), **tables}
    if metrics["grad_norm_step_t"] == 0.0 and metrics["grad_norm_fresh"] == 0.0:
        return _no_gradient(metrics, tables, frozen if not by_hand else None, by_hand)
    if first_bad is None:
        return CheckResult(CHECK, Status.PASS,
                           f"step {t}'s {what} equals a fresh one"
                           + (f" for each of the {metrics['optimizers']} optimizers" if len(rows) > 1 else "")
                           + f" (max relative error {metrics['max_rel_error']:.1e} ≤ {tol:.0e})", metrics, tables)
    label = pairs[first_bad][0]
    explained = shown["leak_equals_leftover_gradient"]
    metrics["leak_equals_leftover_gradient"] = bool(explained)
    metrics["previous_step_grad_norm"] = norm_of(earlier[-1].grads) if earlier else 0.0
    worst = shown["max_rel_error"]
    whose = _whose(pairs[first_bad][1], rows[first_bad + 1:], tol, held, metrics) if label else ""
    if explained:
        factor = shown["leftover_factor"]
        times = "" if abs(factor - 1.0) <= 1e-3 else f" times {factor:.3g}"
        if shown["leak_clipped_together"]:
            times += f", clipped together with it (the clip scaled their sum by {shown['clip_factor']:.3g})"
        why = (f"it equals the fresh update plus the gradient left over from step {t - 1}{times} (the update "
               "applies the leftover gradient)" if by_hand else
               f"it equals the fresh gradient plus the gradient left over from step {t - 1}{times}")
        if label:
            fix = (f"Clear the gradients {pairs[first_bad][1].optimizer} steps with before its backward, in every "
                   f"step: {pairs[first_bad][1].optimizer}.zero_grad(set_to_none=True) (or the zero_grad() of the "
                   "module holding its parameters, e.g. netD.zero_grad() first in the discriminator's update).")
        else:
            fix = LEAK_FIX
        advice = [fix, STANDARD_STEP_ADVICE]
        summary = f"step {t}'s {what} differs from a fresh one by {worst:.1%} (max over parameters){whose}: {why}"
        return CheckResult(CHECK, Status.FAIL, summary, metrics, tables, advice)
    # Not the leftover gradient: something else the step carries from call to call (state the checks do not
    # snapshot, a recurrent state on the model or in a closure) changes step t. Say what was seen, not a cause.
    summary = (f"step {t}'s {what} differs from a fresh one by {worst:.1%} (max over parameters){whose}; cause not "
               f"isolated: the difference is not the gradient left over from step {t - 1}")
    return CheckResult(CHECK, Status.WARN, summary, metrics, tables, [
        "Rerunning the same step from the same state with gradients cleared changed it, but not by the leftover "
        "gradient: look for state the step carries outside ctx (a hidden state kept on the model or in a closure, "
        "a counter in a global) and keep it on ctx (ctx.hidden = ...) so checks can restore it.",
        "If gradients are meant to accumulate across calls, call optimizer.zero_grad(set_to_none=True) once per "
        "optimizer step: right after optimizer.step().", STANDARD_STEP_ADVICE])


def _whose(record: StepRecord, later_rows: list[dict], tol: float, held: dict[str, list[str]] | None,
           metrics: dict[str, Any]) -> str:
    """Where the first difference shows, with several optimizers: the optimizer, the parameters it holds, and the
    later updates that differ too (they may only follow from it)."""
    name = record.optimizer
    metrics["optimizer"] = name
    params = (held or {}).get(name, [n for n, g in record.grads.items() if g is not None])
    whose = f" at {name}.step() (it holds {_owner(params)})"
    later = [r["optimizer"] for r in later_rows if r["max_rel_error"] > tol]
    if later:
        whose += (f"; the later update{'s' if len(later) > 1 else ''} of {', '.join(later)} differ"
                  f"{'' if len(later) > 1 else 's'} too, which may follow from this one")
    return whose


def _explained(a: dict, b: dict, leftover: dict, tol: float, by_hand: bool,
               raw_b: dict | None = None) -> dict[str, Any]:
    """Whether step t's gradient ``a`` is explained by the gradient left over before step t (for the parameters
    ``a`` holds), against the fresh rerun ``b``. Two predictions are tested, each with one least-squares factor:
    ``a = b + f * leftover`` (a plain leak; f = 1, or another factor when the step rescales the accumulated
    gradient; f < 0 for a hand-written update ``p -= lr * grad``), and ``a = c * (raw_b + leftover)`` with
    ``raw_b`` the fresh gradient before clipping (a leak the step's clip then scales together with the fresh
    gradient). Returns the verdict, the factor and which prediction matched."""
    out: dict[str, Any] = {"leak_equals_leftover_gradient": False, "leftover_factor": float("nan"),
                           "leak_clipped_together": False}
    names = [n for n in b if a.get(n) is not None and b.get(n) is not None and a[n].shape == b[n].shape]
    covered = len(names) == sum(1 for n in b if b.get(n) is not None or a.get(n) is not None)
    if not names or not covered:
        return out
    zero = {n: torch.zeros_like(b[n]) for n in names}  # type: ignore[arg-type]
    left = {n: leftover[n] if leftover.get(n) is not None and leftover[n].shape == b[n].shape  # type: ignore
            else zero[n] for n in names}
    full = {n: a[n] for n in names}
    err = max(tol, 1e-4)

    def fit(x: dict, y: dict) -> float:  # the factor f minimising ||x - f y||
        yy = sum(float((y[n].double() * y[n].double()).sum()) for n in names)
        return sum(float((x[n].double() * y[n].double()).sum()) for n in names) / yy if yy else float("nan")

    diff = {n: a[n] - b[n] for n in names}  # type: ignore[operator]
    f = fit(diff, left)
    if f == f and (f < 0 if by_hand else f > 0):
        ok = global_rel_error(full, {n: b[n] + f * left[n] for n in names}) <= err  # type: ignore[operator]
        out.update(leak_equals_leftover_gradient=bool(ok), leftover_factor=f)
        if ok:
            return out
    if by_hand or not raw_b or any(raw_b.get(n) is None or raw_b[n].shape != b[n].shape for n in names):
        return out
    summed = {n: raw_b[n] + left[n] for n in names}  # type: ignore[operator]
    c = fit(full, summed)
    if c == c and 0 < c <= 1 + err and global_rel_error(full, {n: c * summed[n] for n in names}) <= err:
        out.update(leak_equals_leftover_gradient=True, leftover_factor=1.0, leak_clipped_together=True,
                   clip_factor=c)
    return out


def _no_gradient(metrics: dict, tables: dict, frozen: FrozenOptimizer | None, by_hand: bool) -> CheckResult:
    if frozen is not None:
        # Not a misplaced zero_grad: the optimizer was built over frozen parameters, which never get a gradient.
        metrics.update(frozen.metrics())
        return CheckResult(CHECK, Status.FAIL, f"no gradient reaches optimizer.step(): {frozen.sentence()}", metrics,
                           {"optimizer_parameters": frozen.table, **tables}, [frozen.advice])
    return CheckResult(
        CHECK, Status.FAIL,
        "the step changes no parameter: every gradient is zero or None when it updates" if by_hand else
        "no gradient reaches optimizer.step(): every gradient is zero or None when the optimizer steps",
        metrics, tables,
        advice=["Call optimizer.zero_grad() after optimizer.step() (or before the first backward of the next "
                "step), never between backward() and step().", STANDARD_STEP_ADVICE])
