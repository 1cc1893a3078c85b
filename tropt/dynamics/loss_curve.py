"""``dynamics.loss_curve``: is training diverging, flat, unstable, noisy late, overfitting or budget-bound?

Works on a short run of a :class:`tropt.Setup` (:func:`check_loss_curve`) and on curves a user already has
(:func:`diagnose_curves`: arrays, DataFrames, CSV files, TensorBoard / CSV-logger exports).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..core.schedule_guard import hold_schedules_at_end
from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ._probe import _checkpoints, _epoch_length, _epoch_means, _Probe, _ProbePlan, _run_probe
from .curves import FAIL_CLASSES, MIN_POINTS, CurveDiagnosis, CurveThresholds, classify_curve
from .logs import read_curve

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "dynamics.loss_curve"
SETTLING_FAILS = frozenset({"diverging", "non_finite"})  # FAIL classes a checkpoint may settle (see _Settled)
WARM_UP_RISE = 1.5  # a flat curve whose last LR is above this times the midpoint's LR is still warming up

_LABEL = {
    "non_finite": "non-finite loss",
    "diverging": "diverging",
    "flat": "flat",
    "unstable": "unstable",
    "noisy_late": "noisy late in training",
    "not_generalising": "the model learns nothing that generalises",
    "overfitting": "overfitting",
    "still_improving": "still improving at the end",
    "healthy": "healthy",
}


def _g(x: float) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and math.isfinite(x) else str(x)


def _n(count: Any, noun: str) -> str:
    """``1 spike``, ``2 spikes``."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _step(x: float) -> str:
    # int(): under numpy 1.x, round() of a numpy float returns a numpy float ("3.0", not "3")
    return str(int(round(x))) if math.isfinite(x) else str(x)  # noqa: RUF046


def _clip_advice(m: dict) -> str:
    if "grad_norm_p90" in m:
        return (f"Clip gradients at about {_g(m['grad_norm_p90'])} (the 90th percentile of the observed gradient "
                "norms): torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).")
    return ("Clip gradients at about the 90th percentile of the gradient norms you observe "
            "(torch.nn.utils.clip_grad_norm_).")


def _describe(cls: str, m: dict) -> str:
    if cls == "non_finite":
        if m.get("non_finite"):
            return (f"the loss became non-finite at step {_step(m['first_non_finite_step'])} "
                    f"({_n(m['non_finite'], 'non-finite value')})")
        return f"the validation loss is non-finite ({_n(m.get('val_non_finite', '?'), 'value')})"
    if cls == "diverging":
        return (f"the loss rose to {_g(m['end_loss'])} at the end (start {_g(m['start_loss'])}, "
                f"best {_g(m['best_loss'])} at step {_step(m['best_loss_step'])})")
    if cls == "flat":
        return f"no significant decrease: {_g(m['start_loss'])} → {_g(m['end_loss'])} over {m['points']} points"
    if cls == "unstable":
        return f"{_n(m['spikes'], 'loss spike')} (robust z of log-loss change above threshold)"
    if cls == "noisy_late":
        return (f"step-to-step noise grew from {_g(m['early_noise_abs'])} to {_g(m['late_noise_abs'])} "
                f"(±{m['late_noise']:.0%} of the loss) in the last quarter")
    if cls == "not_generalising":
        basis = f" ({m['val_baseline_basis']})" if "val_baseline_basis" in m else ""
        return (f"labels may not match inputs: the validation loss never beat {_g(m['val_baseline'])}, what a "
                f"prediction that ignores the input scores{basis} (best {_g(m['val_best_loss'])}), while the training "
                f"loss fell to {_g(m['end_loss'])}")
    if cls == "overfitting":
        return (f"validation was best at step {_step(m['val_best_step'])} ({_g(m['val_best_loss'])}) and rose to "
                f"{_g(m['val_end_loss'])} while training kept falling")
    if cls == "still_improving":
        x = m["late_improvement"]
        if m.get("scale") == "log":
            return f"the loss fell a further {-math.expm1(-x):.1%} over the last tenth of the run"
        return f"the loss fell a further {_g(x)} (in units of its spread) over the last tenth of the run"
    if "late_improvement" in m and "still_improving" in m.get("classes", ""):
        return f"the loss fell from {_g(m['start_loss'])} to {_g(m['end_loss'])}"
    return f"the loss fell from {_g(m['start_loss'])} to {_g(m['end_loss'])} and settled"


def _advice(cls: str, m: dict) -> list[str]:
    if cls in ("non_finite", "diverging"):
        return ["Lower the learning rate (3–10× lower, or run dynamics.lr_range) and add a warm-up of a few hundred "
                "steps.",
                _clip_advice(m)]
    if cls == "flat":
        return ["Raise the learning rate (run dynamics.lr_range to find one that lowers the loss) and check that "
                "gradients reach every layer (model.gradient_flow)."]
    if cls == "unstable":
        return ["Add a learning-rate warm-up and lower the peak learning rate.", _clip_advice(m)]
    if cls == "noisy_late":
        return ["Decay the learning rate towards the end (cosine or step schedule) or increase the batch size."]
    if cls == "not_generalising":
        return ["Check that each label is paired with its own input: a shuffle, sort or filter applied to the inputs "
                "or the labels alone, a misaligned join, or an augmentation that changes what the label means. The "
                "model memorises its training data but learns nothing that holds on validation data; a run with "
                "deliberately shuffled labels that reaches the same training loss confirms it."]
    if cls == "overfitting":
        return [f"Regularise (weight decay, dropout, augmentation, more data) or stop at step "
                f"{_step(m['val_best_step'])}, where validation was best."]
    if cls == "still_improving":
        return ["Train longer: the loss was still falling when the run ended (it is budget-bound)."]
    return []


def _lr_warm_up(lrs: Any) -> dict:
    """The LR at the start, midpoint and end of the run, and whether it was still rising at the end (a warm-up in
    progress: the last recorded LR more than ``WARM_UP_RISE`` times the midpoint's)."""
    if lrs is None:
        return {}
    lr = np.asarray(lrs, dtype=np.float64).reshape(-1)
    lr = lr[np.isfinite(lr)]
    if lr.size < 3:
        return {}
    start, mid, end = float(lr[0]), float(lr[lr.size // 2]), float(lr[-1])
    return {"lr_start": start, "lr_mid": mid, "lr_end": end,
            "lr_warming_up": bool(mid > 0 and end > WARM_UP_RISE * mid)}


def _trend_table(diag: CurveDiagnosis) -> pd.DataFrame:
    if "trend_step" not in diag.series:
        return pd.DataFrame({"step": diag.series["step"], "loss": diag.series["train_loss"]})
    return pd.DataFrame({"step": diag.series["trend_step"], "smoothed_loss": diag.series["trend_loss"]})


def curve_result(diag: CurveDiagnosis, *, probe_steps: int | None = None,
                 extra_metrics: dict | None = None) -> CheckResult:
    """Turn a :class:`CurveDiagnosis` into the ``dynamics.loss_curve`` result.

    ``probe_steps`` marks a short diagnostic run chosen by tropt: there "still improving" is expected and reported
    without a warning (the user's real budget is longer than the probe).
    """
    m = dict(diag.metrics)
    if extra_metrics:
        m.update(extra_metrics)
    classes = list(diag.classes)
    flagged = [c for c in classes if c != "healthy" and not (probe_steps and c == "still_improving")]
    m.update(_lr_warm_up(diag.series.get("lr")))
    # flat while the LR still climbs: the run ended inside its warm-up, which says nothing about what it can learn
    warming = "flat" in flagged and bool(m.get("lr_warming_up"))
    # flat, of a loss whose trend takes both signs: an objective, not an error measure; flat says nothing then.
    # Likewise the logged sum of several players' losses (a GAN's D + G, stepped by their own optimizers): at the
    # game's equilibrium it stays flat while both players learn.
    game = "flat" in flagged and not warming and bool(m.get("several_optimizers"))
    objective = "flat" in flagged and not warming and (bool(m.get("trend_takes_both_signs")) or game)
    excused = warming or objective
    if any((c in FAIL_CLASSES or c == "non_finite") and not (excused and c == "flat") for c in flagged):
        status = Status.FAIL
    elif flagged:
        status = Status.WARN
    else:
        status = Status.PASS
    head = flagged[0] if flagged else "healthy"
    summary = f"{_LABEL[head]}: {_describe(head, m)}"
    if warming and head == "flat":
        summary = (f"flat while the learning rate is still warming up (lr {_g(m['lr_start'])} → {_g(m['lr_end'])} "
                   f"over the run): run longer than the warm-up, or judge after it ({_describe(head, m)})")
    if objective and head == "flat":
        summary = ("flat, of a loss whose trend takes both signs (an objective with no floor at zero, such as a "
                   "policy-gradient surrogate, not an error measure that must fall): the curve cannot say whether "
                   f"the model learns ({_describe(head, m)})")
        if game and not m.get("trend_takes_both_signs"):
            summary = ("flat, of a loss stepped by several optimizers (the sum of the players' losses of a game such "
                       "as a GAN's D and G, which need not fall while both learn): the curve cannot say whether the "
                       f"model learns ({_describe(head, m)})")
    others = [c for c in flagged[1:]]
    if others:
        summary += "; also " + ", ".join(_LABEL[c] for c in others)
    if probe_steps and "still_improving" in classes:
        summary += f" (still improving after the {probe_steps}-step probe, as expected of a short run)"
    advice: list[str] = []
    if warming:
        advice.append(f"The learning rate was still rising when the run ended ({_g(m['lr_mid'])} at the midpoint, "
                      f"{_g(m['lr_end'])} at the end): run past the warm-up (a longer probe, steps=...) or judge the "
                      "curve after it; if it is still flat at the full learning rate, raise the learning rate.")
    if objective:
        advice.append("Judge learning by the task's own metric (the episode return, a reward, an accuracy on held-out "
                      "data): a surrogate objective on fresh rollouts, or a critic's score, need not fall while the "
                      "model improves. If it should be an error measure, check why it goes below zero.")
    for c in flagged:
        if excused and c == "flat":
            continue
        for a in _advice(c, m):
            if a not in advice:
                advice.append(a)
    tables = {"trend": _trend_table(diag), **diag.tables}
    findings = pd.DataFrame(
        [{"class": c, "flagged": c in flagged, "evidence": _describe(c, m)} for c in classes],
        columns=["class", "flagged", "evidence"],
    )
    tables = {"findings": findings, **tables}
    return CheckResult(CHECK_ID, status, summary, m, tables, advice, dict(diag.series))


def diagnose_curves(
    train: Any,
    val: Any = None,
    steps: Any = None,
    *,
    val_steps: Any = None,
    grad_norms: Any = None,
    lrs: Any = None,
    thresholds: CurveThresholds | None = None,
    val_baseline: float | None = None,
) -> CheckResult:
    """Classify loss curves you already have (no Setup needed); returns the ``dynamics.loss_curve`` result.

    Parameters
    ----------
    train
        The training loss: an array/list/tensor, a pandas Series (its index is the step), a DataFrame (a
        ``train_loss``/``loss`` column and an optional ``step`` column; TensorBoard's "Download CSV" columns
        ``Wall time, Step, Value``; Lightning ``CSVLogger`` metrics with ``val_loss`` too), a CSV path, or a
        TensorBoard events file / log directory (tags like ``train/loss`` and ``val/loss``), an MLflow run (a ``Run``,
        ``"runs:/<run id>"`` or ``"mlflow:<run id>"``; or ``read_mlflow(experiment=...)``'s result), or a W&B offline
        run directory / ``.wandb`` file. Any ``{tag: (steps, values)}`` dict (what :func:`read_tensorboard`,
        :func:`read_mlflow` and :func:`read_wandb` return) works too.
    val
        Validation loss in any of those forms. When None and ``train`` is a table or log directory holding a
        validation loss as well, that one is used.
    steps
        Steps of the training values, when ``train`` is a plain array (default 0..n-1).
    val_steps
        Steps of the validation values, when ``val`` is a plain array (default: spread over the training steps).
    grad_norms
        Optional gradient norms per step; the clipping advice then names a threshold (their 90th percentile).
    lrs
        Optional learning rate at each training value (e.g. a logged ``lr`` column): a loss jump right after the
        learning rate rose (warm restarts, a warm-up) is then listed but not counted as instability.
    thresholds
        :class:`tropt.dynamics.CurveThresholds` to change the classifier's sensitivity.
    val_baseline
        Optional validation loss of a prediction that ignores the input (the training class prior's cross entropy,
        the variance of the targets around the training mean): a validation loss that never beats it while the
        training loss ends well below it is "not generalising" (FAIL).

    Returns
    -------
    CheckResult
        FAIL for diverging / non-finite / flat, WARN for unstable, noisy late, overfitting, still improving;
        PASS for a healthy curve. ``metrics['class']`` is the primary class, ``metrics['classes']`` all of them.
    """
    curve = read_curve(train, "train")
    assert curve is not None  # role "train" raises instead of returning None
    t_steps, t_values = curve
    if steps is not None:
        t_steps = np.asarray(steps, dtype=np.float64).reshape(-1)
    v = None
    if val is not None:
        v = read_curve(val, "val")
        if v is None:
            v = read_curve(val, "train")  # a table whose only loss column is the validation loss
    elif not isinstance(train, (list, tuple, np.ndarray, pd.Series)) and not hasattr(train, "detach"):
        v = read_curve(train, "val")  # a table or log directory that holds both curves
    v_steps, v_values = (None, None) if v is None else v
    if val_steps is not None:
        v_steps = np.asarray(val_steps, dtype=np.float64).reshape(-1)
    if v_values is not None and v_steps is None and t_steps is not None and v_values.size:
        v_steps = np.linspace(t_steps[0], t_steps[-1], v_values.size)
    if t_steps is not None and t_steps.size == t_values.size and np.any(np.diff(t_steps) < 0):
        order = np.argsort(t_steps, kind="stable")  # logs appended out of order (resumed runs)
        t_steps, t_values = t_steps[order], t_values[order]
        if lrs is not None and np.size(lrs) == order.size:
            lrs = np.asarray(lrs, dtype=np.float64).reshape(-1)[order]
    diag = classify_curve(t_values, t_steps, v_values, v_steps, grad_norms, thresholds, lrs=lrs,
                          val_baseline=val_baseline)
    return curve_result(diag, extra_metrics={"source": "logs"})


def _horizon_skip(ctx: Any, steps: int) -> CheckResult | None:
    """A SKIP when the scheduler cannot be stepped ``steps`` times (OneCycleLR raises past its total_steps)."""
    horizon = getattr(ctx.scheduler, "total_steps", None)
    if not (isinstance(horizon, int) and not isinstance(horizon, bool) and horizon < steps):
        return None
    fix = (f"run a shorter probe, tropt.dynamics.check_loss_curve(setup, steps={horizon}), "
           if horizon >= 10 else "")
    return CheckResult(
        CHECK_ID, Status.SKIP,
        f"the scheduler's total_steps ({horizon}) is shorter than the {steps}-step probe: "
        f"{type(ctx.scheduler).__name__} cannot be stepped past its total_steps, so the probe cannot run",
        {"scheduler": type(ctx.scheduler).__name__, "scheduler_total_steps": horizon, "probe_steps": steps},
        advice=[f"To probe this Setup, {fix or ''}{'or ' if fix else ''}give the Setup a longer schedule "
                f"(total_steps >= {steps}, e.g. the length of your real run)."])


@register(CHECK_ID, title="Loss-curve diagnosis",
          description="Run a short probe on a copy (up to a few hundred steps, stopping once the verdict is settled) "
                      "and classify the curve: diverging, flat, unstable, noisy, overfitting, budget-bound or healthy.",
          budgets={'quick': {'steps': 150, 'min_steps': 10, 'val_batches': 1},
                   'thorough': {'steps': 1000, 'min_steps': None}},
          plot="tropt.plots.dynamics")
def check_loss_curve(
    setup: Setup,
    *,
    steps: int = 300,
    min_steps: int | None = 40,
    eval_every: int | None = None,
    val_batches: int = 4,
    thresholds: CurveThresholds | None = None,
    progress: bool = True,
    callback: Any = None,
) -> CheckResult:
    """Train a copy of the Setup for up to ``steps`` optimizer steps with its own step, scheduler and data order, then
    classify the training (and validation, when ``val_data`` is given) loss curve.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`; never modified (the run works on a copy inside :func:`tropt.snapshot.preserved`).
    steps
        Most optimizer steps of the probe run (each takes ``accumulation_steps`` micro-batches of one batch).
    min_steps
        The sequential test: the curve so far is classified at ``min_steps`` and then at every 1.5 times as many
        steps; the probe stops at a checkpoint whose verdict (status and primary class) is the one of the checkpoint
        before when that verdict is PASS or a diverging FAIL (a flat or not-generalising FAIL and the WARN classes
        run every step, as does a curve whose learning rate is still warming up). None runs all ``steps``.
        ``metrics["stopped"]`` says why the probe ended, ``["verdicts"]`` what each checkpoint found.
    eval_every
        Evaluate ``val_data`` every this many steps (default: about 15 evaluations over the first checkpoint's
        steps and the planned steps, whichever is finer), and at every checkpoint.
    val_batches
        Validation batches per evaluation.
    thresholds
        :class:`tropt.dynamics.CurveThresholds`.
    progress
        Show a progress bar.
    callback
        Optional ``callback({"check", "step", "total", "loss"})`` after each step (live displays); raising
        :class:`tropt.errors.Cancelled` in it stops the run.

    The loss of a step is what the step returns, else what its ``ctx.loss_fn`` calls computed, else an extra
    forward pass before the step. The run stops early at the first non-finite loss. "Still improving at the end"
    is expected of a short probe and does not warn here (it does in :func:`diagnose_curves`).
    """
    from ..core.stepping import StepRunner, evaluate
    from ..snapshot import preserved
    from .baseline import input_independent_baseline

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 10:
        raise TroptError(f"steps={steps!r}; the loss-curve probe needs an integer >= 10", "use e.g. steps=300")
    if min_steps is not None and (isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 1):
        raise TroptError(f"min_steps={min_steps!r}; it must be a positive integer or None",
                         "use e.g. min_steps=40, or None to run all the steps")
    setup.validate()
    has_val = setup.val_data is not None
    marks = _checkpoints(steps, min_steps)
    # About 15 evaluations over the planned steps, and at least 10 by the second checkpoint (where a healthy curve
    # settles), so the validation curve has the points its classes need either way.
    second = marks[1] if len(marks) > 1 else steps
    plan = _ProbePlan(steps, eval_every or max(1, min(steps // 15, second // 10)), val_batches, marks, progress,
                      callback)
    probe = _Probe()
    with preserved(setup.model):
        ctx = setup.build()
        skip = _horizon_skip(ctx, steps)
        if skip is not None:
            return skip
        # A schedule whose end is not a total_steps attribute (DeepLab's PolyLR(max_iters), a LambdaLR sized for a
        # short run) shows its end when stepped past it: it raises or gives a rate that is not a finite real number.
        # It is held there (tropt.core.schedule_guard) and the probe is not judged past it.
        guards = hold_schedules_at_end(ctx, hold_at_zero=False)  # LR 0 is the probe's own finding (a WARN)
        runner = StepRunner(setup, ctx)
        baseline = input_independent_baseline(setup, ctx, val_batches) if has_val else None
        if has_val:
            probe.val_at.append(0)
            probe.val_losses.append(evaluate(setup, ctx, val_batches))
        settled = _Settled(setup, probe, runner, baseline, thresholds, steps)
        _run_probe(setup, ctx, runner, probe, plan, settled)
    ended = next((g.held_at for g in guards if g.held_at is not None), None)
    if ended is not None:
        name = type(getattr(guards[0], "_inner", None)).__name__
        return CheckResult(
            CHECK_ID, Status.SKIP,
            f"the schedule ended after {ended - 1} scheduler steps, inside the {steps}-step probe: {name} raised or "
            "gave a "
            "learning rate that is not a finite real number when stepped past its end, so the probe cannot run",
            {"scheduler": name, "schedule_ended_at": ended, "probe_steps": steps},
            advice=[f"To probe this Setup, give it a schedule sized for the length of your real run (at least "
                    f"{steps} optimizer steps), or run tropt.dynamics.check_loss_curve(setup, steps={ended - 1})."])
    result = settled.result()
    if result is None:
        raise TroptError(f"the probe produced {len(probe.losses)} losses in {probe.ran} steps; classifying needs at "
                         f"least {MIN_POINTS}", "make the step return its loss, or run more steps")
    result.metrics.update(planned_steps=steps, stopped=probe.stopped or f"ran the planned {steps} steps",
                          verdicts="; ".join(probe.verdicts))
    if probe.schedule_end is not None:
        return _schedule_ended_caveat(result, probe.schedule_end, steps)
    return result


def _schedule_ended_caveat(result: CheckResult, end: int, steps: int) -> CheckResult:
    """The Setup's schedule ran step ``end`` of the probe at LR 0 (a warm-up/decay sized by ``num_training_steps``, a
    Trainer's ``max_steps``): from there on no step moved the model. A flat curve is then evidence about a schedule
    of ``end - 1`` steps, not about the loop: WARN, never FAIL, and say so."""
    import dataclasses

    result.metrics.update(schedule_end_step=end)
    if result.status is not Status.FAIL or result.metrics.get("class") != "flat":
        return result
    trained = end - 1
    return dataclasses.replace(
        result, status=Status.WARN,
        summary=(f"{result.summary}; but the Setup's schedule reaches learning rate 0 at step {end} of the "
                 f"{steps}-step probe, so only {trained} steps trained (too short a schedule for this probe, or your "
                 "real run's length: judge it against that)"),
        advice=[f"If your real run is longer, give the Setup its schedule (num_training_steps / max_steps of the "
                f"real run) and rerun; if it really is {trained} steps, raise the learning rate or train longer.",
                *(result.advice or [])])


class _Settled:
    """The sequential test of the probe: classifies the curve so far at a checkpoint and says whether the verdict is
    settled (the same status and primary class as at the checkpoint before)."""

    def __init__(self, setup: Setup, probe: _Probe, runner: Any, baseline: dict | None,
                 thresholds: CurveThresholds | None, steps: int) -> None:
        self.setup, self.probe, self.runner, self.baseline = setup, probe, runner, baseline
        self.thresholds, self.steps = thresholds, steps
        self.last: tuple | None = None

    def __call__(self, n: int) -> bool:
        r = self.result()
        if r is None:
            return False
        key = (r.status.value, r.metrics.get("class"))
        self.probe.verdicts.append(f"{n}: {key[0]} {key[1]}")
        again, self.last = key == self.last, key
        # Only what a longer run cannot undo settles early: a curve that falls without a finding (PASS) or one that
        # diverged. A flat or not-generalising FAIL can still turn (a slow start, a small fall that becomes a clear
        # one), and the WARN classes (noisy late, unstable, overfitting) are judged on the late part of the run, so
        # those run every planned step; a curve under a rising learning rate is judged after the warm-up.
        settles = key[0] == Status.PASS.value or key[1] in SETTLING_FAILS
        if not (again and settles) or r.metrics.get("lr_warming_up"):
            return False
        self.probe.stopped = f"settled at step {n}: {key[0]} ({key[1]}) at two checkpoints in a row"
        return True

    def result(self) -> CheckResult | None:
        """The ``dynamics.loss_curve`` result of the curve so far (None while it has too few points)."""
        probe, setup = self.probe, self.setup
        if len(probe.losses) < MIN_POINTS and all(math.isfinite(float(v)) for v in probe.losses):
            return None
        values = np.array([float(v) for v in probe.losses])
        x = np.asarray(probe.loss_steps, dtype=np.float64)
        lrs: Any = probe.lrs
        per_epoch = _epoch_length(setup, len(values))
        if per_epoch:
            values, x, lrs = _epoch_means(values, x, np.asarray(lrs, dtype=np.float64), per_epoch)
        has_val = setup.val_data is not None
        diag = classify_curve(values, x,
                              np.asarray(probe.val_losses) if has_val else None,
                              np.asarray(probe.val_at, dtype=np.float64) if has_val else None,
                              probe.norms or None, self.thresholds, lrs=lrs,
                              val_baseline=self.baseline["value"] if self.baseline else None)
        extra: dict[str, Any] = {"source": "setup run", "steps_run": probe.ran,
                                 "loss_from": self.runner.source or "none"}
        if probe.norms_from:
            extra["grad_norm_from"] = f"{probe.norms_from} (the first of several optimizers)"
            extra["several_optimizers"] = True
        if per_epoch:
            extra["points"] = f"epoch means ({per_epoch} batches each)"
        if self.baseline:
            extra["val_baseline_basis"] = f"the loss of predicting {self.baseline['basis']}"
        if setup.scheduler is not None:
            extra["scheduler"] = "the Setup's scheduler"
        return curve_result(diag, probe_steps=probe.ran, extra_metrics=extra)
