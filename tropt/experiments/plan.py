"""``OptimizationPlan``: from findings (and a comparison) to a decision a person can act on.

The plan holds the baseline, the bottlenecks worst first, the prioritised interventions (blocking correctness fixes
first, then compared candidates by verdict and gain on the selection metric, then hypotheses never compared), the
adopted changes and the stop / escalate conditions. Time and cost are reported beside the gain, never ranked by.
Values only: it renders as Markdown, standalone HTML and JSON.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import TroptError
from ..result import Report, Status, read_json, write_json
from .budget import Budget, Guardrails
from .candidates import BASELINE
from .interventions import (
    NOT_COMPARED,
    blocking_fix,
    combination_notes,
    compared_candidate,
    finite,
    fmt,
    hypothesis,
    priority,
)
from .provenance import refuse_mixed_setups, rerun_record
from .stats import ADOPT, ESCALATE, MIN_SEEDS
from .suggest import CORRECTNESS, FindingsError, blocking_findings, load_report, suggest

if TYPE_CHECKING:
    from ..setup import Setup

FORMAT = "tropt.plan/1"
BLOCKED, ESCALATED, ADOPTED, KEEP, UNCOMPARED = "blocked", "escalate", "adopt", "keep the baseline", "not compared"
FIELDS = ("outcome", "baseline", "bottlenecks", "interventions", "adopted", "stop_conditions", "escalate_conditions",
          "identity")
INTERVENTION_FIELDS = ("priority", "kind", "name", "finding", "hypothesis", "changed", "acceptance", "budget",
                       "identity", "observed", "limitations", "rollback")
_STAGE = {"data": 1, "model": 2, "loop": 4, "dynamics": 5, "perf": 6}


def _order_key(r: Any) -> tuple:
    """FAIL by stage, then ERROR, then WARN (each by stage): the worst first; a symptom of a broken step after the
    root cause it follows from (:func:`tropt.verdict.rank_stage`)."""
    from ..verdict import rank_stage

    rank = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2}[r.status]
    correctness = 0 if r.check.startswith(CORRECTNESS) else 1
    stage, symptom = rank_stage(r)
    return (rank, correctness, _STAGE.get(r.check.split(".")[0], 9) if stage == 99 else stage, symptom)


@dataclass
class OptimizationPlan:
    """The optimization plan: see the module docstring. Build it with :meth:`from_report` or :func:`tropt.optimize`.

    Every list field that is empty has its reason in ``why_empty[field]``.
    """

    outcome: str
    baseline: dict[str, Any]
    bottlenecks: list[dict[str, Any]]
    interventions: list[dict[str, Any]]
    adopted: list[dict[str, Any]]
    stop_conditions: list[str]
    escalate_conditions: list[str]
    identity: dict[str, Any]
    why_empty: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    outcome_reason: str = ""
    warnings: list[dict[str, Any]] = field(default_factory=list)  # WARN findings: judgement calls, not bottlenecks
    costs: list[dict[str, Any]] = field(default_factory=list)  # cost and quality per candidate (experiments.costs)
    metric: str = "the selection metric"
    higher_is_better: bool = False
    rerun: dict[str, Any] = field(default_factory=dict)  # seeds, budget, rules, scores: experiments.provenance
    # set by tropt.optimize (not serialised: each has its own JSON, findings.json and comparison.json)
    report = None
    comparison = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_report(cls, report: Any, comparison: Any = None, *, budget: Budget | None = None,
                    guardrails: Guardrails | None = None, suggestions: Any = None,
                    setup: Setup | None = None) -> OptimizationPlan:
        """The plan from a diagnosis (a Report or findings.json) and, when it ran, the :class:`Comparison`.

        ``budget`` defaults to the comparison's; ``guardrails`` to the comparison's (else the defaults).
        ``suggestions`` (from :func:`tropt.suggest`) supplies the hypotheses; by default they are derived again.
        """
        from .comparison import Comparison

        rep = load_report(report)
        if comparison is not None and not isinstance(comparison, Comparison):
            if isinstance(comparison, (str, dict)):
                comparison = (Comparison.from_dict(comparison) if isinstance(comparison, dict)
                              else Comparison.from_json(comparison))
            else:
                raise TroptError(f"OptimizationPlan: comparison is a {type(comparison).__name__}",
                                 "pass the Comparison tropt.compare returned, its to_dict(), or a comparison.json path")
        if budget is None and comparison is not None and comparison.meta.get("budget"):
            budget = Budget(**comparison.meta["budget"])
        if budget is not None and not isinstance(budget, Budget):
            raise TroptError(f"OptimizationPlan: budget is a {type(budget).__name__}",
                             "pass tropt.Budget(steps=300) or None")
        if guardrails is None:
            guardrails = comparison.guardrails if comparison is not None else Guardrails()
        if not isinstance(guardrails, Guardrails):
            raise TroptError(f"OptimizationPlan: guardrails is a {type(guardrails).__name__}",
                             "pass tropt.Guardrails(...) or None")
        sugg = suggestions if suggestions is not None else suggest(rep, setup)
        return _build(rep, comparison, budget, guardrails, sugg)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        from ..result import json_safe

        d = {k: getattr(self, k) for k in FIELDS}
        d.update(why_empty=self.why_empty, notes=self.notes, outcome_reason=self.outcome_reason,
                 warnings=self.warnings, costs=self.costs, metric=self.metric, higher_is_better=self.higher_is_better,
                 rerun=self.rerun)
        return {"format": FORMAT, **json_safe(d)}

    def to_json(self, path: Any = None) -> str:
        return write_json(self.to_dict(), path, indent=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OptimizationPlan:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TroptError("not a tropt plan "
                             f"(format {d.get('format') if isinstance(d, dict) else type(d).__name__!r})",
                             f"pass what OptimizationPlan.to_dict() wrote (format {FORMAT!r})")
        return cls(**{k: d[k] for k in FIELDS}, why_empty=d.get("why_empty", {}), notes=d.get("notes", []),
                   outcome_reason=d.get("outcome_reason", ""), warnings=d.get("warnings", []),
                   costs=d.get("costs", []), metric=d.get("metric", "the selection metric"),
                   higher_is_better=bool(d.get("higher_is_better", False)), rerun=d.get("rerun", {}))

    @classmethod
    def from_json(cls, text_or_path: str) -> OptimizationPlan:
        return cls.from_dict(read_json(text_or_path))

    # ------------------------------------------------------------------ rendering
    @property
    def escalates(self) -> bool:
        """True when the plan ends in "escalate" (the CLI exits 1)."""
        return self.outcome == ESCALATED

    def to_markdown(self) -> str:
        """The plan as Markdown; every piece of user text is escaped."""
        from .plan_render import markdown

        return markdown(self)

    def _repr_html_(self) -> str:
        from .plan_render import html_body

        return html_body(self)

    def to_html(self, path: Any = None, title: str = "tropt optimization plan") -> str:
        """A standalone, offline HTML page (no external resources); also written to ``path`` when given."""
        from ..result import REPORT_CSS

        page = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
                f"<style>{REPORT_CSS}</style></head><body>{self._repr_html_()}</body></html>")
        if path is not None:
            from ..output import write_text_atomic

            write_text_atomic(path, page)
        return page

    def __repr__(self) -> str:
        return f"OptimizationPlan({self.outcome}: {len(self.interventions)} interventions, {len(self.adopted)} adopted)"


# ---------------------------------------------------------------------------------------------- building
def _build(rep: Report, comp: Any, budget: Budget | None, g: Guardrails, sugg: Any) -> OptimizationPlan:
    blocking = blocking_findings(rep)
    why: dict[str, str] = {}
    notes: list[str] = []
    baseline = _baseline(rep, comp, budget)
    found = [{"check": r.check, "status": r.status.value, "summary": r.summary, "fix": r.advice[0] if r.advice else ""}
             for r in sorted((r for r in rep if r.status in (Status.FAIL, Status.ERROR, Status.WARN)), key=_order_key)]
    bottlenecks = [b for b in found if b["status"] != Status.WARN.value]  # a WARN needs judgement: not a bottleneck
    warnings = [b for b in found if b["status"] == Status.WARN.value]
    if not bottlenecks:
        why["bottlenecks"] = (f"none: no check failed ({len(warnings)} WARN{'s' if len(warnings) != 1 else ''}, "
                              "listed under Warnings)" if warnings
                              else f"none: all {len(rep)} checks passed or were skipped")
    identity = {k: rep.identity.get(k)
                for k in ("tropt", "torch", "device", "seed", "config_hash", "data_fingerprint", "git_commit")
                if rep.identity.get(k) is not None} or {"note": "the findings carry no run identity"}
    if comp is not None:
        identity.update(comparison_id=comp.meta.get("comparison_id"), seeds=comp.meta.get("seeds"))
        refuse_mixed_setups(rep.identity, comp.meta.get("identity") or {})
    over = _budget_exceeded(baseline, comp, budget, g)
    errored = [r.check for r in rep if r.status is Status.ERROR and r.check.startswith(CORRECTNESS)]
    if errored:
        notes.append(f"{', '.join(errored)} could not run (ERROR): their correctness is unknown, so a comparison's "
                     "result holds only if they would pass; fix what stopped them and diagnose again")

    interventions: list[dict[str, Any]] = [blocking_fix(r, rep) for r in blocking]
    if blocking and comp is not None:
        notes.append("a comparison was given, but correctness FAILs block it: its results are not used")
        comp = None
    interventions += _compared_and_hypotheses(comp, g, budget, sugg, bool(blocking))
    for i, iv in enumerate(interventions, 1):
        iv["priority"] = i
    if not interventions:
        why["interventions"] = ("none: no finding suggests a change tropt can test (no LR range outside the Setup's "
                                "LR, no faster precision, no data-bound or compute-bound step, no unstable or "
                                "overfitting curve); the baseline stands")
    adopted = [iv for iv in interventions if iv.get("verdict") == ADOPT][:1]
    others = [iv["name"] for iv in interventions if iv.get("verdict") == ADOPT][1:]
    if others and comp is not None:
        notes += combination_notes(adopted[0]["name"], others, comp.meta.get("candidates", {}), comp.metric)
    if blocking:
        outcome, reason = BLOCKED, (f"{len(blocking)} correctness FAIL{'s' if len(blocking) > 1 else ''} "
                                    f"({', '.join(r.check for r in blocking)}) block every comparison: fix "
                                    f"{'them' if len(blocking) > 1 else 'it'} first, then diagnose again. "
                                    "No comparison was run.")
        why["adopted"] = "none: correctness FAILs block every comparison until fixed"
    elif over:
        outcome, reason = ESCALATED, over
        why["adopted"] = "none: the budget is not met, so no candidate could be judged at it"
    elif comp is not None and any(iv.get("verdict") == ESCALATE for iv in interventions):
        names = [iv["name"] for iv in interventions if iv.get("verdict") == ESCALATE]
        outcome, reason = ESCALATED, (f"{', '.join(names)} did not meet the budget (escalate: budget); "
                                      "see their observed results")
        if not adopted:
            why["adopted"] = "none: escalated candidates are not adopted until they meet the budget"
    elif adopted:
        outcome, reason = ADOPTED, f"adopt {adopted[0]['name']}: {adopted[0]['observed']}"
    elif comp is not None:
        outcome, reason = KEEP, ("no candidate beat the baseline inside the guardrails (a paired 95% interval "
                                 "above min_effect, Holm-adjusted p < 0.05): keep the baseline")
        why["adopted"] = "none: no candidate was adopted (see each intervention's observed result)"
    else:
        outcome, reason = UNCOMPARED, "no comparison was run: every intervention is a hypothesis until compared"
        why["adopted"] = "none: nothing was compared, and a change is a hypothesis until compared"
    if outcome == ESCALATED and adopted:
        adopted = []
        why["adopted"] = "none: the plan escalates, so nothing is adopted until the budget is settled"
    from .costs import cost_rows

    plan = OptimizationPlan(outcome, baseline, bottlenecks, interventions,
                            [{k: a[k] for k in ("name", "changed", "observed", "rollback")} for a in adopted],
                            _stop_conditions(g, comp), _escalate_conditions(g, budget), identity, why, notes, reason,
                            warnings, cost_rows(comp, g) if comp is not None else [],
                            comp.metric if comp is not None else "the selection metric",
                            comp.higher_is_better if comp is not None else False)
    plan.rerun = rerun_record(comp, adopted[0]["name"] if adopted else None) if comp is not None else {}
    return plan


def _compared_and_hypotheses(comp: Any, g: Guardrails, budget: Budget | None, sugg: Any,
                             blocked: bool) -> list[dict[str, Any]]:
    """The compared candidates (by priority) and, unless correctness FAILs block, the suggestions never compared."""
    out: list[dict[str, Any]] = []
    details = dict(getattr(sugg, "details", {}) or {})
    if comp is not None:  # a comparison that tropt.optimize ran carries the hypotheses behind its candidates
        from .suggest import Suggestion

        for n, d in (comp.meta.get("suggestions") or {}).items():
            details.setdefault(n, Suggestion(**{**d, "overrides": {}}))
    compared: set[str] = set()
    if comp is not None:
        rows = comp.decision(g)
        table = comp.to_frame(g)
        items = [compared_candidate(r, table, comp, g, budget, details.get(r["candidate"]))
                 for r in rows.to_dict("records")]
        items.sort(key=priority)
        out += items
        compared = {r["candidate"] for r in rows.to_dict("records")}
    if not blocked:
        for name, s in details.items():
            if name not in compared:
                out.append(hypothesis(s, budget, g, "not compared yet: run tropt.compare (or tropt.optimize) on it"))
        for s in getattr(sugg, "hypotheses", []):
            out.append(hypothesis(s, budget, g, s.why_not_compared))
    return out


def _baseline(rep: Report, comp: Any, budget: Budget | None) -> dict[str, Any]:
    from .speed import step_seconds

    out: dict[str, Any] = {}
    thr = rep["perf.throughput"] if "perf.throughput" in rep else None  # noqa: SIM401 - Report has no .get()
    curve = rep["dynamics.loss_curve"] if "dynamics.loss_curve" in rep else None  # noqa: SIM401 - Report has no .get()
    base_runs = comp._runs_of(BASELINE) if comp is not None else []  # the selection seeds (not the confirmation)
    tm = thr.metrics if thr is not None and thr.status in (Status.PASS, Status.WARN) else {}
    if finite(tm.get("step_ms")):
        out["runtime_per_step_ms"] = float(tm["step_ms"])
    elif base_runs and any(finite(step_seconds(r)) for r in base_runs):  # measured inside each run, training only
        per = [step_seconds(r) for r in base_runs if finite(step_seconds(r))]
        out["runtime_per_step_ms"] = 1e3 * sum(per) / len(per)
    else:
        out["runtime_per_step_ms"] = "not measured: perf.throughput did not run and no comparison was given"
    if finite(tm.get("samples_per_s")):
        out["samples_per_s"] = float(tm["samples_per_s"])
    elif base_runs:
        v = [r["samples_per_s"] for r in base_runs if finite(r.get("samples_per_s"))]
        out["samples_per_s"] = sum(v) / len(v) if v else "not measured: every baseline run failed"
    else:
        out["samples_per_s"] = "not measured: perf.throughput did not run and no comparison was given"
    run_s = None
    if base_runs:
        run_s = sum(r["seconds"] for r in base_runs) / len(base_runs)
        out["seconds_per_run"] = run_s
    elif budget is not None and budget.steps and finite(out.get("runtime_per_step_ms")):
        run_s = budget.steps * out["runtime_per_step_ms"] / 1e3
        out["seconds_per_run"] = f"≈{run_s:.3g} (estimated: {budget.steps} steps × {out['runtime_per_step_ms']:.3g} ms)"
    if budget is not None and budget.cost_per_hour is not None and run_s is not None:
        out["cost_per_run"] = budget.cost(run_s)
    else:
        out["cost"] = ("not priced: give Budget(cost_per_hour=...)" if budget is None or budget.cost_per_hour is None
                       else "not priced: no runtime measured")
    if curve is not None and curve.status is not Status.SKIP and curve.metrics.get("class"):
        out["convergence_class"] = str(curve.metrics.get("classes") or curve.metrics["class"])
    else:
        out["convergence_class"] = "not measured: dynamics.loss_curve did not run"
    if comp is not None and base_runs:
        s = [r["score"] for r in base_runs if r["status"] == "ok" and finite(r.get("score"))]
        if s:
            mean = sum(s) / len(s)
            sd = (sum((x - mean) ** 2 for x in s) / (len(s) - 1)) ** 0.5 if len(s) > 1 else math.nan
            out["final_metric"] = f"{comp.metric} {mean:.4g} ± {fmt(sd)} over {len(s)} seeds"
        else:
            out["final_metric"] = "not measured: every baseline run failed"
    elif curve is not None and finite(curve.metrics.get("val_end_loss")):
        out["final_metric"] = (f"val loss {curve.metrics['val_end_loss']:.4g} at the end of the "
                               f"{curve.metrics.get('steps_run', '?')}-step probe")
    elif curve is not None and finite(curve.metrics.get("end_loss")):
        out["final_metric"] = (f"train loss {curve.metrics['end_loss']:.4g} at the end of the probe "
                               "(no validation split)")
    else:
        out["final_metric"] = "not measured: no comparison and no loss-curve probe"
    if budget is not None:
        out["budget"] = ", ".join(f"{k}={v}" for k, v in budget.to_dict().items() if v is not None)
    if comp is not None:
        from .fairness import basis_text

        out["compared_at"] = basis_text(comp.compared_at, comp.meta.get("budget") or {})
    return out


def _budget_exceeded(baseline: dict, comp: Any, budget: Budget | None, g: Guardrails) -> str:
    """Why the baseline alone exceeds the budget (with the numbers), or ''."""
    if comp is not None:
        capped = [r for r in comp.records if r["candidate"] == BASELINE and r.get("stopped_by") == "seconds"]
        if capped:
            r = capped[0]
            want = ", ".join(f"{k}={v}" for k, v in (comp.meta.get("budget") or {}).items() if v is not None)
            return (f"the baseline alone exceeds the budget: {len(capped)} of its runs hit the seconds cap "
                    f"(seed {r['seed']} stopped after {r['steps']} steps, {r['samples']} samples, "
                    f"{r['seconds']:.3g} s) before the budget ({want}): raise Budget(seconds=...), lower "
                    "steps/samples, or make the step faster first")
    step_ms = baseline.get("runtime_per_step_ms")
    if budget is None or not finite(step_ms) or not budget.steps:
        return ""
    need = budget.steps * step_ms / 1e3
    for limit, what in ((budget.seconds, "Budget(seconds=...)"), (g.max_seconds, "the guardrail's per-run limit")):
        if limit is not None and need > limit:
            return (f"the baseline alone exceeds the budget: {budget.steps} steps × {step_ms:.3g} ms per step "
                    f"(perf.throughput) ≈ {need:.3g} s per run, above {what} of {limit:.3g} s: raise the limit to at "
                    f"least {need * 1.2:.3g} s, lower the steps to {max(1, int(limit * 1e3 / step_ms / 1.2))}, or make "
                    "the step faster first")
    return ""


def _stop_conditions(g: Guardrails, comp: Any) -> list[str]:
    metric = comp.metric if comp is not None else "the selection metric"
    return [
        "stop before any comparison when a correctness check (data.*, model.*, loop.*) FAILs: fix it and diagnose "
        "again",
        f"reject (quality) a candidate when the whole paired 95% interval of its change in {metric} lies beyond a "
        f"drop of {fmt(g.max_quality_drop)}{' of the baseline' if g.relative else ''} (non-inferiority; Holm-adjusted "
        "p < 0.05 across the candidates)",
        f"reject (instability) a candidate with more than {g.max_instability_increase} unstable runs (non-finite, "
        "spiking or diverging) beyond the baseline's, even when it is faster",
        f"call it inconclusive, never a winner, when fewer than {MIN_SEEDS} seeds pair, the Holm-adjusted p is not "
        f"below 0.05, or the interval's lower bound does not clear min_effect {g.describe_min_effect()}",
    ]


def _escalate_conditions(g: Guardrails, budget: Budget | None) -> list[str]:
    out = ["escalate when the baseline alone exceeds the budget (its measured time per step × the steps is over the "
           "limit)",
           "escalate (budget) when a run hits Budget(seconds=...) before its steps/samples: the comparison is not at "
           "the stated budget"]
    if g.max_seconds is not None:
        out.append(f"escalate (budget) a candidate whose runs take longer than {fmt(g.max_seconds)} s on average")
    if budget is not None and budget.cost_per_hour is not None:
        out.append(f"report cost at {fmt(budget.cost_per_hour)} per hour; escalate when the adopted change costs more "
                   "per run than the baseline without a quality gain")
    return out


__all__ = ["NOT_COMPARED", "FindingsError", "OptimizationPlan"]
