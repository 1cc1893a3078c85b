"""Stepping a Setup, shared by the dynamics, perf and experiments code: read the loss of the user's step, validation.

The loss of one optimizer step is read, in this order, from: what the step returns (a tensor or number); else
the losses its calls to ``ctx.loss_fn`` produced (weighted by micro-batch size, as :func:`tropt.standard_step`
weights them); else an extra no-grad forward pass on the step's micro-batches just before the step (the first
step of such a run then has no loss and is dropped).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from ..setup import Setup


class LossRecorder:
    """Wraps ``ctx.loss_fn`` so the losses the step computes are seen without changing them."""

    def __init__(self, ctx: Any) -> None:
        self.inner = ctx.loss_fn
        self.size = ctx.batch_size
        self.values: list[torch.Tensor] = []
        self.sizes: list[int] = []
        ctx.loss_fn = self

    def __call__(self, model: Any, batch: Any) -> torch.Tensor:
        loss = self.inner(model, batch)
        self.values.append(loss.detach().float().reshape(()))
        try:
            self.sizes.append(self.size(batch))
        except Exception:  # noqa: BLE001 - an unusual batch: weight it 1
            self.sizes.append(1)
        return loss

    def reset(self) -> None:
        self.values.clear()
        self.sizes.clear()

    def mean(self) -> torch.Tensor | None:
        if not self.values:
            return None
        total = float(sum(self.sizes))
        return cast(torch.Tensor, sum(v * (n / total) for v, n in zip(self.values, self.sizes, strict=True)))


def as_loss(value: Any) -> torch.Tensor | None:
    """The step's return value as a 0-d float tensor, or None when it is not a single number."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        if value.dim() == 0 and value.dtype == torch.float32:  # the usual case: one op, not three
            return value.detach()
        return value.detach().float().reshape(())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    return None


class StepRunner:
    """Runs the Setup's step on a built context and reports each step's loss (a 0-d tensor; no sync per step)."""

    def __init__(self, setup: Setup, ctx: Any) -> None:
        self.setup, self.ctx = setup, ctx
        self.recorder = LossRecorder(ctx)
        self.source: str | None = None  # where losses come from: "step return", "loss_fn calls", "extra forward"
        self.pre_forward = False

    def _forward_loss(self, micro: list) -> torch.Tensor:
        ctx = self.ctx
        sizes = [ctx.batch_size(mb) for mb in micro]
        total = float(sum(sizes))
        with torch.no_grad(), ctx.autocast():
            parts = (self.recorder.inner(ctx.model, mb).detach().float() * (n / total)
                     for mb, n in zip(micro, sizes, strict=True))
            return cast(torch.Tensor, sum(parts))

    def step(self, micro: list) -> torch.Tensor | None:
        pre = self._forward_loss(micro) if self.pre_forward else None
        self.recorder.reset()
        out = self.setup.run_step(self.ctx, micro)
        loss = as_loss(out)
        if loss is not None:
            self.source = self.source or "step return"
            return loss
        loss = self.recorder.mean()
        if loss is not None:
            self.source = self.source or "loss_fn calls"
            return loss
        if pre is not None:
            return pre
        self.pre_forward, self.source = True, "extra forward"
        return None


def evaluate(setup: Setup, ctx: Any, n_batches: int) -> float:
    """Mean validation loss over the first ``n_batches`` of val_data, in eval mode without gradients.

    The global RNG state is put back afterwards so evaluating does not change the training run's randomness.
    """
    model = ctx.model
    modes = {m: m.training for m in model.modules()}
    rng = torch.get_rng_state()
    total, count = 0.0, 0
    try:
        model.eval()
        with torch.no_grad():
            for batch in setup.batches(n_batches, which="val", cycle=False):
                with ctx.autocast():
                    loss = setup.loss(model, batch)
                n = setup.size(batch)
                total += float(loss.float()) * n
                count += n
    finally:
        for m, mode in modes.items():
            m.training = mode
        torch.set_rng_state(rng)
    return total / count if count else math.nan


def sync(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock times measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()
