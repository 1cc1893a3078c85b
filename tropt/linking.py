"""Cross-references between the results of one run, decided once every result is in (a check cannot know what
another one found, so it never claims it in its own summary).

- ``metrics["see_also"]``: "<id> reports this defect" is added only when that check did report it.
- The root cause first, the symptoms after it (issue 27 §5): when a stage-4 check isolates a defect in the step
  (:func:`is_root`), the results it explains in the checks that ran that same step are marked
  ``metrics["symptom_of"] = <root id>`` (and ``metrics["symptom_kind"]``, the evidence that matched), ranked after
  their root by :func:`tropt.verdict.rank_stage`, and advised to fix the step before any hyperparameter: a learning
  rate or a clip tuned against a broken step tunes the bug.

"Explains" is read from evidence: each symptom's kind comes from its own result (:func:`symptom_kinds`: a
non-finite loss, a divergence, no progress, an eval gap, ...), and :data:`EXPLAINS` says which kinds each root can
produce in which checks. A data FAIL, or a model defect the step cannot cause ("the model ignores its input" while
its loss still falls), is never a symptom.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from .result import CheckResult, Status

# Symptom kinds: what a result's own evidence says went wrong.
NONFINITE = "non-finite"      # a loss or gradient became inf/NaN
DIVERGES = "diverges"         # the loss rises, spikes or oscillates
NO_PROGRESS = "no progress"   # the loss stalls, stays flat or falls too slowly
NO_UPDATE = "no update"       # no gradient or no parameter change reached the model
GRADIENTS = "gradients"       # model.gradient_flow: gradients too small, too large or missing in places
LR_ANOMALY = "range sweep"    # dynamics.lr_range: the sweep's range, measured with the broken step
EVAL_GAP = "eval gap"         # train and evaluation disagree: a generalisation gap, an eval metric off
DIFFERS = "differs"           # a loop.* invariance that breaks without an isolated cause of its own

_TRAINING = frozenset({NONFINITE, DIVERGES, NO_PROGRESS, NO_UPDATE})
_UNSTABLE = frozenset({NONFINITE, DIVERGES})

# Which root kinds can explain which symptoms: root check -> {symptom check (an id, or a "stage." prefix) -> the
# symptom kinds that root produces there}. A root explains only checks that run the user's step in the way it
# breaks: loop.resume and loop.ddp defects show only in resumed or multi-process runs, which no other check makes.
EXPLAINS: dict[str, dict[str, frozenset[str]]] = {
    # gradients cleared, double-counted or mis-scaled across micro-batches: every training run of the step
    "loop.accumulation": {"model.overfit_batch": _TRAINING, "model.gradient_flow": frozenset({GRADIENTS, NO_UPDATE}),
                          "dynamics.": _TRAINING | {LR_ANOMALY}, "perf.": _UNSTABLE,
                          "loop.": frozenset({DIFFERS, NONFINITE})},
    # gradients leaking from step to step (or none reaching the optimizer): the same runs
    "loop.zero_grad": {"model.overfit_batch": _TRAINING, "model.gradient_flow": frozenset({GRADIENTS, NO_UPDATE}),
                       "dynamics.": _TRAINING | {LR_ANOMALY}, "perf.": _UNSTABLE,
                       "loop.": frozenset({DIFFERS, NONFINITE})},
    # gradients that depend on the loss scale: non-finite or unstable steps wherever the scaler runs
    "loop.loss_scaling": {"model.overfit_batch": _UNSTABLE, "dynamics.": _UNSTABLE | {LR_ANOMALY},
                          "perf.precision": _UNSTABLE, "loop.": frozenset({DIFFERS, NONFINITE})},
    # a schedule that runs K times too fast: the learning rate every training run sees
    "loop.scheduler_cadence": {"model.overfit_batch": _TRAINING, "dynamics.": _TRAINING | {LR_ANOMALY}},
    # dropout or batch norm in eval mode while training: train and evaluation no longer differ as they should
    "loop.train_mode": {"model.eval_metric": frozenset({EVAL_GAP}), "dynamics.loss_curve": frozenset({EVAL_GAP}),
                        "model.overfit_batch": frozenset({NO_PROGRESS})},
    "loop.resume": {},
    "loop.ddp": {},
}

_NO_CAUSE = ("", "unnamed", "not_isolated")  # "differs; cause not isolated" names no cause (issue 27 §2)
# Checks whose every FAIL states a cause in metrics["cause"]; the others' FAILs each name one defect in their summary.
_CAUSE_REQUIRED = frozenset({"loop.accumulation", "loop.ddp"})

_CURVE_KINDS = {"non_finite": NONFINITE, "diverging": DIVERGES, "unstable": DIVERGES, "noisy_late": DIVERGES,
                "flat": NO_PROGRESS, "still_improving": NO_PROGRESS, "not_generalising": EVAL_GAP,
                "overfitting": EVAL_GAP}
_TEXT_KINDS = (
    (NONFINITE, re.compile(r"non-finite|nonfinite|\bnan\b|\binf\b")),
    (DIVERGES, re.compile(r"diverg|unstable|explod|spike|oscillat")),
    (NO_PROGRESS, re.compile(r"stall|falls only|\bflat\b|plateau|still falling|does not (fall|decrease|learn)")),
    (NO_UPDATE, re.compile(r"no (parameter|gradient|optimizer step)|changes no parameter|never updated")),
    (EVAL_GAP, re.compile(r"generali[sz]|overfitting\b|train.{0,20}(eval|val)|eval.{0,20}train|\bgap\b")),
)


def link_findings(results: list[CheckResult]) -> list[CheckResult]:
    """Resolve cross-references between results: ``see_also`` (said only when that check did report the defect,
    FAIL or WARN, in the same run), then root causes and their symptoms (see the module's docstring). Linking twice
    changes nothing."""
    found = {r.check: r.status for r in results}
    out = []
    for r in results:
        other = r.metrics.get("see_also")
        if (isinstance(other, str) and found.get(other) in (Status.FAIL, Status.WARN)
                and f"; {other} reports this defect" not in r.summary):
            r = dataclasses.replace(r, summary=f"{r.summary}; {other} reports this defect")
        out.append(r)
    return link_symptoms(out)


def is_root(r: CheckResult) -> bool:
    """Whether ``r`` isolates a defect in the step: a FAIL of a stage-4 check in :data:`EXPLAINS` that names its
    cause. Not one that says "cause not isolated", a non-finite comparison ("nothing can be compared"), a latent
    finding, or one already linked as a symptom."""
    if r.status is not Status.FAIL or r.check not in EXPLAINS or "symptom_of" in r.metrics:
        return False
    if r.metrics.get("latent") or "nonfinite_step" in r.metrics or "not isolated" in r.summary.lower():
        return False
    cause = r.metrics.get("cause")
    if cause is None:
        return r.check not in _CAUSE_REQUIRED
    return isinstance(cause, str) and cause not in _NO_CAUSE


def symptom_kinds(r: CheckResult) -> frozenset[str]:
    """What went wrong in ``r``, read from its evidence (its loss-curve classes, its metrics, its summary); empty
    for a result no broken step can explain."""
    text = r.summary.lower()
    metrics = r.metrics
    if "ignores its input" in text or "does read its input" in text:
        start, final = metrics.get("start_loss"), metrics.get("final_loss")
        # Not beating the zeroed-input baseline while the loss falls is a model defect (or slow learning, when the
        # model reads its input); a loss that never fell is a step that does not train, and says nothing about the
        # input.
        falls = isinstance(start, (int, float)) and isinstance(final, (int, float)) and final < start
        return frozenset() if falls else frozenset({NO_PROGRESS})
    kinds = {kind for kind, pattern in _TEXT_KINDS if pattern.search(text)}
    if any(str(k).startswith("nonfinite") for k in metrics):
        kinds.add(NONFINITE)
    if "peak_loss" in metrics:
        kinds.add(DIVERGES)
    if r.check == "dynamics.loss_curve":
        kinds = {_CURVE_KINDS[c] for c in _curve_classes(r) if c in _CURVE_KINDS} or kinds
    if r.check == "dynamics.lr_range":
        kinds.add(LR_ANOMALY)
    if r.check == "model.gradient_flow":
        kinds.add(GRADIENTS)
    if r.check.startswith("loop.") and _differs_unexplained(r):
        kinds.add(DIFFERS)
    return frozenset(kinds)


def _curve_classes(r: CheckResult) -> set[str]:
    """The loss curve's flagged classes: its findings table, else its ``classes`` metric."""
    table = r.tables.get("findings")
    if table is not None and {"class", "flagged"} <= set(table.columns):
        return {str(c) for c, f in zip(table["class"], table["flagged"]) if bool(f)}
    return {c.strip() for c in str(r.metrics.get("classes", "")).split(",") if c.strip()}


def _differs_unexplained(r: CheckResult) -> bool:
    """A loop.* invariance broken without a cause of its own: a FAIL naming none, or a WARN saying so."""
    cause = r.metrics.get("cause")
    if isinstance(cause, str) and cause not in _NO_CAUSE:
        return False
    return r.status is Status.FAIL or "not isolated" in r.summary.lower()


def explained_kinds(root: CheckResult, r: CheckResult) -> frozenset[str]:
    """The kinds of ``r`` that ``root`` explains (empty when it explains none): ``r`` a FAIL or WARN of a check the
    root's table names, not a root itself, not a loop check naming a cause of its own."""
    if (r.check == root.check or r.status not in (Status.FAIL, Status.WARN) or "symptom_of" in r.metrics
            or is_root(r)):
        return frozenset()
    cause = r.metrics.get("cause")
    if r.check.startswith("loop.") and isinstance(cause, str) and cause not in _NO_CAUSE:
        return frozenset()  # a loop check that names a cause of its own reports a defect of its own
    allowed = _allowed(EXPLAINS.get(root.check, {}), r.check)
    return symptom_kinds(r) & allowed


def _allowed(table: Mapping[str, frozenset[str]], check: str) -> frozenset[str]:
    exact = table.get(check)
    if exact is not None:
        return exact
    return frozenset().union(*(kinds for p, kinds in table.items() if p.endswith(".") and check.startswith(p)))


def link_symptoms(results: list[CheckResult]) -> list[CheckResult]:
    """Mark the results a root explains (the first root, in contract order, that explains them): ``symptom_of``
    and ``symptom_kind`` in the metrics, a sentence in the summary, and advice to fix the step first instead of
    the result's own."""
    roots = [r for r in results if is_root(r)]
    if not roots:
        return results
    out = []
    for r in results:
        for root in roots:
            kinds = explained_kinds(root, r)
            if kinds:
                r = _as_symptom(r, root, kinds)
                break
        out.append(r)
    return out


def _as_symptom(r: CheckResult, root: CheckResult, kinds: frozenset[str]) -> CheckResult:
    status = r.status.value.upper()
    # The root's own fix is listed at its rank, before this one; repeating it here would put its words (which may
    # name a learning rate, as a schedule's fix does) into a symptom's advice.
    return dataclasses.replace(
        r, metrics={**r.metrics, "symptom_of": root.check, "symptom_kind": ", ".join(sorted(kinds))},
        summary=f"{r.summary}; a symptom of the broken step that {root.check} isolates",
        advice=[f"Fix the step first: {root.check} FAILs with the defect it isolates (its fix comes before this "
                f"one); this check ran that step, so its {status} ({', '.join(sorted(kinds))}) follows from it. "
                "Change no hyperparameter until the step is fixed, then diagnose again; if this check still "
                f"{'FAILs' if r.status is Status.FAIL else 'WARNs'}, its own advice applies then."])
