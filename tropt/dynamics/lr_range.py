"""``dynamics.lr_range``: the learning-rate range test, with several suggestions and how much they agree.

An exponential LR sweep on a copy of the Setup (its own step, accumulation and data order), stopped once a
bias-corrected EMA of the loss exceeds ``stop_factor`` × its best. The suggestions are read from a centred running
median of the losses afterwards: unlike the EMA it has no lag (an EMA with fastai's beta of 0.98 trails a 100-step
sweep by half of it) and one lucky or spiky batch does not move it. Instead of one argmin
suggestion (which users of Lightning's and torch-lr-finder's finders report as unreliable) it gives three —
steepest descent of the smoothed loss against log-LR, fastai's "valley", and the minimum / 10 — repeated over
seeds for a noise estimate, and says how far apart they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..core.capture import group_lr
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ._held_schedule import held_schedulers
from .lr_suggest import METHODS, centred_median, ema_smooth, suggest  # noqa: F401 - ema_smooth: public here before

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "dynamics.lr_range"
SETTLE_MARGIN = 3.0  # one sweep settles the verdict when the Setup's LR is this factor from the tolerance band's edge


@dataclass(frozen=True)
class _Plan:
    """What every sweep of one run shares: the planned learning rates and when to stop."""

    lrs: np.ndarray
    num_steps: int
    repeats: int
    beta: float
    stop_factor: float
    callback: Any
    min_drop: float = 0.05
    settle: bool = True


def _validate(start_lr: float, end_lr: float, num_steps: int, repeats: int, beta: float) -> None:
    if not (0 < start_lr < end_lr) or not math.isfinite(end_lr):
        raise TroptError(f"start_lr={start_lr!r}, end_lr={end_lr!r}; the sweep needs 0 < start_lr < end_lr < inf",
                         "use e.g. start_lr=1e-7, end_lr=10")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 10:
        raise TroptError(f"num_steps={num_steps!r}; the sweep needs an integer >= 10", "use e.g. num_steps=100")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise TroptError(f"repeats={repeats!r}; it must be an integer >= 1", "use repeats=1 for a single sweep")
    if not (0 <= beta < 1):
        raise TroptError(f"beta={beta!r}; the EMA factor must be in [0, 1)", "use e.g. beta=0.98")


def _lr_set_by_step(stepped: float, swept: float) -> CheckResult:
    return CheckResult(
        CHECK_ID, Status.SKIP,
        f"the step sets the learning rate itself (the optimizer stepped with {stepped:.3g} where the "
        f"sweep set {swept:.3g}), so a sweep cannot control it",
        {"lr_set_by_sweep": swept, "lr_at_optimizer_step": stepped},
        advice=["Run the sweep in your own loop (set the learning rate schedule to an exponential ramp), "
                "or make the step read its peak learning rate from the optimizer's param group."])


def _no_lr_to_sweep(optimizer: Any) -> CheckResult | None:
    """A SKIP when a param group holds no learning rate the sweep can set (e.g. Adafactor's relative step), else None.

    A group with ``relative_step=True`` derives its step size itself and ignores ``group["lr"]``; any other group
    whose rate :func:`tropt.core.capture.group_lr` cannot read (``lr=None``, a schedule object) has none to set.
    """
    for i, g in enumerate(optimizer.param_groups):
        relative = g.get("relative_step") is True
        if not relative and math.isfinite(group_lr(optimizer, g)):
            continue
        why = ("relative_step=True: it derives its own step size from the step count and ignores the group's lr"
               if relative else "no number the sweep could set or read")
        return CheckResult(
            CHECK_ID, Status.SKIP,
            f"the optimizer ({type(optimizer).__name__}) has no learning rate to sweep: param group {i} holds "
            f"lr={g.get('lr')!r} with {why}",
            {"optimizer": type(optimizer).__name__, "group": i, "lr": repr(g.get("lr")), "relative_step": relative},
            advice=["Pass an optimizer with an explicit lr to sweep it (e.g. Adafactor(relative_step=False, "
                    "scale_parameter=False, warmup_init=False, lr=1e-3), or AdamW); Adafactor(relative_step=True) "
                    "sets its own step size, so there is no learning rate to tune."])
    return None


def _ramp(plan: _Plan, sweep_setup: Any, ctx: Any, runner: Any, ratios: list[float], stepped_at: list[float],
          seed: int, r: int, bar: Any) -> tuple[list[float], list[float], str] | CheckResult:
    """One sweep's (losses, learning rates, why it stopped) up to where it stops; a SKIP when the step sets its own
    LR."""
    raw: list[float] = []
    used: list[float] = []
    best, avg, beta = math.inf, 0.0, plan.beta
    rise = _RiseWatch(plan)
    for i, batch in enumerate(sweep_setup.batches(plan.num_steps, seed=seed)):
        lr = float(plan.lrs[i])
        for g, ratio in zip(ctx.optimizer.param_groups, ratios):
            g["lr"] = lr * ratio
        seen = len(stepped_at)
        loss = runner.step(ctx.split(batch, ctx.accumulation_steps))
        # Only a step taken in this call counts (a GradScaler skips steps on inf gradients).
        if len(stepped_at) > seen and not math.isclose(stepped_at[-1], lr * ratios[0], rel_tol=1e-6):
            return _lr_set_by_step(stepped_at[-1], lr * ratios[0])
        bar.update(1)
        if plan.callback is not None:
            plan.callback({"check": CHECK_ID, "step": r * plan.num_steps + i + 1,
                           "total": plan.num_steps * plan.repeats, "repeat": r, "lr": lr,
                           "loss": None if loss is None else float(loss)})
        if loss is None:
            continue
        value = float(loss)
        raw.append(value)
        used.append(lr)
        if not math.isfinite(value):
            break
        avg = beta * avg + (1 - beta) * value
        smooth_now = avg / (1 - beta ** len(raw))
        best = min(best, smooth_now)
        if len(raw) > 1 and smooth_now > plan.stop_factor * best:
            rise.why = f"the smoothed loss passed {plan.stop_factor:g}x its best"
            break
        if plan.settle and rise.past_minimum(raw):
            break
    rise.why = rise.why or ("a non-finite loss" if raw and not math.isfinite(raw[-1]) else "the end of the sweep")
    return raw, used, rise.why


class _RiseWatch:
    """The sweep's sequential stop: once the running median of the last ``window`` losses has fallen below the
    median of the first ``window`` (by ``min_drop`` and by more than their noise) and then risen back above that start
    by more than the noise, the loss has diverged past its minimum and the rest of the sweep cannot move the
    suggestions (they are all read at or before the minimum).

    The noise is that of the first window's losses (at LRs too small to train, the batches' own spread): the standard
    error of a difference of two medians of ``window`` losses, times ``SIGNIFICANCE``. The lag-free median decides
    where the bias-corrected EMA (beta 0.98 trails a 100-step sweep by half of it) would run on for tens of steps."""

    SIGNIFICANCE = 3.0

    def __init__(self, plan: _Plan) -> None:
        self.window = max(5, plan.num_steps // 10) | 1
        self.min_drop = plan.min_drop
        self.best = math.inf
        self.why = ""

    def past_minimum(self, raw: list[float]) -> bool:
        w = self.window
        if len(raw) < 2 * w:
            return False
        head = np.asarray(raw[:w])
        start, now = float(np.median(head)), float(np.median(raw[-w:]))
        self.best = min(self.best, now)
        mad = 1.4826 * float(np.median(np.abs(head - start)))
        noise = self.SIGNIFICANCE * 1.2533 * mad * math.sqrt(2 / w)
        fell = start - self.best
        if fell > max(self.min_drop * abs(start), noise) and now - start > noise:
            self.why = (f"the loss rose back above its start ({now:.3g} > {start:.3g}, medians of {w} steps; noise "
                        f"{noise:.2g}) after falling {fell / abs(start):.0%}")
            return True
        return False


def _sweep(setup: Setup, sweep_setup: Any, plan: _Plan, r: int,
           bar: Any) -> tuple[dict[str, Any], list[float], str | None] | CheckResult:
    """Sweep ``r`` on a fresh copy: (its record, the copy's group LRs, where its losses came from), or a SKIP."""
    from ..core.stepping import StepRunner

    seed = setup.seed + r
    ctx = sweep_setup.build(seed=seed)
    if setup.scheduler is not None:
        held_schedulers(setup, ctx)
    unsweepable = _no_lr_to_sweep(ctx.optimizer)
    if unsweepable is not None:
        return unsweepable
    group_lrs = [group_lr(ctx.optimizer, g) for g in ctx.optimizer.param_groups]
    ref = group_lrs[0] if group_lrs[0] > 0 else (max(group_lrs) or 1.0)
    ratios = [g / ref for g in group_lrs]
    runner = StepRunner(sweep_setup, ctx)
    stepped_at: list[float] = []  # group 0's LR at each optimizer.step(): a step that sets its own LR shows here
    handle = ctx.optimizer.register_step_pre_hook(lambda o, a, k: stepped_at.append(group_lr(o, o.param_groups[0])))
    try:
        ramp = _ramp(plan, sweep_setup, ctx, runner, ratios, stepped_at, seed, r, bar)
    finally:
        handle.remove()
    if isinstance(ramp, CheckResult):
        return ramp
    raw, used, why = ramp
    raw_arr = np.asarray(raw)
    finite = np.isfinite(raw_arr)
    n_ok = int(np.argmin(finite)) if not finite.all() else raw_arr.size
    smooth = centred_median(raw_arr[:n_ok], max(5, plan.num_steps // 10) | 1)
    lrs_used = np.asarray(used[:n_ok])
    record = {"seed": seed, "lr": lrs_used, "raw": raw_arr[:n_ok], "smooth": smooth, "steps": len(raw),
              "suggest": suggest(lrs_used, smooth, skip_start=max(1, plan.num_steps // 10)),
              "stopped_at": float(used[-1]) if used else math.nan, "stopped_by": why}
    return record, group_lrs, runner.source


@register(CHECK_ID, title="Learning-rate range test",
          description="Sweep the LR exponentially on a copy; suggest a range (steepest, valley, min/10 over seeds) "
                      "and compare the Setup's LR.",
          budgets={'quick': {'num_steps': 60, 'repeats': 1},
                   'thorough': {'num_steps': 200, 'repeats': 3, 'settle': False}},
          plot="tropt.plots.dynamics")
def check_lr_range(
    setup: Setup,
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 100,
    beta: float = 0.98,
    stop_factor: float = 4.0,
    repeats: int = 2,
    tolerance: float = 10.0,
    inconclusive: float = 100.0,
    min_drop: float = 0.05,
    settle: bool = True,
    progress: bool = True,
    callback: Any = None,
) -> CheckResult:
    """LR range test on a copy of the Setup.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`. Never modified: the sweep runs on a fresh copy inside
        :func:`tropt.snapshot.preserved` (parameters, modes, hooks and RNG states restored even on errors).
    start_lr, end_lr
        Ends of the exponential sweep; at step i the LR is start·(end/start)^(i/(num_steps-1)).
    num_steps
        Optimizer steps per sweep (each respects ``accumulation_steps`` and uses the Setup's own step).
    beta
        EMA factor of the bias-corrected smoothing that decides when to stop.
    stop_factor
        Stop a sweep once the smoothed loss exceeds this multiple of its best (or the loss is not finite).
    repeats
        Sweeps with different seeds (data order, dropout); the spread of their suggestions is the noise estimate.
    tolerance
        WARN when the Setup's LR is more than this factor outside the suggested range.
    inconclusive
        WARN, with no range, when the three suggestions are more than this factor apart.
    min_drop
        WARN, with no range, when no sweep's smoothed loss fell by more than this fraction of its start.
    settle
        The sequential tests (``metrics["stopped_by"]`` and ``["settled"]`` say which decided): a sweep stops once
        its running median has fallen by ``min_drop`` and risen back above its start (diverged past its minimum),
        and the further seeds are not run when the first sweep's verdict is clear by a factor
        ``SETTLE_MARGIN`` (the Setup's LR that far inside, or outside, the tolerance band of a range whose methods
        agree within 10x). False runs every sweep to ``stop_factor`` and every seed.
    progress
        Show a progress bar.
    callback
        Optional ``callback({"check", "step", "total", "repeat", "lr", "loss"})`` after each step of each sweep
        (live displays); raising :class:`tropt.errors.Cancelled` in it stops the run.

    Notes
    -----
    The sweep sets the LR of every param group each step, keeping the user's ratios between groups (the
    reported LR is group 0's). The Setup's scheduler would fight the sweep, so it is not built; a step function
    that calls ``ctx.scheduler.step()`` (or any other method of its scheduler: timm's ``step_update``) gets a
    stand-in that leaves the LR alone.
    """
    from tqdm.auto import tqdm

    from ..snapshot import preserved

    _validate(start_lr, end_lr, num_steps, repeats, beta)
    if setup.optimizer is None:
        return CheckResult(CHECK_ID, Status.SKIP, "no optimizer in this Setup (optimizer=None): the sweep sets the "
                           "optimizer's learning rate, which a hand-written update does not read",
                           advice=["To sweep the learning rate of a hand-written update, give it an optimizer "
                                   "(torch.optim.SGD does p -= lr * grad) or run the sweep in your own loop."])
    setup.validate()
    sweep_setup = setup.replace(scheduler=None)
    plan = _Plan(start_lr * (end_lr / start_lr) ** (np.arange(num_steps) / (num_steps - 1)), num_steps, repeats,
                 beta, stop_factor, callback, min_drop, settle)
    sweeps: list[dict[str, Any]] = []
    group_lrs: list[float] = []
    loss_from = None
    with preserved(setup.model):
        bar = tqdm(total=num_steps * repeats, desc=CHECK_ID, disable=not progress, leave=False)
        try:
            for r in range(repeats):
                done = _sweep(setup, sweep_setup, plan, r, bar)
                if isinstance(done, CheckResult):
                    return done
                record, group_lrs, loss_from = done
                sweeps.append(record)
                settled = _one_sweep_settles(sweeps, group_lrs, tolerance, min_drop) if settle and r == 0 else None
                if settled and repeats > 1:
                    sweeps[0]["settled"] = settled
                    break
        finally:
            bar.close()
    result = _result(setup, sweeps, group_lrs, num_steps, tolerance, inconclusive, min_drop, stop_factor, loss_from)
    result.metrics.update(sweeps_planned=repeats, stopped_by="; ".join(s["stopped_by"] for s in sweeps),
                          settled=sweeps[0].get("settled", "no: every planned sweep ran") if sweeps else "no")
    if sweeps and "settled" in sweeps[0]:
        result.metrics["seed_spread_x"] = math.nan
        result.metrics["seed_note"] = (f"one sweep settled the verdict ({sweeps[0]['settled']}); the other "
                                       f"{repeats - 1} seed(s) were not run, so there is no seed-noise estimate")
    return result


def _one_sweep_settles(sweeps: list[dict], group_lrs: list[float], tolerance: float, min_drop: float) -> str | None:
    """Why the first sweep alone settles the verdict, or None: its loss fell clearly (twice ``min_drop``), its methods
    agree within 10x, and the Setup's LR lies ``SETTLE_MARGIN`` times inside (or outside) the tolerance band.

    A second seed moves the suggestions by its seed noise; the band's edge is then a factor ``SETTLE_MARGIN`` away, so
    only a seed spread beyond that (which the full test would report as unreliable anyway) could change the verdict.
    """
    s = sweeps[0]
    smooth = s["smooth"]
    if not smooth.size or not smooth[0]:
        return None
    drop = float(smooth[0] - np.min(smooth)) / abs(float(smooth[0]))
    vals = [v for v in s["suggest"].values() if math.isfinite(v) and v > 0]
    setup_lr = float(group_lrs[0]) if group_lrs else math.nan
    if drop < 2 * min_drop or len(vals) < 2 or not (math.isfinite(setup_lr) and setup_lr > 0):
        return None
    low, high = min(vals), max(vals)
    if high / low > 10:
        return None
    inside = min(setup_lr * tolerance / low, high * tolerance / setup_lr)
    if inside >= SETTLE_MARGIN:
        return f"the Setup's LR {setup_lr:.2g} lies {inside:.0f}x inside the tolerance band of {low:.2g}-{high:.2g}"
    outside = max(low / (setup_lr * tolerance), setup_lr / (high * tolerance))
    if outside >= SETTLE_MARGIN:
        return f"the Setup's LR {setup_lr:.2g} lies {outside:.0f}x outside the tolerance band of {low:.2g}-{high:.2g}"
    return None


def _suggestion_tables(sweeps: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    """(per-seed suggestions, their geometric mean and spread per method, the mean per method that has one)."""
    rows = []
    for s in sweeps:
        for m in METHODS:
            rows.append({"method": m, "seed": s["seed"], "lr": s["suggest"][m]})
    table = pd.DataFrame(rows, columns=["method", "seed", "lr"])
    agg_rows = []
    per_method: dict[str, float] = {}
    for m in METHODS:
        lr = table["lr"].astype(float)
        vals = table.loc[(table["method"] == m) & np.isfinite(lr) & (table["lr"] > 0), "lr"].astype(float)
        if vals.empty:
            agg_rows.append({"method": m, "lr": math.nan, "seed_spread_x": math.nan, "sweeps": 0})
            continue
        logs = np.log10(vals.to_numpy())
        per_method[m] = float(10 ** np.mean(logs))
        agg_rows.append({"method": m, "lr": per_method[m], "seed_spread_x": float(10 ** (logs.max() - logs.min())),
                         "sweeps": int(vals.size)})
    return table, pd.DataFrame(agg_rows, columns=["method", "lr", "seed_spread_x", "sweeps"]), per_method


def _evidence(setup: Setup, sweeps: list[dict], setup_lr: float, num_steps: int, stop_factor: float,
              loss_from: str | None, per_method: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, series) of a run's sweeps."""
    metrics: dict[str, Any] = {
        "setup_lr": setup_lr,
        "sweeps": len(sweeps),
        "steps_per_sweep": int(np.median([s["steps"] for s in sweeps])) if sweeps else 0,
        "planned_steps": num_steps,
        "stop_factor": stop_factor,
        "loss_from": loss_from or "none",
    }
    if setup.scheduler is not None:
        metrics["note"] = "the Setup's scheduler was held still during the sweep; setup_lr is the optimizer's base LR"
    for m, v in per_method.items():
        metrics[f"suggested_{m}"] = v
    series: dict[str, Any] = {}
    for s in sweeps:
        series[f"lr_seed{s['seed']}"] = s["lr"]
        series[f"loss_seed{s['seed']}"] = s["raw"]
        series[f"smoothed_seed{s['seed']}"] = s["smooth"]
    return metrics, series


def _methods_text(per_method: dict[str, float]) -> str:
    return (f"steepest {per_method.get('steepest', math.nan):.2g}, valley {per_method.get('valley', math.nan):.2g}, "
            f"min/10 {per_method.get('min_div_10', math.nan):.2g}")


def _result(setup: Setup, sweeps: list[dict], group_lrs: list[float], num_steps: int, tolerance: float,
            inconclusive: float, min_drop: float, stop_factor: float, loss_from: str | None) -> CheckResult:
    table, suggestions, per_method = _suggestion_tables(sweeps)
    setup_lr = float(group_lrs[0]) if group_lrs else math.nan
    metrics, series = _evidence(setup, sweeps, setup_lr, num_steps, stop_factor, loss_from, per_method)
    tables = {"suggestions": suggestions, "per_seed": table}
    if sweeps:
        s0 = sweeps[0]
        tables["sweep"] = pd.DataFrame({"lr": s0["lr"], "loss": s0["raw"], "smoothed": s0["smooth"]})

    best_drop = max((float(s["smooth"][0] - np.min(s["smooth"])) / abs(float(s["smooth"][0]))
                     if s["smooth"].size and s["smooth"][0] else 0.0) for s in sweeps) if sweeps else 0.0
    metrics["best_relative_drop"] = best_drop
    if not per_method or best_drop < min_drop:
        # A sweep whose loss never fell by more than its noise holds no information on where learning starts.
        return CheckResult(CHECK_ID, Status.WARN,
                           f"no learning rate in the sweep lowered the loss by more than {min_drop:.0%} (best "
                           f"relative drop {best_drop:.1%} over {metrics['steps_per_sweep']} steps); no range can be "
                           "read from it", metrics, tables,
                           ["Check that the model can learn at all (model.overfit_batch, model.gradient_flow).",
                            "Give the sweep more steps (num_steps=300) so that learning shows before the LR grows too "
                            "large, or widen it (start_lr / end_lr)."], series)
    vals = np.array(list(per_method.values()))
    low, high = float(vals.min()), float(vals.max())
    agreement = high / low
    # Sweeps that saw the same batches from the same weights (no shuffling, no dropout) are identical: their
    # "spread" of 1x would be no evidence of stability, so it is not reported as one.
    identical = len(sweeps) > 1 and all(s["raw"].shape == sweeps[0]["raw"].shape
                                        and np.array_equal(s["raw"], sweeps[0]["raw"]) for s in sweeps[1:])
    spread = math.nan if identical else float(np.nanmax(suggestions["seed_spread_x"].to_numpy(dtype=float)))
    metrics.update(suggested_low=low, suggested_high=high, agreement_x=agreement, seed_spread_x=spread)
    if identical:
        suggestions["seed_spread_x"] = math.nan
        metrics["seed_note"] = ("the sweeps were identical (the data order and the model do not depend on the seed), "
                                "so there is no seed-noise estimate")
    # the range a user should try: the suggestions' span (their geometric middle when they coincide)
    within = low / tolerance <= setup_lr <= high * tolerance if math.isfinite(setup_lr) and setup_lr > 0 else False
    metrics["setup_lr_in_range"] = "yes" if within else "no"
    if agreement > inconclusive:
        # Suggestions orders of magnitude apart mean the sweep's loss is too noisy (or too flat) to locate a range.
        summary = (f"inconclusive: the suggestions span {agreement:.0f}× ({low:.2g}–{high:.2g}; "
                   f"{_methods_text(per_method)}), too far apart to suggest a range; the Setup's LR is {setup_lr:.2g}")
        return CheckResult(CHECK_ID, Status.WARN, summary, metrics, tables,
                           ["The sweep's loss is too noisy to read: use larger batches for the test, more steps "
                            "(num_steps=300) or heavier smoothing (beta=0.99), then rerun.",
                            "Compare a few short runs at LRs a factor 3 apart instead (dynamics.loss_curve)."], series)
    agree_text = (f"the methods agree within {agreement:.1f}×" if agreement <= 10
                  else f"the methods span {agreement:.0f}× (treat the range as rough)")
    summary = (f"suggested LR {low:.2g}–{high:.2g} ({_methods_text(per_method)}); {agree_text}; "
               f"the Setup's LR is {setup_lr:.2g}")
    advice: list[str] = []
    if within:
        status = Status.PASS
    else:
        status = Status.WARN
        direction = "lower" if setup_lr > high * tolerance else "higher"
        summary += f", more than {tolerance:g}× outside that range"
        advice.append(f"Try a {direction} learning rate, between {low:.2g} and {high:.2g} (geometric middle "
                      f"{math.sqrt(low * high):.2g}), and confirm with a short run (dynamics.loss_curve).")
    if spread > 10:
        advice.append("The suggestions moved more than 10× between seeds: run more repeats or steps before "
                      "trusting them.")
    return CheckResult(CHECK_ID, status, summary, metrics, tables, advice, series)
