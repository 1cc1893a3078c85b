"""Training a copy on one fixed batch, for ``model.overfit_batch``: the loss (and accuracy) after every step, which
parameters got a gradient and which changed, whether an optimizer or a hand-written update did the stepping.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.batch import get_leaf
from ..core.carried_state import CarriedState, find_slots
from ..core.grad_mode import loss_grad_mode
from ..core.modes import dropout_off
from ..core.objective import Capture
from ..core.own_hooks import norm_view, owned_hook
from ..core.schedule_guard import hold_schedules_at_end
from ._common import zeroed_arguments

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "model.overfit_batch"


def _evaluate(setup: Setup, ctx: Any, batch: Any, objective: Any) -> tuple[float, float | None, torch.Tensor | None]:
    """Loss and accuracy on the batch as trained (train mode so BatchNorm uses batch statistics; dropout off; no
    gradients unless the loss differentiates inside itself)."""
    grad = loss_grad_mode(setup, ctx.model, batch, ctx)
    with grad, dropout_off(ctx.model), Capture(ctx.model) as cap, ctx.autocast():
        loss = float(setup.loss(ctx.model, batch).detach().float())
    out = cap.output
    acc = None
    if objective is not None and out is not None:
        got = objective.correct(out, get_leaf(batch, objective.target_path).to(out.device))
        if got is not None and got[1] > 0:
            acc = got[0] / got[1]
    return loss, acc, out


def train_on_batch(setup: Setup, batch: Any, objective: Any, steps: int, target_fraction: float, seed: int,
           stop_early: bool, desc: str, progress: bool, fixed_steps: int | None = None,
           callback: Any = None, phase: str = "model", zero_args: frozenset = frozenset(),
           min_accuracy: float = 1.0, probe: Any = None) -> dict[str, Any]:
    """Train a fresh copy on ``batch`` (see :func:`_train_ctx`); ``probe(ctx)``, when given, runs on the trained
    copy and its value is returned under ``"probe"``."""
    ctx = setup.build(seed=seed)
    with zeroed_arguments(ctx.model, zero_args):  # the baseline: the model sees zeros where it reads its inputs
        out = _train_ctx(ctx, setup, batch, objective, steps, target_fraction, stop_early, desc, progress,
                         fixed_steps, callback, phase, min_accuracy)
    if probe is not None:
        out["probe"] = probe(ctx)
    return out


def _train_ctx(ctx: Any, setup: Setup, batch: Any, objective: Any, steps: int, target_fraction: float, stop_early: bool,
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
    counter = StepCounter(params, got_grad)
    # A step without an optimizer (or one it never steps) updates by hand: judged from the parameter change.
    handle = counter.hook()
    hand_updates = [0]
    losses, accs = [], []
    # Every repetition of the fixed batch starts from the state the step carries in from before the first: the
    # batch repeats, so what it ends with is no continuation (a hidden state on the model, a trainer object, a
    # closure). Put back after every call and at the end (the user's own objects are left as they were).
    carried = CarriedState.take(ctx, setup.step)
    # The probe may train longer than the Setup's schedule is sized for: past its end the schedule is held at its
    # last rates instead of raising, turning complex or decaying to 0 (tropt.core.schedule_guard).
    guards = hold_schedules_at_end(ctx)
    loss0, acc0, out = _evaluate(setup, ctx, batch, objective)
    losses.append(loss0)
    accs.append(acc0)
    nonfinite_at = None if math.isfinite(loss0) else 0
    reached = False
    stopped = "non-finite loss" if nonfinite_at is not None else "step limit"
    n = fixed_steps if fixed_steps is not None else steps
    if callback is not None:
        callback({"check": CHECK, "phase": phase, "step": 0, "total": n, "loss": loss0})
    try:
        for t in tqdm(range(1, n + 1), desc=desc, disable=not progress, leave=False):
            if nonfinite_at is not None:
                break
            # Until an optimizer step is seen, keep the values to observe a hand-written update.
            watch = not ctx.optimizers or opt_steps[0] == 0
            seen, before = opt_steps[0], ([p.detach().clone() for p in params] if watch else None)
            counter.calls.clear()
            setup.run_step(ctx, micro)
            opt_steps[0] += counter.updates()
            _forget_batch_state(ctx, carried)
            if watch and opt_steps[0] == seen:
                assert before is not None  # copied whenever watch is set
                _hand_update(params, before, got_grad, hand_updates)
            loss, acc, out = _evaluate(setup, ctx, batch, objective)
            losses.append(loss)
            accs.append(acc)
            if callback is not None:
                callback({"check": CHECK, "phase": phase, "step": t, "total": n, "loss": loss})
            if not math.isfinite(loss):
                nonfinite_at, stopped = t, "non-finite loss"
                break
            # Only a loss with a floor at zero falls to a fraction of its start (a negative one is below it at once).
            if (stop_early and loss0 > 0 and min(losses) >= 0 and loss <= target_fraction * loss0
                    and (acc is None or acc >= min_accuracy)):
                reached, stopped = True, "target reached"
                break
    finally:
        handle.remove()
        _restore(carried)
    changed = [names[i] for i, (p, v) in enumerate(zip(params, start_values))
               if p.shape != v.shape or not torch.equal(p.detach(), v)]
    # The outputs of the last evaluation are those of the final weights (nothing changes after it): no extra pass.
    out_final = out if nonfinite_at is None else None
    return {"losses": np.asarray(losses, dtype=float), "accs": accs, "reached": reached, "nonfinite_at": nonfinite_at,
            "got_grad": [names[i] for i in range(len(params)) if got_grad[i]], "names": names,
            "trainable": [names[i] for i, p in enumerate(params) if p.requires_grad], "changed": changed,
            "optimizer_steps": opt_steps[0], "hand_updates": hand_updates[0], "out": out_final, "stopped": stopped,
            "schedule_held_at": next((g.held_at for g in guards if g.held_at is not None), None)}


class StepCounter:
    """Counts the optimizer steps of one call of the user's step, whichever optimizer makes them: every optimizer
    holding a parameter of the model (``ctx.optimizers``, one the step keeps on ``ctx`` or builds itself), through
    the global step hook. One call is one training step: a GAN's D then G is 1, one optimizer stepped twice is 2
    (the count of the optimizer that stepped most, as ``tropt.core.capture.run_steps`` counts them); a wrapper and
    the optimizer it wraps (Lookahead, SAM) step together and count once. At each step, the parameters holding a
    non-zero gradient are marked in ``got_grad``."""

    def __init__(self, params: list, got_grad: torch.Tensor) -> None:
        self.params, self.got_grad = params, got_grad
        self.ids = {id(p) for p in params}
        self.calls: dict[int, int] = {}  # id(optimizer) -> its steps in the current call

    def _holds_model(self, optimizer: Any) -> bool:
        return any(id(p) in self.ids for g in getattr(optimizer, "param_groups", ()) for p in g["params"])

    def hook(self) -> Any:
        """Register the global pre-step hook; returns its handle."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        @owned_hook("fixed-batch probe (its optimizer-step hook)")
        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not self._holds_model(optimizer):
                return
            self.calls[id(optimizer)] = self.calls.get(id(optimizer), 0) + 1
            for i, p in enumerate(self.params):  # norm_view: a sparse gradient's values
                if p.grad is not None and not self.got_grad[i] and bool((norm_view(p.grad) != 0).any()):
                    self.got_grad[i] = True

        return register_optimizer_step_pre_hook(pre_hook)

    def updates(self) -> int:
        """The optimizer steps of the call just made."""
        return max(self.calls.values(), default=0)


def _forget_batch_state(ctx: Any, carried: CarriedState | None = None) -> None:
    """Drop the tensors the step carries on ctx from one batch to the next (a recurrent hidden state), and put the
    state carried elsewhere (``carried``: tensor attributes of the model or of objects on ctx, the step's closure or
    bound object) back to what it was before the first repetition.

    The batch repeats here, so state carried from its own end is not a continuation: every step starts from the
    state the loss is evaluated with, as the first did. Counters and other plain numbers stay (a learning-rate
    schedule goes on).
    """
    for name, value in list(ctx._user_attrs().items()):
        if _tensors_only(value):
            delattr(ctx, name)
    if carried is not None:
        _restore(carried)


def _restore(carried: CarriedState) -> None:
    """Put back what each piece of carried state held at the snapshot (None included: a hidden state not set yet).
    State that appeared since (an EMA object the step builds at its first call) is left alone: it is no part of the
    batch's repetition, and dropping its attributes would break the object."""
    for slot in find_slots(carried.ctx, carried.step):
        if slot.name in carried.values:
            slot.put(_clone(carried.values[slot.name]))


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        items = [_clone(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


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
