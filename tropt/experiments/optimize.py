"""``tropt.optimize``: diagnose, stop on correctness FAILs, suggest, compare under the budget, decide, plan."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import TroptError
from .budget import Budget, Guardrails
from .plan import OptimizationPlan, _baseline, _budget_exceeded
from .suggest import suggest

if TYPE_CHECKING:
    from ..setup import Setup


def optimize(
    setup: Setup,
    *,
    splits: Mapping[str, Any] | None = None,
    label: str | int | None = None,
    budget: Budget,
    group: str | None = None,
    time: str | None = None,
    guardrails: Guardrails | None = None,
    seeds: Iterable[int] = (0, 1, 2),
    executor: Any = None,
    tracking: Any = None,
    candidates: Mapping[str, Mapping[str, Any]] | None = None,
    checks: Any = None,
    report: Any = None,
    progress: bool = True,
    threads: int | str | None = None,
    **compare_kwargs: Any,
) -> OptimizationPlan:
    """The whole workflow in one call: diagnose, then either the blocking fixes or a compared, decided plan.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`; never modified.
    splits, label, group, time
        Data splits and their columns for the data checks, as in :func:`tropt.diagnose`.
    budget
        :class:`tropt.Budget` for every run of the comparison. A budget the baseline alone exceeds (its measured time
        per step × steps over ``Budget.seconds`` or the guardrail's limit) escalates before any comparison.
    guardrails, seeds, executor, tracking
        As in :func:`tropt.compare`.
    candidates
        Extra candidates of your own, compared alongside the suggested ones.
    checks
        Restrict the diagnosis (as in :func:`tropt.diagnose`); default every check that applies.
    report
        A diagnosis already made of this Setup (skips diagnosing again).
    threads
        torch intra-op threads for the diagnosis and every run of the comparison: one policy for both
        (:func:`tropt.budgets.tropt_threads`; None takes the cores other work leaves idle).
    compare_kwargs
        Passed to :func:`tropt.compare` (``eval_every``, ``early_stopping``, ``metric``, ``reinit``, ...).

    Returns
    -------
    OptimizationPlan
        ``plan.outcome`` is "blocked", "escalate", "adopt", "keep the baseline" or "not compared"; ``plan.comparison``
        holds the comparison when one ran, ``plan.report`` the diagnosis.
    """
    from ..diagnosis import diagnose
    from ..setup import Setup
    from .orchestration import compare

    if not isinstance(setup, Setup):
        raise TroptError(f"optimize: setup is a {type(setup).__name__}, expected a tropt.Setup",
                         "pass tropt.Setup(model, loss_fn, optimizer, train_data, val_data)")
    if not isinstance(budget, Budget):
        raise TroptError(f"optimize: budget is a {type(budget).__name__}, expected a tropt.Budget",
                         "pass budget=tropt.Budget(steps=300); the budget is stated, never guessed")
    g = guardrails if guardrails is not None else Guardrails()
    if not isinstance(g, Guardrails):
        raise TroptError(f"optimize: guardrails is a {type(g).__name__}", "pass tropt.Guardrails(...) or None")
    rep = report if report is not None else diagnose(setup, splits, label=label, group=group, time=time, checks=checks,
                                                     progress=progress, threads=threads)
    sugg = suggest(rep, setup)
    plan_args: dict[str, Any] = dict(budget=budget, guardrails=g, suggestions=sugg)
    if sugg.blocking:  # a leak or a broken update is not repaired by another optimizer: nothing is compared
        return _attach(OptimizationPlan.from_report(rep, **plan_args), rep, None)
    if _budget_exceeded(_baseline(rep, None, budget), None, budget, g):
        return _attach(OptimizationPlan.from_report(rep, **plan_args), rep, None)
    cands = {**sugg, **(candidates or {})}
    if not cands:
        return _attach(OptimizationPlan.from_report(rep, **plan_args), rep, None)
    comp = compare(setup, cands, budget=budget, seeds=seeds, guardrails=g, executor=executor, tracking=tracking,
                   progress=progress, threads=threads, **compare_kwargs)
    comp.meta["suggestions"] = {n: s.to_dict() for n, s in sugg.details.items()}
    return _attach(OptimizationPlan.from_report(rep, comp, **plan_args), rep, comp)


def _attach(plan: OptimizationPlan, report: Any, comparison: Any) -> OptimizationPlan:
    """Keep the diagnosis and the comparison on the plan (not serialised: they have their own JSON)."""
    plan.report = report  # type: ignore[attr-defined]
    plan.comparison = comparison  # type: ignore[attr-defined]
    return plan
