"""What explains a gradient that differs under DDP, for ``loop.ddp``: the single-process run it is compared with, and
the per-process normalisation cause, predicted from ``loss_fn`` per process or micro-batch and from the user's step
itself run alone on each process's share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.capture import observed_at, run_steps
from ..core.compare import global_rel_error, weighted_mean_fit
from ..core.modes import quiet_randomness
from ..core.noise_floor import reseed, rng_advanced
from ..setup import Setup
from ._batch_dependence import Freeze, freeze_batch_dependence
from ._clip_seen import ClipSeen
from ._stochastic import QuietFunctionalDropout
from ._verdicts import require_steps
from .accumulation_causes import loss_grads


def single_run(setup: Setup, full: Any, *, freeze: Freeze, stream: int = 0,
               advanced: list[str] | None = None) -> tuple[tuple[dict, dict, dict], str]:
    """The single-process gradients (at optimizer.step, before clipping, at the clip's entry) on the full batch,
    drawing from ``stream``;
    ``advanced`` receives the global generators the step drew from."""
    ctx = setup.build()
    reseed(setup.seed, stream)
    quiet_randomness(ctx.model)
    freeze_batch_dependence(ctx.model, freeze)
    with QuietFunctionalDropout(), ClipSeen(ctx.model) as seen:
        (records, calls), drawn = rng_advanced(lambda: run_steps(setup, ctx,
                                                                 [setup.split(full, setup.accumulation_steps)]))
    if advanced is not None:
        advanced += drawn
    require_steps(setup, calls, "the single-process run")
    at_clip = {n: None if g is None else torch.from_numpy(g) for n, g in seen.grads.items()}
    return (records[0].grads, records[0].pre_clip, at_clip), observed_at(records)


def _own_normalisation(setup: Setup, full: Any, whole: list, view: int, freeze: Freeze,
                       clip: Callable[[dict], dict], ddp_grads: dict, close: float) -> bool:
    """Whether each process's own normalisation explains the DDP gradient, predicted from the user's step itself
    (a step that counts its own items, as the HF Trainer's num_items_in_batch or fairseq's sample_size, normalises
    otherwise than ``loss_fn`` does), at the view the verdict compared (0 at optimizer.step, 1 before clipping, 3 at
    the clip's entry). Two predictions must hold:

    - the DDP gradient is the average of the step run alone on each process's share (DDP reduced right);
    - the step run on the whole batch is a weighted mean of those per-share runs (weights >= 0 summing to 1: each
      share counted by its items). A step already wrong on one process (zero_grad inside the micro-batch loop)
      reproduces itself on every share too, but its run on the whole batch is no such mean.

    After a clip, each process's clipped gradient does not average to the clipped average: the pre-clip gradients are
    averaged and clipped, as DDP's averaged gradient is."""
    after_clip = view == 0 and setup.grad_clip is not None
    index = 1 if after_clip else {0: 0, 1: 1, 3: 2}[view]
    runs = [single_run(setup, share, freeze=freeze)[0][index] for share in whole]
    alone = single_run(setup, full, freeze=freeze)[0][index]
    if not all(runs) or not alone:
        return False
    names = [n for n in alone if alone[n] is not None and all(r.get(n) is not None for r in runs)]
    average = {n: sum(r[n] for r in runs) / len(runs) for n in names}
    if not names or global_rel_error(ddp_grads, clip(average) if after_clip else average) > close:
        return False
    residual, weights = weighted_mean_fit(alone, runs)
    return weights is not None and residual <= close and bool((weights >= -close).all())


def per_process_mean(setup: Setup, whole: list, shares: list[list], ddp_grads: dict, tol: float, freeze: Freeze,
                      clipped_grads: bool = True, view: int = 0, full: Any = None) -> str | None:
    """Does the DDP gradient equal the average of per-process (or per-micro-batch) mean losses?

    With a loss that is a mean over items other than samples (tokens, non-padding positions), each process
    normalising by its own item count gives a mean of per-process means: not the mean over the whole batch. Returns
    "process" or "micro-batch" for the hypothesis that matches, else None.
    """
    world, k = len(shares), len(shares[0])
    close = max(10 * tol, 1e-4)

    def clipped(g: dict) -> dict:  # gradients captured after the step's clipping: clip the hypothesis alike
        if not clipped_grads:
            return g
        norm = float(torch.sqrt(sum((v.double() ** 2).sum() for v in g.values() if v is not None)))
        coef = min(1.0, setup.grad_clip / (norm + 1e-6)) if setup.grad_clip is not None else 1.0
        return {n: (None if v is None else v * coef) for n, v in g.items()}

    if global_rel_error(ddp_grads, clipped(loss_grads(setup, whole, [1 / world] * world, freeze))) <= close:
        return "process"
    # A step that counts its own items (the HF Trainer's num_items_in_batch, fairseq's sample_size) can normalise
    # otherwise than loss_fn does: predict from the step itself, run alone on each process's share and averaged as
    # DDP averages. Equal means DDP reduced right and only each process's own normalisation differs.
    if full is not None and _own_normalisation(setup, full, whole, view, freeze, clipped, ddp_grads, close):
        return "process"
    micro = [mb for share in shares for mb in share]
    per_micro = loss_grads(setup, micro, [1 / len(micro)] * len(micro), freeze) if k > 1 else None
    if per_micro is not None and global_rel_error(ddp_grads, clipped(per_micro)) <= close:
        return "micro-batch"
    return None
