"""``model.overfit_batch``: can the model memorise one small batch? (Karpathy: "overfit one batch")

A copy is trained with the user's optimizer factory and step on one fixed batch of at most ``samples`` samples. A
second copy, from the same initial weights, is trained on the same batch with its inputs zeroed: the
input-independent baseline. A model that learns reaches a loss far below both its start and that baseline.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from .composition import loss_findings
from ._common import (
    Capture,
    dropout_off,
    fmt,
    argument_positions,
    get_leaf,
    input_paths,
    input_scale,
    probe,
    require_samples,
    take_samples,
    target_scale,
    zero_inputs,
    zeroed_arguments,
)

CHECK = "model.overfit_batch"


def _acc(a: float) -> str:
    """An accuracy that never rounds up to 100% (99.9% of tokens is not all of them)."""
    return "100%" if a >= 1.0 else f"{math.floor(a * 1000) / 10:.1f}%"


def _evaluate(setup: Any, ctx: Any, batch: Any, objective: Any) -> tuple[float, float | None, torch.Tensor | None]:
    """Loss and accuracy on the batch as trained (train mode so BatchNorm uses batch statistics; dropout off)."""
    with torch.no_grad(), dropout_off(ctx.model), Capture(ctx.model) as cap, ctx.autocast():
        loss = float(setup.loss(ctx.model, batch).detach().float())
    out = cap.output
    acc = None
    if objective is not None and out is not None:
        got = objective.correct(out, get_leaf(batch, objective.target_path).to(out.device))
        if got is not None and got[1] > 0:
            acc = got[0] / got[1]
    return loss, acc, out


def _train(setup: Any, batch: Any, objective: Any, steps: int, target_fraction: float, seed: int,
           stop_early: bool, desc: str, progress: bool, fixed_steps: int | None = None,
           callback: Any = None, phase: str = "model", zero_args: frozenset = frozenset(),
           min_accuracy: float = 1.0) -> dict[str, Any]:
    ctx = setup.build(seed=seed)
    with zeroed_arguments(ctx.model, zero_args):  # the baseline: the model sees zeros where it reads its inputs
        return _train_ctx(ctx, setup, batch, objective, steps, target_fraction, stop_early, desc, progress,
                          fixed_steps, callback, phase, min_accuracy)


def _train_ctx(ctx: Any, setup: Any, batch: Any, objective: Any, steps: int, target_fraction: float, stop_early: bool,
               desc: str, progress: bool, fixed_steps: int | None, callback: Any, phase: str,
               min_accuracy: float) -> dict[str, Any]:
    from tqdm.auto import tqdm

    k = setup.accumulation_steps
    micro = setup.split(batch, k) if k > 1 else [batch]
    params = [p for p in ctx.model.parameters()]
    names = [n for n, _ in ctx.model.named_parameters()]
    start_values = [p.detach().clone() for p in params]
    got_grad = torch.zeros(len(params), dtype=torch.bool)
    opt_steps = [0]

    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        opt_steps[0] += 1
        for i, p in enumerate(params):
            if p.grad is not None and not got_grad[i] and bool((p.grad != 0).any()):
                got_grad[i] = True

    # A step without an optimizer (or one it never steps) updates by hand: judged from the parameter change.
    handle = ctx.optimizer.register_step_pre_hook(pre_hook) if ctx.optimizer is not None else None
    hand_updates = [0]
    losses, accs = [], []
    loss0, acc0, out0 = _evaluate(setup, ctx, batch, objective)
    losses.append(loss0)
    accs.append(acc0)
    nonfinite_at = None if math.isfinite(loss0) else 0
    reached = False
    n = fixed_steps if fixed_steps is not None else steps
    if callback is not None:
        callback({"check": CHECK, "phase": phase, "step": 0, "total": n, "loss": loss0})
    try:
        for t in tqdm(range(1, n + 1), desc=desc, disable=not progress, leave=False):
            if nonfinite_at is not None:
                break
            # Until an optimizer step is seen, keep the values to observe a hand-written update.
            watch = ctx.optimizer is None or opt_steps[0] == 0
            seen, before = opt_steps[0], ([p.detach().clone() for p in params] if watch else None)
            setup.run_step(ctx, micro)
            _forget_batch_state(ctx)
            if watch and opt_steps[0] == seen:
                _hand_update(params, before, got_grad, hand_updates)
            loss, acc, out = _evaluate(setup, ctx, batch, objective)
            losses.append(loss)
            accs.append(acc)
            if callback is not None:
                callback({"check": CHECK, "phase": phase, "step": t, "total": n, "loss": loss})
            if not math.isfinite(loss):
                nonfinite_at = t
                break
            if stop_early and loss <= target_fraction * loss0 and (acc is None or acc >= min_accuracy):
                reached = True
                break
    finally:
        if handle is not None:
            handle.remove()
    changed = [names[i] for i, (p, v) in enumerate(zip(params, start_values))
               if p.shape != v.shape or not torch.equal(p.detach(), v)]
    _, _, out_final = _evaluate(setup, ctx, batch, objective) if nonfinite_at is None else (None, None, None)
    return {"losses": np.asarray(losses, dtype=float), "accs": accs, "reached": reached, "nonfinite_at": nonfinite_at,
            "got_grad": [names[i] for i in range(len(params)) if got_grad[i]], "names": names,
            "trainable": [names[i] for i, p in enumerate(params) if p.requires_grad], "changed": changed,
            "optimizer_steps": opt_steps[0], "hand_updates": hand_updates[0], "out": out_final}


def _forget_batch_state(ctx: Any) -> None:
    """Drop the tensors the step carries on ctx from one batch to the next (a recurrent hidden state).

    The batch repeats here, so state carried from its own end is not a continuation: every step starts from the
    state the loss is evaluated with, as the first did. Counters and other plain numbers stay (a learning-rate
    schedule goes on).
    """
    for name, value in list(ctx._user_attrs().items()):
        if _tensors_only(value):
            delattr(ctx, name)


def _tensors_only(value: Any) -> bool:
    """A tensor, or a non-empty (nested) tuple/list of tensors: the shape of a recurrent state."""
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(_tensors_only(v) for v in value)


def _hand_update(params: list, before: list, got_grad: torch.Tensor, count: list[int]) -> None:
    """A call with no optimizer step: a parameter that moved, or holds a non-zero gradient, got an update."""
    moved = False
    for i, (p, v) in enumerate(zip(params, before)):
        changed = p.shape != v.shape or not torch.equal(p.detach(), v)
        moved |= changed
        if not got_grad[i] and (changed or (p.grad is not None and bool((p.grad != 0).any()))):
            got_grad[i] = True
    count[0] += int(moved)


def _plateaued(losses: np.ndarray, window: float = 0.25, share: float = 0.1, tol: float = 0.005) -> bool:
    """Whether the last ``window`` of the curve added less than ``share`` of the total improvement (and, for a curve
    that barely moved at all, less than ``tol`` of its start). A slow but steady decline is not a plateau: its last
    quarter holds a quarter of the progress."""
    n = len(losses)
    if n < 8:
        return False
    w = max(2, int(n * window))
    tail = losses[-w:]
    span = max(losses[0] - losses.min(), 0.0)
    return (tail[0] - tail.min()) <= max(share * span, tol * abs(losses[0]))


def _bounded_output_cause(out: torch.Tensor | None, objective: Any, squashes: bool = True) -> str | None:
    """A specific reason when the outputs are probabilities fed to a loss that expects logits.

    Rows that sum to 1 are softmax outputs whatever the model; outputs merely inside [0, 1] are blamed on a squashing
    layer only when the model has one (``squashes``): small logits of a model that has not learned look the same."""
    if out is None or objective is None:
        return None
    o = out.float()
    in_unit = bool(((o >= 0) & (o <= 1)).all())
    if objective.kind == "cross_entropy" and in_unit and o.ndim >= 2:
        sums = o.sum(-1) if objective.layout == 0 else o.sum(1)
        if torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            return ("the model's outputs are probabilities (each row sums to 1) but the loss is cross entropy, "
                    "which applies log_softmax itself: softmax is applied twice, bounding the logits to [0, 1]")
        if not squashes:
            return None
        return ("the model's outputs all lie in [0, 1] but the loss is cross entropy, which expects unbounded "
                "logits: a sigmoid/softmax before the loss bounds them")
    if objective.kind == "bce_logits" and in_unit and squashes:
        return ("the model's outputs all lie in [0, 1] but the loss is binary cross entropy *with logits*, which "
                "applies the sigmoid itself: the sigmoid is applied twice")
    return None


@register(CHECK, title="Overfit one small batch",
          description="Train a copy on one fixed small batch; it must memorise it and beat a zeroed-input baseline.")
def check_overfit_batch(setup: Any, *, samples: int = 32, steps: int = 200, target_fraction: float = 0.1,
                        min_accuracy: float = 0.95, baseline_ratio: float = 0.9, diverge_ratio: float = 2.0,
                        seed: int | None = None,
                        progress: bool = True, callback: Any = None) -> CheckResult:
    """Train a copy on one fixed batch and judge whether it can memorise it.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    samples
        Samples taken from the first batch (at most; at least 2 are needed).
    steps
        Maximum optimizer steps (stops early once the batch is memorised).
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
    summary, ``metrics["loss_floor"]``).
    """
    setup.validate()
    seed = setup.seed if seed is None else seed
    with preserved(setup.model):
        batch = take_samples(setup.sample_batch(), max(2, samples), setup.layout)
        n = require_samples(batch, 2, "with one sample even a model that ignores its input can memorise the target, "
                                      "so the input-independent baseline cannot be told apart", CHECK, setup.layout)
        require_samples(batch, setup.accumulation_steps, f"the step splits it into accumulation_steps="
                                                         f"{setup.accumulation_steps} micro-batches", CHECK, setup.layout)
        model_probe = setup.build(seed=seed)
        _, _, objective, _ = probe(setup, model_probe.model, batch, model_probe)
        # The baseline zeroes what the model reads, never the target: the model's arguments whose zeroing changes
        # its output (targets the loss derives from the inputs stay intact); batch tensors as a fallback when the
        # loss never calls the model itself.
        positions = argument_positions(setup, model_probe.model, batch, model_probe)
        inputs = input_paths(setup, model_probe.model, batch, model_probe)
        composition = loss_findings(setup, model_probe.model, batch, model_probe)  # named causes of a stall
        del model_probe
        real = _train(setup, batch, objective, steps, target_fraction, seed, True, "overfit batch", progress,
                      callback=callback, min_accuracy=min_accuracy)
        base_steps = max(len(real["losses"]) - 1, 1)
        base_batch, zero_args = (batch, positions) if positions is not None else (zero_inputs(batch, inputs), frozenset())
        base = _train(setup, base_batch, objective, steps, target_fraction, seed, False, "zeroed-input baseline",
                      progress, fixed_steps=base_steps if real["reached"] else steps, callback=callback, phase="baseline",
                      zero_args=zero_args)
    losses, base_losses = real["losses"], base["losses"]
    start, final = float(losses[0]), float(losses[-1])
    best = float(np.nanmin(losses)) if np.isfinite(losses).any() else math.nan
    base_final = float(base_losses[-1])
    acc = real["accs"][-1]
    metrics: dict[str, Any] = {
        "samples": n, "steps_run": len(losses) - 1, "max_steps": steps, "start_loss": start, "final_loss": final,
        "best_loss": best, "loss_fraction": final / start if start else math.nan, "baseline_final_loss": base_final,
        "target_fraction": target_fraction, "baseline_ratio": baseline_ratio,
        "objective": objective.kind if objective is not None else "unknown",
        "optimizer_steps": real["optimizer_steps"], "observed_at": "optimizer.step" if real["optimizer_steps"] else "parameter change",
        "inputs_zeroed_in_baseline": len(positions) if positions is not None else len(inputs),
    }
    if acc is not None:
        metrics["final_accuracy"] = acc
        metrics["baseline_final_accuracy"] = base["accs"][-1] if base["accs"][-1] is not None else math.nan
    series = {"loss": losses, "baseline_loss": base_losses}
    curve = pd.DataFrame({"step": np.arange(len(losses)), "loss": losses,
                          "accuracy": [math.nan if a is None else a for a in real["accs"]]})
    tables = {"curve": curve.iloc[np.unique(np.linspace(0, len(curve) - 1, min(len(curve), 21)).astype(int))]}
    no_grad = [x for x in real["trainable"] if x not in real["got_grad"]]
    scale_table, scale_notes = input_scale(batch, inputs)
    offset = target_scale(batch, objective)

    def fail(summary: str, advice: list[str], extra: dict | None = None) -> CheckResult:
        return CheckResult(CHECK, Status.FAIL, summary, metrics, {**tables, **(extra or {})}, advice, series)

    if real["nonfinite_at"] is not None:
        return fail(f"the loss became non-finite at step {real['nonfinite_at']} while overfitting one batch of {n}",
                    ["Lower the learning rate or clip gradients (grad_clip=1.0).",
                     "Check the loss for log(0) or a division by zero (use F.cross_entropy on logits, add eps)."])
    if not real["got_grad"]:
        why = ("optimizer.step() was never called by the step and no parameter changed" if real["optimizer_steps"] == 0
               else "every .grad was None or zero when optimizer.step() ran")
        return fail(f"no parameter received a gradient while overfitting one batch ({why})",
                    ["Call loss.backward() before optimizer.step(), and do not detach the output or wrap the forward "
                     "in torch.no_grad()."],
                    {"no_gradient": pd.DataFrame({"parameter": no_grad})})
    if not real["changed"]:
        why = ("optimizer.step() was never called by the step and no parameter changed" if real["optimizer_steps"] == 0
               else "the optimizer ran but left every parameter as it was (learning rate 0, or an optimizer over no "
                    "parameters of this model)")
        return fail(f"no parameter changed in {real['optimizer_steps']} optimizer steps: {why}",
                    ["Make the step call optimizer.step(), with a non-zero learning rate, on an optimizer built from "
                     "the model's parameters."])
    peak = int(np.nanargmax(losses)) if np.isfinite(losses).any() else 0
    reached = real["reached"] or (final <= target_fraction * start and (acc is None or acc >= min_accuracy))
    # Above where it started and above the input-independent start (a pretrained model's tiny start is no yardstick).
    level = max(start, float(base_losses[0])) if math.isfinite(float(base_losses[0])) else start
    if start > 0 and math.isfinite(best) and not reached and losses[peak] > diverge_ratio * level:
        # Rising far above where it started is divergence whatever the shape of the tail: never "still falling".
        metrics.update(diverge_ratio=diverge_ratio, peak_loss=float(losses[peak]), peak_step=peak)
        if final > diverge_ratio * start:
            what = (f"the loss diverges while overfitting one batch of {n}: {fmt(start)} -> {fmt(final)} "
                    f"({fmt(final / start)}x its start; highest {fmt(float(losses[peak]))} at step {peak})")
        else:
            what = (f"the loss diverged while overfitting one batch of {n}: it rose from {fmt(start)} to "
                    f"{fmt(float(losses[peak]))} at step {peak} ({fmt(float(losses[peak]) / start)}x its start) and "
                    f"ends at {fmt(final)} without memorising the batch")
        return fail(what, ["Lower the learning rate (3-10x) or clip gradients (grad_clip=1.0).",
                           "Check that the step descends: it must call backward() on the loss itself (not -loss) "
                           "and optimizer.step() with a positive learning rate."])
    frozen = [name for name, p in setup.model.named_parameters() if not p.requires_grad]
    if (not reached and frozen and acc is not None and acc >= min_accuracy and final < start
            and final < baseline_ratio * base_final):
        # Frozen layers bound how confident the outputs can get: the trainable ones fit every label, but the loss
        # keeps a floor they cannot remove. That is memorisation, with a caveat.
        metrics.update(frozen_parameters=len(frozen), loss_floor=final)
        summary = (f"memorised a batch of {n} in {len(losses) - 1} steps: train accuracy {_acc(acc)}, loss "
                   f"{fmt(start)} -> {fmt(final)} (zeroed-input baseline: {fmt(base_final)}); the loss keeps a floor "
                   f"at {final / start:.0%} of its start (above the {target_fraction:.0%} target) that the "
                   f"{len(frozen)} frozen parameter(s) ({', '.join(frozen[:4])}{', ...' if len(frozen) > 4 else ''}) "
                   "impose: they bound how confident the outputs can get")
        return CheckResult(CHECK, Status.PASS, summary, metrics,
                           {**tables, "frozen": pd.DataFrame({"parameter": frozen})}, [], series)
    if reached:
        summary = (f"memorised a batch of {n} in {len(losses) - 1} steps: loss {fmt(start)} -> {fmt(final)}"
                   + (f", train accuracy {_acc(acc)}" if acc is not None else "")
                   + f" (zeroed-input baseline: {fmt(base_final)})")
        return CheckResult(CHECK, Status.PASS, summary, metrics, tables, [], series)
    squashes = any(isinstance(m, (nn.Sigmoid, nn.Softmax)) for m in setup.model.modules())
    cause = None if scale_notes else _bounded_output_cause(real["out"], objective, squashes)
    if cause is not None:
        return fail(f"the loss stalls at a floor of {fmt(final)} ({final / start:.0%} of its start): {cause}",
                    ["Return raw logits from the model and let the loss apply softmax/sigmoid (remove the final "
                     "Softmax/Sigmoid, or use NLLLoss on log_softmax outputs)."])
    if composition:
        # How loss_fn composes output and loss (softmax before cross entropy, a broadcasting target) explains a
        # stall better than any guess from the curve (see model.init_loss, which reports the same finding first).
        metrics["composition"] = ", ".join(f.kind for f in composition)
        return fail(f"the loss falls only to {fmt(final)} ({final / start:.0%} of its start) in {len(losses) - 1} steps: "
                    + "; ".join(f.summary for f in composition), [f.advice for f in composition])
    # Slow or stalled: how far the inputs (and a regression target) are from unit scale is part of the evidence,
    # and often the cause.
    tables["input_scale"] = scale_table
    if offset is not None:
        tables["target_scale"] = offset[0]
        metrics["target_mean"], metrics["target_std"] = float(offset[0]["mean"].iloc[0]), float(offset[0]["std"].iloc[0])
        return fail(f"the loss falls only to {fmt(final)} ({final / start:.0%} of its start) in {len(losses) - 1} steps: "
                    f"{offset[1]}",
                    [f"Standardise the target (subtract its mean, divide by its std) or set the bias of the last layer "
                     f"to its mean ({fmt(metrics['target_mean'])}); then rerun."] + scale_notes)
    base_start = float(base_losses[0])
    # Both curves still creeping down together (a tiny learning rate) is slow learning, not an ignored input: that
    # needs the model to have stopped improving, or the baseline to have learned what it can.
    decided = _plateaued(losses) or base_final <= 0.8 * base_start
    if base_final > 0 and final >= baseline_ratio * base_final and math.isfinite(base_final) and decided:
        return fail(f"the model ignores its input: after {len(losses) - 1} steps its loss {fmt(final)} does not beat "
                    f"the {fmt(base_final)} of the same model trained on zeroed inputs",
                    scale_notes + [
                        "Check that the forward pass uses its input (no torch.zeros_like/detached or overwritten input, "
                        "no constant output path), and that inputs and labels are paired correctly.",
                        "If it does, the input's signal is lost on the way: look for dead units (model.activation_stats) "
                        "or vanishing gradients (model.gradient_flow)."])
    if _plateaued(losses) and objective is None and final < baseline_ratio * base_final:
        # A custom loss (label smoothing, a regulariser) can have a floor well above zero: beating the baseline is
        # learning, and tropt cannot tell where that floor is.
        return CheckResult(
            CHECK, Status.WARN,
            f"the loss plateaus at {fmt(final)} ({final / start:.0%} of its start), well below the zeroed-input baseline's "
            f"{fmt(base_final)}; the loss is not one tropt recognises, so whether that is its floor (label smoothing, "
            "regularisation terms) cannot be told",
            metrics, tables, ["If the loss has no such floor, raise the learning rate or the steps and rerun; to let tropt "
                              "judge memorisation, compute the plain loss in loss_fn (e.g. without label smoothing)."]
            + scale_notes, series)
    if _plateaued(losses):
        return fail(f"the loss stalls at a floor of {fmt(final)} ({final / start:.0%} of its start) and stops "
                    f"improving before memorising {n} samples"
                    + (f" (train accuracy {_acc(acc)})" if acc is not None else ""),
                    scale_notes + ["Check for a bounded output (sigmoid/softmax/tanh before the loss), a too-small model, "
                                   "or labels the inputs cannot determine; then raise the learning rate."])
    return CheckResult(
        CHECK, Status.WARN,
        f"the loss is still falling but did not memorise a batch of {n} within {steps} steps: "
        f"{fmt(start)} -> {fmt(final)} ({final / start:.0%} of its start)"
        + (f", train accuracy {_acc(acc)}" if acc is not None else ""),
        metrics, tables, scale_notes + [f"Raise the learning rate or the number of steps (steps={steps * 2}) and rerun; "
                                        "a model that can learn memorises a few dozen samples quickly."], series)
