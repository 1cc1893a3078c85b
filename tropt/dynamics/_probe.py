"""The probe run of ``dynamics.loss_curve``: step a copy of the Setup, record its curve, stop when told to.

The sequential test itself (when the verdict is settled) lives with the check; this module only runs the steps,
evaluates the validation split at the planned steps and at every checkpoint, and says why the run ended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .curves import MIN_POINTS

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "dynamics.loss_curve"
CHECKPOINT_GROWTH = 1.5  # each checkpoint of the sequential probe is this many times the previous one


@dataclass
class _Probe:
    """What the probe run recorded: the loss (and LR) of each optimizer step, validation losses, gradient norms."""

    losses: list[Any] = field(default_factory=list)
    loss_steps: list[int] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)  # the LR of each loss's optimizer step (scheduled spikes)
    val_losses: list[float] = field(default_factory=list)
    val_at: list[int] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    norms_from: str = ""  # with several optimizers, the one whose gradient norms ``norms`` holds
    ran: int = 0  # optimizer steps (calls of the step) made
    stopped: str = ""  # why the probe ended before its planned steps ("" when it ran them all)
    schedule_end: int | None = None  # the first step run at LR 0 after a step above it: the Setup's schedule ended
    verdicts: list[str] = field(default_factory=list)  # "step: verdict" at each checkpoint reached


@dataclass(frozen=True)
class _ProbePlan:
    """How long the probe runs, when it evaluates and when it looks at its curve so far."""

    steps: int
    every: int
    val_batches: int
    checkpoints: list[int]
    progress: bool
    callback: Any


def _schedule_ended(lrs: list[float]) -> bool:
    """True when the last optimizer step ran at learning rate 0 after an earlier one ran above it: the schedule has
    decayed to its end (a warm-up that starts from 0 has no positive LR before it, so it never counts)."""
    if len(lrs) < 2 or not math.isfinite(lrs[-1]) or lrs[-1] != 0.0:
        return False
    return any(math.isfinite(v) and v > 0.0 for v in lrs[:-1])


def _checkpoints(steps: int, min_steps: int | None) -> list[int]:
    """The steps at which the curve so far is classified: ``min_steps``, then ``CHECKPOINT_GROWTH`` times further
    each time, and ``steps`` (only ``steps`` when ``min_steps`` is None)."""
    if min_steps is None:
        return [steps]
    out, n = [], min(max(MIN_POINTS, min_steps), steps)
    while n < steps:
        out.append(n)
        n = max(n + 1, round(n * CHECKPOINT_GROWTH))
    return [*out, steps]


def _run_probe(setup: Setup, ctx: Any, runner: Any, probe: _Probe, plan: _ProbePlan, decided: Any) -> None:
    """Step the copy up to ``plan.steps`` times, evaluating every ``plan.every`` steps and at each checkpoint; stops
    at the first non-finite loss, or at a checkpoint where ``decided(n)`` says the verdict is settled."""
    from tqdm.auto import tqdm

    from ..core.capture import StepRecorder
    from ..core.stepping import evaluate

    has_val = setup.val_data is not None
    steps, marks = plan.steps, set(plan.checkpoints)
    bar = tqdm(total=steps, desc=CHECK_ID, disable=not plan.progress, leave=False)
    with bar, StepRecorder(ctx, "norm") as hook:  # the gradient norm at each optimizer.step()
        for i, batch in enumerate(setup.batches(steps)):
            before = len(hook.records)
            loss = runner.step(ctx.split(batch, ctx.accumulation_steps))
            stepped = hook.records[before:]
            bar.update(1)
            probe.ran = i + 1
            if plan.callback is not None:
                plan.callback({"check": CHECK_ID, "step": i + 1, "total": steps,
                               "loss": None if loss is None else float(loss)})
            if loss is not None:
                probe.losses.append(loss)
                probe.loss_steps.append(i)
                probe.lrs.append(max(stepped[-1].lrs) if stepped and stepped[-1].lrs else math.nan)
                if not math.isfinite(float(loss)):
                    probe.stopped = f"non-finite loss at step {i + 1}"
                    break
                if probe.schedule_end is None and _schedule_ended(probe.lrs):
                    probe.schedule_end = i + 1  # later steps run at LR 0: they cannot lower the loss
            if has_val and ((i + 1) % plan.every == 0 or i + 1 == steps or i + 1 in marks):
                probe.val_at.append(i + 1)
                probe.val_losses.append(evaluate(setup, ctx, plan.val_batches))
            if i + 1 in marks and i + 1 < steps and decided(i + 1):
                break
    # Several optimizers (a GAN's D then G, actor-critic): one series, the first optimizer's (the Setup's first, or
    # the first that stepped), so each step contributes one norm of one model part; see probe.norms_from.
    names = list(dict.fromkeys(r.optimizer for r in hook.records))
    probe.norms_from = names[0] if len(names) > 1 else ""
    probe.norms = [r.grad_norm for r in hook.records if not probe.norms_from or r.optimizer == probe.norms_from]


def _epoch_length(setup: Setup, n: int) -> int | None:
    """Batches per pass over the training data when the probe cycles it many times (>= 20 passes), else None.

    A probe that cycles a few fixed batches sees each batch's own difficulty as a periodic swing in the per-step loss
    (one hard batch stays high while the others fall), which reads as noise larger than the fall. The mean over one
    pass covers the same samples every time, so the trend of the data's loss is judged from those means instead.
    """
    try:
        length = len(setup.loader("train"))
    except TypeError:
        return None
    return int(length) if length >= 2 and n // length >= 20 else None


def _epoch_means(values: np.ndarray, x: np.ndarray, lrs: np.ndarray, e: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Mean loss of each full pass of ``e`` steps, at the pass's last step (and its largest learning rate).

    A non-finite loss stays visible: it makes its pass's mean non-finite, and the partial pass it ends is kept.
    """
    full = len(values) // e
    cut = full * e
    means = values[:cut].reshape(full, e).mean(axis=1)
    at = x[:cut].reshape(full, e)[:, -1]
    lr = lrs[:cut].reshape(full, e).max(axis=1) if lrs.size >= cut else np.full(full, np.nan)
    if cut < len(values) and not np.isfinite(values[cut:]).all():
        means, at, lr = np.r_[means, values[cut:].mean()], np.r_[at, x[-1]], np.r_[lr, np.nan]
    return means, at, list(lr)
