"""Verdict helpers shared by the loop checks: tolerances, the clear ERROR for a step that never updates, the one
owner of "more than one update per call" (``loop.accumulation``), latent defects and non-finite findings."""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from ..core.compare import Tensors, nonfinite_tensors
from ..core.optimizer_params import FrozenOptimizer, frozen_optimizer
from ..errors import StepError, TroptError
from ..result import CheckResult, Status
from ..setup import Setup

# Relative gradient error allowed between two runs that must give the same update, by precision. fp32 differs
# only by summation order (about 1e-7 relative); half precisions round every activation.
TOLERANCE = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 1e-2}


def tolerance_for(setup: Setup, tol: float | None = None) -> float:
    """The relative-error tolerance for the Setup's precision (or ``tol`` when given)."""
    return float(tol) if tol is not None else TOLERANCE[setup.precision]


def require_steps(setup: Setup, calls: list[int], what: str) -> None:
    """Raise a clear StepError when the step under test neither reached ``optimizer.step()`` nor changed a parameter.

    When the optimizer holds only frozen parameters (a step may skip an update that has no gradient), the error says
    so: that is the cause to fix, not the call.
    """
    if sum(calls) == 0:
        who = "tropt.standard_step" if setup.uses_standard_step else "your step function"
        frozen = _frozen_optimizer(setup)
        if frozen is not None:
            raise StepError(f"{who} never called optimizer.step() and changed no parameter during {what}: "
                            f"{frozen.sentence()}", frozen.advice)
        raise StepError(
            f"{who} never called optimizer.step() and changed no parameter during {what}"
            + (" (or the GradScaler skipped every step because the gradients were inf/NaN)"
               if setup.use_scaler else ""),
            "call ctx.optimizer.step() (or ctx.scaler.step(ctx.optimizer)) once per call of step(ctx, micro_batches), "
            "or update the parameters by hand in it",
        )


def _frozen_optimizer(setup: Setup) -> FrozenOptimizer | None:
    """The Setup's optimizer, built on a fresh copy, when it holds only frozen parameters (else None)."""
    if setup.optimizer is None:
        return None
    from ..snapshot import preserved

    try:
        with preserved():
            ctx = setup.build()
            return frozen_optimizer(ctx.model, ctx.optimizer)
    except TroptError:  # the factories' own errors are reported by the checks that build them
        return None


def steps_per_call_note(calls: list[int]) -> str | None:
    """None when no call of the step made more than one update; else a note with the count.

    A step must update once per call. Exactly one check owns this finding (``loop.accumulation``, which FAILs with
    the count); every other loop check attaches this note (see :func:`defer_multi_step`) instead of failing for it.
    """
    many = [c for c in calls if c > 1]
    if not many:
        return None
    return f"optimizer.step() ran {max(many)} times in one call of the step (it must run once per call)"


def defer_multi_step(result: Any, calls: list[int]) -> Any:
    """A non-owner check's result when the step updated more than once per call: PASS or FAIL becomes WARN naming
    the count (this check's comparison is not meaningful then), with ``optimizer_steps_per_call`` in metrics."""
    note = steps_per_call_note(calls)
    if note is None or result.status not in (Status.PASS, Status.FAIL):
        return result
    was = result.status.value.upper()
    return dataclasses.replace(
        result, status=Status.WARN, summary=f"{note} (this check's own comparison: {was}: {result.summary})",
        metrics={**result.metrics, "optimizer_steps_per_call": int(max(calls)), "see_also": "loop.accumulation"},
        advice=["Call optimizer.step() exactly once per call of step(ctx, micro_batches), after the last micro-batch's "
                "backward; then rerun this check.", *result.advice])


def latent_when_unused(setup: Setup, result: Any) -> Any:
    """A FAIL that only shows with gradient accumulation becomes WARN for a Setup that does not accumulate.

    The loop checks still try K micro-batches when ``accumulation_steps=1`` (the step should be right for any K),
    but then the user's own updates are not affected yet: a latent defect, not a wrong update.
    """
    if result.status is not Status.FAIL or setup.accumulation_steps > 1:
        return result
    return dataclasses.replace(
        result, status=Status.WARN,
        summary="latent (this Setup does not accumulate gradients, so its updates are not affected yet): "
                f"{result.summary}",
        metrics={**result.metrics, "latent": True},
        advice=["Fix this before turning on gradient accumulation (accumulation_steps > 1).", *result.advice])


def nonfinite_result(check: str, runs: dict[str, tuple[int, Tensors]],
                     what: str = "gradients") -> Any:
    """A FAIL naming the first non-finite value among compared runs, or None when every value is finite.

    ``runs`` maps a run's label to (step number, tensors). Two NaNs are never "equal": a comparison that meets a
    non-finite value has found that, and nothing else (no cause is guessed from a broken comparison).
    """
    rows: list[dict[str, Any]] = []
    for label, (t, grads) in runs.items():
        for name, count in nonfinite_tensors(grads).items():
            tensor = grads[name]  # not None: only present tensors have non-finite entries
            rows.append({"run": label, "step": t, "tensor": name, "nonfinite_entries": count,
                         "entries": int(tensor.numel()) if tensor is not None else 0})
    if not rows:
        return None
    first = rows[0]
    table = pd.DataFrame(rows)
    labels = sorted(set(table["run"]), key=list(runs).index)
    summary = (f"non-finite {what} at step {first['step']} ({first['tensor']}: {first['nonfinite_entries']} of "
               f"{first['entries']} entries inf/NaN, in {len(table)} tensor(s) of run{'s' if len(labels) > 1 else ''} "
               f"{', '.join(labels)}): nothing can be compared until the loss and its {what} are finite")
    metrics = {"nonfinite_step": int(first["step"]), "nonfinite_tensors": len(table),
               "nonfinite_runs": ", ".join(labels),
               "observed_at": "optimizer.step"}
    return CheckResult(check, Status.FAIL, summary, metrics, {"nonfinite": table}, [
        "Find where the loss goes non-finite: NaN/inf in the inputs, log(0) or division by zero in the loss, "
        "or an fp16 overflow (a .half() model: train in fp32 or bf16 autocast, or use fp16 autocast with a "
        "GradScaler).",
        "If it diverges only after some steps, lower the learning rate or clip gradients.",
    ])
