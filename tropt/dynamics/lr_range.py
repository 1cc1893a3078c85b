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

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "dynamics.lr_range"
METHODS = ("steepest", "valley", "min_div_10")


class _HeldScheduler:
    """Stands in for the user's scheduler during the sweep: a step function may call ``ctx.scheduler.step()``
    without moving the swept learning rate."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return [group_lr(self.optimizer, g) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def ema_smooth(losses: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected exponential moving average (as in Adam / fastai): unbiased from the first value on."""
    out = np.empty(len(losses))
    avg = 0.0
    for i, v in enumerate(losses):
        avg = beta * avg + (1 - beta) * v
        out[i] = avg / (1 - beta ** (i + 1))
    return out


def centred_median(values: np.ndarray, window: int) -> np.ndarray:
    """Running median over ``window`` points centred on each point (shrinking at the ends)."""
    n, half = len(values), window // 2
    return np.array([np.median(values[max(0, i - half): i + half + 1]) for i in range(n)]) if n else np.empty(0)


def _window_slopes(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """Least-squares slope of y against x over every window of m consecutive points (O(n) with cumulative sums)."""
    def window_sum(v: np.ndarray) -> np.ndarray:
        c = np.concatenate(([0.0], np.cumsum(v)))
        return c[m:] - c[:-m]

    sx, sy, sxx, sxy = window_sum(x), window_sum(y), window_sum(x * x), window_sum(x * y)
    var = sxx - sx * sx / m
    return np.where(var > 0, (sxy - sx * sy / m) / np.where(var > 0, var, 1.0), 0.0)


def suggest(lrs: np.ndarray, smooth: np.ndarray, skip_start: int = 0) -> dict[str, float]:
    """The three suggestions on one smoothed sweep (NaN when the curve gives none).

    ``steepest``: the most negative slope of the smoothed loss against log10(lr), before the minimum.
    ``valley``: fastai's valley — the longest run of decreasing loss, two thirds down it.
    ``min_div_10``: the LR of the smoothed minimum, divided by 10.

    The first ``skip_start`` points are left out of the minimum: the bias-corrected EMA rests on only a few losses
    there, so one lucky first batch would otherwise be "the minimum" at the smallest LR.
    """
    out = {m: math.nan for m in METHODS}
    n = len(smooth)
    if n < 5:
        return out
    skip = min(skip_start, n - 3)
    i_min = skip + int(np.nanargmin(smooth[skip:]))
    out["min_div_10"] = float(lrs[i_min] / 10)
    lo = min(skip_start, max(0, i_min - 2))
    if i_min - lo >= 2:
        # Least-squares slope over windows of a fifth of the sweep: a point-wise gradient of a noisy loss finds its
        # steepest "descent" in the noise at LRs far too small to learn anything.
        m = min(max(3, n // 5), i_min - lo + 1)
        slopes = _window_slopes(np.log10(lrs[lo:i_min + 1]), smooth[lo:i_min + 1], m)
        out["steepest"] = float(lrs[lo + int(np.argmin(slopes)) + m // 2])
    # fastai valley: longest decreasing subsequence (O(n^2) with n <= a few hundred)
    lds = np.ones(n, dtype=np.int64)
    max_start = max_end = 0
    for i in range(1, n):
        prev = lds[:i][smooth[i] < smooth[:i]]
        if prev.size:
            lds[i] = prev.max() + 1
        if lds[max_end] < lds[i]:
            max_end = i
            max_start = max_end - lds[max_end]
    sections = (max_end - max_start) / 3
    idx = max_start + int(sections) + int(sections / 2)
    if max_end > max_start:
        out["valley"] = float(lrs[min(idx, n - 1)])
    return out


@dataclass(frozen=True)
class _Plan:
    """What every sweep of one run shares: the planned learning rates and when to stop."""

    lrs: np.ndarray
    num_steps: int
    repeats: int
    beta: float
    stop_factor: float
    callback: Any


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
          seed: int, r: int, bar: Any) -> tuple[list[float], list[float]] | CheckResult:
    """One sweep's (losses, learning rates) up to where it stops; a SKIP when the step sets its own LR."""
    raw: list[float] = []
    used: list[float] = []
    best, avg, beta = math.inf, 0.0, plan.beta
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
            break
    return raw, used


def _sweep(setup: Setup, sweep_setup: Any, plan: _Plan, r: int,
           bar: Any) -> tuple[dict[str, Any], list[float], str | None] | CheckResult:
    """Sweep ``r`` on a fresh copy: (its record, the copy's group LRs, where its losses came from), or a SKIP."""
    from ..core.stepping import StepRunner

    seed = setup.seed + r
    ctx = sweep_setup.build(seed=seed)
    if setup.scheduler is not None:
        ctx.scheduler = _HeldScheduler(ctx.optimizer)
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
    raw, used = ramp
    raw_arr = np.asarray(raw)
    finite = np.isfinite(raw_arr)
    n_ok = int(np.argmin(finite)) if not finite.all() else raw_arr.size
    smooth = centred_median(raw_arr[:n_ok], max(5, plan.num_steps // 10) | 1)
    lrs_used = np.asarray(used[:n_ok])
    record = {"seed": seed, "lr": lrs_used, "raw": raw_arr[:n_ok], "smooth": smooth, "steps": len(raw),
              "suggest": suggest(lrs_used, smooth, skip_start=max(1, plan.num_steps // 10)),
              "stopped_at": float(used[-1]) if used else math.nan}
    return record, group_lrs, runner.source


@register(CHECK_ID, title="Learning-rate range test",
          description="Sweep the LR exponentially on a copy; suggest a range (steepest, valley, min/10 over seeds) "
                      "and compare the Setup's LR.",
          budgets={'quick': {'num_steps': 60, 'repeats': 1}, 'thorough': {'num_steps': 200, 'repeats': 3}},
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
    progress
        Show a progress bar.
    callback
        Optional ``callback({"check", "step", "total", "repeat", "lr", "loss"})`` after each step of each sweep
        (live displays); raising :class:`tropt.errors.Cancelled` in it stops the run.

    Notes
    -----
    The sweep sets the LR of every param group each step, keeping the user's ratios between groups (the
    reported LR is group 0's). The Setup's scheduler would fight the sweep, so it is not built; a step function
    that calls ``ctx.scheduler.step()`` gets a stand-in that leaves the LR alone.
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
                 beta, stop_factor, callback)
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
        finally:
            bar.close()
    return _result(setup, sweeps, group_lrs, num_steps, tolerance, inconclusive, min_drop, stop_factor, loss_from)


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
