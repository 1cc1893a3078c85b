"""Why a parameter's gradient is exactly zero: a cut path, or parts of the loss that cancel it by design.

A Wasserstein critic's output bias ``b`` gets ``d/db (mean D(real) - mean D(fake)) = 1 - 1 = 0`` at every step:
each sample's share of the gradient is non-zero, and the shares cancel. A cut path (a dead ReLU upstream, a
multiplication by zero, a detached branch) gives every share zero. :func:`cancelling_parameters` tells them apart
on one batch: it splits the gradient ``loss_fn`` sends to a parameter into the shares of each forward call of the
module holding it, and of contiguous blocks of samples within each call, and calls the gradient cancelling when the
shares are non-zero while their sum (the parameter's gradient) is zero.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..snapshot import preserved

if TYPE_CHECKING:
    from ..setup import Setup

BLOCKS = 4  # contiguous blocks of samples each forward call's share is split into
RELATIVE_ZERO = 1e-6  # the sum of the shares is zero relative to the largest share below this


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, torch.Tensor] | None:
    module_name, _, leaf = name.rpartition(".")
    try:
        module = model.get_submodule(module_name) if module_name else model
    except AttributeError:
        return None
    p = module._parameters.get(leaf)
    return (module, p) if p is not None else None


def _shares(loss: torch.Tensor, outputs: list[torch.Tensor], p: torch.Tensor) -> list[dict[str, Any]]:
    """Each forward call's share of ``p``'s gradient, in up to :data:`BLOCKS` blocks of samples (dimension 0)."""
    live = [o for o in outputs if o.requires_grad]
    if not live:
        return []
    upstream = torch.autograd.grad(loss, live, retain_graph=True, allow_unused=True)
    rows = []
    for call, (out, g) in enumerate(zip(live, upstream)):
        if g is None:
            continue
        n = g.shape[0] if g.dim() else 1
        bounds = [round(i * n / min(BLOCKS, n)) for i in range(min(BLOCKS, n) + 1)]
        for lo, hi in itertools.pairwise(bounds):
            masked = torch.zeros_like(g)
            if g.dim():
                masked[lo:hi] = g[lo:hi]
            else:
                masked = g
            share = torch.autograd.grad(out, p, grad_outputs=masked, retain_graph=True, allow_unused=True)[0]
            rows.append({"call": call + 1, "samples": f"{lo}:{hi}",
                         "share": None if share is None else share.detach().double()})
    return rows


def _evidence(name: str, loss: torch.Tensor, outputs: list[torch.Tensor], p: torch.Tensor) -> dict[str, Any] | None:
    total = torch.autograd.grad(loss, p, retain_graph=True, allow_unused=True)[0]
    if total is None:
        return None  # not in the graph of loss_fn: a cut path, not a cancellation
    rows = [r for r in _shares(loss, outputs, p) if r["share"] is not None]
    if not rows:
        return None
    norms = [float(r["share"].norm()) for r in rows]
    largest = max(norms)
    summed = float(torch.stack([r["share"] for r in rows]).sum(0).norm())
    total_norm = float(total.detach().double().norm())
    if not (largest > 0 and math.isfinite(largest)) or summed > RELATIVE_ZERO * largest \
            or total_norm > RELATIVE_ZERO * largest:
        return None
    return {"name": name, "calls": len({r["call"] for r in rows}), "shares": len(rows),
            "largest_share_norm": largest, "sum_of_shares_norm": summed, "gradient_norm": total_norm,
            "table": [{"parameter": name, "forward_call": r["call"], "samples": r["samples"], "share_norm": n}
                      for r, n in zip(rows, norms)]}


def cancelling_parameters(setup: Setup, ctx: Any, batch: Any, names: list[str],
                          limit: int = 8) -> dict[str, dict[str, Any]]:
    """For the parameters ``names`` (exactly-zero gradients at every step): those whose gradient under ``loss_fn``
    on ``batch`` is the sum of non-zero shares that cancel, with the evidence. The model's gradients, modes and the
    RNGs are left as they were; a probe that fails says nothing (the parameter keeps its finding)."""
    model = ctx.model
    found: dict[str, dict[str, Any]] = {}
    for name in names[:limit]:
        owner = _owner(model, name)
        if owner is None or not owner[1].requires_grad:
            continue
        module, p = owner
        outputs: list[torch.Tensor] = []

        def keep(mod: nn.Module, args: Any, out: Any, outputs: list = outputs) -> None:
            if isinstance(out, torch.Tensor):
                outputs.append(out)

        handle = module.register_forward_hook(keep)
        grads = {id(q): q.grad for q in model.parameters()}
        try:
            with preserved(), torch.enable_grad(), ctx.autocast():
                loss = setup.loss(model, batch).float()
            evidence = _evidence(name, loss, outputs, p)
        except Exception:  # noqa: BLE001 - a loss the probe cannot split: no evidence, the finding stays
            evidence = None
        finally:
            handle.remove()
            for q in model.parameters():
                q.grad = grads[id(q)]
        if evidence is not None:
            found[name] = evidence
    return found
