"""``loop.scheduler_cadence``: does the schedule advance once per optimizer step, whatever the accumulation?

The step runs with K = 1 and K = 4 micro-batches on the same batches; after every optimizer step the scheduler's
position (``last_epoch``) and each group's learning rate are read (through a step pre-hook too, so a scheduler
stepped before ``optimizer.step()`` shows within its own call). A learning rate the step sets by hand
(``param_group["lr"] = get_lr(ctx.it)``) is compared the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.capture import PARAMETER_CHANGE, StepRecorder, group_lr, on_update
from ..core.modes import quiet_randomness
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ..training import StepContext, needs_metric
from ._invariance_common import STANDARD_STEP_ADVICE
from ._schedule_horizon import horizon_finding
from ._verdicts import latent_when_unused, require_steps, steps_per_call_note

_AFTER_OPT = "Call ctx.scheduler.step() once per optimizer step, right after optimizer.step()."


def _lr_changes(lrs: np.ndarray) -> bool:
    """Whether any group's learning rate takes more than one value over the recorded optimizer steps."""
    return bool(len(lrs) > 1 and not np.allclose(lrs, lrs[:1], rtol=1e-9, atol=0))


def _same_lrs(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-6, atol=0))


class _HandUpdate(Exception):
    """A call updated the parameters by hand: no learning rate reached an optimizer to compare."""


def _schedule_position(sched: object) -> float:
    pos = getattr(sched, "last_epoch", None)
    return float(pos) if isinstance(pos, (int, float)) else float("nan")


def _lr0(optimizer: Any) -> float:
    return group_lr(optimizer, optimizer.param_groups[0])  # NaN when the group holds no number (unknown)


def _cadence_run(setup: Setup, ctx: StepContext, batches: list, kk: int) -> dict:
    """Run ``batches`` as ``kk`` micro-batches each; record the schedule around every call and optimizer step.

    Positions and learning rates are read at the start and end of every call and, through a second step pre-hook,
    at every ``optimizer.step()``: a scheduler stepped before the optimizer shows there, within its own call.
    """
    quiet_randomness(ctx.model)
    # The schedule compared is ctx.scheduler's, over ctx.optimizer's updates: with several optimizers (a GAN's D and
    # G) the others' records are left out (a hand-written update's record names no optimizer).
    own = (ctx.optimizer_name(0) if hasattr(ctx, "optimizer_name") else "optimizer", "")
    at_step: list[float] = []
    handles = on_update(ctx.optimizer, lambda opt, args, kwargs: at_step.append(_schedule_position(ctx.scheduler)))
    start = _schedule_position(ctx.scheduler)
    before, lr_before, after, lr_after, calls = [], [], [], [], []
    try:
        with StepRecorder(ctx, capture="lr") as rec:
            for b in batches:
                before.append(_schedule_position(ctx.scheduler) - start)
                lr_before.append(_lr0(ctx.optimizer))
                n, values = len(rec.records), rec.before_call()
                setup.run_step(ctx, setup.split(b, kk))
                rec.after_call(values, len(rec.records) - n)  # a hand-written update shows as a record without LRs
                calls.append(sum(r.optimizer in own for r in rec.records[n:]))
                after.append(_schedule_position(ctx.scheduler) - start)
                lr_after.append(_lr0(ctx.optimizer))
    finally:
        for h in handles:
            h.remove()
    require_steps(setup, calls, f"the K={kk} run")
    records = [r for r in rec.records if r.optimizer in own]
    if any(not r.lrs for r in records):
        raise _HandUpdate()
    first = np.cumsum([0, *calls[:-1]])  # index of each call's first optimizer step
    stepped = [i for i, c in enumerate(calls) if c > 0]
    lrs = np.array([r.lrs for r in records])
    return {"lrs": lrs, "positions": np.array(after), "calls": calls,
            # a scheduler without last_epoch (timm's, fairseq's) has NaN positions: only its LR tells if it moved
            "moved": bool((not math.isnan(after[-1]) and after[-1] != 0) or lr_after[-1] != lr_before[0]),
            # per call with exactly one optimizer step: how far the schedule moved in that call
            "advances": [after[i] - before[i] for i in stepped if calls[i] == 1],
            # per call: how far the schedule had moved (position, LR) by the call's first optimizer.step()
            "early": [(at_step[first[i]] - start - before[i], lrs[first[i], 0], lr_before[i]) for i in stepped]}


@dataclass
class _Cadence:
    """The K=1 and K=k runs the verdict compares, and what decides how to read them."""

    k: int
    steps: int  # optimizer steps compared (one per batch)
    one: dict
    many: dict
    hand_set: bool  # no scheduler object: the step writes param_group["lr"] itself
    has_position: bool  # the scheduler reports its position (last_epoch)
    plateau: bool
    schedule: str  # "set by hand in the step" or the scheduler's type name
    faster: bool | None  # the K run reads every K-th K=1 learning rate (None when not asked)
    scheduler: Any = None  # the K=1 run's scheduler (its horizon is set beside the training's length)


@register(
    "loop.scheduler_cadence",
    title="Scheduler steps once per optimizer step",
    description="learning rate and schedule position at each optimizer step are the same with K = 1 and K = 4",
    plot="tropt.plots.loop",
)
def check_scheduler_cadence(setup: Setup, *, steps: int | None = None, k: int = 4,
                            progress: bool = True) -> CheckResult:
    """FAIL when the schedule advances per micro-batch (LR sequence differs between K = 1 and K = ``k``) or more than
    once per optimizer step; WARN when it never moves (fine for a per-epoch scheduler stepped outside the step) or is
    stepped before ``optimizer.step()``.

    Compares, after every optimizer step, the scheduler's position (``last_epoch``) and each group's learning
    rate. ``steps`` defaults to 1 when the scheduler reports its position (decisive on its own), else 2 (3 for a
    learning rate the step sets by hand) so the learning rates can differ. Without a scheduler object the learning
    rate the step writes into ``param_group["lr"]`` (``lr = get_lr(ctx.it)``) is compared the same way; SKIP only
    when it never changes in either run, or without an optimizer. With neither a scheduler nor a step of the user's
    (``tropt.standard_step`` sets no learning rate) the Setup alone decides: SKIP before any step runs. When the runs
    differ, a K=1 run over ``steps * k`` optimizer steps confirms "advanced per micro-batch" (the K run reads every
    K-th of its learning rates).
    """
    if setup.optimizer is None:
        return CheckResult("loop.scheduler_cadence", Status.SKIP,
                           "no optimizer in this Setup (optimizer=None): a hand-written update has no learning rate "
                           "tropt can read, so the schedule cannot be compared")
    setup.validate()
    if steps is not None and steps < 1:
        raise TroptError(f"check_scheduler_cadence needs steps >= 1 (got {steps})", "use steps=2")
    if setup.scheduler is None and setup.uses_standard_step:
        return _no_schedule(k)
    with preserved(setup.model):
        found = _cadence_runs(setup, steps, k)
    if isinstance(found, CheckResult):
        return found
    evidence = _cadence_evidence(found)
    counted = _count_verdict(evidence)
    return _with_horizon(setup, evidence, counted if counted is not None else _schedule_verdict(setup, evidence))


def _with_horizon(setup: Setup, e: _Evidence, result: CheckResult) -> CheckResult:
    """Set the schedule's horizon beside the training's length (``_schedule_horizon``): a schedule stepped once per
    optimizer step but sized in epochs, or one not stepped in the step but sized in optimizer steps, is a WARN
    with both numbers (a PASS becomes it; a FAIL or WARN gains the sentence)."""
    c = e.c
    if c.hand_set or c.plateau or not c.has_position:
        return result
    adv = c.one["advances"]
    per_step = bool(adv) and all(a == 1 for a in adv)
    still = not c.one["moved"] and not c.many["moved"]
    found = horizon_finding(setup, c.scheduler, per_step=per_step) if per_step or still else None
    if found is None:
        return result
    metrics = {**result.metrics, **found.metrics}
    if result.status is Status.PASS:
        return CheckResult(result.check, Status.WARN, f"{result.summary}, but {found.sentence}", metrics,
                           result.tables, [*found.advice, *result.advice], result.series)
    return CheckResult(result.check, result.status, f"{result.summary}; and {found.sentence}", metrics,
                       result.tables, [*result.advice, *found.advice], result.series)


def _no_schedule(k: int) -> CheckResult:
    """The SKIP the Setup alone decides, before any step runs: no scheduler, and tropt.standard_step sets no
    learning rate (a step of the user's may set ``param_group["lr"]`` by hand, so that one is still run)."""
    return CheckResult("loop.scheduler_cadence", Status.SKIP,
                       "no scheduler in this Setup and the step is tropt.standard_step, which sets no learning rate: "
                       "the learning rate stays as the optimizer was built, so there is no schedule to check "
                       "(no step was run)",
                       {"optimizer_steps": 0, "k": k, "schedule": "none"},
                       advice=["To check a schedule, pass it as Setup(scheduler=lambda optimizer: ...); a step that "
                               "sets param_group['lr'] itself goes in as Setup(step=...), and is then compared with "
                               f"K=1 and K={k}."])


def _cadence_runs(setup: Setup, steps: int | None, k: int) -> CheckResult | _Cadence:
    """Run K=1 and K=k (and, when they differ, the runs that tell why); a SKIP or WARN when nothing compares."""
    hand_set = setup.scheduler is None  # a step that writes param_group["lr"] itself (e.g. lr = get_lr(ctx.it))
    first = setup.build(accumulation_steps=1)
    has_position = not math.isnan(_schedule_position(first.scheduler))
    # ReduceLROnPlateau counts metric evaluations: stepping it before optimizer.step() shifts no schedule.
    plateau = isinstance(first.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if setup.uses_standard_step and first.scheduler is not None and needs_metric(first.scheduler):
        return CheckResult("loop.scheduler_cadence", Status.SKIP,
                           f"the scheduler is a {type(first.scheduler).__name__}, which steps on a metric in your "
                           "epoch loop (scheduler.step(val_loss) after validation); tropt.standard_step leaves it "
                           "alone, so there is no per-step schedule to compare",
                           {"scheduler": type(first.scheduler).__name__},
                           advice=["Step it once per validation with the metric it watches; to check a loop that "
                                   "steps it inside the training step, pass that step as Setup(step=...)."])
    if steps is None:
        steps = 1 if has_position else 3 if hand_set else 2
    batches = list(setup.batches(steps))
    if min(setup.size(b) for b in batches) < k:
        raise TroptError(f"batches must hold at least K={k} samples to compare K=1 with K={k}",
                         "use bigger batches or k=2")
    try:
        tags = _tag_lrs(first.optimizer) if hand_set else []
        one = _cadence_run(setup, first, batches, 1)
        written = _untag_lrs(first.optimizer, tags) if hand_set else True
        if hand_set and not written and not _lr_changes(one["lrs"]):
            return _never_set(len(batches), k, one)
        many = _cadence_run(setup, setup.build(accumulation_steps=k), batches, k)
    except _HandUpdate:
        return CheckResult("loop.scheduler_cadence", Status.SKIP,
                           "the step updates the parameters by hand (no optimizer.step()), so no learning rate "
                           "reaches an optimizer to compare", {"observed_at": PARAMETER_CHANGE})
    if hand_set and not (_lr_changes(one["lrs"]) or _lr_changes(many["lrs"])):
        return CheckResult("loop.scheduler_cadence", Status.SKIP,
                           "no scheduler in this Setup and the learning rate never changed over "
                           f"{len(batches)} optimizer steps with K=1 or K={k}: no schedule to check",
                           {"steps": len(batches), "k": k, "runs": f"K=1 and K={k}", "lr_written": True,
                            "optimizer_steps": int(sum(one["calls"]) + sum(many["calls"])),
                            "lr": float(one["lrs"][0, 0]) if len(one["lrs"]) else float("nan")})
    if hand_set and not _same_lrs(one["lrs"], many["lrs"]):
        drifting = _counter_outside_ctx(setup, batches, k, one)
        if drifting is not None:
            return drifting
    faster = None
    if not _same_lrs(one["lrs"], many["lrs"]) and max(one["calls"] + many["calls"]) <= 1:
        faster = _advances_per_micro_batch(setup, many, k)
    schedule = "set by hand in the step" if hand_set else type(first.scheduler).__name__
    return _Cadence(k, len(batches), one, many, hand_set, has_position, plateau, schedule, faster, first.scheduler)


class _Untouched(float):
    """A group's learning rate as tropt left it before the K=1 run: a step that assigns ``group["lr"]`` (by hand, or
    through a scheduler it builds on ctx) replaces this object, even with the same value, so the assignment shows."""


def _tag_lrs(optimizer: Any) -> list:
    """Put an :class:`_Untouched` copy of each group's float learning rate in place; returns what was put there
    (a tensor learning rate stays itself: a write to it changes its value, which the recorded rates show)."""
    tags = []
    for g in optimizer.param_groups:
        lr = g.get("lr")
        if type(lr) is float:
            g["lr"] = lr = _Untouched(lr)
        tags.append(lr)
    return tags


def _untag_lrs(optimizer: Any, tags: list) -> bool:
    """Whether the step assigned any group's learning rate since :func:`_tag_lrs`; puts plain floats back."""
    groups = optimizer.param_groups
    written = len(groups) != len(tags) or any(g.get("lr") is not t for g, t in zip(groups, tags, strict=False))
    for g in groups:
        if type(g.get("lr")) is _Untouched:
            g["lr"] = float(g["lr"])
    return written


def _never_set(steps: int, k: int, one: dict) -> CheckResult:
    """The SKIP a K=1 run alone decides: no scheduler, and the step never assigned a learning rate nor changed one.

    A schedule written by hand (``group["lr"] = get_lr(ctx.it)``) or by a scheduler the step builds assigns the
    group's ``lr`` in every call that sets it, so a K={k} run of a step that assigned none has nothing to compare."""
    return CheckResult(
        "loop.scheduler_cadence", Status.SKIP,
        f"no scheduler in this Setup and the learning rate never changed over {steps} optimizer steps with K=1: the "
        "step never assigned a learning rate (param_group['lr']), so there is no schedule to check (the K="
        f"{k} run was not needed)",
        {"steps": steps, "k": k, "runs": "K=1 only", "lr_written": False,
         "optimizer_steps": int(sum(one["calls"])),
         "lr": float(one["lrs"][0, 0]) if len(one["lrs"]) else float("nan")},
        advice=["To check a schedule, pass it as Setup(scheduler=lambda optimizer: ...), or set param_group['lr'] "
                "in the step (it is then compared with K=1 and K=" f"{k})."])


def _counter_outside_ctx(setup: Setup, batches: list, k: int, one: dict) -> CheckResult | None:
    """A WARN when a second fresh K=1 run differs from the first, else None.

    A counter kept outside ctx (a module-level global) carries over from run to run: a second fresh K=1 run then
    differs from the first, and no comparison between runs means anything.
    """
    again = _cadence_run(setup, setup.build(accumulation_steps=1), batches, 1)["lrs"]
    if _same_lrs(again, one["lrs"]):
        return None
    return CheckResult(
        "loop.scheduler_cadence", Status.WARN,
        "cannot compare the hand-set learning rate: two fresh runs with K=1 step with different learning rates "
        f"({one['lrs'][0, 0]:.3g} vs {again[0, 0]:.3g} at the first step), so the step keeps its schedule state "
        "outside ctx (a module-level counter?) and every run continues where the last one stopped",
        {"steps": len(batches), "k": k, "schedule": "set by hand in the step", "observed_at": "optimizer.step"},
        advice=["Keep the iteration counter on the step context (ctx.it = getattr(ctx, 'it', 0) ... ctx.it += 1), "
                "so every run starts from the same state; then rerun this check."])


def _advances_per_micro_batch(setup: Setup, many: dict, k: int) -> bool:
    """Does the K run's schedule equal the K=1 schedule read every K optimizer steps (advanced per micro-batch)?

    Any offset: a counter read after its per-micro-batch increments lands on every K-th value from K-1.
    """
    m = len(many["lrs"])
    ref = _cadence_run(setup, setup.build(accumulation_steps=1), list(setup.batches(m * k)), 1)["lrs"]
    return any(_same_lrs(ref[o::k][:m], many["lrs"]) for o in range(k))


@dataclass
class _Evidence:
    """The compared schedules and the result's metrics, tables and series, for the verdicts below."""

    c: _Cadence
    metrics: dict
    tables: dict
    series: dict
    same_lr: bool
    same_pos: bool
    n: int  # optimizer steps both runs made

    def result(self, status: Status, summary: str, advice: list[str] | None = None) -> CheckResult:
        return CheckResult("loop.scheduler_cadence", status, summary, self.metrics, self.tables,
                           [*advice, STANDARD_STEP_ADVICE] if advice else [], self.series)


def _cadence_evidence(c: _Cadence) -> _Evidence:
    lr1, pos1, calls1 = c.one["lrs"], c.one["positions"], c.one["calls"]
    lrk, posk, callsk = c.many["lrs"], c.many["positions"], c.many["calls"]
    k, steps = c.k, c.steps
    n = min(len(lr1), len(lrk))
    table = pd.DataFrame({
        "step": np.arange(1, steps + 1),
        "lr_k1": [lr1[i, 0] if i < len(lr1) else np.nan for i in range(steps)],
        f"lr_k{k}": [lrk[i, 0] if i < len(lrk) else np.nan for i in range(steps)],
        "position_k1": pos1, f"position_k{k}": posk,
        "optimizer_steps_k1": calls1, f"optimizer_steps_k{k}": callsk,
    })
    same_lr = len(lr1) == len(lrk) and np.allclose(lr1[:n], lrk[:n], rtol=1e-6, atol=0)
    same_pos = np.allclose(pos1, posk, equal_nan=True)
    max_diff = float(np.max(np.abs(lr1[:n] - lrk[:n]) / np.maximum(np.abs(lr1[:n]), 1e-30))) if n else float("nan")
    metrics = {"steps": steps, "k": k, "position_after_k1": float(pos1[-1]), f"position_after_k{k}": float(posk[-1]),
               "schedule": c.schedule,
               "observed_at": "optimizer.step",
               "optimizer_steps_k1": int(sum(calls1)), f"optimizer_steps_k{k}": int(sum(callsk)),
               "max_lr_rel_diff": max_diff}
    series = {"lr_k1": lr1[:, 0], f"lr_k{k}": lrk[:, 0]}
    return _Evidence(c, metrics, {"schedule": table}, series, same_lr, same_pos, n)


def _count_verdict(e: _Evidence) -> CheckResult | None:
    """What K=1 alone shows (a schedule that never moves, or moves twice per step), and step counts that differ."""
    c, metrics = e.c, e.metrics
    pos1, calls1, callsk, k = c.one["positions"], c.one["calls"], c.many["calls"], c.k
    # A scheduler without last_epoch gives no position; then "moved" is read from the learning rates alone.
    if not c.one["moved"] and not c.many["moved"]:
        opt_steps = int(sum(calls1))
        return e.result(Status.WARN,
                        f"the schedule did not move during {opt_steps} optimizer step{'s' if opt_steps != 1 else ''} "
                        "(position and learning rate unchanged): fine if your epoch loop steps it once per epoch, "
                        "outside the step function; a bug if it is meant to step per optimizer step",
                        ["If the scheduler is meant to advance per optimizer step (warm-up, cosine or linear decay "
                         "over steps), call ctx.scheduler.step() once per optimizer step, right after "
                         "optimizer.step().",
                         "If it is a per-epoch scheduler stepped in your epoch loop, nothing to fix: tropt runs only "
                         "the step function and cannot see that loop."])
    # With K=1 a correct step advances the schedule exactly once per optimizer step.
    adv = c.one["advances"]
    if c.has_position and adv and min(adv) >= 2:
        times = f"{adv[0]:.0f} times" if len(set(adv)) == 1 else f"{min(adv):.0f} to {max(adv):.0f} times"
        metrics["schedule_steps_per_optimizer_step"] = float(np.mean(adv))
        return e.result(Status.FAIL,
                        f"the scheduler is stepped {times} per optimizer step (position {pos1[-1]:.0f} after "
                        f"{sum(calls1)} optimizer step(s) with K=1): the schedule runs that much faster than planned",
                        ["Call scheduler.step() exactly once per optimizer step: look for a second call (a callback, a "
                         "helper, or the epoch loop also stepping it).", _AFTER_OPT])
    # The order within a call shows in the K=1 run alone: found even when K=1 and K=k cannot be compared.
    early = _stepped_early(c, metrics)
    if calls1 != callsk:
        per = [x for x in callsk if x]
        metrics["see_also"] = "loop.accumulation"  # named in the summary by diagnose only when it reports the defect
        return _cannot_compare(e, early,
                               "cannot compare the schedule per optimizer step: optimizer.step() ran "
                               f"{sum(callsk)} times with K={k} but {sum(calls1)} with K=1 over {c.steps} step(s), so "
                               "the step does not run the optimizer once per call"
                               f"{' (once per micro-batch?)' if per and max(per) == k else ''}",
                               [f"Call optimizer.step() once per call of the step function, after the backward of the "
                                f"last of the {k} micro-batches; then rerun this check.", _AFTER_OPT])
    note = steps_per_call_note(calls1 + callsk)
    if note is not None:
        metrics.update(optimizer_steps_per_call=int(max(calls1 + callsk)), see_also="loop.accumulation")
        return _cannot_compare(e, early, f"cannot compare the schedule per optimizer step: {note}",
                               ["Call optimizer.step() exactly once per call of step(ctx, micro_batches); then rerun "
                                "this check."])
    return None


def _cannot_compare(e: _Evidence, early: tuple[str, list[str]] | None, why: str, advice: list[str]) -> CheckResult:
    """The WARN for runs that cannot be compared; led by a scheduler stepped before the optimizer when K=1 shows
    one."""
    if early is None:
        return e.result(Status.WARN, why, advice)
    sentence, early_advice = early
    return e.result(Status.WARN, f"{sentence}; and {why}", [*early_advice, *advice])


def _stepped_early(c: _Cadence, metrics: dict) -> tuple[str, list[str]] | None:
    """From the K=1 run alone: the scheduler stepped before ``optimizer.step()`` within a call (the first update
    already uses the schedule's second learning rate); the sentence and advice, or None. Adds the learning rates to
    ``metrics``."""
    early = next(((d, used, planned) for d, used, planned in c.one["early"]
                  if (c.has_position and d > 0) or not math.isclose(used, planned, rel_tol=1e-9)), None)
    if early is None or c.plateau or c.hand_set:  # a hand-set LR is written before the step on purpose
        return None
    _, used, planned = early
    metrics.update(lr_at_optimizer_step=float(used), lr_planned=float(planned))
    return (f"the scheduler is stepped before optimizer.step(): the optimizer steps with learning rate {used:.3g} "
            f"where the schedule's value for that step is {planned:.3g}, so every update uses the next step's "
            "learning rate (the schedule's first value is skipped)",
            [f"Move ctx.scheduler.step() after optimizer.step() (PyTorch's order since 1.1). {_AFTER_OPT}"])


def _schedule_verdict(setup: Setup, e: _Evidence) -> CheckResult:
    """The schedules themselves: K=1 vs K=k, then the order of scheduler and optimizer steps within a call."""
    c, metrics, n, k, faster = e.c, e.metrics, e.n, e.c.k, e.c.faster
    lr1, pos1, lrk, posk = c.one["lrs"], c.one["positions"], c.many["lrs"], c.many["positions"]
    if c.hand_set and not e.same_lr:
        first_diff = next((i for i in range(n) if not np.allclose(lr1[i], lrk[i], rtol=1e-6, atol=0)), n)
        metrics.update(first_differing_step=first_diff + 1, per_micro_batch_confirmed=bool(faster))
        where = (f"at optimizer step {first_diff + 1} the learning rate is {lr1[first_diff, 0]:.3g} with K=1 but "
                 f"{lrk[first_diff, 0]:.3g} with K={k}" if first_diff < n
                 else "the runs made different numbers of steps")
        cause = (f"{where}; the K={k} learning rates are the K=1 schedule read every {k} steps, so the counter that "
                 "sets the learning rate (e.g. ctx.it) advances per micro-batch, not per optimizer step" if faster
                 else f"{where} (the hand-set learning rate depends on how the batch is split)")
        return latent_when_unused(setup, e.result(
            Status.FAIL, f"the hand-set learning-rate schedule depends on accumulation: {cause}",
            ["Advance the iteration counter that sets the learning rate once per optimizer step (after "
             "optimizer.step()), not once per micro-batch; a warm-up of W steps otherwise ends after W/K optimizer "
             "steps."]))
    if not (e.same_lr and e.same_pos):
        per_micro = bool(faster) or (pos1[-1] > 0 and abs(posk[-1] / pos1[-1] - k) < 0.5)
        metrics["per_micro_batch_confirmed"] = bool(faster)
        times = f"{k}" if faster or not pos1[-1] > 0 else f"{posk[-1] / pos1[-1]:.0f}"
        cause = (f"it advances {times}× faster with K={k}: the scheduler is stepped per micro-batch" if per_micro
                 else f"the learning rates differ between K=1 and K={k} (positions {pos1[-1]:.0f} vs {posk[-1]:.0f} "
                      f"after {c.steps} step{'' if c.steps == 1 else 's'})")
        return latent_when_unused(setup, e.result(
            Status.FAIL, f"the schedule depends on accumulation: {cause}",
            ["Call scheduler.step() once per optimizer step (after optimizer.step()), not once per micro-batch; "
             "a warm-up of W steps otherwise ends after W/K optimizer steps."]))
    # Stepped before optimizer.step(): the first update already uses the schedule's second learning rate.
    early = _stepped_early(c, metrics)
    if early is not None:
        return e.result(Status.WARN, *early)
    if c.hand_set:
        return e.result(Status.PASS, f"the hand-set learning rate advances once per optimizer step: same learning "
                                     f"rates with K=1 and K={k} over {c.steps} optimizer steps")
    return e.result(Status.PASS,
                    f"the schedule advances once per optimizer step: same learning rates and positions with K=1 and "
                    f"K={k}")
