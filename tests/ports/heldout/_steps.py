"""The accumulation step several probe ports share: each micro-batch's mean loss weighted by its share of the
samples, one optional clip, one optimizer step (the wav2letter, MoE and re-id training loops all do this)."""
from __future__ import annotations

from collections.abc import Callable

import torch

import tropt


def share_weighted_step(clip: float | None = None) -> Callable[[tropt.StepContext, list], torch.Tensor]:
    """A step that weights each micro-batch's loss by its share of the samples, clips to ``clip`` (None: no clip)
    and steps once; it returns the summed weighted loss."""
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        ctx.model.train()
        ctx.optimizer.zero_grad()
        sizes = [ctx.batch_size(mb) for mb in micro]
        total = torch.zeros(())
        for mb, n in zip(micro, sizes, strict=True):
            loss = ctx.loss_fn(ctx.model, mb) * (n / sum(sizes))
            loss.backward()
            total += loss.detach()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), clip)
        ctx.optimizer.step()
        return total

    return step
