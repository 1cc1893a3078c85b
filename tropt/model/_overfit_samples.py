"""The fixed batch of ``model.overfit_batch``: how many samples it takes, and why.

Fewer samples make the check cheaper (``budget="quick"`` takes 2), but a model that ignores its input memorises a
batch whose samples all share one target as well as one that reads it: the zeroed-input baseline can only be told
apart from the model when the targets differ. So the samples are doubled (up to the whole batch) until the targets
of an identified objective differ.

A sample prefix can also be no valid batch at all: a loss built over the batch's structure (batch-hard triplet
mining needs two identities and a positive for every anchor; in-batch negatives need a second sample; a P x K
sampler's batch read as ``view(N, -1)``) raises, or is not finite, on the first two samples of a whole batch it
handles. That is the prefix's fault, not the loss's: the samples are doubled (up to the whole batch) until the loss
runs; only the whole batch's failure is the loss's own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ..core.batch import get_leaf
from ..core.objective import probe
from ..errors import StepError
from ._common import take_samples

if TYPE_CHECKING:
    from ..result import CheckResult
    from ..setup import Setup

DEFAULT_SAMPLES = 32  # the check's default ``samples``

# Once the model memorised the batch the baseline cannot change the verdict (a PASS never depends on it): it runs this
# many steps at most, for a comparison with the model at the same step, instead of as many steps as the model ran.
BASELINE_STEPS_AFTER_PASS = 4


def baseline_steps(real: dict, steps: int) -> tuple[int, str]:
    """How many steps the zeroed-input baseline runs, and why (``metrics["baseline_stopped"]``)."""
    ran = max(len(real["losses"]) - 1, 1)
    if real["reached"]:
        k = min(ran, BASELINE_STEPS_AFTER_PASS)
        return k, (f"the model memorised the batch in {ran} steps, which no baseline changes: {k} steps, to compare "
                   "at the same step")
    return steps, "step limit (the model did not memorise the batch: the baseline decides the verdict)"


def _same_targets(batch: Any, objective: Any, n: int) -> bool:
    """Whether every sample of ``batch`` (``n`` of them, along dimension 0) has the same target; False when the
    objective or its target is unknown."""
    if objective is None or n < 2:
        return False
    try:
        target = get_leaf(batch, objective.target_path)
    except (KeyError, IndexError, TypeError, AttributeError):
        return False
    if not isinstance(target, torch.Tensor) or target.dim() == 0 or target.shape[0] != n:
        return False
    return bool((target == target[:1]).all())


def overfit_samples(setup: Setup, samples: int, model: Any, ctx: Any) -> tuple[Any, Any, str]:
    """(batch, identified objective, why that many samples): at least ``samples`` and 2 per micro-batch (BatchNorm
    needs 2 to normalise), doubled while every sample has the same target, or while ``loss_fn`` raises or is not
    finite on the prefix, and the batch holds more."""
    k = setup.accumulation_steps
    full = setup.sample_batch()
    total = setup.layout.size(full)
    n = max(2, samples, 2 * k if k > 1 else 2)
    why = f"samples={samples}" if n == samples else f"{n}: at least 2 per micro-batch (samples={samples})"
    while True:
        batch = take_samples(full, n, setup.layout)
        size = min(n, total)
        try:
            value, _, objective, _ = probe(setup, model, batch, ctx)
            if k > 1 and size >= k:  # the step trains on its K micro-batches: each must be a valid batch too
                with torch.no_grad():
                    for mb in setup.split(batch, k):
                        setup.loss(model, mb)
        except StepError as exc:
            # loss_fn itself raised on the prefix (StepError from Setup.loss with the user's exception as cause):
            # a batch-structured loss may need more samples; the whole batch's failure is re-raised as before
            if size >= total or exc.__cause__ is None:
                raise
            n *= 2
            why = (f"{min(n, total)}: loss_fn raised {type(exc.__cause__).__name__} on the first {size} samples "
                   f"(a loss over the batch's structure needs more of them) (samples={samples})")
            continue
        if size < total and not math.isfinite(value):
            n *= 2
            why = f"{min(n, total)}: loss_fn is not finite on the first {size} samples (samples={samples})"
            continue
        if size >= total or not _same_targets(batch, objective, size):
            return batch, objective, why
        n *= 2
        why = f"{min(n, total)}: the first {size} samples all have the same target (samples={samples})"


def escalated(first: CheckResult, again: CheckResult, samples: int) -> CheckResult:
    """``again`` (the verdict on ``samples`` samples), with the evidence of the cheaper first run that did not
    memorise its fewer samples in its metrics (``first_*``) and why it was rerun (``metrics["escalated"]``)."""
    import dataclasses

    m = first.metrics
    metrics = {**again.metrics, "first_samples": m["samples"], "first_status": first.status.value,
               "first_steps_run": m["steps_run"], "first_stopped": m["stopped"],
               "escalated": (f"{m['samples']} samples were not memorised ({first.status.value}): the verdict is judged "
                             f"on {again.metrics['samples']} (samples={samples}), as without the shortcut")}
    return dataclasses.replace(again, metrics=metrics)
