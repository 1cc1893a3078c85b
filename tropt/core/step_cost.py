"""The cost of a diagnosis in step-equivalents of the user's own step (issue 32).

A check's seconds mean little across machines and loads; the same seconds divided by the time of one optimizer step
of the Setup's own step, measured in the same process right before, say how many training steps the check was worth
("``model.overfit_batch`` cost 40 steps"), which carries over to a faster machine and a bigger model. The step is
timed on tropt's copy (``Setup.build``), with the device synchronised around every clock read, and the user's
model and RNGs are restored afterwards.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..setup import Setup


def _sync(device: Any) -> None:
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step_seconds(setup: Setup, *, warmup: int = 1, steps: int = 2) -> float | None:
    """The median seconds of one call of the Setup's step on one training batch (after ``warmup`` calls), on a copy;
    None when it cannot be measured (no data, a step that raises: the checks report that themselves)."""
    from ..snapshot import preserved
    from .carried_state import CarriedState

    carried = None
    try:
        with preserved(setup.model):
            ctx = setup.build()
            # State the step keeps in its closure or on an object it holds is the user's: put it back afterwards.
            carried = CarriedState.take(ctx, setup.step)
            batch = next(iter(setup.batches(1)))
            micro = setup.split(batch, setup.accumulation_steps)
            times = []
            for i in range(warmup + steps):
                _sync(setup.device)
                t0 = time.perf_counter()
                setup.run_step(ctx, micro)
                _sync(setup.device)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
    except (Exception, SystemExit):  # noqa: BLE001 - a footnote: a step that fails is each check's own finding
        return None
    finally:
        if carried is not None:
            carried.restore("step.")  # the copy's own state is thrown away with it
    seconds = statistics.median(times)
    return seconds if seconds > 0 else None


def measured_step_seconds(results: list) -> float | None:
    """The step time ``perf.throughput`` already measured in this diagnosis (the median of its timed steps, the
    Setup's own step on tropt's copy at the checks' thread count), or None when it did not run or measured nothing:
    :func:`diagnose` then times the step itself, so a full diagnosis pays for one timing, not two."""
    for r in results:
        if r.check != "perf.throughput" or getattr(r.status, "value", r.status) not in ("pass", "warn"):
            continue
        ms = r.metrics.get("compute_ms")
        if isinstance(ms, (int, float)) and ms > 0:
            return float(ms) / 1e3
    return None


def add_costs(results: list, step_s: float | None, setup_checks: set[str]) -> dict[str, Any]:
    """Put ``metrics["cost_steps"]`` (the check's seconds over one step's) on each model-side result; returns the
    totals for the report's identity (``step_seconds``, ``cost_steps``)."""
    if not step_s:
        return {}
    total = 0.0
    for r in results:
        seconds = getattr(r, "duration_s", None)
        if r.check not in setup_checks or seconds is None:
            continue
        r.metrics["cost_steps"] = round(seconds / step_s, 1)
        total += seconds / step_s
    return {"step_seconds": round(step_s, 6), "cost_steps": round(total, 1)}

