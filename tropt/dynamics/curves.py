"""Loss-curve classification on plain arrays: the computation behind ``dynamics.loss_curve``.

:func:`classify_curve` works on numbers only (a training loss per step, optionally a validation loss at its own
steps) so it serves both a short run of a :class:`tropt.Setup` and logs a user already has
(:func:`tropt.dynamics.diagnose_curves`). Everything is computed on the log of the loss (relative changes, so
thresholds do not depend on the loss's units) in O(n): the curve is cut into at most ``MAX_BINS`` equal-count bins
whose medians give a robust trend, and noise is measured from first differences, which cancel the trend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TroptError
from .baseline import beats_baseline

MAX_BINS = 50
MIN_POINTS = 10
LR_WINDOW = 5  # a spike within this many steps after a learning-rate increase is the schedule's (warm restart, warm-up)

# Classes in order of severity (the primary class is the first that applies).
CLASSES = ("non_finite", "diverging", "flat", "not_generalising", "overfitting", "unstable", "noisy_late",
           "still_improving", "healthy")
FAIL_CLASSES = frozenset({"non_finite", "diverging", "flat", "not_generalising"})


@dataclass
class CurveThresholds:
    """Thresholds of the classifier; all changes are in natural-log units of the loss (0.05 ≈ 5%).

    Attributes
    ----------
    min_decrease
        Flat when the smoothed loss never falls more than this below its start (and the fall is not clearly
        above the noise).
    rise
        Diverging when the loss ends more than this above its start.
    rise_from_min
        Diverging when the loss ends more than this above its own minimum (log 3: three times the best loss).
    spike_z
        A step whose log-loss change has a robust z-score above this is a spike ...
    spike_min_jump
        ... provided the loss also jumped by more than this (log 1.3: +30%), so tiny jumps on very smooth curves
        are not spikes.
    noisy_ratio, noisy_min
        Noisy late when the step-to-step noise over the last quarter is more than ``noisy_ratio`` times that of
        the first quarter in the loss's own units, and above ``noisy_min`` relative to the loss (log units).
    overfit_rise
        Overfitting when validation ends more than this above its minimum while training still falls.
    improving
        Still improving when the last tenth of the run is more than this below the tenth before it.
    significance
        Changes must also exceed this many standard errors of the bin medians to count.
    baseline_margin, generalise_share
        Not generalising when no validation loss lies more than ``baseline_margin`` below the input-independent
        baseline (``val_baseline``), nor more than ``generalise_share`` of the training loss's fall below it ...
    fit_below_baseline
        ... while the training loss (not flat) ends more than this below it (log 1.03: the model fits its training
        data better than the baseline, so it learned something, but nothing that carries over). Early in a correct
        run validation falls about as much as training, so a quarter of it is a wide margin.
    """

    min_decrease: float = 0.05
    rise: float = math.log(1.1)
    rise_from_min: float = math.log(3.0)
    spike_z: float = 6.0
    spike_min_jump: float = math.log(1.3)
    noisy_ratio: float = 3.0
    noisy_min: float = 0.15
    overfit_rise: float = 0.05
    improving: float = 0.02
    significance: float = 3.0
    baseline_margin: float = 0.02
    generalise_share: float = 0.25
    fit_below_baseline: float = math.log(1.03)


@dataclass
class CurveDiagnosis:
    """What :func:`classify_curve` found: the classes that apply (most severe first) and the evidence."""

    classes: list[str]
    metrics: dict[str, Any]
    series: dict[str, np.ndarray]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def primary(self) -> str:
        return self.classes[0]


def _robust_sigma(x: np.ndarray) -> float:
    """1.4826 × MAD: the standard deviation of Gaussian data, unmoved by outliers."""
    if x.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _bins(n: int, max_bins: int = MAX_BINS, min_count: int = 10) -> np.ndarray:
    """Edges of at most ``max_bins`` contiguous bins of (nearly) equal count (>= ``min_count``) over ``n`` points."""
    k = int(max(1, min(max_bins, n // min_count)))
    return np.linspace(0, n, k + 1).round().astype(np.int64)


def _as_float_array(values: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise TroptError(f"{name}: cannot read the values as numbers ({exc})",
                         "pass a 1-d array or list of losses") from None
    return arr


@dataclass
class _Shape:
    """The finite part of a training curve in classifier units (log loss, or linear units scaled to its spread),
    with its robust trend and its noise levels."""

    x: np.ndarray  # steps of the finite part
    y: np.ndarray  # losses of the finite part
    z: np.ndarray  # the losses in classifier units
    positive: bool  # log units (else linear units of ``spread``)
    spread: float
    centers: np.ndarray  # trend: the median step and ...
    level: np.ndarray  # ... the median z of each bin
    dz: np.ndarray
    sigma: float  # white-noise level of one point
    early_noise: float
    late_noise: float
    early_noise_abs: float  # in the loss's own units
    late_noise_abs: float
    nedges: np.ndarray  # edges of the local noise bins (over dz)
    noise: np.ndarray  # noise of a change, per local bin
    w: int  # start / end windows: a tenth of the run each
    significance: float

    def to_loss(self, v: Any) -> Any:
        """Classifier units back to the loss's own units."""
        return np.exp(v) if self.positive else np.asarray(v) * self.spread

    def sig_of(self, noise_level: float) -> float:
        """How far apart two window medians must be to count (``significance`` standard errors)."""
        return self.significance * math.sqrt(2) * 1.2533 * noise_level / math.sqrt(self.w)


def _read_train(train: Any, steps: Any) -> tuple[np.ndarray, np.ndarray]:
    """(losses, steps) of the training curve as float arrays, or a TroptError saying what is wrong with them."""
    y = _as_float_array(train, "train")
    n = y.size
    if n < MIN_POINTS and np.isfinite(y).all():
        raise TroptError(f"the training curve has {n} points; classifying it needs at least {MIN_POINTS}",
                         "log the loss at more steps (or run more steps)")
    x = np.arange(n, dtype=np.float64) if steps is None else _as_float_array(steps, "steps")
    if x.size != n:
        raise TroptError(f"steps has {x.size} values but train has {n}", "give one step per training loss value")
    return y, x


def _finite_part(y: np.ndarray, x: np.ndarray, metrics: dict, tables: dict,
                 classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The curve up to its first non-finite value (all of it when finite); records the non-finite values."""
    finite = np.isfinite(y)
    if finite.all():
        metrics["non_finite"] = 0
        return y, x
    first_bad = int(np.argmin(finite))
    metrics["non_finite"] = int((~finite).sum())
    metrics["first_non_finite_step"] = float(x[first_bad])
    classes.append("non_finite")
    tables["non_finite_steps"] = pd.DataFrame({"step": x[~finite][:1000], "loss": y[~finite][:1000]})
    return y[:first_bad], x[:first_bad]


def _shape(y_use: np.ndarray, x_use: np.ndarray, th: CurveThresholds) -> _Shape:
    """Scale the finite curve, and measure its trend (bin medians) and noise (from first differences)."""
    positive = bool((y_use > 0).all())
    spread = 1.0
    if positive:
        z = np.log(y_use)
    else:
        # Losses that can be negative (e.g. a negative log-likelihood): use linear units scaled so that one unit
        # is the curve's own spread, so the (log-unit) thresholds keep a comparable meaning.
        spread = float(np.subtract(*np.percentile(y_use, [90, 10]))) or 1.0
        z = y_use / spread
    n_use = z.size
    # Trend: medians of <= MAX_BINS bins of >= 10 points each (robust to spikes, O(n)).
    edges = _bins(n_use, min_count=10)
    nb = edges.size - 1
    centers = np.empty(nb)
    level = np.empty(nb)
    for i in range(nb):
        level[i] = np.median(z[edges[i]:edges[i + 1]])
        centers[i] = np.median(x_use[edges[i]:edges[i + 1]])
    # Noise: from first differences (they cancel the trend), globally, per quarter and per local bin (>= 20 points).
    dz = np.diff(z)
    quarter = max(2, dz.size // 4)
    # ... and in the loss's own units: relative noise grows as a loss approaches zero (a few hard samples dominate
    # a batch), which is not a problem; noise that is larger late than early in absolute terms is.
    dy = np.diff(y_use)
    nedges = _bins(dz.size, min_count=20)
    noise = np.array([_robust_sigma(dz[nedges[i]:nedges[i + 1]]) for i in range(nedges.size - 1)])  # of a change
    if noise.size >= 3:  # a bin straddling a change of noise level underestimates it: take the neighbours' too
        noise = np.maximum(noise, np.maximum(np.r_[noise[0], noise[:-1]], np.r_[noise[1:], noise[-1]]))
    root2 = math.sqrt(2)
    return _Shape(
        x=x_use, y=y_use, z=z, positive=positive, spread=spread, centers=centers, level=level, dz=dz,
        sigma=_robust_sigma(dz) / root2, early_noise=_robust_sigma(dz[:quarter]) / root2,
        late_noise=_robust_sigma(dz[-quarter:]) / root2, early_noise_abs=_robust_sigma(dy[:quarter]) / root2,
        late_noise_abs=_robust_sigma(dy[-quarter:]) / root2, nedges=nedges, noise=noise,
        w=max(1, n_use // 10), significance=th.significance)


# How many first points the start is also read from. A short curve (epoch means of a small train set: 50 points, a
# trend window of 5) has its fall inside the window itself, so the first 1-3 points are read too, each against its
# own standard error.
_EARLY_READS = (1, 2, 3, 5, 10)


def _levels(c: _Shape, th: CurveThresholds, metrics: dict, classes: list[str]) -> float:
    """Start, end and best of the trend; "diverging" or "flat". Returns the end level (classifier units)."""
    z, w = c.z, c.w
    start, end = float(np.median(z[:w])), float(np.median(z[-w:]))
    best_i = int(np.argmin(c.level))
    best = float(c.level[best_i])
    decrease, rise, rise_from_min = start - best, end - start, end - best
    noisiest = max(c.early_noise, c.late_noise)
    sig = c.sig_of(noisiest)
    # The best bin median is the minimum of many noisy medians, biased low by a few of their standard errors.
    per_bin = max(1, z.size // c.level.size)
    sig_best = sig + th.significance * 1.2533 * noisiest / math.sqrt(per_bin)
    metrics.update(
        start_loss=float(c.to_loss(start)),
        end_loss=float(c.to_loss(end)),
        best_loss=float(c.to_loss(best)),
        best_loss_step=float(c.centers[best_i]),
        decrease=decrease,
        noise=c.sigma,
    )
    # A trend above zero in some bins and below it in others: an objective with no floor at zero (a policy-gradient
    # surrogate, a critic's score), not an error measure that must fall (see curve_result).
    trend = c.to_loss(c.level)
    metrics["trend_takes_both_signs"] = bool(not c.positive and (trend > 0).any() and (trend < 0).any())

    # --- diverging: ends clearly above where it started, or far above its own best
    if (rise > max(th.rise, sig)) or (rise_from_min > max(th.rise_from_min, sig_best)):
        classes.append("diverging")
        metrics["rise_from_start"] = rise
        metrics["rise_from_best"] = rise_from_min
    # --- flat: never decreased meaningfully. A fast early fall can sit inside the first tenth (a loss that halves in
    # 20 of 300 steps and then plateaus at its noise floor), so the start is also read from the first 5 and 10
    # points against the end, each with its own standard error.
    elif decrease < max(th.min_decrease, sig_best) and not any(
            float(np.median(z[:k])) - end > max(th.min_decrease, th.significance * 1.2533 * noisiest
                                                 * math.sqrt(1 / k + 1 / w))
            for k in _EARLY_READS if k < w) and not _falls_in_loss_units(c, th, per_bin, best):
        classes.append("flat")
    return end


def _flat_against_validation(val: Any, th: CurveThresholds, metrics: dict, classes: list[str]) -> None:
    """Drop "flat" when the validation loss -- fixed data in eval mode, free of the training step's own randomness
    (per-batch mixup/CutMix draws, dropout) -- fell clearly over the same run: the training curve's noise hid a fall
    that happened."""
    if "flat" not in classes:
        return
    v = _as_float_array(val, "val")
    v = v[np.isfinite(v)]
    if v.size < 10 or not (v > 0).all():
        return
    k = max(1, v.size // 10)
    fell = float(np.log(np.median(v[:k])) - np.log(np.median(v[-k:])))
    if fell > max(10 * th.min_decrease, math.log(2.0)):
        classes.remove("flat")
        metrics["flat_overruled_by_validation"] = fell


def _falls_in_loss_units(c: _Shape, th: CurveThresholds, per_bin: int, best: float) -> bool:
    """Whether a positive loss falls significantly in its own units, against its own-unit noise.

    Log units make a loss's relative noise grow as it nears zero: a loss that falls from 1.2 to a floor where batches
    alternate between 0.05 and 0.5 (CutMix applied with probability 0.5, mixup, RL returns) has a late log-noise of
    order 1, so a fivefold fall reads as insignificant there although it is far outside the noise in the loss's own
    units. "Flat" must hold in both scales."""
    if not c.positive:
        return False  # z is already the loss's own (scaled) units
    y, w = c.y, c.w
    start, best_loss = float(np.median(y[:w])), float(c.to_loss(best))
    noisiest = max(c.early_noise_abs, c.late_noise_abs)
    sig_best = c.sig_of(noisiest) + th.significance * 1.2533 * noisiest / math.sqrt(per_bin)
    return start - best_loss > max(th.min_decrease * abs(start), sig_best)


def _spikes(c: _Shape, th: CurveThresholds, lrs: Any, n: int, metrics: dict, series: dict, tables: dict,
            classes: list[str]) -> None:
    """Spikes: robust z-scores of log-loss changes; those just after a learning-rate increase are the schedule's.

    The noise scale is local (that of the bin the change falls in), so a run whose noise grows late is "noisy",
    not a string of spikes; the global scale is a floor for bins that happen to be very smooth.
    """
    dz, sigma, n_use = c.dz, c.sigma, c.z.size
    local = np.repeat(c.noise, np.diff(c.nedges))
    scale = np.maximum(local, 0.25 * sigma * math.sqrt(2)) if sigma > 0 else local
    scale = np.where(scale > 0, scale, float(np.std(dz)) or 1.0)
    rz = (dz - np.median(dz)) / scale
    up = np.flatnonzero((rz > th.spike_z) & (dz > th.spike_min_jump))
    # consecutive jumps are one event
    events = up[np.concatenate(([True], np.diff(up) > 1))] if up.size else up
    scheduled = np.zeros(events.size, dtype=bool)
    if lrs is not None:
        lr = _as_float_array(lrs, "lrs")
        if lr.size != n:
            raise TroptError(f"lrs has {lr.size} values but train has {n}",
                             "give the learning rate of each training step")
        series["lr"] = lr
        rose = np.r_[False, lr[1:n_use] > lr[:n_use - 1] * (1 + 1e-9)]  # rose[j]: step j's LR above step j-1's
        # change e (loss e -> e+1) follows step e's update: the schedule's when the LR rose shortly before
        scheduled = np.array([bool(rose[max(0, e - LR_WINDOW + 1):e + 1].any()) for e in events], dtype=bool)
        metrics["spikes_after_lr_increase"] = int(scheduled.sum())
    metrics["spikes"] = int((~scheduled).sum())
    series["spike_step"] = c.x[events[~scheduled] + 1] if events.size else np.empty(0)
    if events.size:
        tables["spikes"] = pd.DataFrame(
            {
                "step": c.x[events + 1],
                "loss": c.y[events + 1],
                "loss_before": c.y[events],
                "robust_z": rz[events],
                **({"after_lr_increase": scheduled} if lrs is not None else {}),
            }
        ).head(1000)
    if metrics["spikes"] and "diverging" not in classes:
        classes.append("unstable")


def _validation(c: _Shape, end: float, val: Any, val_steps: Any, x: np.ndarray, val_baseline: float | None,
                th: CurveThresholds, metrics: dict, series: dict, classes: list[str]) -> None:
    """Overfitting, not generalising and a non-finite validation loss, from the validation curve."""
    v = _as_float_array(val, "val")
    if not v.size:
        return
    vx = (np.linspace(x[0], x[-1], v.size) if val_steps is None else _as_float_array(val_steps, "val_steps"))
    if vx.size != v.size:
        raise TroptError(f"val_steps has {vx.size} values but val has {v.size}", "give one step per validation value")
    series["val_step"], series["val_loss"] = vx, v
    ok = np.isfinite(v)
    metrics["val_points"] = int(v.size)
    if ok.sum() < 3:
        return
    vv, vxx = v[ok], vx[ok]
    vz = np.log(vv) if (vv > 0).all() else vv / (float(np.subtract(*np.percentile(vv, [90, 10]))) or 1.0)
    # light smoothing (from 5 points): a running median of 3 keeps one noisy evaluation from deciding
    vz_s = np.median(np.stack([np.r_[vz[0], vz[:-1]], vz, np.r_[vz[1:], vz[-1]]]), axis=0) if vz.size >= 5 else vz
    bi = int(np.argmin(vz_s))
    v_tail = max(1, vz_s.size // 5)
    v_end = float(np.median(vz_s[-v_tail:]))
    best_step = float(vxx[bi])
    metrics.update(val_best_step=best_step, val_best_loss=float(vv[bi]), val_end_loss=float(vv[-1]))
    # training still falling after the validation minimum?
    after = c.x >= best_step
    train_falls = bool(after.sum() >= 4 and np.median(c.z[after][: max(2, after.sum() // 4)]) - end > 0)
    if v_end - float(vz_s[bi]) > th.overfit_rise and bi < vz_s.size - v_tail and train_falls:
        classes.append("overfitting")
        metrics["val_rise"] = v_end - float(vz_s[bi])
    if val_baseline is not None and c.positive and val_baseline > 0 and math.isfinite(val_baseline):
        _against_baseline(vv, val_baseline, end, th, metrics, classes)
    if not np.isfinite(v).all() and "non_finite" not in classes:
        classes.insert(0, "non_finite")
        metrics["val_non_finite"] = int((~np.isfinite(v)).sum())


def _against_baseline(vv: np.ndarray, val_baseline: float, end: float, th: CurveThresholds, metrics: dict,
                      classes: list[str]) -> None:
    """"Not generalising": validation never beats the input-independent baseline while training ends well below."""
    metrics["val_baseline"] = float(val_baseline)
    metrics["val_below_baseline"] = (math.log(val_baseline) - math.log(float(vv.min())) if (vv > 0).all()
                                     else math.nan)
    fit = math.log(val_baseline) - end
    metrics["train_below_baseline"] = fit
    margin = min(th.baseline_margin, th.generalise_share * fit)
    if (fit > th.fit_below_baseline and "flat" not in classes
            and not beats_baseline(vv, val_baseline, margin)):
        classes.append("not_generalising")


def _finish(c: _Shape | None, classes: list[str], metrics: dict, series: dict, tables: dict) -> CurveDiagnosis:
    if c is None:  # went non-finite almost at once: nothing more to say
        metrics["class"] = classes[0]
        metrics["classes"] = ",".join(classes)
        return CurveDiagnosis(classes, metrics, series, tables)
    if not classes:
        classes.append("healthy")
    classes.sort(key=CLASSES.index)
    metrics["class"] = classes[0]
    metrics["classes"] = ",".join(classes)
    series["trend_step"] = c.centers
    series["trend_loss"] = np.asarray(c.to_loss(c.level), dtype=np.float64)
    return CurveDiagnosis(classes, metrics, series, tables)


def classify_curve(
    train: Any,
    steps: Any = None,
    val: Any = None,
    val_steps: Any = None,
    grad_norms: Any = None,
    thresholds: CurveThresholds | None = None,
    lrs: Any = None,
    val_baseline: float | None = None,
) -> CurveDiagnosis:
    """Classify a training-loss curve (and optionally a validation curve).

    Parameters
    ----------
    train
        Training loss per logged step (1-d).
    steps
        The step of each training value (default 0..n-1).
    val, val_steps
        Validation loss and the steps it was measured at (default: spread evenly over the training steps).
    grad_norms
        Optional gradient norms per step, used to suggest a clipping threshold (90th percentile).
    thresholds
        :class:`CurveThresholds`; the defaults suit most runs.
    lrs
        Optional learning rate of the optimizer step that followed each training value. A spike within
        ``LR_WINDOW`` steps after the learning rate rose (a warm restart, a warm-up) is listed but not counted as
        instability.
    val_baseline
        Optional validation loss of the best input-independent prediction (e.g. the training class prior, see
        :func:`tropt.dynamics.baseline.input_independent_baseline`). "Not generalising" when the validation loss
        never beats it while the training loss ends well below it.

    Returns
    -------
    CurveDiagnosis
    """
    th = thresholds or CurveThresholds()
    y, x = _read_train(train, steps)
    metrics: dict[str, Any] = {"points": int(y.size), "first_step": float(x[0]), "last_step": float(x[-1])}
    series: dict[str, np.ndarray] = {"step": x, "train_loss": y}
    tables: dict[str, pd.DataFrame] = {}
    classes: list[str] = []
    y_use, x_use = _finite_part(y, x, metrics, tables, classes)
    if y_use.size < MIN_POINTS:  # went non-finite almost at once: nothing more to say
        return _finish(None, classes, metrics, series, tables)

    c = _shape(y_use, x_use, th)
    metrics["scale"] = "log" if c.positive else "linear"
    end = _levels(c, th, metrics, classes)
    _spikes(c, th, lrs, y.size, metrics, series, tables, classes)

    # --- noisy late in training
    metrics["early_noise"], metrics["late_noise"] = c.early_noise, c.late_noise
    metrics["early_noise_abs"], metrics["late_noise_abs"] = c.early_noise_abs, c.late_noise_abs
    if (c.late_noise > th.noisy_min and c.late_noise_abs > th.noisy_ratio * max(c.early_noise_abs, 1e-300)
            and "diverging" not in classes):
        classes.append("noisy_late")
    if val is not None:  # overfitting, not generalising (need validation)
        _validation(c, end, val, val_steps, x, val_baseline, th, metrics, series, classes)
        _flat_against_validation(val, th, metrics, classes)

    # --- still improving at the end (budget-bound)
    # (not when overfitting: more budget would make that worse)
    z, w = c.z, c.w
    if z.size >= 20 and not (set(classes) & {"diverging", "flat", "non_finite", "overfitting"}):
        last, prev = float(np.median(z[-w:])), float(np.median(z[-2 * w:-w]))
        metrics["late_improvement"] = prev - last
        if prev - last > max(th.improving, c.sig_of(c.late_noise)):
            classes.append("still_improving")

    if grad_norms is not None:
        g = _as_float_array(grad_norms, "grad_norms")
        g = g[np.isfinite(g)]
        if g.size:
            metrics["grad_norm_median"] = float(np.median(g))
            metrics["grad_norm_p90"] = float(np.percentile(g, 90))
            series["grad_norm"] = _as_float_array(grad_norms, "grad_norms")
    return _finish(c, classes, metrics, series, tables)
