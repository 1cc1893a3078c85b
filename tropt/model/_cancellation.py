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
    if not (largest > 0 and math.isfinite(largest)):
        return None
    summed = float(torch.stack([r["share"] for r in rows]).sum(0).norm())
    total_norm = float(total.detach().double().norm())
    cancel = None
    if summed <= RELATIVE_ZERO * largest and total_norm <= RELATIVE_ZERO * largest:
        cancel = sorted({r["call"] for r in rows})
    else:
        cancel = _cancelling_calls(rows)
    if cancel is None:
        return None
    kept = [(r, n) for r, n in zip(rows, norms) if r["call"] in cancel]
    return {"name": name, "calls": len(cancel), "shares": len(kept),
            "largest_share_norm": max(n for _, n in kept),
            "sum_of_shares_norm": float(torch.stack([r["share"] for r, _ in kept]).sum(0).norm()),
            "gradient_norm": total_norm, "cancelling_calls": ", ".join(map(str, cancel)),
            "table": [{"parameter": name, "forward_call": r["call"], "samples": r["samples"], "share_norm": n,
                       "cancels": r["call"] in cancel} for r, n in zip(rows, norms)]}


MAX_CALLS = 6  # forward calls of one module searched for a cancelling subset (2^6 subsets at most)


def _cancelling_calls(rows: list[dict[str, Any]]) -> list[int] | None:
    """The smallest set of two or more forward calls whose shares cancel exactly, or None.

    ``loss_fn`` may hold terms a step never differentiates for this parameter: a GAN's loss_fn logs D's loss plus
    G's, and G's term reaches D's parameters through a D that the step freezes (or whose gradient it clears) before
    G's backward. D's optimizer then sees D's terms only, and a hinge or Wasserstein critic's output bias gets
    -1 (reals) + 1 (fakes) = 0 there, while loss_fn's whole gradient is -1 from G's term. Some calls' shares
    cancelling exactly is the same evidence as all of them cancelling: the path to the parameter is not cut."""
    by_call: dict[int, torch.Tensor] = {}
    largest: dict[int, float] = {}
    for r in rows:
        by_call[r["call"]] = by_call.get(r["call"], 0) + r["share"]
        largest[r["call"]] = max(largest.get(r["call"], 0.0), float(r["share"].norm()))
    calls = [c for c in by_call if largest[c] > 0]
    if len(calls) < 3 or len(calls) > MAX_CALLS:  # two calls: the whole-gradient test above already decides
        return None
    for size in range(2, len(calls)):
        for subset in itertools.combinations(calls, size):
            top = max(largest[c] for c in subset)
            if float(torch.stack([by_call[c] for c in subset]).sum(0).norm()) <= RELATIVE_ZERO * top \
                    and all(float(by_call[c].norm()) > RELATIVE_ZERO * top for c in subset):
                return list(subset)
    return None


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
