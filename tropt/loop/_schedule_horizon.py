"""A schedule's horizon against the training it is stepped over: sized in epochs but stepped per iteration, or the
reverse (issue 28, "Schedules sized in epochs but stepped per iteration").

A comparison of K=1 against K=4 cannot see this: both runs step the schedule alike. What shows it is the
schedule's own length (``CosineAnnealingLR``'s ``T_max``, ``OneCycleLR``'s ``total_steps``, ``StepLR``'s
``step_size``, ``MultiStepLR``'s last milestone, ``LinearLR``/``PolynomialLR``'s ``total_iters``, a Hugging Face
``LambdaLR``'s ``num_training_steps``) set beside the optimizer steps in one epoch (``Setup(steps_per_epoch=)``, or
``len(train_data)`` over the loader batches one step reads: :meth:`tropt.Setup.epoch_steps`) and, when the Setup
declares it, the planned length of the run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import TroptError

_SCHED = torch.optim.lr_scheduler


@dataclass(frozen=True)
class Horizon:
    """How many scheduler steps a schedule is sized for: ``what`` names the argument (``T_max=10``)."""

    steps: int
    what: str
    period: bool = False  # a decay period (StepLR's step_size), not the end of the schedule


def schedule_horizon(scheduler: Any) -> Horizon | None:
    """The horizon of a torch scheduler (or a Hugging Face LambdaLR), or None when it has none it states."""
    if isinstance(scheduler, _SCHED.CosineAnnealingLR):
        return Horizon(int(scheduler.T_max), f"T_max={scheduler.T_max}")
    if isinstance(scheduler, _SCHED.OneCycleLR):
        return Horizon(int(scheduler.total_steps), f"total_steps={scheduler.total_steps}")
    if isinstance(scheduler, _SCHED.StepLR):
        return Horizon(int(scheduler.step_size), f"step_size={scheduler.step_size}", period=True)
    if isinstance(scheduler, _SCHED.MultiStepLR) and scheduler.milestones:
        return Horizon(int(max(scheduler.milestones)), f"milestones={sorted(scheduler.milestones)}", period=True)
    if isinstance(scheduler, (_SCHED.LinearLR, _SCHED.ConstantLR, _SCHED.PolynomialLR)):
        return Horizon(int(scheduler.total_iters), f"total_iters={scheduler.total_iters}")
    if isinstance(scheduler, _SCHED.SequentialLR):
        tail = schedule_horizon(scheduler._schedulers[-1])
        start = int(scheduler._milestones[-1]) if scheduler._milestones else 0
        if tail is None or tail.period:
            return Horizon(start, f"milestones={list(scheduler._milestones)}") if start else None
        return Horizon(start + tail.steps, f"milestones={list(scheduler._milestones)} + {tail.what}")
    if isinstance(scheduler, _SCHED.LambdaLR):
        for fn in scheduler.lr_lambdas:
            total = fn.keywords.get("num_training_steps") if isinstance(fn, functools.partial) else None
            if isinstance(total, int) and total > 0:
                return Horizon(total, f"num_training_steps={total}")
    return None


def steps_per_epoch(setup: Any) -> tuple[int | None, str]:
    """Optimizer steps per epoch and where the number comes from: ``Setup(steps_per_epoch=)`` when given, else
    ``len(train_data)`` over the loader batches one step reads (K with ``accumulation="batches"``, 1 with
    ``"split"``): :meth:`tropt.Setup.epoch_steps`."""
    if callable(getattr(setup, "epoch_steps", None)):
        n, source = setup.epoch_steps()
        return (n if n is not None and n > 0 else None), source
    declared = getattr(setup, "steps_per_epoch", None)  # a Setup-like object without epoch_steps
    if isinstance(declared, int) and declared > 0:
        return declared, "Setup(steps_per_epoch=)"
    try:
        n = len(setup.loader("train"))
    except (TypeError, AttributeError, NotImplementedError, TroptError):  # no length (an iterable), or no data
        return None, "unknown"
    return (n or None), "len(train_data)"


def planned_steps(setup: Any, per_epoch: int | None) -> tuple[int | None, int | None]:
    """(planned optimizer steps, planned epochs) when the Setup declares them (``epochs``, ``total_steps`` or
    ``max_steps``); None where it does not."""
    epochs = getattr(setup, "epochs", None)
    epochs = epochs if isinstance(epochs, int) and epochs > 0 else None
    for name in ("total_steps", "max_steps"):
        total = getattr(setup, name, None)
        if isinstance(total, int) and total > 0:
            return total, epochs
    return (epochs * per_epoch if epochs and per_epoch else None), epochs


@dataclass(frozen=True)
class HorizonFinding:
    """A mismatch between the schedule's horizon and the training, with its evidence."""

    sentence: str
    metrics: dict
    advice: list[str]


def horizon_finding(setup: Any, scheduler: Any, *, per_step: bool) -> HorizonFinding | None:
    """The mismatch for a schedule stepped once per optimizer step (``per_step``) or not within the step at all
    (an epoch loop steps it), or None when its horizon fits, is unknown, or there is nothing to set it beside."""
    h = schedule_horizon(scheduler)
    per_epoch, source = steps_per_epoch(setup)
    if h is None or per_epoch is None or per_epoch < 2 or h.steps < 1:
        return None
    total, epochs = planned_steps(setup, per_epoch)
    name = type(scheduler).__name__
    metrics = {"schedule_horizon": h.steps, "schedule_horizon_from": h.what, "steps_per_epoch": per_epoch,
               "steps_per_epoch_from": source, **({"planned_steps": total} if total else {}),
               **({"planned_epochs": epochs} if epochs else {})}
    if per_step:
        return _per_step_finding(name, h, per_epoch, source, total, epochs, metrics)
    return _per_epoch_finding(name, h, per_epoch, source, total, epochs, metrics)


def _per_step_finding(name: str, h: Horizon, per_epoch: int, source: str, total: int | None, epochs: int | None,
                      metrics: dict) -> HorizonFinding | None:
    # Under one epoch: an end (T_max, total_steps, total_iters) or every milestone is reached in the first epoch; a
    # decay period (StepLR's step_size) only from 2 on and at least twice per epoch: step_size=1 is an exponential
    # decay per scheduler step, whatever the unit.
    short = h.steps < per_epoch and (not h.period or h.what.startswith("milestones")
                                     or (h.steps >= 2 and per_epoch >= 2 * h.steps))
    sized_in_epochs = (epochs is not None and h.steps <= epochs) or short
    if total is not None and not sized_in_epochs and not h.period and h.steps >= total:
        return None  # ends at (or after) the planned run: fits
    if not sized_in_epochs:
        return None
    what = "decays every" if h.period else "ends after"
    against = (f"the {total} planned optimizer steps ({epochs} epochs of {per_epoch})" if total and epochs
               else f"the {total} planned optimizer steps" if total
               else f"one epoch of {per_epoch} optimizer steps ({source})")
    metrics["sized_in_epochs"] = True
    return HorizonFinding(
        f"its length looks counted in epochs while it is stepped once per optimizer step: {name}({h.what}) {what} "
        f"{h.steps} scheduler steps, against {against}, so it "
        + ("decays that often within each epoch" if h.period else
           "runs through its whole schedule within the first epoch"
           + (" and then climbs back (cosine is periodic)" if name == "CosineAnnealingLR" else "")),
        metrics,
        [f"If {h.what} counts epochs, step the scheduler once per epoch (in the epoch loop), or count it in optimizer "
         f"steps: multiply it by the {per_epoch} optimizer steps per epoch"
         + ("" if h.what.startswith("milestones") else f" ({h.what.split('=')[0]}={h.steps * per_epoch})")
         + (" (OneCycleLR: total_steps = epochs * len(train_loader))" if name == "OneCycleLR" else "") + "."])


def _per_epoch_finding(name: str, h: Horizon, per_epoch: int, source: str, total: int | None, epochs: int | None,
                       metrics: dict) -> HorizonFinding | None:
    """The schedule does not move within the step (an epoch loop steps it): a horizon of at least one epoch's
    optimizer steps then counts iterations, and stepped once per epoch it covers only epochs / horizon of it."""
    if epochs is not None and h.steps <= epochs:
        return None  # sized in the planned epochs: right for a per-epoch step
    # Without the planned length, only a horizon of whole epochs (at least two) reads as counted in iterations.
    whole_epochs = h.steps % per_epoch == 0 and h.steps >= 2 * per_epoch
    if not (whole_epochs or (total is not None and h.steps == total)) or (h.period and epochs is None):
        return None
    covered = (f"{epochs} of its {h.steps} steps ({epochs / h.steps:.1%})" if epochs
               else f"one of its {h.steps} steps per epoch")
    metrics["sized_in_iterations"] = True
    return HorizonFinding(
        f"its length looks counted in optimizer steps while it is not stepped within the step: {name}({h.what}) spans "
        f"{h.steps} scheduler steps, at least one epoch's {per_epoch} optimizer steps ({source}); stepped once per "
        f"epoch by your epoch loop it covers only {covered}",
        metrics,
        [f"If {h.what} counts optimizer steps, call ctx.scheduler.step() once per optimizer step, right after "
         "optimizer.step(); if the epoch loop is meant to step it, size it in epochs."])
