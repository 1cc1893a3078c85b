"""The interventions of an :class:`~tropt.experiments.plan.OptimizationPlan`, one dict each: a blocking correctness
fix, a compared candidate (with its acceptance test, limitations and rollback) or a hypothesis never compared; and
the few formatters the plan's text uses.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from ..result import Report
from .budget import Budget, Guardrails
from .stats import ADOPT, ESCALATE, INCONCLUSIVE, MIN_SEEDS

NOT_COMPARED = "hypothesis — not yet compared"
YOURS = "your candidate"


def fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "n/a"


def finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def show(v: Any) -> str:
    if isinstance(v, float):
        return fmt(v)
    if isinstance(v, dict):
        return "; ".join(f"{k}={show(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "; ".join(show(x) for x in v)
    return str(v)


def blocking_fix(r: Any, rep: Report) -> dict[str, Any]:
    # the configuration hash and data fingerprint are the plan's run identity: stated once, not per intervention
    ident = ({"run identity": "the plan's (config_hash, data_fingerprint, git_commit)",
              **({"seed": rep.identity["seed"]} if rep.identity.get("seed") is not None else {})}
             if rep.identity.get("config_hash") or rep.identity.get("data_fingerprint") else {})
    evidence = ""
    for name, df in r.tables.items():
        if len(df):
            evidence = f"{name}: {len(df)} rows, e.g. " + "; ".join(
                ", ".join(f"{c}={show(v)}" for c, v in row.items()) for row in df.head(3).to_dict("records"))
            break
    return {
        "kind": "blocking fix", "name": f"fix {r.check}", "finding": r.check, "verdict": "blocking",
        "hypothesis": (f"a symptom of the broken step {r.metrics['symptom_of']} isolates, not a tuning choice: "
                       f"{r.summary}" if isinstance(r.metrics.get("symptom_of"), str)
                       else f"a correctness defect, not a tuning choice: {r.summary}"),
        "changed": r.advice[0] if r.advice else "the code or data the finding points at",
        "fix": r.advice[0] if r.advice else "see the check's documentation",
        "evidence": evidence or r.summary,
        "acceptance": f"{r.check} passes when tropt diagnose runs again (no FAIL), and no other check newly fails",
        "budget": "one diagnosis run; no training comparison until it passes",
        "identity": ident or "the findings carry no run identity",
        "observed": f"FAIL: {r.summary}" + (f" Evidence: {evidence}" if evidence else ""),
        "limitations": "the finding is as strong as the check's evidence; a fix can uncover the next defect, so "
                       "diagnose again",
        "rollback": "none: a correctness fix is kept; when it changes the metrics, re-measure the baseline before "
                    "comparing anything",
    }


def acceptance(metric: str, g: Guardrails, goal: str = "quality") -> str:
    from .speed import SPEEDUP

    if goal == "speed":
        return (f"seconds per step ≥ {SPEEDUP:g}× faster than the baseline's, paired over the same seeds and beyond "
                f"timing noise (the time ratio's 95% interval below 1), with {metric} non-inferior: the gain's paired "
                f"95% interval above minus the larger of the allowed drop ({fmt(g.max_quality_drop)}"
                f"{' relative' if g.relative else ''}) and min_effect ({g.describe_min_effect()}); unstable runs ≤ the "
                f"baseline's + {g.max_instability_increase}; never for a candidate that changes only lr or scheduler "
                "(the same compute)")
    parts = [f"{metric} better than the baseline: the paired 95% interval of the gain above min_effect "
             f"{g.describe_min_effect()}, with the paired t-test's Holm-adjusted p < 0.05 across the comparison's "
             f"candidates (≥ {MIN_SEEDS} seeds)",
             f"not rejected for quality: the whole interval beyond a drop of {fmt(g.max_quality_drop)}"
             f"{' (relative)' if g.relative else ''} rejects it",
             f"unstable runs ≤ the baseline's + {g.max_instability_increase}"]
    if g.max_seconds is not None:
        parts.append(f"≤ {fmt(g.max_seconds)} s per run")
    return "; ".join(parts)


def budget_text(budget: Budget | None, comp: Any = None) -> str:
    if budget is None:
        return "not set: give budget=tropt.Budget(steps=...) to compare it"
    text = ", ".join(f"{k}={v}" for k, v in budget.to_dict().items() if v is not None)
    if comp is not None:
        seeds = comp.meta.get("seeds", [])
        text += f" per run × {len(seeds)} seeds {seeds}, the same for the baseline"
    return text


def compared_candidate(row: dict, table: Any, comp: Any, g: Guardrails, budget: Budget | None,
                       s: Any) -> dict[str, Any]:
    name = row["candidate"]
    over = comp.meta.get("candidates", {}).get(name, {})
    changed = (s.changed if s is not None else None) or [f"{k}={v}" for k, v in over.items()] or ["(no overrides)"]
    what = ", ".join(f"{k}={v}" for k, v in over.items()) or "no overrides"
    hyp = (s.hypothesis if s is not None
           else f"changing {what} beats the baseline on {comp.metric} at {comp.compared_at} (your candidate, "
                "compared as given)")
    finding = s.finding if s is not None else YOURS
    seeds = comp.meta.get("seeds", [])
    # the configuration hash and data fingerprint are the plan's run identity: stated once, not per intervention
    ident = {"candidate": f"{name}: {what}", "seeds": seeds, "comparison_id": comp.meta.get("comparison_id"),
             "run identity": "the plan's (config_hash, data_fingerprint, git_commit)"}
    own = ((comp.meta.get("candidate_identities") or {}).get(name) or {}).get("config_hash")
    if own:  # the candidate's own configuration (its overrides' code and values), not the baseline's
        ident["candidate_config_hash"] = own
    conf = comp.meta.get("confirmation") or {}
    if conf.get("candidate") == name:
        ident["confirmation_seeds"] = conf.get("seeds")
    noise, n = row.get("noise"), row.get("seeds")
    lim = [f"{n} paired seeds (the baseline's spread between seeds {fmt(noise)}; the decision reads the paired "
           "differences, which the pairing frees of that spread)",
           f"budget {budget_text(budget)}: a longer run can rank candidates differently"]
    if isinstance(n, int) and n < MIN_SEEDS:
        lim.append(f"fewer than {MIN_SEEDS} seeds cannot tell a difference from noise")
    if "cpu" in str((comp.meta.get("identity") or {}).get("device", "cpu")):
        lim.append("CPU timings shift with machine load: compare times within one comparison only")
    lim += [n_ for n_ in comp.notes if "test" in n_]
    allowed = g.allowed_drop(row["baseline_mean"]) if finite(row.get("baseline_mean")) else g.max_quality_drop
    tol = max(allowed, noise if finite(noise) else 0.0)
    worse = "below" if comp.higher_is_better else "above"
    slow = row["baseline_seconds"] * 1.5 if finite(row.get("baseline_seconds")) else math.nan
    rollback = (f"revert to the baseline if, in use, {comp.metric} goes {worse} the baseline's "
                f"{fmt(row['baseline_mean'])} by more than {fmt(tol)} (the larger of seed noise and the guardrail), if "
                f"non-finite or spiking losses appear, or if a run takes longer than {fmt(slow)} s (1.5× the baseline)")
    secs = row.get("seconds")
    goal = getattr(s, "goal", "quality")
    verdict, observed = row["verdict"], f"{row['verdict']}: {row['reason']}"
    if verdict == ADOPT and row.get("adopted_for") == "speed":
        goal = "speed"
        observed = f"adopt (speed): {row['speedup']:.2f}× the baseline's speed per step — {row['reason']}"
    if goal == "speed":
        lim.append("the speed is read from the seconds per step measured inside each run, paired by seed; machine "
                   "load moves it, so it counts only beyond timing noise")
    return {
        "kind": "compared candidate", "name": name, "finding": finding, "verdict": verdict,
        "hypothesis": hyp, "changed": changed, "acceptance": acceptance(comp.metric, g, goal),
        "budget": budget_text(budget, comp), "identity": ident,
        "observed": observed, "limitations": lim, "rollback": rollback,
        # cost is its own objective, reported beside the gain and never folded into it
        "gain": row.get("gain"), "seconds": secs, "cost_per_run": row.get("cost_per_run"),
    }


VERDICT_ORDER = {ADOPT: 0, INCONCLUSIVE: 1, ESCALATE: 2}


def priority(iv: dict) -> tuple:
    """Adopted first, then inconclusive, escalated, rejected; within each, by the gain on the selection metric
    (largest first). Time and cost never rank: at the same compute, timing noise must not pick the winner, so equal
    gains keep the order the candidates were given in (a stable sort)."""
    gain = iv.get("gain")
    return (VERDICT_ORDER.get(iv["verdict"], 3), -(gain if finite(gain) else -math.inf))


# Overrides that set the same thing: two candidates changing one of them are alternatives, never a combination
# (an optimizer comes with its own learning rate; batch_size re-batches train_data; use_scaler belongs to precision).
KNOBS = {"lr": "learning rate", "optimizer": "learning rate", "precision": "precision", "use_scaler": "precision",
         "train_data": "training data", "batch_size": "training data"}


def knobs(overrides: Any) -> set[str]:
    """The knobs a candidate's overrides turn (see :data:`KNOBS`; any other keyword is its own knob)."""
    return {KNOBS.get(k, k) for k in (overrides or {})}


def combination_notes(winner: str, others: list[str], overrides: dict[str, Any], metric: str) -> list[str]:
    """What to compare next when several candidates beat the baseline and only ``winner`` is adopted: the
    combination with those that turn other knobs; none with those that turn the same knob (alternatives)."""
    mine = knobs(overrides.get(winner))
    apart = [o for o in others if not knobs(overrides.get(o)) & mine]
    same = [o for o in others if o not in apart]
    notes = []
    if apart:
        notes.append(f"{', '.join(apart)} also beat the baseline and turn{'s' if len(apart) == 1 else ''} other knobs "
                     f"than {winner} ({', '.join(sorted(mine)) or 'none'}); their combination with {winner} was not "
                     f"compared, so only the best by gain on {metric} is adopted: compare the combination next")
    if same:
        shared = sorted(mine & set().union(*(knobs(overrides.get(o)) for o in same)))
        notes.append(f"{', '.join(same)} also beat the baseline but set the same knob as {winner} "
                     f"({', '.join(shared)}): they are alternatives, not a combination; {winner} is adopted for the "
                     f"larger gain on {metric}")
    return notes


def hypothesis(s: Any, budget: Budget | None, g: Guardrails, why: str) -> dict[str, Any]:
    return {
        "kind": "hypothesis", "name": s.name, "finding": s.finding, "verdict": "not compared",
        "hypothesis": s.hypothesis, "changed": s.changed or ["(not expressible as Setup overrides)"],
        "acceptance": acceptance("the selection metric", g, getattr(s, "goal", "quality")),
        "budget": budget_text(budget),
        "identity": "none yet: it gets one when compared",
        "observed": f"{NOT_COMPARED} ({why})" if why else NOT_COMPARED,
        "limitations": [f"derived from one diagnosis ({s.finding}: {s.evidence})", "no seeds, no budget: untested"],
        "rollback": "not applicable until adopted; once compared, revert when the acceptance metric falls back "
                    "within seed noise of the baseline",
    }
