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
           min_accuracy: float = 1.0) -> dict[str, Any]:
    ctx = setup.build(seed=seed)
    with zeroed_arguments(ctx.model, zero_args):  # the baseline: the model sees zeros where it reads its inputs
        return _train_ctx(ctx, setup, batch, objective, steps, target_fraction, stop_early, desc, progress,
                          fixed_steps, callback, phase, min_accuracy)


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

    @owned_hook("fixed-batch probe (its optimizer-step hook)")
    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        opt_steps[0] += 1
        for i, p in enumerate(params):  # norm_view: a sparse gradient's values
            if p.grad is not None and not got_grad[i] and bool((norm_view(p.grad) != 0).any()):
                got_grad[i] = True

    # A step without an optimizer (or one it never steps) updates by hand: judged from the parameter change.
    handle = ctx.optimizer.register_step_pre_hook(pre_hook) if ctx.optimizer is not None else None
    hand_updates = [0]
    losses, accs = [], []
    # Every repetition of the fixed batch starts from the state the step carries in from before the first: the
    # batch repeats, so what it ends with is no continuation (a hidden state on the model, a trainer object, a
    # closure). Put back after every call and at the end (the user's own objects are left as they were).
    carried = CarriedState.take(ctx, setup.step)
    loss0, acc0, _out0 = _evaluate(setup, ctx, batch, objective)
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
            _forget_batch_state(ctx, carried)
            if watch and opt_steps[0] == seen:
                assert before is not None  # copied whenever watch is set
                _hand_update(params, before, got_grad, hand_updates)
            loss, acc, _out = _evaluate(setup, ctx, batch, objective)
            losses.append(loss)
            accs.append(acc)
            if callback is not None:
                callback({"check": CHECK, "phase": phase, "step": t, "total": n, "loss": loss})
            if not math.isfinite(loss):
                nonfinite_at = t
                break
            # Only a loss with a floor at zero falls to a fraction of its start (a negative one is below it at once).
            if (stop_early and loss0 > 0 and min(losses) >= 0 and loss <= target_fraction * loss0
                    and (acc is None or acc >= min_accuracy)):
                reached = True
                break
    finally:
        if handle is not None:
            handle.remove()
        _restore(carried)
    changed = [names[i] for i, (p, v) in enumerate(zip(params, start_values))
               if p.shape != v.shape or not torch.equal(p.detach(), v)]
    _, _, out_final = _evaluate(setup, ctx, batch, objective) if nonfinite_at is None else (None, None, None)
    return {"losses": np.asarray(losses, dtype=float), "accs": accs, "reached": reached, "nonfinite_at": nonfinite_at,
            "got_grad": [names[i] for i in range(len(params)) if got_grad[i]], "names": names,
            "trainable": [names[i] for i, p in enumerate(params) if p.requires_grad], "changed": changed,
            "optimizer_steps": opt_steps[0], "hand_updates": hand_updates[0], "out": out_final}


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
