"""Fair budgets: a candidate that changes the batch size is compared at equal samples, never at equal steps.

Under ``Budget(steps=N)`` a candidate whose batches hold twice the samples sees twice the data in the same steps,
and would win on quality for that alone. :func:`fair_budgets` gives such a candidate a samples budget equal to
what the baseline reads (``N`` × the baseline's batch size), so every run reads the same number of training
samples (about the same forward/backward compute per sample), and says so. A budget in samples is equal samples
already; candidates whose batches are the baseline's size keep the steps budget (equal steps = equal samples).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .budget import Budget
from .candidates import BASELINE

if TYPE_CHECKING:
    from ..setup import Setup

EQUAL_STEPS, EQUAL_SAMPLES = "equal steps", "equal samples"


def _batch_size(setup: Setup) -> int | None:
    from ..core.batch import batch_size

    try:
        return int(batch_size(setup.sample_batch()))
    except Exception:  # noqa: BLE001 - unreadable here: the run itself reports it
        return None


def fair_budgets(built: dict[str, tuple[Setup, Any]], budget: Budget) -> tuple[dict[str, Budget], str, list[str]]:
    """Each candidate's budget, what the comparison is equal in (``"equal steps"`` or ``"equal samples"``), and a
    note per candidate whose budget was turned into samples."""
    if budget.samples is not None or budget.steps is None:
        return {n: budget for n in built}, EQUAL_SAMPLES, []
    sizes = {n: _batch_size(s) for n, (s, _) in built.items()}
    base = sizes.get(BASELINE)
    out, notes = {}, []
    for name in built:
        size = sizes[name]
        if name == BASELINE or base is None or size is None or size == base:
            out[name] = budget
            continue
        samples = budget.steps * base
        out[name] = replace(budget, steps=None, samples=samples)
        notes.append(f"{name} reads batches of {size} samples (the baseline {base}): under Budget(steps="
                     f"{budget.steps}) it would see {size / base:.3g}× the baseline's samples, so it ran at equal "
                     f"samples instead: {samples} samples (≈{-(-samples // size)} of its steps)")
    basis = EQUAL_SAMPLES if notes else EQUAL_STEPS
    return out, basis, notes


def basis_text(basis: str, budget: dict[str, Any]) -> str:
    """The comparison's basis in words, for tables and the plan."""
    if basis == EQUAL_STEPS:
        return (f"equal steps ({budget.get('steps')} per run; every candidate's batches hold as many samples as the "
                "baseline's, so equal samples too)")
    if budget.get("samples") is not None:
        return f"equal samples ({budget.get('samples')} training samples per run)"
    return ("equal samples: candidates that change the batch size ran until they had read as many training samples "
            f"as the baseline's {budget.get('steps')} steps")
