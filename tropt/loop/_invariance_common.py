"""What the four invariance checks (zero_grad, accumulation, loss_scaling, scheduler_cadence) share: the advice that
points to the reference step, and norms of named gradient sets."""

from __future__ import annotations

import math

STANDARD_STEP_ADVICE = "Compare your step with tropt.standard_step, the reference implementation of this contract."


def norm_of(grads: dict) -> float:
    """The global Frobenius norm of a name -> tensor (or None) mapping."""
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values() if g is not None))


def cosine(a: dict, b: dict) -> float:
    """Cosine similarity of two gradient sets taken as one vector each (NaN when either is zero)."""
    dot = sum(float((a[n] * b[n]).sum()) for n in a if a[n] is not None and b.get(n) is not None)
    na, nb = norm_of(a), norm_of(b)
    return dot / (na * nb) if na > 0 and nb > 0 else float("nan")
