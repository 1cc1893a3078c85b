"""What a training step receives (:class:`StepContext`) and the reference step (:func:`standard_step`).

A user's own loop is checked by passing their step function as ``Setup(step=...)``; it must have the signature
``step(ctx, micro_batches)`` where ``micro_batches`` is the list of micro-batches that make up one optimizer step,
and may return the step's loss (a tensor or float) or None.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .batching import batch_size

PRECISION_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepContext:
    """Everything one optimizer step needs: the (copied) model, its optimizer, scheduler and scaler, the loss.

    Attributes
    ----------
    model, optimizer, scheduler, scaler
        Live training objects (tropt's copies when a check builds them). ``scaler`` is a
        ``torch.amp.GradScaler`` or None; ``scheduler`` may be None.
    loss_fn
        ``loss_fn(model, batch) -> scalar tensor``.
    grad_clip
        Max global gradient norm, or None.
    accumulation_steps
        Micro-batches per optimizer step the loop is configured for.
    device
        The torch device batches are on.
    precision
        "fp32", "bf16" or "fp16"; :meth:`autocast` gives its context manager.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    grad_clip: float | None
    accumulation_steps: int
    device: torch.device
    precision: str = "fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision's autocast context manager (a no-op for fp32)."""
        dtype = PRECISION_DTYPES[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


def needs_metric(scheduler: Any) -> bool:
    """Whether ``scheduler.step`` needs an argument (a metric, like ReduceLROnPlateau): no argument-free step."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return True
    import inspect

    try:
        params = inspect.signature(scheduler.step).parameters.values()
    except (TypeError, ValueError, AttributeError):  # no step, or a builtin without a signature: assume argument-free
        return False
    return any(p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def standard_step(ctx: StepContext, micro_batches: list) -> torch.Tensor:
    """The reference optimizer step: what a correct loop does with K micro-batches.

    Each micro-batch's (mean-reduced) loss is weighted by its share of the step's samples, so K uneven
    micro-batches give exactly the gradient of the whole batch; then unscale -> clip -> step -> update ->
    zero_grad, and the scheduler once per optimizer step. Returns the step's loss (detached, sample-weighted).
    """
    if ctx.scheduler is not None and needs_metric(ctx.scheduler):  # fail before any update, not at scheduler.step()
        from .errors import SetupError

        raise SetupError(
            f"Setup: the scheduler is a {type(ctx.scheduler).__name__}, which steps on a metric (scheduler.step(metric)); "
            "tropt.standard_step steps the scheduler once per optimizer step with no argument, so it cannot drive it",
            "pass your own step=step(ctx, micro_batches) that calls ctx.scheduler.step(metric) (e.g. with the step's loss), "
            "or leave the scheduler out of the Setup")
    sizes = [batch_size(mb) for mb in micro_batches]
    total = sum(sizes)
    step_loss = torch.zeros((), device=ctx.device)
    no_sync = getattr(ctx.model, "no_sync", None)  # DistributedDataParallel: all-reduce once, on the last micro-batch
    for i, (mb, n) in enumerate(zip(micro_batches, sizes)):
        quiet = no_sync() if no_sync is not None and i < len(micro_batches) - 1 else contextlib.nullcontext()
        with quiet:
            with ctx.autocast():
                loss = ctx.loss_fn(ctx.model, mb)
            weighted = loss.float() * (n / total)
            (ctx.scaler.scale(weighted) if ctx.scaler is not None else weighted).backward()
        step_loss += weighted.detach()
    if ctx.scaler is not None:
        ctx.scaler.unscale_(ctx.optimizer)  # clip the true gradients, never the scaled ones
    if ctx.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
    if ctx.scaler is not None:
        ctx.scaler.step(ctx.optimizer)
        ctx.scaler.update()
    else:
        ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    if ctx.scheduler is not None:
        ctx.scheduler.step()
    return step_loss
