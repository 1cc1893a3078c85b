"""``model.gradient_flow``: does the gradient reach every parameter, at a sane size, and does each one get updated?

A copy is trained for a few steps with the user's optimizer and step under a :class:`tropt.GradientMonitor`; the
record is judged by :func:`judge_gradient_flow` (in :mod:`.gradient_verdict`, which a user can also apply to their
own loop via ``monitor.result()``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from ..core.modes import dropout_off
from ..core.optimizer_params import frozen_optimizer
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import copy_module, preserved
from ._cancellation import cancelling_parameters
from .gradient_verdict import judge_gradient_flow, parameter_summary
from .monitor import GradientMonitor

if TYPE_CHECKING:
    from ..setup import Setup

__all__ = ["check_gradient_flow", "init_reference", "judge_gradient_flow"]

CHECK = "model.gradient_flow"


def init_reference(setup: Setup, ctx: Any, batch: Any) -> tuple[float, float, float, float] | None:
    """(global gradient norm at the model's own initialisation, at PyTorch's default initialisation of the same
    architecture, the noise floor, the lower of the two paired ratios) on one batch: every module with
    ``reset_parameters`` re-initialised on a copy. None when no module can be re-initialised or a norm is not
    finite. The model's gradients are cleared afterwards; RNGs are restored.

    Both models are evaluated on the same RNG stream (a loss that draws noise, timesteps or masks draws the same
    numbers for both: a paired comparison), on two streams (:func:`tropt.core.noise_floor.reseed`): the norms'
    relative change between streams is the floor (0.0 for a deterministic loss). The norms are their means over the
    streams, and an explosion at initialisation needs both paired ratios above the limit."""
    from ..core.noise_floor import reseed

    ref = copy_module(ctx.model)
    with preserved():
        torch.manual_seed(setup.seed)
        resettable = [m for m in ref.modules() if callable(getattr(m, "reset_parameters", None))]
        if not resettable:
            return None
        try:
            for m in resettable:
                m.reset_parameters()
        except Exception:  # noqa: BLE001 - a custom reset_parameters with its own arguments: no reference
            return None
        pairs = []
        for stream in (0, 1):
            norms = []
            for model in (ctx.model, ref):
                reseed(setup.seed, stream)
                norms.append(_grad_norm(setup, ctx, model, batch))
            pairs.append(norms)
    if not all(math.isfinite(n) and n > 0 for pair in pairs for n in pair):
        return None
    own, default = (pairs[0][0] + pairs[1][0]) / 2, (pairs[0][1] + pairs[1][1]) / 2
    floor = max(abs(pairs[0][i] - pairs[1][i]) / max(pairs[0][i], pairs[1][i]) for i in (0, 1))
    return own, default, floor, min(a / b for a, b in pairs)


def _grad_norm(setup: Setup, ctx: Any, model: torch.nn.Module, batch: Any) -> float:
    """The global gradient norm of ``setup``'s loss on ``batch`` for ``model`` (its gradients cleared after)."""
    model.zero_grad(set_to_none=True)
    # The backward pass runs in the forward's modes: activation checkpointing recomputes the forward inside it, and a
    # block recomputed with dropout back on raises torch's CheckpointError.
    with dropout_off(model):
        with ctx.autocast():
            loss = setup.loss(model, batch)
        loss.float().backward()
    grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return float(torch.stack(grads).norm()) if grads else math.nan


def _cancelling(setup: Setup, ctx: Any, mon: GradientMonitor) -> dict[str, dict[str, Any]]:
    """The parameters whose gradient was exactly zero at every recorded step and whose zero the loss's parts cancel
    by design (see :mod:`._cancellation`); probed on the first batch only when there are such parameters."""
    s = parameter_summary(mon)
    zero = list(s[(s["steps_with_grad"] > 0) & (s["zero_fraction"] >= 1.0)]["name"])
    if not zero:
        return {}
    return cancelling_parameters(setup, ctx, setup.sample_batch(), zero)


class _HandUpdates:
    """Records a step that updates parameters by hand (no optimizer step) into a GradientMonitor.

    The gradients are the last ones each parameter accumulated in the call (kept by reference through
    ``register_post_accumulate_grad_hook``, so a step that sets ``.grad`` to None after its update is still seen);
    a parameter that moved counts as updated (in an optimizer with a non-zero learning rate, for the verdict).
    """

    def __init__(self, model: Any) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.last: dict[int, Any] = {}
        self.values: list | None = None
        self.handles: list = []
        self.recorded = 0  # hand-written updates recorded

    def __enter__(self) -> _HandUpdates:
        for i, p in enumerate(self.params):
            self.handles.append(p.register_post_accumulate_grad_hook(lambda t, i=i: self.last.__setitem__(i, t.grad)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()

    def before(self, watch: bool) -> None:
        self.last.clear()
        self.values = [p.detach().clone() for p in self.params] if watch else None

    def record(self, mon: GradientMonitor) -> None:
        if self.values is None:
            return
        moved = [i for i, (p, v) in enumerate(zip(self.params, self.values))
                 if p.shape != v.shape or not torch.equal(p.detach(), v)]
        if not moved:
            return
        missing = [i for i, p in enumerate(self.params) if p.grad is None and self.last.get(i) is not None]
        for i in missing:
            self.params[i].grad = self.last[i]
        try:
            mon.record()
            self.recorded += 1
        finally:
            for i in missing:
                self.params[i].grad = None
        index = {id(p): j for j, p in enumerate(mon._params)}
        rows = [index[id(self.params[i])] for i in moved if id(self.params[i]) in index]
        mon.in_optimizer[rows] = True
        mon.lr_nonzero[rows] = True


@register(CHECK, title="Gradient flow",
          description="Train a copy for a few steps under GradientMonitor: missing, unused, vanishing or exploding "
                      "gradients.",
          budgets={'quick': {'steps': 5}, 'thorough': {'steps': 50}},
          plot="tropt.plots.model")
def check_gradient_flow(setup: Setup, *, steps: int = 20, vanish_ratio: float = 1e-3, vanish_rms: float = 1e-5,
                        explode_update_ratio: float = 1.0, explode_growth: float = 1e3,
                        explode_init_ratio: float = 1e3, explode_norm: float | None = None, seed: int | None = None,
                        progress: bool = True, callback: Any = None) -> CheckResult:
    """Train a copy for ``steps`` optimizer steps with the user's step and judge its gradients.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    steps
        Optimizer steps to record (each uses ``accumulation_steps`` micro-batches of one batch).
    vanish_ratio, vanish_rms
        Vanishing when the first layer's gradient RMS is below ``vanish_ratio`` x the last layer's and below
        ``vanish_rms`` in absolute terms (AUTOTRAINER's rule, both configurable).
    explode_update_ratio, explode_growth
        Exploding when one optimizer step moves the parameters by more than ``explode_update_ratio`` x their norm,
        or the global gradient norm (as the optimizer sees it, after any clipping) reaches ``explode_growth`` x the
        median of the steps before it. Judged against the model's own scale: a large gradient norm alone (MSE on
        targets around 100, or any gradient under Adam, whose update ignores the gradient's scale) is not an
        explosion.
    explode_init_ratio
        Exploding when the gradient at initialisation is this many times that of the same architecture at PyTorch's
        default initialisation (every module's ``reset_parameters``) on the first batch: the initial weight scale.
    explode_norm
        Optional absolute cap on the global gradient norm (None: off).
    seed
        Seed of the copy (the Setup's seed when None).
    progress
        Show a progress bar.
    callback
        Optional ``callback({"check", "step", "total", "monitor"})`` after each step (live displays); raising
        :class:`tropt.errors.Cancelled` in it stops the run.
    """
    from tqdm.auto import tqdm

    setup.validate()
    with preserved(setup.model):
        ctx = setup.build(seed=setup.seed if seed is None else seed)
        k = setup.accumulation_steps
        reference = init_reference(setup, ctx, setup.sample_batch())
        # Every optimizer holding the copy's parameters is watched (the Setup's, and any the step builds and keeps on
        # ctx): a parameter is updated when any of them holds it.
        with GradientMonitor(ctx.model, full_every=1, detail=True, capacity=steps) as mon, \
                _HandUpdates(ctx.model) as hand:
            stepped = False  # an optimizer step was seen: from then on no parameter copies are needed
            bar = tqdm(setup.batches(steps), total=steps, desc="gradient flow", disable=not progress, leave=False)
            for i, batch in enumerate(bar):
                seen = mon.steps_seen
                hand.before(watch=ctx.optimizer is None or not stepped)
                setup.run_step(ctx, setup.split(batch, k) if k > 1 else [batch])
                stepped |= mon.steps_seen > seen
                if mon.steps_seen == seen:  # no optimizer step: a hand-written update, recorded from the parameters
                    hand.record(mon)
                if callback is not None:
                    callback({"check": CHECK, "step": i + 1, "total": steps, "monitor": mon})
        cancelled = _cancelling(setup, ctx, mon)
    result = judge_gradient_flow(mon, vanish_ratio=vanish_ratio, vanish_rms=vanish_rms,
                                 explode_update_ratio=explode_update_ratio, explode_growth=explode_growth,
                                 explode_norm=explode_norm, grad_clip=setup.grad_clip, init_reference=reference,
                                 explode_init_ratio=explode_init_ratio, cancelled=cancelled)
    result.metrics["observed_at"] = "parameter change" if hand.recorded else "optimizer.step"
    frozen = frozen_optimizer(ctx.model, ctx.optimizer) if not mon.recorded_steps else None
    if frozen is not None:  # it did call optimizer.step(): on an optimizer holding only frozen parameters
        return dataclasses.replace(result, status=Status.FAIL, summary=f"no optimizer step updated the model: "
                                   f"{frozen.sentence()}", metrics={**result.metrics, **frozen.metrics()},
                                   tables={"optimizer_parameters": frozen.table, **result.tables},
                                   advice=[frozen.advice])
    return result
