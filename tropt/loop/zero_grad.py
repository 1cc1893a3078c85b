"""``loop.zero_grad``: are gradients cleared once per optimizer step?

Step t's gradient at ``optimizer.step()`` is compared with the gradient of the same step rerun from the same state
with every gradient cleared first: a leak from earlier steps (a missing or misplaced ``zero_grad``) shows as the
difference, and is named when it equals the gradient the previous step left behind.
"""

from __future__ import annotations

import torch

from ..core.capture import PARAMETER_CHANGE, TrainingState, observed_at, run_steps
from ..core.compare import compare_tensors, global_rel_error, nonfinite_tensors
from ..core.modes import quiet_randomness
from ..core.optimizer_params import FrozenOptimizer, frozen_optimizer
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ._invariance_common import STANDARD_STEP_ADVICE, norm_of
from ._verdicts import defer_multi_step, nonfinite_result, require_steps, tolerance_for


@register(
    "loop.zero_grad",
    title="Gradients cleared every step",
    description="step t's gradient equals the gradient of the same step rerun from the same state with gradients "
                "cleared",
    plot="tropt.plots.loop",
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
        leftover = {n: (None if p.grad is None else p.grad.detach().float().clone())
                    for n, p in ctx.model.named_parameters()}
        rec_a, calls_a = run_steps(setup, ctx, [steps[-1]])
        state.restore()
        for p in ctx.model.parameters():
            p.grad = None
        rec_b, calls_b = run_steps(setup, ctx, [steps[-1]])
        frozen = frozen_optimizer(ctx.model, ctx.optimizer)
    require_steps(setup, calls_a + calls_b, f"step {t}")
    result = _zero_grad_verdict(t, tol, earlier, rec_a, rec_b, leftover, frozen)
    return defer_multi_step(result, calls + calls_a + calls_b)


def _zero_grad_verdict(t: int, tol: float, earlier: list, rec_a: list, rec_b: list, leftover: dict,
                       frozen: FrozenOptimizer | None = None) -> CheckResult:
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
    leftover_norm = norm_of(leftover)
    metrics = {"t": t, "max_rel_error": worst, "global_rel_error": global_rel_error(a, b), "tolerance": tol,
               "grad_norm_step_t": norm_of(a), "grad_norm_fresh": norm_of(b),
               "leftover_grad_norm_before_step_t": leftover_norm,
               "observed_at": where}
    tables = {"parameters": table}
    if norm_of(a) == 0.0 and norm_of(b) == 0.0 and frozen is not None and not by_hand:
        # Not a misplaced zero_grad: the optimizer was built over frozen parameters, which never get a gradient.
        metrics.update(frozen.metrics())
        return CheckResult("loop.zero_grad", Status.FAIL,
                           f"no gradient reaches optimizer.step(): {frozen.sentence()}", metrics,
                           {"optimizer_parameters": frozen.table, **tables}, [frozen.advice])
    if norm_of(a) == 0.0 and norm_of(b) == 0.0:
        return CheckResult(
            "loop.zero_grad", Status.FAIL,
            "the step changes no parameter: every gradient is zero or None when it updates" if by_hand else
            "no gradient reaches optimizer.step(): every gradient is zero or None when the optimizer steps",
            metrics, tables,
            advice=["Call optimizer.zero_grad() after optimizer.step() (or before the first backward of the next "
                    "step), never between backward() and step().", STANDARD_STEP_ADVICE])
    if worst <= tol:
        return CheckResult("loop.zero_grad", Status.PASS,
                           f"step {t}'s {what} equals a fresh one (max relative error {worst:.1e} ≤ {tol:.0e})",
                           metrics, tables)
    # Evidence: is the extra exactly what the earlier step left behind?
    summed = {n: (b[n] if b.get(n) is not None else 0) + (leftover[n] if leftover.get(n) is not None else 0)
              for n in b}
    expected = {n: (v if isinstance(v, torch.Tensor) else None) for n, v in summed.items()}
    explained = global_rel_error(a, expected) <= max(tol, 1e-4) if leftover_norm > 0 and not by_hand else False
    metrics["leak_equals_leftover_gradient"] = bool(explained)
    last = earlier[-1].grads if earlier else {}
    metrics["previous_step_grad_norm"] = norm_of(last)
    why = ("it equals the fresh gradient plus the gradient left over from step " f"{t - 1}" if explained
           else "gradients from earlier steps leak into it")
    return CheckResult(
        "loop.zero_grad", Status.FAIL,
        f"step {t}'s {what} differs from a fresh one by {worst:.1%} (max over parameters): {why}",
        metrics, tables,
        advice=["Call optimizer.zero_grad(set_to_none=True) once per optimizer step: right after optimizer.step() "
                "(or before the first backward of the next step).", STANDARD_STEP_ADVICE])
