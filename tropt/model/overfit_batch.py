"""``model.overfit_batch``: can the model memorise one small batch? (Karpathy: "overfit one batch")

A copy is trained with the user's optimizer factory and step on one fixed batch of at most ``samples`` samples. A
second copy, from the same initial weights, is trained on the same batch with its inputs zeroed: the
input-independent baseline. A model that learns reaches a loss far below both its start and that baseline.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from torch import nn

from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._common import (
    acc_text,
    argument_positions,
    fmt,
    input_paths,
    input_scale,
    require_samples,
    target_scale,
    zero_inputs,
)
from ._input_dependence import input_dependence, reads_but_slow, reads_its_input
from ._overfit_causes import bounded_output_cause, spectral_floor, spectral_norm_layers
from ._overfit_samples import (
    DEFAULT_SAMPLES,
    baseline_steps,
    escalated,
    overfit_samples,
)
from .composition import loss_findings
from .fixed_batch import train_on_batch

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "model.overfit_batch"


def _plateaued(losses: np.ndarray, window: float = 0.25, share: float = 0.1, tol: float = 0.005,
               target: float | None = None) -> bool:
    """Whether the last ``window`` of the curve added less than ``share`` of the total improvement (and, for a curve
    that barely moved at all, less than ``tol`` of its start). A slow but steady decline is not a plateau: its last
    quarter holds a quarter of the progress. Nor is a tail that falls at every step at least as fast as the curve
    did on average, however little it moved: an optimizer warming up (Adafactor's ``warmup_init`` steps 1e-6 * t)
    is still speeding up. Nor, judged relative to the loss and its trend, is a tail whose latest relative rate of
    decline would bring the loss down to ``target`` within as many steps again as have run (see
    :func:`_steps_to_target`): a loss that fitted fast and now decays slowly but steadily is still falling."""
    n = len(losses)
    if n < 8:
        return False
    w = max(2, int(n * window))
    tail = losses[-w:]
    falling = bool((np.diff(tail) < 0).all())
    if falling and losses[0] > losses[-1] and (tail[0] - tail[-1]) / (w - 1) >= (losses[0] - losses[-1]) / (n - 1):
        return False
    if target is not None and _steps_to_target(losses, target, window) <= n - 1:
        return False
    span = max(losses[0] - losses.min(), 0.0)
    return (tail[0] - tail.min()) <= max(share * span, tol * abs(losses[0]))


def _steps_to_target(losses: np.ndarray, target: float, window: float = 0.25) -> float:
    """Steps the loss would take to fall to ``target`` at the relative rate of decline of the second half of the
    last ``window`` of the curve (log-linear: the loss losing the same fraction of itself at every step); 0 when the
    loss is already at or below ``target`` and that recent tail still falls by at least 1% of itself (what is short
    is the accuracy, and the loss is still improving); inf when that recent tail does not fall, the loss is not
    positive or the target is not positive. A loss nearing a floor slows down, so its recent rate projects the
    target far away; a steady decay keeps it within reach."""
    n = len(losses)
    w = max(2, int(n * window))
    tail = losses[-w:]
    half = w // 2
    a, b = float(tail[half]), float(tail[-1])
    if not (target > 0 and 0 < b < a and math.isfinite(a)):
        return math.inf
    if b <= target:
        return 0.0 if a >= 1.01 * b else math.inf
    rate = math.log(a / b) / (w - 1 - half)
    return math.log(b / target) / rate


@dataclass(frozen=True)
class _Options:
    """The check's thresholds (its keyword arguments), bundled for the judging helpers."""

    steps: int
    target_fraction: float
    min_accuracy: float
    baseline_ratio: float
    diverge_ratio: float


@dataclass
class _Case:
    """The evidence of one run of the check: the batch, the two trainings, and the result's parts so far."""

    opts: _Options
    n: int
    objective: Any
    real: dict[str, Any]
    base: dict[str, Any]
    composition: list
    scale_table: pd.DataFrame
    scale_notes: list[str]
    offset: tuple[pd.DataFrame, str] | None
    metrics: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    series: dict[str, Any]
    frozen: list[str]
    squashes: bool
    spectral: list[tuple[str, str]]
    losses: np.ndarray = field(init=False)
    start: float = field(init=False)
    final: float = field(init=False)
    base_final: float = field(init=False)
    acc: float | None = field(init=False)
    ran: int = field(init=False)  # steps run

    def __post_init__(self) -> None:
        self.losses = self.real["losses"]
        self.start, self.final = float(self.losses[0]), float(self.losses[-1])
        self.base_final = float(self.base["losses"][-1])
        self.acc = self.real["accs"][-1]
        self.ran = len(self.losses) - 1

    def plateaued(self) -> bool:
        """Whether the model's curve stopped improving (judged relative to the loss and its trend)."""
        return _plateaued(self.losses, target=self.opts.target_fraction * self.start)

    def fail(self, summary: str, advice: list[str], extra: dict | None = None) -> CheckResult:
        return CheckResult(CHECK, Status.FAIL, summary, self.metrics, {**self.tables, **(extra or {})}, advice,
                           self.series)


def _train_both(setup: Setup, samples: int, opts: _Options, seed: int, progress: bool,
                callback: Any) -> tuple[Any, int, Any, frozenset | None, set, list, dict, dict]:
    """Train a copy on one small batch, then the zeroed-input baseline: (batch, samples, objective, zeroed
    argument positions, input paths, loss-composition findings, model run, baseline run)."""
    model_probe = setup.build(seed=seed)
    batch, objective, why = overfit_samples(setup, samples, model_probe.model, model_probe)
    n = require_samples(batch, 2, "with one sample even a model that ignores its input can memorise the target, "
                                  "so the input-independent baseline cannot be told apart", CHECK, setup.layout)
    require_samples(batch, setup.accumulation_steps, f"the step splits it into accumulation_steps="
                                                     f"{setup.accumulation_steps} micro-batches", CHECK, setup.layout)
    # The baseline zeroes what the model reads, never the target: the model's arguments whose zeroing changes
    # its output (targets the loss derives from the inputs stay intact); batch tensors as a fallback when the
    # loss never calls the model itself.
    positions = argument_positions(setup, model_probe.model, batch, model_probe)
    inputs = input_paths(setup, model_probe.model, batch, model_probe)
    composition = loss_findings(setup, model_probe.model, batch, model_probe)  # named causes of a stall
    del model_probe
    steps = opts.steps
    real = train_on_batch(setup, batch, objective, steps, opts.target_fraction, seed, True, "overfit batch",
                          progress, callback=callback, min_accuracy=opts.min_accuracy,
                          probe=lambda ctx: input_dependence(setup, ctx, batch, positions, inputs))
    base_batch, zero_args = (batch, positions) if positions is not None else (zero_inputs(batch, inputs), frozenset())
    base_steps, real["baseline_stopped"] = baseline_steps(real, steps)
    real["samples_why"] = why
    base = train_on_batch(setup, base_batch, objective, steps, opts.target_fraction, seed, False,
                          "zeroed-input baseline", progress, fixed_steps=base_steps,
                          callback=callback, phase="baseline", zero_args=zero_args)
    return batch, n, objective, positions, inputs, composition, real, base


def _case(setup: Setup, opts: _Options, batch: Any, n: int, objective: Any, positions: frozenset | None, inputs: set,
          composition: list, real: dict, base: dict) -> _Case:
    """The metrics, series and tables every verdict shares."""
    losses, base_losses = real["losses"], base["losses"]
    start, final = float(losses[0]), float(losses[-1])
    best = float(np.nanmin(losses)) if np.isfinite(losses).any() else math.nan
    acc = real["accs"][-1]
    metrics: dict[str, Any] = {
        "samples": n, "samples_taken": real["samples_why"], "steps_run": len(losses) - 1, "max_steps": opts.steps,
        "start_loss": start,
        "final_loss": final, "best_loss": best, "loss_fraction": final / start if start else math.nan,
        "baseline_final_loss": float(base_losses[-1]), "target_fraction": opts.target_fraction,
        "baseline_ratio": opts.baseline_ratio, "objective": objective.kind if objective is not None else "unknown",
        "optimizer_steps": real["optimizer_steps"], "stopped": real["stopped"],
        "baseline_steps_run": len(base_losses) - 1, "baseline_stopped": real["baseline_stopped"],
        "observed_at": "optimizer.step" if real["optimizer_steps"] else "parameter change",
        "inputs_zeroed_in_baseline": len(positions) if positions is not None else len(inputs),
    }
    if real.get("probe") is not None:  # the trained model's output change when each sample gets another's input
        metrics["input_dependence"] = real["probe"]
    if acc is not None:
        metrics["final_accuracy"] = acc
        metrics["baseline_final_accuracy"] = base["accs"][-1] if base["accs"][-1] is not None else math.nan
    curve = pd.DataFrame({"step": np.arange(len(losses)), "loss": losses,
                          "accuracy": [math.nan if a is None else a for a in real["accs"]]})
    tables = {"curve": curve.iloc[np.unique(np.linspace(0, len(curve) - 1, min(len(curve), 21)).astype(int))]}
    scale_table, scale_notes = input_scale(batch, inputs)
    return _Case(opts, n, objective, real, base, composition, scale_table, scale_notes, target_scale(batch, objective),
                 metrics, tables, {"loss": losses, "baseline_loss": base_losses},
                 frozen=[name for name, p in setup.model.named_parameters() if not p.requires_grad],
                 squashes=any(isinstance(m, (nn.Sigmoid, nn.Softmax)) for m in setup.model.modules()),
                 spectral=spectral_norm_layers(setup.model))


def _broken(c: _Case) -> CheckResult | None:
    """A non-finite loss, no gradient at all, or no parameter that changed."""
    real = c.real
    if real["nonfinite_at"] is not None:
        return c.fail(f"the loss became non-finite at step {real['nonfinite_at']} while overfitting one batch of {c.n}",
                      ["Lower the learning rate or clip gradients (grad_clip=1.0).",
                       "Check the loss for log(0) or a division by zero (use F.cross_entropy on logits, add eps)."])
    if not real["got_grad"]:
        no_grad = [x for x in real["trainable"] if x not in real["got_grad"]]
        why = ("optimizer.step() was never called by the step and no parameter changed" if real["optimizer_steps"] == 0
               else "every .grad was None or zero when optimizer.step() ran")
        return c.fail(f"no parameter received a gradient while overfitting one batch ({why})",
                      ["Call loss.backward() before optimizer.step(), and do not detach the output or wrap the "
                       "forward in torch.no_grad()."],
                      {"no_gradient": pd.DataFrame({"parameter": no_grad})})
    if not real["changed"]:
        why = ("optimizer.step() was never called by the step and no parameter changed" if real["optimizer_steps"] == 0
               else "the optimizer ran but left every parameter as it was (learning rate 0, or an optimizer over no "
                    "parameters of this model)")
        return c.fail(f"no parameter changed in {real['optimizer_steps']} optimizer steps: {why}",
                      ["Make the step call optimizer.step(), with a non-zero learning rate, on an optimizer built "
                       "from the model's parameters."])
    return None


def _reached(c: _Case) -> bool:
    return c.real["reached"] or (c.final <= c.opts.target_fraction * c.start
                                 and (c.acc is None or c.acc >= c.opts.min_accuracy))


def _diverged(c: _Case) -> CheckResult | None:
    """Rising far above where it started is divergence whatever the shape of the tail: never "still falling"."""
    losses, start, final, n = c.losses, c.start, c.final, c.n
    best = c.metrics["best_loss"]
    peak = int(np.nanargmax(losses)) if np.isfinite(losses).any() else 0
    # Above where it started and above the input-independent start (a pretrained model's tiny start is no yardstick).
    base_start = float(c.base["losses"][0])
    level = max(start, base_start) if math.isfinite(base_start) else start
    ratio = c.opts.diverge_ratio
    if not (start > 0 and math.isfinite(best) and not _reached(c) and losses[peak] > ratio * level):
        return None
    c.metrics.update(diverge_ratio=ratio, peak_loss=float(losses[peak]), peak_step=peak)
    if final > ratio * start:
        what = (f"the loss diverges while overfitting one batch of {n}: {fmt(start)} -> {fmt(final)} "
                f"({fmt(final / start)}x its start; highest {fmt(float(losses[peak]))} at step {peak})")
    else:
        what = (f"the loss diverged while overfitting one batch of {n}: it rose from {fmt(start)} to "
                f"{fmt(float(losses[peak]))} at step {peak} ({fmt(float(losses[peak]) / start)}x its start) and "
                f"ends at {fmt(final)} without memorising the batch")
    return c.fail(what, ["Lower the learning rate (3-10x) or clip gradients (grad_clip=1.0).",
                         "Check that the step descends: it must call backward() on the loss itself (not -loss) "
                         "and optimizer.step() with a positive learning rate."])


def _memorised(c: _Case) -> CheckResult | None:
    """PASS: memorised, or fitted every label with a loss floor that frozen parameters impose."""
    start, final, acc, frozen, n = c.start, c.final, c.acc, c.frozen, c.n
    reached = _reached(c)
    if (not reached and frozen and acc is not None and acc >= c.opts.min_accuracy and final < start
            and final < c.opts.baseline_ratio * c.base_final):
        # Frozen layers bound how confident the outputs can get: the trainable ones fit every label, but the loss
        # keeps a floor they cannot remove. That is memorisation, with a caveat.
        c.metrics.update(frozen_parameters=len(frozen), loss_floor=final)
        summary = (f"memorised a batch of {n} in {c.ran} steps: train accuracy {acc_text(acc)}, loss "
                   f"{fmt(start)} -> {fmt(final)} (zeroed-input baseline: {fmt(c.base_final)}); the loss keeps a floor "
                   f"at {final / start:.0%} of its start (above the {c.opts.target_fraction:.0%} target) that the "
                   f"{len(frozen)} frozen parameter(s) ({', '.join(frozen[:4])}{', ...' if len(frozen) > 4 else ''}) "
                   "impose: they bound how confident the outputs can get")
        return CheckResult(CHECK, Status.PASS, summary, c.metrics,
                           {**c.tables, "frozen": pd.DataFrame({"parameter": frozen})}, [], c.series)
    if reached:
        k = len(c.base["losses"]) - 1
        at = (f"zeroed-input baseline: {fmt(c.base_final)}" if k >= c.ran else
              f"after {k} steps the model's loss was {fmt(float(c.losses[k]))}, the zeroed-input baseline's "
              f"{fmt(c.base_final)}")
        summary = (f"memorised a batch of {n} in {c.ran} steps: loss {fmt(start)} -> {fmt(final)}"
                   + (f", train accuracy {acc_text(acc)}" if acc is not None else "") + f" ({at})")
        return CheckResult(CHECK, Status.PASS, summary, c.metrics, c.tables, [], c.series)
    return None


def _named_cause(c: _Case) -> CheckResult | None:
    """A stall with a named cause: bounded outputs, how loss_fn composes the loss, or a far-off regression target."""
    start, final = c.start, c.final
    cause = None if c.scale_notes else bounded_output_cause(c.real["out"], c.objective, c.squashes)
    if cause is not None:
        return c.fail(f"the loss stalls at a floor of {fmt(final)} ({final / start:.0%} of its start): {cause}",
                      ["Return raw logits from the model and let the loss apply softmax/sigmoid (remove the final "
                       "Softmax/Sigmoid, or use NLLLoss on log_softmax outputs)."])
    if c.composition:
        # How loss_fn composes output and loss (softmax before cross entropy, a broadcasting target) explains a
        # stall better than any guess from the curve (see model.init_loss, which reports the same finding first).
        c.metrics["composition"] = ", ".join(f.kind for f in c.composition)
        return c.fail(f"the loss falls only to {fmt(final)} ({final / start:.0%} of its start) in {c.ran} steps: "
                      + "; ".join(f.summary for f in c.composition), [f.advice for f in c.composition])
    # Slow or stalled: how far the inputs (and a regression target) are from unit scale is part of the evidence,
    # and often the cause.
    c.tables["input_scale"] = c.scale_table
    offset = c.offset
    if offset is None:
        return None
    c.tables["target_scale"] = offset[0]
    c.metrics["target_mean"] = float(offset[0]["mean"].iloc[0])
    c.metrics["target_std"] = float(offset[0]["std"].iloc[0])
    return c.fail(f"the loss falls only to {fmt(final)} ({final / start:.0%} of its start) in {c.ran} steps: "
                  f"{offset[1]}",
                  [f"Standardise the target (subtract its mean, divide by its std) or set the bias of the last layer "
                   f"to its mean ({fmt(c.metrics['target_mean'])}); then rerun.", *c.scale_notes])


def _signed(c: _Case) -> CheckResult | None:
    """SKIP the memorisation rule for a loss that takes negative values (a Wasserstein critic's D(fake) - D(real)):
    "a fraction of its start" has no meaning without a floor at zero (a negative start is below any such target
    at once), and the zeroed-input baseline is not judged on that scale either."""
    lows = [float(np.nanmin(x)) for x in (c.losses, c.base["losses"]) if np.isfinite(x).any()]
    low = min(lows) if lows else math.nan
    if not low < 0:
        return None
    c.metrics.update(signed_loss=True, lowest_loss=low)
    where = (f"starts at {fmt(c.start)}" if c.start <= 0 else f"reaches {fmt(low)}")
    summary = (f"memorisation not judged: the loss {where}, below zero, so it has no floor at zero (a Wasserstein "
               f"critic's D(fake) - D(real)) and 'falls to {c.opts.target_fraction:.0%} of its start' cannot be "
               f"judged; it went {fmt(c.start)} -> {fmt(c.final)} in {c.ran} steps (zeroed-input baseline: "
               f"{fmt(c.base_final)}); gradients reached the parameters and nothing diverged")
    advice = ["To let tropt judge memorisation, give the Setup a loss_fn with a floor at zero (e.g. the "
              "discriminator's binary cross entropy); the loss curve is in the series."]
    return CheckResult(CHECK, Status.SKIP, summary, c.metrics, c.tables, advice, c.series)


def _zeroing_changes_target(c: _Case) -> bool:
    """Whether zeroing the input zeroes the loss's target too (a masked autoencoder rebuilds its input): at the
    same initial weights the zeroed-input loss starts below half of the model's. A model that ignores its input
    starts the two at the same loss when its target does not depend on the input, so this is never met by one."""
    base_start = float(c.base["losses"][0])
    return c.start > 0 and math.isfinite(base_start) and 0 <= base_start < 0.5 * c.start


def _not_memorised(c: _Case) -> CheckResult:
    """The verdict without memorisation; "ignores its input" is not judged when the input is also the target."""
    if not _zeroing_changes_target(c):
        return _not_memorised_verdict(c, True)
    base_start = float(c.base["losses"][0])
    c.metrics["baseline_start_fraction"] = base_start / c.start
    r = _not_memorised_verdict(c, False)
    why = (" (whether the model ignores its input is not judged: on zeroed inputs the loss starts at "
           f"{fmt(base_start)}, {base_start / c.start:.0%} of the model's {fmt(c.start)}, at the same weights: the "
           "loss's target is derived from the input, so zeroing the input zeroes the target too)")
    return dataclasses.replace(r, summary=r.summary + why)


def _not_memorised_verdict(c: _Case, judge_input: bool) -> CheckResult:
    """No named cause: an ignored input, a plateau (of a loss tropt knows or not), or still falling."""
    losses, start, final, base_final, acc, n = c.losses, c.start, c.final, c.base_final, c.acc, c.n
    notes, ratio = c.scale_notes, c.opts.baseline_ratio
    base_start = float(c.base["losses"][0])
    # Both curves still creeping down together (a tiny learning rate) is slow learning, not an ignored input: that
    # needs the model to have stopped improving, or the baseline to have learned what it can.
    plateaued = c.plateaued()
    decided = plateaued or base_final <= 0.8 * base_start
    if judge_input and base_final > 0 and final >= ratio * base_final and math.isfinite(base_final) and decided:
        if reads_its_input(c.real.get("probe")):
            return reads_but_slow(c)
        return c.fail(f"the model ignores its input: after {c.ran} steps its loss {fmt(final)} does not beat "
                      f"the {fmt(base_final)} of the same model trained on zeroed inputs",
                      [
                          *notes,
                          "Check that the forward pass uses its input (no torch.zeros_like/detached or overwritten "
                          "input, no constant output path), and that inputs and labels are paired correctly.",
                          "If it does, the input's signal is lost on the way: look for dead units "
                          "(model.activation_stats) or vanishing gradients (model.gradient_flow)."])
    if plateaued and c.objective is None and final < ratio * base_final:
        # A custom loss (label smoothing, a regulariser) can have a floor well above zero: beating the baseline is
        # learning, and tropt cannot tell where that floor is.
        return CheckResult(
            CHECK, Status.WARN,
            f"the loss plateaus at {fmt(final)} ({final / start:.0%} of its start), well below the zeroed-input "
            f"baseline's {fmt(base_final)}; the loss is not one tropt recognises, so whether that is its floor (label "
            "smoothing, regularisation terms) cannot be told",
            c.metrics, c.tables, ["If the loss has no such floor, raise the learning rate or the steps and rerun; to "
                                  "let tropt judge memorisation, compute the plain loss in loss_fn (e.g. without "
                                  "label smoothing).", *notes], c.series)
    if plateaued and c.spectral:
        return spectral_floor(c)
    if plateaued:
        return c.fail(f"the loss stalls at a floor of {fmt(final)} ({final / start:.0%} of its start) and stops "
                      f"improving before memorising {n} samples"
                      + (f" (train accuracy {acc_text(acc)})" if acc is not None else ""),
                      [*notes, "Check for a bounded output (sigmoid/softmax/tanh before the loss), a too-small "
                               "model, or labels the inputs cannot determine; then raise the learning rate."])
    steps = c.opts.steps
    to_target = _steps_to_target(losses, c.opts.target_fraction * start)
    trend = ""
    if math.isfinite(to_target):
        c.metrics["tail_steps_to_target"] = to_target
        trend = (f"; at its latest rate it reaches the {c.opts.target_fraction:.0%} target in about "
                 f"{math.ceil(to_target)} more steps" if to_target > 0 else
                 f"; the loss is below the {c.opts.target_fraction:.0%} target and still falling, the train accuracy "
                 f"short of {c.opts.min_accuracy:.0%}")
    return CheckResult(
        CHECK, Status.WARN,
        f"the loss is still falling but did not memorise a batch of {n} within {steps} steps: "
        f"{fmt(start)} -> {fmt(final)} ({final / start:.0%} of its start)"
        + (f", train accuracy {acc_text(acc)}" if acc is not None else "") + trend,
        c.metrics, c.tables, [*notes, f"Raise the learning rate or the number of steps (steps={steps * 2}) and "
                                      "rerun; a model that can learn memorises a few dozen samples quickly."],
        c.series)


@register(CHECK, title="Overfit one small batch",
          description="Train a copy on one fixed small batch; it must memorise it and beat a zeroed-input baseline.",
          budgets={'quick': {'steps': 100, 'samples': 2}, 'thorough': {'steps': 500}},
          plot="tropt.plots.model")
def check_overfit_batch(setup: Setup, *, samples: int = DEFAULT_SAMPLES, steps: int = 200, target_fraction: float = 0.1,
                        min_accuracy: float = 0.95, baseline_ratio: float = 0.9, diverge_ratio: float = 2.0,
                        seed: int | None = None,
                        progress: bool = True, callback: Any = None) -> CheckResult:
    """Train a copy on one fixed batch and judge whether it can memorise it.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    samples
        Samples taken from the first batch (at most; at least 2 per micro-batch; doubled while every sample taken has
        the same target, which a model ignoring its input memorises as well). ``budget="quick"`` takes 2: a verdict
        other than PASS on fewer than 32 is judged again on 32 (``metrics["escalated"]``).
    steps
        Maximum optimizer steps (stops early once the batch is memorised; the zeroed-input baseline then runs at
        most ``BASELINE_STEPS_AFTER_PASS`` steps, since no baseline changes a PASS).
    target_fraction
        PASS once the loss falls to this fraction of its start (and train accuracy reaches ``min_accuracy`` for
        classes).
    min_accuracy
        Train accuracy needed with a class objective. Below 1 because a token-level batch can hold positions no
        model can predict (the token after a fixed start token), while the loss still falls far.
    baseline_ratio
        FAIL ("ignores its input") when the final loss is above this fraction of the zeroed-input baseline's.
    diverge_ratio
        FAIL ("diverges") when the loss rose above this many times its start (and the zeroed-input baseline's
        start) at any step and the batch was not memorised, whatever the tail's shape.

    seed
        Seed of the copies (the Setup's seed when None).
    progress
        Show progress bars.
    callback
        Optional ``callback({"check", "phase": "model"|"baseline", "step", "total", "loss"})`` at the start and after
        each step (live loss curves); raising :class:`tropt.errors.Cancelled` in it stops the run.

    A model with frozen parameters (``requires_grad=False``) that reaches ``min_accuracy`` and beats the baseline
    PASSes even when its loss stays above ``target_fraction``: the frozen layers impose that floor (noted in the
    summary, ``metrics["loss_floor"]``). A model with spectrally normalised layers whose loss stalls at a floor
    WARNs, naming the layers: the normalisation bounds the logits' scale, so cross entropy cannot reach zero.
    """
    setup.validate()
    seed = setup.seed if seed is None else seed
    opts = _Options(steps, target_fraction, min_accuracy, baseline_ratio, diverge_ratio)
    first = _judged(setup, samples, opts, seed, progress, callback)
    if first.status is Status.PASS or samples >= DEFAULT_SAMPLES or first.metrics["samples"] >= DEFAULT_SAMPLES:
        return first
    # Fewer samples than the default (budget="quick") decide a PASS cheaply; any other verdict is judged on the
    # default samples, as without the shortcut (two samples can have near-equal soft targets a baseline fits).
    again = _judged(setup, DEFAULT_SAMPLES, opts, seed, progress, callback)
    if again.metrics["samples"] <= first.metrics["samples"]:
        return first
    return escalated(first, again, DEFAULT_SAMPLES)


def _judged(setup: Setup, samples: int, opts: _Options, seed: int, progress: bool, callback: Any) -> CheckResult:
    with preserved(setup.model):
        evidence = _train_both(setup, samples, opts, seed, progress, callback)
    c = _case(setup, opts, *evidence)
    for judge in (_broken, _diverged, _signed, _memorised, _named_cause):
        result = judge(c)
        if result is not None:
            return result
    return _not_memorised(c)
